#!/usr/bin/env python3
"""Two pi2 builds on the same `pi2 bench` arguments, in interleaved rounds (old, new, old, ...),
so that drifting load on a shared machine hits both alike. Prints, per test and FFN mode, the
median tokens/s of each build over the rounds and new/old.

    bench/before_after.py OLD_PI2 NEW_PI2 --rounds 3 -- -m qwen2.5-coder-0.5b -p 128 -n 64 -t 2

Everything after `--` goes to `pi2 bench` (with `-o json` added).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402


def run(binary, args):
    out = subprocess.run(
        [binary, "bench", *args, "-o", "json"],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ).stdout
    return {(r["test"], r.get("ffn", ""), r.get("head", ""), r["threads"]): r["avg_ts"]
            for r in json.loads(out)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--name", help="also write docs/measurements/NAME.json")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    args = argv[cut + 1 :]
    results = pi2bench.interleaved(a.rounds, {"old": lambda: run(a.old, args), "new": lambda: run(a.new, args)})
    keys = [k for k in results["old"][0] if k in results["new"][0]]
    print("| test | ffn | head | threads | old t/s | new t/s | new/old |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for k in keys:
        old, new = (pi2bench.spread([x[k] for x in results[w]]) for w in ("old", "new"))
        width = lambda s: s["max"] / s["min"] - 1
        print(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {old['median']:.2f} | {new['median']:.2f} | "
            f"{new['median'] / old['median']:.3f} (spread old {width(old):.0%}, new {width(new):.0%}) |"
        )
        rows.append({"test": k[0], "ffn": k[1], "head": k[2], "threads": k[3], "old": old, "new": new})
    if a.name:
        pi2bench.write(a.name, {"what": "two pi2 builds, interleaved rounds of pi2 bench", "command": " ".join(sys.argv),
                                "rows": rows}, plot=False)


if __name__ == "__main__":
    main()
