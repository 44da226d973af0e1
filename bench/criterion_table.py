#!/usr/bin/env python3
"""Summarise the criterion results under target/criterion as one line per benchmark.

    python3 bench/criterion_table.py [FILTER_REGEX]

Prints `group/function/parameter  throughput` from each benchmark's latest run (`new/`), in
GiB/s for byte throughput and M/s for element throughput (the mean time per iteration).
"""
import json, re, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent / "target" / "criterion"
pat = re.compile(sys.argv[1]) if len(sys.argv) > 1 else None
rows = []
for bench in root.rglob("new/benchmark.json"):
    b = json.loads(bench.read_text())
    est = json.loads((bench.parent / "estimates.json").read_text())
    name = b["full_id"]
    if pat and not pat.search(name):
        continue
    secs = est["mean"]["point_estimate"] / 1e9
    tp = b.get("throughput") or {}
    if "Bytes" in tp:
        rows.append((name, f"{tp['Bytes'] / secs / 2**30:8.2f} GiB/s"))
    elif "Elements" in tp:
        rows.append((name, f"{tp['Elements'] / secs / 1e6:8.2f} M/s"))
    else:
        rows.append((name, f"{secs * 1e6:10.1f} us"))
for name, v in sorted(rows):
    print(f"{name:55s} {v}")
