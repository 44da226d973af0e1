#!/usr/bin/env python3
"""Decode through the C API and the Python package against `pi2 run` at the same settings, and
the peak memory of a Python process under a memory budget.

    python3 bench/embedding_apis.py [--model qwen2.5-coder-0.5b] [--tokens 128] [--rounds 5] \
        [--budget 50%] [--name NAME]

Interleaved rounds, each: `pi2 run -p P -n N --temp 0 --ignore-eos -t 2 --json` (`-b 8` under a budget), the C example
(`examples/c/generate.c`, built by `cargo xtask c-example`) and `pi2.Model(...).generate(...)`,
all in memory and all under `--mem-budget B` (from the plain GGUF's cached conversion, made
once before); generation tokens per second as each reports it (prompt excluded). Then the
Python process's peak RSS (VmHWM) under the budget against the budget and the interpreter's
own peak after `import pi2`. Needs `pip install ./python` into target/py-venv. Writes
docs/measurements/embedding-apis-NAME.json.
"""
import argparse, json, os, re, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

PY = pi2bench.ROOT / "target" / "py-venv" / "bin" / "python"
C_EXAMPLE = pi2bench.ROOT / "target" / "c-example" / "generate"
PROMPT = "def quicksort(xs):"
# Under a budget the prompt batch's buffers share the neuron cache's room: all three front ends
# size them for the same batch (`pi2 run` would otherwise size them to its prompt, and a
# session for 64 tokens).
BATCH = 8

PY_CODE = """
import json, sys, pi2
model, budget, n = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
m = pi2.Model(model, mem_budget=budget, threads=2, n_batch=int(sys.argv[5]) if budget else None)
m.generate(sys.argv[4], max_tokens=n, temperature=0, ignore_eos=True)
print(json.dumps(m.stats()))
"""


def pi2_run(model, n, budget):
    extra = ["--mem-budget", budget, "-b", str(BATCH)] if budget else []
    out = subprocess.run([pi2bench.pi2(), "run", "-m", model, "-p", PROMPT, "-n", str(n), "--temp", "0",
                          "--ignore-eos", "-t", "2", "--json", *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["timings"]["predicted_per_second"]


def c_api(model, n, budget):
    env = dict(os.environ, PI2_IGNORE_EOS="1")
    if budget:
        env.update(PI2_MEM_BUDGET=budget, PI2_N_BATCH=str(BATCH))
    out = subprocess.run([str(C_EXAMPLE), model, PROMPT, str(n)], capture_output=True, text=True, env=env, check=True)
    return float(re.search(r"([\d.]+) tokens per second", out.stderr).group(1))


def python(model, n, budget):
    out = subprocess.run([str(PY), "-c", PY_CODE, model, budget or "", str(n), PROMPT, str(BATCH)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--name")
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    # Built now (and checked against pi2 run), so it links the library of this commit.
    subprocess.run(["cargo", "xtask", "c-example"], cwd=pi2bench.ROOT, check=True)
    # The conversion for the budget, made once before any timing.
    pi2_run(model, 1, a.budget)
    steps = {}
    for where, budget in (("memory", None), ("budget", a.budget)):
        steps[f"pi2_run_{where}"] = lambda b=budget: pi2_run(model, a.tokens, b)
        steps[f"c_api_{where}"] = lambda b=budget: c_api(model, a.tokens, b)
        steps[f"python_{where}"] = lambda b=budget: python(model, a.tokens, b)["tokens_per_second"]
    runs = pi2bench.interleaved(a.rounds, steps)
    summary = {k: pi2bench.spread(v) for k, v in runs.items()}
    ratios = {}
    for where in ("memory", "budget"):
        base = summary[f"pi2_run_{where}"]["median"]
        for api in ("c_api", "python"):
            ratios[f"{api}_{where}"] = summary[f"{api}_{where}"]["median"] / base
    # Peak memory of a Python process under the budget, against the interpreter's own.
    base_peak = int(subprocess.run([str(PY), "-c", "import pi2, re; print(re.search(r'VmHWM:\\s+(\\d+)', "
                                    "open('/proc/self/status').read()).group(1))"],
                                   capture_output=True, text=True, check=True).stdout) * 1024
    st = python(model, a.tokens, a.budget)
    budget_bytes = pi2bench.size(a.budget, Path(model).stat().st_size)
    memory = {"budget_bytes": budget_bytes, "python_peak_rss_bytes": st["peak_rss_bytes"],
              "interpreter_peak_rss_bytes": base_peak,
              "within_budget_plus_interpreter": st["peak_rss_bytes"] <= budget_bytes + base_peak,
              "bytes_read_per_token": st["bytes_read_per_token"]}
    data = {"model": Path(model).name, "tokens": a.tokens, "rounds": a.rounds, "budget": a.budget,
            "prompt": PROMPT, "runs": runs, "summary": summary, "ratio_to_pi2_run": ratios, "python_memory": memory}
    name = a.name or "embedding-apis-" + re.sub(r"[^a-z0-9.]+", "-", Path(model).stem.lower().split("-instruct")[0])
    pi2bench.write(name, data, plot=False)
    print(json.dumps({"ratio_to_pi2_run": ratios, "python_memory": memory}, indent=1))


if __name__ == "__main__":
    main()
