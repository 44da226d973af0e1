#!/usr/bin/env python3
"""Two pi2 builds on the same `pi2 bench` arguments, in interleaved rounds (old, new, old, ...),
so that drifting load on a shared machine hits both alike. Prints, per test and FFN mode, the
median tokens/s of each build over the rounds and new/old.

    bench/before_after.py OLD_PI2 NEW_PI2 --rounds 3 -- -m qwen2.5-coder-0.5b -p 128 -n 64 -t 2

Everything after `--` goes to `pi2 bench` (with `-o json` added).
"""

import argparse
import json
import statistics
import subprocess
import sys


def run(binary, args):
    out = subprocess.run(
        [binary, "bench", *args, "-o", "json"],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ).stdout
    return {(r["test"], r.get("ffn", ""), r["threads"]): r["avg_ts"] for r in json.loads(out)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    args = argv[cut + 1 :]
    results = {"old": [], "new": []}
    for r in range(a.rounds):
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            binary = a.old if which == "old" else a.new
            results[which].append(run(binary, args))
            print(f"round {r + 1} {which} done", file=sys.stderr)
    keys = [k for k in results["old"][0] if k in results["new"][0]]
    print(f"| test | ffn | threads | old t/s | new t/s | new/old |")
    print(f"| --- | --- | --- | --- | --- | --- |")
    for k in keys:
        old = statistics.median(x[k] for x in results["old"])
        new = statistics.median(x[k] for x in results["new"])
        spread = lambda w: max(x[k] for x in results[w]) / min(x[k] for x in results[w]) - 1
        print(
            f"| {k[0]} | {k[1]} | {k[2]} | {old:.2f} | {new:.2f} | {new / old:.3f} "
            f"(spread old {spread('old'):.0%}, new {spread('new'):.0%}) |"
        )


if __name__ == "__main__":
    main()
