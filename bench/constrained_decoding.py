#!/usr/bin/env python3
"""The cost of constrained decoding: `pi2 run` decode time per token with and without a JSON
schema (same model, prompt, threads), interleaved rounds; writes
docs/measurements/constrained-decoding-<model>.json.

    python3 bench/constrained_decoding.py --model models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
"""

import argparse
import json
import pathlib
import platform
import statistics
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = {"type": "object",
          "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
              "name": {"type": "string"}, "price": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "price", "tags"]}}},
          "required": ["items"]}
PROMPT = "<|im_start|>user\nList twenty shop items with prices and tags as JSON.<|im_end|>\n<|im_start|>assistant\n"


def cpu():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(pi2, model, threads, n, schema):
    args = [pi2, "run", "-m", model, "-p", PROMPT, "-n", str(n), "-t", str(threads), "--temp", "0", "--json"]
    if schema:
        args += ["--json-schema", json.dumps(SCHEMA)]
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    t = out["timings"]
    return {"tokens": t["predicted_n"], "ms_per_token": t["predicted_ms"] / max(t["predicted_n"], 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    pi2 = str(ROOT / "target/release/pi2")
    rounds = []
    for _ in range(a.rounds):
        rounds.append({"plain": run(pi2, a.model, a.threads, a.tokens, False),
                       "json_schema": run(pi2, a.model, a.threads, a.tokens, True)})
    plain = statistics.median(r["plain"]["ms_per_token"] for r in rounds)
    held = statistics.median(r["json_schema"]["ms_per_token"] for r in rounds)
    result = {
        "machine": {"cpu": cpu(), "threads": a.threads},
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip(),
        "model": pathlib.Path(a.model).name,
        "command": f"python3 bench/constrained_decoding.py --model {a.model} --threads {a.threads} --tokens {a.tokens} --rounds {a.rounds}",
        "rounds": rounds,
        "median_ms_per_token": {"plain": plain, "json_schema": held},
        "overhead": held / plain - 1,
    }
    stem = pathlib.Path(a.model).stem
    base, _, quant = stem.rpartition(".")
    name = (base if quant[:1] in ("Q", "q") else stem).lower().replace("-instruct", "")
    out = ROOT / "docs/measurements" / f"constrained-decoding-{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_ms_per_token"]), f"overhead {result['overhead']:+.1%}", "->", out)


if __name__ == "__main__":
    main()
