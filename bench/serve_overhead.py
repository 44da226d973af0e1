#!/usr/bin/env python3
"""Serving overhead: single-stream decode through `pi2 serve` against `pi2 run`, interleaved.

Each round runs `pi2 run --json` (its own decode speed: tokens after the first over their time)
and then one streamed completion through a running `pi2 serve` with the same model, threads and
prompt, timed by this client from the first streamed token to the last (so HTTP, SSE framing and
the slot hand-off are all included). Rounds are interleaved and summarised by the shared
harness (bench/pi2bench.py); writes docs/measurements/serve-overhead-NAME.json.

    python3 bench/serve_overhead.py -m models/X.gguf -t 2 -n 128 --rounds 5
Extra pi2 options for both (e.g. a budget) go after `--`.
"""

import argparse
import http.client
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402


def run_speed(a, extra):
    cmd = [a.pi2, "run", "-m", a.model, "-p", a.prompt, "-n", str(a.n), "-t", str(a.threads),
           "--temp", "0", "--ignore-eos", "--json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["timings"]["predicted_per_second"]


def serve_speed(host, port, a):
    body = json.dumps({"prompt": a.prompt, "max_tokens": a.n, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    first = last = None
    tokens = 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"][0]["finish_reason"] is None:
            now = time.perf_counter()
            first = first or now
            last = now
        else:
            tokens = chunk["usage"]["completion_tokens"]
            engine = chunk["timings"]["predicted_per_second"]
    c.close()
    # Chunks carry whole characters: a chunk may hold several tokens, or wait for the next.
    return (tokens - 1) / (last - first), engine


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pi2", default=None, help="the pi2 binary (default: this checkout's release build)")
    p.add_argument("--name")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--port", type=int, default=18181)
    p.add_argument("--serve-args", default="", help="options for `pi2 serve` only, e.g. '-b 64'")
    p.add_argument("extra", nargs="*", help="pi2 options for both, after --")
    a = p.parse_args()
    a.pi2 = a.pi2 or pi2bench.pi2()
    server = subprocess.Popen([a.pi2, "serve", "-m", a.model, "-t", str(a.threads), "--port", str(a.port)] + a.extra + a.serve_args.split(),
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        if "http://" not in line:
            sys.exit(f"pi2 serve did not start: {line}{server.stderr.read()}")
        serve_speed("127.0.0.1", a.port, a)  # warm-up (weights repacked, pages in)
        last = {}

        def serve_client():
            last["client"], last["inside"] = serve_speed("127.0.0.1", a.port, a)
            return last["client"]

        runs = pi2bench.interleaved(a.rounds, {
            "run": lambda: run_speed(a, a.extra),
            "serve_client": serve_client,
            # The server's own timings of the request just timed at the client.
            "serve_inside": lambda: last["inside"],
        })
        summary = {k: pi2bench.spread(v) for k, v in runs.items()}
        r, s, e = (summary[k]["median"] for k in ("run", "serve_client", "serve_inside"))
        data = {"model": Path(a.model).name, "threads": a.threads, "tokens": a.n, "rounds": a.rounds,
                "extra": a.extra, "unit": "generated tokens per second", "runs": runs, "summary": summary,
                "serve_over_run": s / r, "inside_over_run": e / r}
        name = a.name or "serve-overhead-" + re.sub(r"[^a-z0-9.]+", "-", Path(a.model).stem.lower().split("-instruct")[0])
        pi2bench.write(name, data, plot=False)
        print(f"median: run {r:.2f} t/s, serve {s:.2f} t/s at the client, {e:.2f} inside; "
              f"serve/run {s / r:.3f} (inside {e / r:.3f})")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
