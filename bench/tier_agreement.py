#!/usr/bin/env python3
"""How closely pi2's kernel tiers agree on quantized files (issue 51, part 5).

    python3 bench/tier_agreement.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m] [--chunks 4]

For each model, pi2's perplexity over the first `--chunks` chunks of 512 tokens of
testdata/corpus/kjv_genesis.txt with every kernel tier this CPU runs, and on the best tier
also without the row-interleaved copies (`--no-repack`: the same arithmetic summed in another
order). Writes docs/measurements/tier-agreement.json: each run's perplexity and its relative
difference from the scalar reference.
"""
import argparse, json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import pi2bench  # noqa: E402

CORPUS = ROOT / "testdata" / "corpus" / "kjv_genesis.txt"


def tiers():
    flags = pi2bench.cpu_flags()
    out = ["scalar"]
    if "avx2" in flags:
        out.append("avx2")
    if "avx512f" in flags:
        out.append("avx512")
    if "avx512_vnni" in flags:
        out.append("avx512vnni")
    return out


def ppl(model, chunks, extra):
    cmd = [pi2bench.pi2(), "perplexity", "-m", model, "-f", str(CORPUS), "-c", "512",
           "--chunks", str(chunks), "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["ppl"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m")
    ap.add_argument("--chunks", type=int, default=4)
    a = ap.parse_args()
    results = []
    for spec in a.models.split(","):
        path = pi2bench.model_path(spec)
        runs = [(t, ["--kernel-tier", t]) for t in tiers()]
        runs.append((f"{tiers()[-1]} --no-repack", ["--kernel-tier", tiers()[-1], "--no-repack"]))
        values = {name: ppl(path, a.chunks, extra) for name, extra in runs}
        ref = values["scalar"]
        rows = [{"run": k, "ppl": v, "vs_scalar_pct": 100.0 * (v - ref) / ref} for k, v in values.items()]
        print(f"{spec}: " + ", ".join(f"{r['run']} {r['ppl']:.4f} ({r['vs_scalar_pct']:+.3f}%)" for r in rows))
        results.append({"model": spec, "file": Path(path).name, "runs": rows})
    pi2bench.write("tier-agreement", {
        "what": "pi2 perplexity per kernel tier on quantized files (512-token chunks of kjv_genesis)",
        "chunks": a.chunks, "models": results}, plot=False)


if __name__ == "__main__":
    main()
