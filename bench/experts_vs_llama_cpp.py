#!/usr/bin/env python3
"""Mixtures of experts larger than memory: pi2 streaming a plain GGUF's experts (`pi2 run
--mem-budget`, no conversion) against llama.cpp with mmap, inside the same cgroup v1 memory cap.

    sudo python3 bench/experts_vs_llama_cpp.py --model STAND-IN.gguf [--budgets 65%,25%] \
        [--tokens 16] [--rounds 1] [--threads 2] [--name NAME]

Both engines complete the same prompt greedily (llama.cpp: bench/llama_runner.py `complete`,
llama-cpp-python built for this CPU, weights left in the mapping; pi2: `pi2 run --temp 0
--ignore-eos --json`), each in a fresh cgroup cap with the page cache dropped first, in
interleaved rounds; both also run without a cap (the in-memory lines). Per point: generation
t/s, pi2's expert bytes read per token, hit rate, read rate while the device was busy, I/O
wait share, peak cgroup memory, whether pi2's text equals its in-memory text, and the routing
statistics pi2 measured on the tokens it decoded (popularity per layer, reuse between tokens):
what decides how far a cache of experts can go.

Writes docs/measurements/experts-NAME.json and prints a table. Needs root.
"""
import argparse, json, os, subprocess, sys, tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

PROMPT = ("Write a Python function that parses a CSV file and returns the rows as dictionaries, "
          "then explain how it handles quoted fields.")


def pi2_run(model, budget, tokens, threads, cap, prompt_file, extra=()):
    args = [pi2bench.pi2(), "run", "-m", model, "-f", prompt_file, "-n", str(tokens), "--temp", "0",
            "--ignore-eos", "-t", str(threads), "-c", "512", "--json", *extra]
    if budget:
        args += ["--mem-budget", str(budget)]
    if cap:
        out, peak, err = pi2bench.capped(args, cap)
    else:
        p = subprocess.run(args, capture_output=True, text=True)
        out, peak, err = (p.stdout, None, None) if p.returncode == 0 else (None, None, p.stderr[-300:])
    if out is None:
        return None, peak, err
    j = json.loads(out)
    x = j.get("experts") or {}
    busy = x.get("device_busy_secs") or 0
    return {"tps": j["timings"]["predicted_per_second"],
            "prompt_tps": j["timings"]["prompt_per_second"],
            "expert_bytes_per_token": x.get("expert_bytes_per_token"),
            "hit_rate": x.get("hit_rate"), "cache_slots": x.get("cache_slots"),
            "read_rate_busy": (x.get("bytes_read") or 0) / busy if busy else None,
            "io_wait_share": x.get("io_wait_share"),
            "reader": x.get("engine") and f"{x['engine']} x{x.get('io_depth')}",
            "prefetch": x.get("prefetch"),
            "routing": j.get("routing"), "peak_rss": j.get("peak_rss_bytes"),
            "text": j.get("text")}, peak, None


def llama_run(model, tokens, threads, cap, prompt_file, repack=False):
    out, peak, err = pi2bench.llama(["complete", model, threads, tokens, prompt_file, 0, int(repack)], cap)
    if out is None:
        return None, peak, err
    return {"tps": out["n"] / out["gen_s"], "n": out["n"]}, peak, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a plain mixture-of-experts GGUF")
    ap.add_argument("--budgets", default="65%,25%")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", help="measurement name (default: the model file's stem)")
    ap.add_argument("--no-memory", action="store_true", help="skip the uncapped lines")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp's capped lines")
    ap.add_argument("--llama-repack-in-memory", action="store_true",
                    help="llama.cpp's uncapped line with its defaults (weights repacked into its own "
                         "buffers, which do not fit under a cap) instead of the mapping")
    ap.add_argument("--pi2-line", action="append", default=[], metavar="NAME=ARGS",
                    help="also run pi2 with these extra arguments inside every cap, as engine NAME "
                         "(e.g. 'no-prefetch=--no-prefetch'); repeatable")
    a = ap.parse_args()
    model = a.model
    file_bytes = os.path.getsize(model)
    caps = [(b, pi2bench.size(b, file_bytes)) for b in a.budgets.split(",")]
    prompt = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    prompt.write(PROMPT)
    prompt.close()
    steps = {}
    if not a.no_memory:
        steps[("llama.cpp", "memory")] = lambda: llama_run(model, a.tokens, a.threads, None, prompt.name,
                                                           a.llama_repack_in_memory)
        steps[("pi2", "memory")] = lambda: pi2_run(model, None, a.tokens, a.threads, None, prompt.name)
    for b, cap in caps:
        if not a.no_llama:
            steps[("llama.cpp", b)] = lambda cap=cap: llama_run(model, a.tokens, a.threads, cap, prompt.name)
        steps[("pi2", b)] = lambda cap=cap: pi2_run(model, cap, a.tokens, a.threads, cap, prompt.name)
        for line in a.pi2_line:
            label, _, extra = line.partition("=")
            steps[(f"pi2 {label}", b)] = lambda cap=cap, extra=extra.split(): pi2_run(
                model, cap, a.tokens, a.threads, cap, prompt.name, extra)
    raw = pi2bench.interleaved(a.rounds, steps)
    os.unlink(prompt.name)
    mem_text = next((r[0]["text"] for r in raw.get(("pi2", "memory"), []) if r[0]), None)
    points = []
    for (engine, where), runs in raw.items():
        ok = [r[0] for r in runs if r[0]]
        last = ok[-1] if ok else {}
        points.append({
            "engine": engine, "cap": where,
            "cap_share": None if where == "memory" else pi2bench.size(where, file_bytes) / file_bytes,
            "tps": pi2bench.spread([r["tps"] for r in ok]),
            "peak_cgroup_bytes": max((r[1] for r in runs if r[1]), default=None),
            "errors": [r[2] for r in runs if r[2]],
            **{k: last.get(k) for k in ("prompt_tps", "expert_bytes_per_token", "hit_rate", "cache_slots",
                                        "read_rate_busy", "io_wait_share", "reader", "prefetch", "routing",
                                        "peak_rss")
               if engine.startswith("pi2")},
            "same_text_as_in_memory": (None if not engine.startswith("pi2") or mem_text is None or not ok
                                       else all(r["text"] == mem_text for r in ok)),
        })
    table(points)
    name = a.name or Path(model).stem
    pi2bench.write(f"experts-{name}", {
        "what": "greedy generation t/s under cgroup v1 memory caps, page cache dropped: pi2 streaming "
                "the plain GGUF's experts vs llama.cpp mmap",
        "command": " ".join(sys.argv), "model": Path(model).name, "file_bytes": file_bytes,
        "tokens": a.tokens, "threads": a.threads, "rounds": a.rounds, "points": points,
    }, plot=False)


def table(points):
    by = {(p["engine"], p["cap"]): p for p in points}
    print("| cap | llama.cpp t/s | pi2 t/s | pi2 / llama.cpp | pi2 expert MB read/token | hit rate | "
          "read rate GB/s | I/O wait | peak cgroup MiB llama.cpp / pi2 | same text |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for cap in dict.fromkeys(p["cap"] for p in points):
        l, p = by.get(("llama.cpp", cap)), by.get(("pi2", cap))
        lt = l["tps"]["median"] if l and l["tps"] else float("nan")
        pt = p["tps"]["median"] if p and p["tps"] else float("nan")
        p = p or {}
        f = lambda v, s=1.0, fmt="{:.2f}": fmt.format(v / s) if isinstance(v, (int, float)) else "-"
        peak = lambda x: f"{x['peak_cgroup_bytes'] / 2**20:.0f}" if x and x["peak_cgroup_bytes"] else "-"
        errs = "; ".join(e for x in (l, p) if x for e in x["errors"])
        print(f"| {cap} | {lt:.3f} | {pt:.3f} | {pt / lt:.2f}x | {f(p.get('expert_bytes_per_token'), 1e6, '{:.0f}')} | "
              f"{f(p.get('hit_rate'))} | {f(p.get('read_rate_busy'), 1e9)} | {f(p.get('io_wait_share'))} | "
              f"{peak(l)} / {peak(p)} | {p.get('same_text_as_in_memory')} |{' ' + errs if errs else ''}")
        for (engine, c), x in by.items():
            if c == cap and engine.startswith("pi2 ") and x["tps"]:
                xt = x["tps"]["median"]
                print(f"|   {engine} | | {xt:.3f} | {xt / lt:.2f}x | {f(x.get('expert_bytes_per_token'), 1e6, '{:.0f}')} | "
                      f"{f(x.get('hit_rate'))} | {f(x.get('read_rate_busy'), 1e9)} | {f(x.get('io_wait_share'))} | "
                      f"- / {peak(x)} | {x.get('same_text_as_in_memory')} |")


if __name__ == "__main__":
    main()
