#!/usr/bin/env python3
"""The cost of constrained decoding: `pi2 run` decode time per token with and without a JSON
schema (same model, prompt, threads, greedy), in interleaved rounds.

    python3 bench/constrained_decoding.py [--model qwen2.5-coder-0.5b] [--tokens 128] [--rounds 5]

The schema (shop items with names, prices and tags) never completes within the tokens asked, so
both runs generate the same number. Writes docs/measurements/constrained-decoding-NAME.json.
"""
import argparse, json, re, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

SCHEMA = {"type": "object",
          "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
              "name": {"type": "string"}, "price": {"type": "number"},
              "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "price", "tags"]}}},
          "required": ["items"]}
PROMPT = "<|im_start|>user\nList twenty shop items with prices and tags as JSON.<|im_end|>\n<|im_start|>assistant\n"


def ms_per_token(model, threads, n, schema):
    extra = ["--json-schema", json.dumps(SCHEMA)] if schema else []
    out = subprocess.run([pi2bench.pi2(), "run", "-m", model, "-p", PROMPT, "-n", str(n), "-t", str(threads),
                          "--temp", "0", "--json", *extra], check=True, capture_output=True, text=True).stdout
    t = json.loads(out)["timings"]
    assert t["predicted_n"] == n, f"{t['predicted_n']} tokens of {n}: the grammar completed early"
    return t["predicted_ms"] / t["predicted_n"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name")
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    runs = pi2bench.interleaved(a.rounds, {
        "plain": lambda: ms_per_token(model, a.threads, a.tokens, False),
        "json_schema": lambda: ms_per_token(model, a.threads, a.tokens, True),
    })
    summary = {k: pi2bench.spread(v) for k, v in runs.items()}
    overhead = summary["json_schema"]["median"] / summary["plain"]["median"] - 1
    data = {"model": Path(model).name, "threads": a.threads, "tokens": a.tokens, "rounds": a.rounds,
            "schema": SCHEMA, "unit": "ms per generated token", "runs": runs, "summary": summary,
            "overhead": overhead}
    name = a.name or "constrained-decoding-" + re.sub(r"[^a-z0-9.]+", "-", Path(model).stem.lower().split("-instruct")[0])
    pi2bench.write(name, data, plot=False)
    print(json.dumps({"summary": summary, "overhead": overhead}, indent=1))


if __name__ == "__main__":
    main()
