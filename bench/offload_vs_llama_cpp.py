#!/usr/bin/env python3
"""Decode speed under a memory cap: pi2's one command against llama.cpp with mmap, the paper's
baseline, with the quality of what pi2 computed beside every speed.

    sudo python3 bench/offload_vs_llama_cpp.py --model qwen2.5-coder-0.5b \
        [--budgets 100%,75%,60%,50%,40%,30%] [--tokens 32] [--rounds 2] [--threads 2] \
        [--quality-text testdata/corpus/rust_book.txt] [--chunks 16] [--name NAME]

For each cap (a share of the model file, or a size like 300M), in interleaved rounds, both
engines run inside a cgroup v1 memory cap of that size after the page cache is dropped:
- llama.cpp (llama-cpp-python built for this CPU, bench/llama_runner.py `decode`) maps the file
  and decodes --tokens tokens one at a time;
- pi2 runs the one command `pi2 run -m MODEL --mem-budget CAP -n TOKENS --json` on the plain
  GGUF, which runs the cached conversion (made once before the sweep, outside the caps).
Both are also run without a cap, the file in the page cache (the in-memory lines). Quality:
perplexity on held-out text (a genre the calibration does not contain) of what decode computes
(the conversion's sparse FFN and clustered head, scored in memory with `--sparse`) against the
dense model: what offloaded decode computes at every budget where no layer is wholly pinned; a
wholly pinned layer runs the dense FFN instead, closer to the dense model, so the figure bounds
the loss at every capped point. `--dense-line` adds pi2's plain dense decode (the plain GGUF
mapped, no budget) inside each cap: what the one command must not be slower than where the
model fits.

Writes docs/measurements/offload-NAME.json and .svg (bench/plot.py) and prints a table. Needs
root (cgroups, drop_caches).
"""
import argparse, json, os, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

PROMPT = "Write a Python function that parses a CSV file and returns the rows as dictionaries."


def pi2_run(model, budget, tokens, threads, cap, env, extra=()):
    args = [pi2bench.pi2(), "run", "-m", model, "-p", PROMPT, "-n", str(tokens), "--temp", "0",
            "--ignore-eos", "-t", str(threads), "-c", "512", "--json", *extra]
    if budget:
        args += ["--mem-budget", str(budget)]
    if cap:
        out, peak, err = pi2bench.capped(args, cap, env=env)
    else:
        p = subprocess.run(args, capture_output=True, text=True, env=env)
        out, peak, err = (p.stdout, None, None) if p.returncode == 0 else (None, None, p.stderr[-300:])
    if out is None:
        return None, peak, err
    j = json.loads(out)
    o = j.get("offload") or {}
    reader = o.get("engine") and f"{o['engine']} x{o.get('io_depth')}"
    return {"tps": j["timings"]["predicted_per_second"], "bytes_per_token": j.get("bytes_read_per_token"),
            "peak_rss": j.get("peak_rss_bytes"), "reader": reader, "text": j.get("text")}, peak, None


def llama_run(model, tokens, threads, cap):
    out, peak, err = pi2bench.llama(["decode", model, threads, tokens, 0], cap)
    if out is None:
        return None, peak, err
    return {"tps": len(out["token_s"]) / sum(out["token_s"])}, peak, None


def converted_path(model, env):
    """The one command's cached conversion of `model` (made before this is called)."""
    cache = Path(env.get("PI2_CACHE_DIR") or Path.home() / ".cache" / "pi2") / "converted"
    found = sorted(cache.glob(f"{Path(model).stem}-*.gguf"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"no conversion of {model} in {cache}")
    return str(found[-1])


def quality(model, converted, text, chunks, env):
    """Perplexity of what decode computes under any budget (the conversion's sparse FFN and
    clustered head: offloaded decode gives in-memory sparse decode's logits bit for bit, so it
    is scored in memory, `--sparse`), against the dense source model, with the head's agreement."""
    run = lambda m, extra: json.loads(subprocess.run(
        [pi2bench.pi2(), "perplexity", "-m", m, "-f", text, "-c", "512", "--chunks", str(chunks), "--json", *extra],
        capture_output=True, text=True, check=True, env=env).stdout)
    dense, approx = run(model, []), run(converted, ["--sparse"])
    return {"text": str(Path(text).name), "chunks": chunks, "dense_ppl": dense["ppl"], "ppl": approx["ppl"],
            "ppl_increase": approx["ppl"] / dense["ppl"] - 1,
            "head_top1_agreement": approx.get("head_top1_agreement"), "head_mass": approx.get("head_mass"),
            "ffn_sparsity": (approx.get("sparse") or {}).get("ffn_sparsity")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a plain GGUF or a catalogue name")
    ap.add_argument("--budgets", default="100%,75%,60%,50%,40%,30%")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quality-text", default=str(pi2bench.ROOT / "testdata/corpus/rust_book.txt"))
    ap.add_argument("--chunks", type=int, default=16, help="chunks of 512 tokens scored for quality")
    ap.add_argument("--name", help="measurement name (default: the model file's stem)")
    ap.add_argument("--cache-dir", help="PI2_CACHE_DIR for the conversion (default: pi2's own)")
    ap.add_argument("--dense-line", action="store_true",
                    help="also run pi2's plain dense decode (no budget) inside every cap")
    ap.add_argument("--pi2-line", action="append", default=[], metavar="NAME=ARGS",
                    help="also run the one command with these extra arguments inside every cap, as "
                         "engine NAME (e.g. 'pread-4=--io-engine pread --io-depth 4'); repeatable")
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    file_bytes = os.path.getsize(model)
    env = dict(os.environ, **({"PI2_CACHE_DIR": a.cache_dir} if a.cache_dir else {}))
    caps = [(b, pi2bench.size(b, file_bytes)) for b in a.budgets.split(",")]
    # The conversion, once, outside the caps (its time is reported by `pi2 run` itself).
    made = subprocess.run([pi2bench.pi2(), "run", "-m", model, "-p", "x", "-n", "1", "--mem-budget", "50%"],
                          capture_output=True, text=True, env=env)
    if made.returncode != 0:
        sys.exit(f"pi2 could not convert {model}: {made.stderr.strip().splitlines()[-1]}")
    q = quality(model, converted_path(model, env), a.quality_text, a.chunks, env)
    print(f"quality ({q['text']}, {a.chunks} chunks): ppl {q['ppl']:.4f} vs dense {q['dense_ppl']:.4f} "
          f"({q['ppl_increase']:+.2%}), head top-1 {q['head_top1_agreement']}, mass {q['head_mass']}",
          file=sys.stderr)
    steps = {
        ("llama.cpp", "memory"): lambda: llama_run(model, a.tokens, a.threads, None),
        ("pi2", "memory"): lambda: pi2_run(model, None, a.tokens, a.threads, None, env),
    }
    for b, cap in caps:
        steps[("llama.cpp", b)] = lambda cap=cap: llama_run(model, a.tokens, a.threads, cap)
        steps[("pi2", b)] = lambda cap=cap: pi2_run(model, cap, a.tokens, a.threads, cap, env)
        if a.dense_line:
            steps[("pi2 dense", b)] = lambda cap=cap: pi2_run(model, None, a.tokens, a.threads, cap, env)
        for line in a.pi2_line:
            label, _, extra = line.partition("=")
            steps[(f"pi2 {label}", b)] = lambda cap=cap, extra=extra.split(): pi2_run(
                model, cap, a.tokens, a.threads, cap, env, extra)
    raw = pi2bench.interleaved(a.rounds, steps)
    points = []
    for (engine, where), runs in raw.items():
        ok = [r[0] for r in runs if r[0]]
        points.append({
            "engine": engine, "cap": where,
            "cap_share": None if where == "memory" else pi2bench.size(where, file_bytes) / file_bytes,
            "tps": pi2bench.spread([r["tps"] for r in ok]),
            "peak_cgroup_bytes": max((r[1] for r in runs if r[1]), default=None),
            "errors": [r[2] for r in runs if r[2]],
            "bytes_read_per_token": ok[-1].get("bytes_per_token") if ok else None,
            "reader": ok[-1].get("reader") if ok else None,
            "same_text_as_pi2": (None if engine == "llama.cpp" or not ok else
                                 all(r.get("text") == (raw[("pi2", where)][0][0] or {}).get("text") for r in ok)),
        })
    table(points)
    name = a.name or Path(model).stem
    pi2bench.write(f"offload-{name}", {
        "what": "decode t/s under cgroup v1 memory caps, page cache dropped: pi2's one command vs llama.cpp mmap",
        "command": " ".join(sys.argv), "model": Path(model).name, "file_bytes": file_bytes,
        "tokens": a.tokens, "threads": a.threads, "rounds": a.rounds, "quality": q, "points": points,
        "plot": {"kind": "caps", "title": f"{Path(model).name}: decode inside a memory cap",
                 "caption": f"pi2 perplexity {q['ppl_increase']:+.1%} vs dense on {q['text']}, "
                            f"head top-1 {100 * (q['head_top1_agreement'] or 0):.2f}%"},
    })


def table(points):
    by = {(p["engine"], p["cap"]): p for p in points}
    print("| cap | llama.cpp t/s | pi2 t/s | pi2 / llama.cpp | pi2 MB read/token | "
          "peak cgroup MiB llama.cpp / pi2 | pi2 plain dense t/s |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for cap in dict.fromkeys(p["cap"] for p in points):
        l, p = by.get(("llama.cpp", cap)), by.get(("pi2", cap))
        lt = l["tps"]["median"] if l and l["tps"] else float("nan")
        pt = p["tps"]["median"] if p and p["tps"] else float("nan")
        b = p.get("bytes_read_per_token") or {}
        mb = b.get("total", float("nan")) / 1e6
        peak = lambda x: f"{x['peak_cgroup_bytes'] / 2**20:.0f}" if x and x["peak_cgroup_bytes"] else "-"
        d = by.get(("pi2 dense", cap))
        dt = f"{d['tps']['median']:.2f}" if d and d["tps"] else "-"
        errs = "; ".join(e for x in (l, p, d) if x for e in x["errors"])
        print(f"| {cap} | {lt:.2f} | {pt:.2f} | {pt / lt:.2f}x | {mb:.1f} | {peak(l)} / {peak(p)} | {dt} |"
              f"{' ' + errs if errs else ''}")
        for (engine, c), x in by.items():
            if c == cap and engine.startswith("pi2 ") and engine != "pi2 dense" and x["tps"]:
                print(f"|   {engine} | | {x['tps']['median']:.2f} | {x['tps']['median'] / lt:.2f}x | "
                      f"{(x.get('bytes_read_per_token') or {}).get('total', float('nan')) / 1e6:.1f} | "
                      f"- / {peak(x)} | reader {x.get('reader')}, same text {x.get('same_text_as_pi2')} |")


if __name__ == "__main__":
    main()
