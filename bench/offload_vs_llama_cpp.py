#!/usr/bin/env python3
"""Decode speed under a memory cap: pi2 (flash offload) vs llama.cpp (mmap), the paper's baseline.

    sudo python3 bench/offload_vs_llama_cpp.py --model STANDIN.gguf --converted CONVERTED.gguf \
        [--budgets 50%,25%] [--tokens 8] [--prompt 0] [--threads 2]

For each budget (a fraction of the original file, or a size like 2G), both engines run inside a
cgroup v1 memory cap of that size, after `echo 3 > /proc/sys/vm/drop_caches`:
- llama.cpp (`llama-cpp-python` in target/llama-cpp-venv, see compare_llama_cpp.py) loads the
  original file with mmap and decodes --tokens tokens one at a time after a 1-token prompt;
- pi2 runs `pi2 bench -p 0 -n TOKENS -r 1 --offload-only --mem-budget B` on the converted file
  (FFN neurons read from flash, the rest resident; one warm-up pass, then the measured one), where
  B leaves the cap room for pi2's code and heap (the cap is the same for both).
With --prompt N both engines instead process an N-token prompt in one batch (prefill).
Needs root (cgroups, drop_caches). Prints a markdown table.
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / "target" / "llama-cpp-venv" / "bin" / "python"
PI2 = ROOT / "target" / "release" / "pi2"

LLAMA_RUNNER = r"""
import sys, time, json, llama_cpp, llama_cpp.llama_cpp as C
model, threads, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Keep the weights in the file mapping: by default llama.cpp copies Q4_0 tensors into a
# repacked (CPU_REPACK) buffer in anonymous memory, which is not the mmap baseline and does
# not fit under the cap (`--no-repack` in llama.cpp's own tools).
_defaults = C.llama_model_default_params
def _no_repack():
    p = _defaults()
    p.use_extra_bufts = False
    return p
C.llama_model_default_params = _no_repack
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=256,
                      n_batch=32, use_mmap=True, verbose=False)
load = time.perf_counter() - t0
prompt = int(sys.argv[4])
toks = lambda k: [(i * 7919 + 13) % llm.n_vocab() for i in range(k)]
if prompt > 0:
    t = time.perf_counter()
    llm.eval(toks(prompt))
    print(json.dumps({"load_s": load, "token_s": [(time.perf_counter() - t) / prompt] * prompt}))
    sys.exit(0)
llm.eval([1])
times = []
for tok in toks(n):
    t = time.perf_counter()
    llm.eval([tok])
    times.append(time.perf_counter() - t)
print(json.dumps({"load_s": load, "token_s": times}))
"""


def cgroup_root():
    for line in open("/proc/self/cgroup"):
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1] == "memory":
            return Path("/sys/fs/cgroup/memory") / parts[2].lstrip("/")
    sys.exit("no cgroup v1 memory controller")


def capped(cmd, cap_bytes):
    """Run cmd inside a fresh memory cgroup of cap_bytes, caches dropped first."""
    cg = cgroup_root() / f"pi2bench{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(cap_bytes))
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        pre = lambda: Path(cg / "cgroup.procs").write_text(str(os.getpid()))
        out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre)
        peak = int((cg / "memory.max_usage_in_bytes").read_text())
        if out.returncode != 0:
            sys.exit(f"{cmd[0]} failed: {out.stderr[-2000:]}")
        return out.stdout, peak
    finally:
        # Processes have exited; the group can go.
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def size(spec, file_bytes):
    spec = spec.strip()
    if spec.endswith("%"):
        return int(file_bytes * float(spec[:-1]) / 100)
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(spec[:-1]) * mult[spec[-1].upper()]) if spec[-1].upper() in mult else int(spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--converted", required=True)
    ap.add_argument("--budgets", default="50%,25%")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=0, help="measure prefill of this many tokens instead")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--headroom", default="256M", help="cap minus pi2's --mem-budget")
    ap.add_argument("--pi2-args", default="", help="extra pi2 bench arguments (e.g. --no-predictor)")
    a = ap.parse_args()
    file_bytes = os.path.getsize(a.model)
    headroom = size(a.headroom, file_bytes)
    test = f"pp{a.prompt}" if a.prompt else f"tg{a.tokens}"
    print(f"| cap | test | llama.cpp mmap t/s | pi2 offload t/s | pi2 / llama.cpp | pi2 hit rate | "
          f"pi2 MB read/token | pi2 I/O wait share | peak cgroup MiB (llama.cpp / pi2) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for b in a.budgets.split(","):
        cap = size(b, file_bytes)
        out, peak_l = capped([str(VENV_PY), "-c", LLAMA_RUNNER, a.model, str(a.threads), str(a.tokens),
                              str(a.prompt)], cap)
        ll = json.loads(out.strip().splitlines()[-1])
        ll_tps = len(ll["token_s"]) / sum(ll["token_s"])
        p, n = (a.prompt, 0) if a.prompt else (0, a.tokens)
        out, peak_p = capped([str(PI2), "bench", "-m", a.converted, "-p", str(p), "-n", str(n), "-r", "1",
                              "-t", str(a.threads), "-c", "256", "--offload-only", *a.pi2_args.split(),
                              "--mem-budget", str(cap - headroom), "-o", "json"], cap)
        rows = json.loads(out)
        rows = rows if isinstance(rows, list) else rows.get("results", [rows])
        row = rows[-1]
        pi_tps = row["avg_ts"]
        off = (row.get("sparse") or {}).get("offload") or {}
        # Neuron rows, streamed attention layers and output rows decode asked the reader for
        # (prefill streams whole units instead).
        per_tok = (off.get("decode_bytes_requested_per_token", 0)
                   + off.get("attention_bytes_per_token", 0)
                   + off.get("output_bytes_per_token", 0)) / 1e6 if n else float("nan")
        print(f"| {b} ({cap / 2**30:.2f} GiB) | {test} | {ll_tps:.3f} | {pi_tps:.3f} | {pi_tps / ll_tps:.1f}x | "
              f"{off.get('hit_rate', float('nan')):.3f} | {per_tok:.1f} | {off.get('io_wait_share', float('nan')):.2f} | "
              f"{peak_l / 2**20:.0f} / {peak_p / 2**20:.0f} |", flush=True)


if __name__ == "__main__":
    main()
