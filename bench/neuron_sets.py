#!/usr/bin/env python3
"""Neuron sets per sequence (GRIFFIN) against the per-token threshold and the hot-first order,
measured on held-out text. The mode was removed after these measurements (docs/sparsity.md): run
this script with the `pi2` binary of commit 32b6e32 (`--pi2 PATH`), which has `--neuron-sets`.

    python3 bench/neuron_sets.py --converted CONVERTED.gguf --name NAME \
        [--text testdata/corpus/rust_book.txt] [--chunks 8] [--shares 0.5,0.7,0.8,0.9,0.95]

For each share s, `pi2 perplexity --neuron-sets s` scores each chunk's second half with the FFN
restricted to the s of each layer's neurons the first half (the prompt) used most, the per-token
threshold still applying inside the set; `PI2_SETS_STATIC=1` restricts to the s hottest neurons
of the calibration instead (the file's first s neurons); `PI2_SETS_RECALL=1` restricts nothing
and counts which share of the neurons that fire falls in either set (the hit rate each would give
as the resident set of a cache). `--token-sparsities` adds the per-token threshold at those mean
sparsities (`--sparse --sparsity S`: the converted file's profile thresholds), to compare the
two at equal compute. Writes docs/measurements/neuron-sets-NAME.json.
"""
import argparse, json, os, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def perplexity(pi2, model, text, chunks, extra, env_extra):
    env = dict(os.environ, **env_extra)
    cmd = [pi2, "perplexity", "-m", model, "-f", text, "-c", "512", "--chunks", str(chunks), "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    recall = re.findall(r"recall seq ([0-9.]+) static ([0-9.]+)", p.stderr)
    return out, recall[-1] if recall else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--converted", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--text", default=str(ROOT / "testdata/corpus/rust_book.txt"))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--shares", default="0.5,0.7,0.8,0.9,0.95")
    ap.add_argument("--token-sparsities", default="")
    ap.add_argument("--pi2", default=str(ROOT / "target/release/pi2"))
    a = ap.parse_args()
    rows = []
    dense, _ = perplexity(a.pi2, a.converted, a.text, a.chunks, ["--dense", "--dense-head"], {})
    token, _ = perplexity(a.pi2, a.converted, a.text, a.chunks, ["--sparse"], {})
    rows.append({"mode": "per-token threshold (what decode computes)", "share": None,
                 "ppl": token["ppl"], "ffn_sparsity": token["sparse"]["ffn_sparsity"]})
    for t in [float(x) for x in a.token_sparsities.split(",") if x]:
        out, _ = perplexity(a.pi2, a.converted, a.text, a.chunks, ["--sparse", "--sparsity", str(t)], {})
        rows.append({"mode": "per-token threshold", "share": None, "sparsity": t, "ppl": out["ppl"],
                     "ffn_sparsity": out["sparse"]["ffn_sparsity"]})
        print(json.dumps(rows[-1]), flush=True)
    for s in [float(x) for x in a.shares.split(",") if x]:
        for mode, env in (("per-sequence set", {}), ("static hot set", {"PI2_SETS_STATIC": "1"})):
            out, _ = perplexity(a.pi2, a.converted, a.text, a.chunks, ["--neuron-sets", str(s)], env)
            rows.append({"mode": mode, "share": s, "ppl": out["ppl"],
                         "ffn_sparsity": out["sparse"]["ffn_sparsity"]})
        _, recall = perplexity(a.pi2, a.converted, a.text, a.chunks, ["--neuron-sets", str(s)],
                               {"PI2_SETS_RECALL": "1"})
        rows.append({"mode": "recall as a resident set", "share": s,
                     "per_sequence": float(recall[0]), "static_hot": float(recall[1])})
        print(json.dumps(rows[-3:]), flush=True)
    for r in rows:
        if "ppl" in r:
            r["ppl_increase_pct"] = 100 * (r["ppl"] / dense["ppl"] - 1)
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    report = {"model": Path(a.converted).name, "text": Path(a.text).name, "chunks": a.chunks,
              "n_ctx": 512, "dense_ppl": dense["ppl"], "cpu": cpu, "rows": rows}
    path = ROOT / f"docs/measurements/neuron-sets-{a.name}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
