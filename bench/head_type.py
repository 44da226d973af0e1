#!/usr/bin/env python3
"""Converted files that differ only in how the clustered head's output rows are stored
(`pi2 convert --head-type`), compared on what a memory budget reads and what quality costs.

    sudo python3 bench/head_type.py --model PLAIN.gguf --converted A.gguf,B.gguf,... \
        [--budget 50%] [--tokens 32] [--rounds 2] [--threads 2] [--chunks 8] --name NAME

For each converted file: perplexity on held-out text as decode computes it (`pi2 perplexity
--sparse`, the Rust Book by default) with the head's top-1 agreement and mass, and decode speed
inside a cgroup v1 cap of the budget (a share of the plain GGUF's size), page cache dropped,
interleaved rounds: `pi2 run -m CONVERTED --mem-budget BYTES --json`, bytes read per token split
by part. Writes docs/measurements/head-type-NAME.json.
"""
import argparse, json, os, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

PROMPT = "Write a Python function that parses a CSV file and returns the rows as dictionaries."


def quality(conv, text, chunks):
    p = subprocess.run([pi2bench.pi2(), "perplexity", "-m", conv, "-f", text, "-c", "512",
                        "--chunks", str(chunks), "--sparse", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"perplexity on {conv} failed: {p.stderr[-500:]}")
    j = json.loads(p.stdout)
    return {"ppl": j["ppl"], "head_top1_agreement": j["head_top1_agreement"], "head_mass": j["head_mass"]}


def decode(conv, cap, tokens, threads):
    args = [pi2bench.pi2(), "run", "-m", conv, "-p", PROMPT, "-n", str(tokens), "--temp", "0",
            "--ignore-eos", "-t", str(threads), "-c", "512", "--json", "--mem-budget", str(cap)]
    out, peak, err = pi2bench.capped(args, cap)
    if out is None:
        return {"error": err}
    j = json.loads(out)
    return {"tps": j["timings"]["predicted_per_second"], "bytes": j.get("bytes_read_per_token"),
            "text": j["text"], "peak": peak}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the plain GGUF the budget is a share of")
    ap.add_argument("--converted", required=True, help="comma-separated converted files")
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--text", default=str(pi2bench.ROOT / "testdata/corpus/rust_book.txt"))
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    cap = pi2bench.size(a.budget, os.path.getsize(model))
    files = a.converted.split(",")
    dense = subprocess.run([pi2bench.pi2(), "perplexity", "-m", model, "-f", a.text, "-c", "512",
                            "--chunks", str(a.chunks), "--json"], capture_output=True, text=True)
    dense_ppl = json.loads(dense.stdout)["ppl"]
    q = {f: quality(f, a.text, a.chunks) for f in files}
    raw = pi2bench.interleaved(a.rounds, {f: (lambda f=f: decode(f, cap, a.tokens, a.threads)) for f in files})
    rows = []
    for f in files:
        ok = [r for r in raw[f] if "tps" in r]
        rows.append({
            "converted": Path(f).name, **q[f],
            "ppl_increase_pct": 100 * (q[f]["ppl"] / dense_ppl - 1),
            "tps": pi2bench.spread([r["tps"] for r in ok]),
            "bytes_read_per_token": ok[-1]["bytes"] if ok else None,
            "peak_cgroup_bytes": max((r["peak"] for r in ok), default=None),
            "texts_equal_first": bool(ok) and all(r["text"] == ok[0]["text"] for r in ok),
            "errors": [r["error"] for r in raw[f] if "error" in r],
        })
        r = rows[-1]
        b = (r["bytes_read_per_token"] or {})
        print(f"{r['converted']}: ppl {r['ppl']:.4f} ({r['ppl_increase_pct']:+.2f}%), head top-1 "
              f"{r['head_top1_agreement']}, {r['tps'] and r['tps']['median']:.2f} t/s, "
              f"{b.get('total', 0) / 1e6:.1f} MB/token (head {b.get('head', 0) / 1e6:.1f})")
    pi2bench.write(f"head-type-{a.name}", {
        "what": "clustered head rows stored in other types: quality on held-out text and decode inside a cgroup cap",
        "command": " ".join(sys.argv), "model": Path(model).name, "budget": a.budget, "cap_bytes": cap,
        "dense_ppl": dense_ppl, "text": Path(a.text).name, "chunks": a.chunks, "tokens": a.tokens,
        "rounds": a.rounds, "rows": rows,
    }, plot=False)


if __name__ == "__main__":
    main()
