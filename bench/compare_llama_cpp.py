#!/usr/bin/env python3
"""pi2 vs llama.cpp on the same GGUF, interleaved, on this machine.

llama.cpp comes from PyPI (`llama-cpp-python`, built from source with CPU flags read from
/proc/cpuinfo: a native build crashes in ggml's AMX code here). Nothing of llama.cpp is vendored.

    python3 bench/compare_llama_cpp.py [--model M] [--rounds 5] [--reps 3] [--threads 1,2]

Each round runs `pi2 bench -o json` and the same tests through llama.cpp (one process each),
alternating, so slow phases of a noisy machine hit both. Prints a markdown table of mean t/s
and the pi2/llama.cpp ratio per test.
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
    stamp.write_text(args)
    return py

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--pi2", default=str(ROOT / "target" / "release" / "pi2"))
    a = ap.parse_args()
    py = ensure_llama_cpp()
    if not Path(a.pi2).exists():
        subprocess.run(["cargo", "build", "--release", "-p", "pi2-cli"], cwd=ROOT, check=True)
    samples = {}  # (engine, threads, test) -> [t/s]
    for r in range(a.rounds):
        for t in a.threads.split(","):
            out = subprocess.run([a.pi2, "bench", "-m", a.model, "-t", t, "-p", str(a.n_prompt), "-n", str(a.n_gen),
                                  "-r", str(a.reps), "-o", "json"], capture_output=True, text=True, check=True).stdout
            for row in json.loads(out):
                samples.setdefault(("pi2", int(t), row["test"]), []).extend(row["samples_ts"])
            out = subprocess.run([py, "-c", LLAMA_RUNNER, a.model, t, str(a.n_prompt), str(a.n_gen), str(a.reps)],
                                 capture_output=True, text=True, check=True).stdout
            for test, v in json.loads(out.strip().splitlines()[-1]).items():
                samples.setdefault(("llama.cpp", int(t), test), []).extend(v)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"| threads | test | pi2 t/s | llama.cpp t/s | ratio |")
    print(f"| ---: | ---: | ---: | ---: | ---: |")
    for t in a.threads.split(","):
        for test in (f"pp{a.n_prompt}", f"tg{a.n_gen}"):
            p, l = samples[("pi2", int(t), test)], samples[("llama.cpp", int(t), test)]
            mp, ml = statistics.mean(p), statistics.mean(l)
            print(f"| {t} | {test} | {mp:.1f} ± {statistics.stdev(p):.1f} | {ml:.1f} ± {statistics.stdev(l):.1f} | {mp / ml:.2f}x |")

if __name__ == "__main__":
    main()
