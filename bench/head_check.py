#!/usr/bin/env python3
"""The sparse output head against the dense head on every golden prompt: greedy tokens must be
identical. Prints, per prompt, whether they match and the head's rows per token and fallbacks.

    bench/head_check.py PI2 MODEL GOLDEN_JSON [-n 64] [-t 2]

MODEL is a file made by `pi2 convert --head`; GOLDEN_JSON a testdata/golden/*/greedy.json.
"""

import argparse
import json
import subprocess
import sys


def run(pi2, model, case, n, threads, extra):
    args = [pi2, "run", "-m", model, "-p", case["text"], "-n", str(n), "--temp", "0",
            "--ignore-eos", "-t", str(threads), "--json", *extra]
    if case.get("chat_template_applied"):
        args.append("--chat")
    out = subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    return json.loads(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pi2")
    p.add_argument("model")
    p.add_argument("golden")
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-t", type=int, default=2)
    a = p.parse_args()
    cases = json.load(open(a.golden))["cases"]
    same = rows = steps = fallbacks = 0
    for c in cases:
        dense = run(a.pi2, a.model, c, a.n, a.t, ["--dense-head"])
        sparse = run(a.pi2, a.model, c, a.n, a.t, [])
        ok = dense["generated_ids"] == sparse["generated_ids"]
        same += ok
        h = sparse.get("head") or {}
        rows += h.get("rows_per_token", 0) * h.get("steps", 0)
        steps += h.get("steps", 0)
        fallbacks += h.get("fallbacks", 0)
        print(f"{c['name']:<28} {'identical' if ok else 'DIFFERENT'}  rows/token "
              f"{h.get('rows_per_token', 0):.0f} ({100 * h.get('rows_fraction', 0):.2f}%)  "
              f"fallbacks {h.get('fallbacks', 0)}/{h.get('steps', 0)}")
    print(f"{same}/{len(cases)} prompts identical; rows per token {rows / max(steps, 1):.0f}; "
          f"fallbacks {fallbacks}/{steps}")
    sys.exit(0 if same == len(cases) else 1)


if __name__ == "__main__":
    main()
