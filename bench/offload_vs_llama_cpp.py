#!/usr/bin/env python3
"""Decode speed under a memory cap: pi2 (flash offload) vs llama.cpp (mmap), the paper's baseline.

    sudo python3 bench/offload_vs_llama_cpp.py --model MODEL.gguf --converted CONVERTED.gguf \
        [--budgets 100%,75%,60%,50%,35%,25%] [--tokens 8] [--prompt 0] [--threads 2] \
        [--svg speed.svg] [--ppl "dense 14.88, pi2 14.59"]

For each budget (a fraction of the original file, or a size like 2G), both engines run inside a
cgroup v1 memory cap of that size, after `echo 3 > /proc/sys/vm/drop_caches`:
- llama.cpp (`llama-cpp-python` in target/llama-cpp-venv, see compare_llama_cpp.py) loads the
  original file with mmap and decodes --tokens tokens one at a time after a 1-token prompt;
- pi2 runs `pi2 bench -p 0 -n TOKENS -r 1 --offload-only --mem-budget B` on the converted file
  (FFN neurons read from flash, the rest resident; one warm-up pass, then the measured one), where
  B = cap - --headroom (default 0: pi2's budget counts its own code and heap, so the budget is
  the cap).
With --prompt N both engines instead process an N-token prompt in one batch (prefill).
Needs root (cgroups, drop_caches). Prints a markdown table; --svg also draws decode speed
against the cap for both engines (--ppl adds a caption line, e.g. the perplexity of the pi2 model).
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
            # Killed by the cap (-9) or refused: a row that says so, not the end of the sweep.
            last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
            return None, peak, f"exit {out.returncode}: {last[:200]}"
        return out.stdout, peak, None
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
    ap.add_argument("--budgets", default="100%,75%,60%,50%,35%,25%")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=0, help="measure prefill of this many tokens instead")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--headroom", default="0", help="cap minus pi2's --mem-budget")
    ap.add_argument("--svg", help="write the speed-against-memory picture here")
    ap.add_argument("--ppl", default="", help="caption line for the picture (perplexities)")
    ap.add_argument("--pi2-args", default="", help="extra pi2 bench arguments (e.g. --no-predictor)")
    a = ap.parse_args()
    file_bytes = os.path.getsize(a.model)
    headroom = size(a.headroom, file_bytes)
    test = f"pp{a.prompt}" if a.prompt else f"tg{a.tokens}"
    print(f"| cap | test | llama.cpp mmap t/s | pi2 offload t/s | pi2 / llama.cpp | pi2 hit rate | "
          f"pi2 MB read/token | pi2 I/O wait share | peak cgroup MiB (llama.cpp / pi2) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    points = []
    for b in a.budgets.split(","):
        cap = size(b, file_bytes)
        out, peak_l, err_l = capped([str(VENV_PY), "-c", LLAMA_RUNNER, a.model, str(a.threads), str(a.tokens),
                                     str(a.prompt)], cap)
        ll_tps = float("nan")
        if out is not None:
            ll = json.loads(out.strip().splitlines()[-1])
            ll_tps = len(ll["token_s"]) / sum(ll["token_s"])
        p, n = (a.prompt, 0) if a.prompt else (0, a.tokens)
        out, peak_p, err_p = capped([str(PI2), "bench", "-m", a.converted, "-p", str(p), "-n", str(n), "-r", "1",
                                     "-t", str(a.threads), "-c", "256", "--offload-only", *a.pi2_args.split(),
                                     "--mem-budget", str(cap - headroom), "-o", "json"], cap)
        pi_tps, off = float("nan"), {}
        if out is not None:
            rows = json.loads(out)
            rows = rows if isinstance(rows, list) else rows.get("results", [rows])
            row = rows[-1]
            pi_tps = row["avg_ts"]
            off = (row.get("sparse") or {}).get("offload") or {}
        # Neuron rows, streamed attention layers and output rows decode asked the reader for
        # (prefill streams whole units instead).
        per_tok = (off.get("decode_bytes_requested_per_token", 0)
                   + off.get("attention_bytes_per_token", 0)
                   + off.get("output_bytes_per_token", 0)) / 1e6 if n and off else float("nan")
        note = "; ".join(f"{who} {e}" for who, e in (("llama.cpp", err_l), ("pi2", err_p)) if e)
        print(f"| {b} ({cap / 2**30:.2f} GiB) | {test} | {ll_tps:.3f} | {pi_tps:.3f} | {pi_tps / ll_tps:.1f}x | "
              f"{off.get('hit_rate', float('nan')):.3f} | {per_tok:.1f} | {off.get('io_wait_share', float('nan')):.2f} | "
              f"{peak_l / 2**20:.0f} / {peak_p / 2**20:.0f} |{' ' + note if note else ''}", flush=True)
        points.append((cap / file_bytes, ll_tps, pi_tps))
    if a.svg:
        Path(a.svg).write_text(svg(points, Path(a.model).name, test, a.ppl))
        print(f"wrote {a.svg}")


def svg(points, name, test, caption):
    """Decode (or prefill) speed against the memory cap, both engines, as a line chart."""
    w, h, l, r, t, b = 640, 400, 60, 20, 40, 60
    xs = [p[0] for p in points]
    finite = [v for p in points for v in p[1:] if v == v]
    ymax = max(finite + [1.0]) * 1.1
    x0, x1 = min(xs + [0.2]), max(xs + [1.0])
    px = lambda x: l + (x - x0) / (x1 - x0) * (w - l - r)
    py = lambda y: h - b - y / ymax * (h - t - b)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="{l}" y="20">{name}: {test} t/s inside a cgroup memory cap</text>',
           f'<line x1="{l}" y1="{h - b}" x2="{w - r}" y2="{h - b}" stroke="black"/>',
           f'<line x1="{l}" y1="{t}" x2="{l}" y2="{h - b}" stroke="black"/>']
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{h - b + 16}" text-anchor="middle">{x * 100:.0f}%</text>')
    for k in range(5):
        y = ymax * k / 4
        out.append(f'<text x="{l - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    out.append(f'<text x="{(l + w - r) / 2}" y="{h - b + 34}" text-anchor="middle">cap, share of the model file</text>')
    for idx, (label, colour) in ((1, ("llama.cpp mmap", "#d62728")), (2, ("pi2 offload", "#1f77b4"))):
        pts = sorted((p[0], p[idx]) for p in points if p[idx] == p[idx])
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly = t + 14 * idx
        out.append(f'<text x="{w - r - 150}" y="{ly}" fill="{colour}">{label}</text>')
    if caption:
        out.append(f'<text x="{l}" y="{h - 8}">{caption}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
