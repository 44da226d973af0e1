#!/usr/bin/env python3
"""pi2 vs llama.cpp on the same GGUF, interleaved, on this machine.

llama.cpp comes from PyPI (`llama-cpp-python`, built from source with CPU flags read from
/proc/cpuinfo: a native build crashes in ggml's AMX code here). Nothing of llama.cpp is vendored.

    python3 bench/compare_llama_cpp.py [--model PATH|NAME] [--rounds 3] [--reps 3] [--threads 1,2]
        [--n-prompt 128] [--n-gen 128] [--load]

Each round runs `pi2 bench -o json` and the same tests through llama.cpp (one process each),
alternating, so slow phases of a noisy machine hit both. Prints a markdown table of the median
over rounds of each round's mean t/s, the pi2/llama.cpp ratio of those medians, and every
round's value. `--load` keeps a `nice -n 19` busy loop on CPU 0 running throughout (a shared
machine's background work). llama.cpp runs with its defaults (repacked weights where it has
them), one `Llama.eval` call per generated token.
"""
import argparse, json, os, statistics, subprocess, sys, venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "target" / "llama-cpp-venv"
def cmake_args():
    """Native builds crash in ggml's AMX code here, so features are set by hand from the CPU's
    own flags (a VNNI build dies with SIGILL on a CPU without VNNI)."""
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    on = lambda f: "ON" if f else "OFF"
    avx512 = {"avx512f", "avx512bw", "avx512vl"} <= flags
    return (f"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2={on('avx2' in flags)} -DGGML_FMA={on('fma' in flags)} "
            f"-DGGML_F16C={on('f16c' in flags)} -DGGML_AVX512={on(avx512)} "
            f"-DGGML_AVX512_VNNI={on(avx512 and 'avx512_vnni' in flags)} -DGGML_AVX_VNNI={on('avx_vnni' in flags)} "
            "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the llama.cpp (0c1e57098) of testdata/golden

# Runs inside the venv: times prompt processing (one batch) and generation (one token per call).
LLAMA_RUNNER = r"""
import json, sys, time
import llama_cpp
model, threads, n_prompt, n_gen, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                      n_batch=512, verbose=False, logits_all=False)
vocab = llm.n_vocab()
toks = [(i * 2654435761 + 12345) % vocab for i in range(max(n_prompt, n_gen))]
out = {}
def pp():
    llm.reset(); llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    t = time.perf_counter(); llm.eval(toks[:n_prompt]); return n_prompt / (time.perf_counter() - t)
def tg():
    llm.reset(); llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    t = time.perf_counter()
    for i in range(n_gen):
        llm.eval([toks[i]])
    return n_gen / (time.perf_counter() - t)
for name, f in ((f"pp{n_prompt}", pp), (f"tg{n_gen}", tg)):
    f()  # warm-up
    out[name] = [f() for _ in range(reps)]
print(json.dumps(out))
"""

def ensure_llama_cpp():
    py = VENV / "bin" / "python"
    stamp = VENV / "pi2-cmake-args"
    args = cmake_args()
    built = stamp.read_text() if stamp.exists() else None
    if built == args and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py
    print(f"installing {LLAMA_CPP_PYTHON} into {VENV} with CMAKE_ARGS={args!r} (builds llama.cpp, several minutes)", file=sys.stderr)
    venv.create(VENV, with_pip=True)
    env = dict(os.environ, CMAKE_ARGS=args, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    subprocess.run([py, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall", "--no-deps", "--no-binary",
                    "llama-cpp-python", LLAMA_CPP_PYTHON], env=env, check=True)
    # Its runtime dependencies (wheels), installed after so the source build stays pinned.
    subprocess.run([py, "-m", "pip", "install", "-q", "numpy", "typing-extensions", "diskcache", "jinja2"],
                   check=True)
    stamp.write_text(args)
    return py

def model_path(spec):
    """A path, or a catalogue name resolved (and fetched) by `pi2 fetch-model`."""
    if Path(spec).exists():
        return spec
    pi2 = ROOT / "target" / "release" / "pi2"
    out = subprocess.run([str(pi2), "fetch-model", spec], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def background_load():
    """A busy loop at nice 19 pinned to CPU 0: the 'anything else running' of a shared machine."""
    return subprocess.Popen(["taskset", "-c", "0", "nice", "-n", "19", sys.executable, "-c", "while True: pass"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF path or a catalogue name")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--load", action="store_true",
                    help="run everything beside a nice -n 19 busy loop on CPU 0")
    ap.add_argument("--pi2", default=str(ROOT / "target" / "release" / "pi2"))
    ap.add_argument("--pi2-args", default="", help="extra arguments for pi2 bench (space-separated)")
    a = ap.parse_args()
    py = ensure_llama_cpp()
    if not Path(a.pi2).exists():
        subprocess.run(["cargo", "build", "--release", "-p", "pi2-cli"], cwd=ROOT, check=True)
    model = model_path(a.model)
    load = background_load() if a.load else None
    rounds = {}  # (engine, threads, test) -> [mean t/s of each round]
    try:
        for r in range(a.rounds):
            for t in a.threads.split(","):
                out = subprocess.run([a.pi2, "bench", "-m", model, "-t", t, "-p", str(a.n_prompt), "-n", str(a.n_gen),
                                      "-r", str(a.reps), "-o", "json", *a.pi2_args.split()],
                                     capture_output=True, text=True, check=True).stdout
                for row in json.loads(out):
                    if row.get("ffn", "dense") != "dense" and "ffn" in row:
                        continue
                    rounds.setdefault(("pi2", int(t), row["test"]), []).append(statistics.mean(row["samples_ts"]))
                out = subprocess.run([py, "-c", LLAMA_RUNNER, model, t, str(a.n_prompt), str(a.n_gen), str(a.reps)],
                                     capture_output=True, text=True, check=True).stdout
                for test, v in json.loads(out.strip().splitlines()[-1]).items():
                    rounds.setdefault(("llama.cpp", int(t), test), []).append(statistics.mean(v))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        if load:
            load.kill()
    print(f"{Path(model).name}, {a.rounds} interleaved rounds of {a.reps} repetitions"
          f"{', beside a nice -n 19 busy loop on CPU 0' if a.load else ''}; median of the round means")
    print("| threads | test | pi2 t/s | llama.cpp t/s | ratio | pi2 rounds | llama.cpp rounds |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for t in a.threads.split(","):
        for test in (f"pp{a.n_prompt}", f"tg{a.n_gen}"):
            p, l = rounds[("pi2", int(t), test)], rounds[("llama.cpp", int(t), test)]
            mp, ml = statistics.median(p), statistics.median(l)
            fmt = lambda xs: " ".join(f"{x:.1f}" for x in xs)
            print(f"| {t} | {test} | {mp:.1f} | {ml:.1f} | {mp / ml:.2f}x | {fmt(p)} | {fmt(l)} |")

if __name__ == "__main__":
    main()
