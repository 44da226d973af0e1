#!/usr/bin/env python3
"""Slots sharing one memory budget: `pi2 serve --parallel N --mem-budget B` answering N
concurrent greedy streams, against one stream on `pi2 serve --parallel 1 --mem-budget B`.

    sudo python3 bench/parallel_slots.py --model qwen2.5-coder-0.5b [--budget 50%] \
        [--streams 4] [--tokens 64] [--rounds 2] [--threads 2] [--name NAME]

Each server runs inside a cgroup v1 memory cap of the budget, page cache dropped, in interleaved
rounds; clients run outside the cap. Throughput is the clients' tokens over the wall time from
the first request to the last answer (prompts included, as a user sees them). Every stream's
text is compared with `pi2 run`'s under the same cap. The server's peak resident memory
(VmHWM) is reported against the budget. Writes docs/measurements/parallel-slots-NAME.json.
"""
import argparse, json, os, socket, sys, threading, time, urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "SELECT name, email FROM users WHERE",
    "A haiku about the sea:",
    "import numpy as np\n",
    "The best way to learn a language is",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(port, prompt, tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


def metric_values(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        lines = r.read().decode().splitlines()
    return {k: float(v) for k, v in (l.split() for l in lines if l and not l.startswith("#"))}


def wait_listening(proc):
    """The server's first stderr line names its address once its engines are ready."""
    line = proc.stderr.readline()
    if "http://" not in line:
        raise RuntimeError(f"pi2 serve did not start: {line.strip()} {proc.stderr.read()[-300:]}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name")
    ap.add_argument("--cache-dir")
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    file_bytes = Path(model).stat().st_size
    cap = pi2bench.size(a.budget, file_bytes)
    env = dict(os.environ, **({"PI2_CACHE_DIR": a.cache_dir} if a.cache_dir else {}))
    prompts = PROMPTS[: a.streams]
    common = ["-m", model, "-t", str(a.threads), "--mem-budget", str(cap)]

    # `pi2 run`'s texts under the same cap (this also makes the conversion, once).
    want = {}
    for p in prompts:
        out, _, err = pi2bench.capped([pi2bench.pi2(), "run", *common, "-p", p, "-n", str(a.tokens),
                                       "--temp", "0", "--ignore-eos", "--json"], cap, env=env)
        if out is None:
            sys.exit(f"pi2 run: {err}")
        want[p] = json.loads(out)["text"]

    texts = {}

    def serve(parallel, streams):
        def step():
            port = free_port()
            cmd = [pi2bench.pi2(), "serve", *common, "--parallel", str(parallel), "--port", str(port)]
            with pi2bench.capped_process(cmd, cap, env=env) as proc:
                wait_listening(proc)
                results = [None] * len(streams)

                def client(i):
                    results[i] = complete(port, streams[i], a.tokens)
                started = time.monotonic()
                threads = [threading.Thread(target=client, args=(i,)) for i in range(len(streams))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.monotonic() - started
                peak = pi2bench.peak_rss(proc.pid)
                metrics = metric_values(port)
            if any(r is None for r in results):
                return None
            for p, r in zip(streams, results):
                texts[(parallel, p)] = r["choices"][0]["text"]
            tokens = sum(r["usage"]["completion_tokens"] for r in results)
            batches = metrics.get("pi2_decode_batches_total")
            return {"tps": tokens / wall, "wall_s": wall, "tokens": tokens, "peak_rss": peak,
                    "stream_tps": [r["timings"]["predicted_per_second"] for r in results],
                    "mean_batch": metrics["pi2_decode_batch_tokens_total"] / batches if batches else 1.0,
                    "read_bytes_per_token": metrics.get("pi2_flash_read_bytes_total", 0) / tokens}
        return step

    steps = {"one": serve(1, prompts[:1]), f"{a.streams} streams": serve(a.streams, prompts)}
    raw = pi2bench.interleaved(a.rounds, steps)
    med = {k: pi2bench.spread([r["tps"] for r in v if r]) for k, v in raw.items()}
    peak = max(r["peak_rss"] for v in raw.values() for r in v if r)
    same = all(texts.get((n, p)) == want[p] for (n, p) in texts)
    ratio = med[f"{a.streams} streams"]["median"] / med["one"]["median"]
    print(f"| | tokens/s (median of {a.rounds}) | mean decode batch | bytes read per token (prompts included) |\n| --- | ---: | ---: | ---: |")
    for k in steps:
        last = [r for r in raw[k] if r][-1]
        print(f"| {k} | {med[k]['median']:.2f} ({med[k]['min']:.2f}-{med[k]['max']:.2f}) | "
              f"{last['mean_batch']:.2f} | {last['read_bytes_per_token'] / 1e6:.1f} MB |")
    print(f"{a.streams} streams / one: {ratio:.2f}x; texts equal to pi2 run: {same}; "
          f"server peak RSS {peak / 2**20:.1f} MiB of a {cap / 2**20:.1f} MiB budget")
    name = a.name or Path(model).stem.lower().split("-instruct")[0]
    pi2bench.write(f"parallel-slots-{name}", {
        "what": "pi2 serve under a memory budget inside a cgroup v1 cap of it (page cache dropped): one "
                "stream on --parallel 1 against N concurrent greedy streams on --parallel N sharing one "
                "engine; throughput = completion tokens / wall time of all requests (prompts included)",
        "command": " ".join(sys.argv), "model": Path(model).name, "budget": a.budget, "budget_bytes": cap,
        "streams": a.streams, "tokens": a.tokens, "threads": a.threads, "rounds": a.rounds,
        "ratio": ratio, "texts_equal_run": same, "peak_rss": peak, "median_tps": med, "runs": raw,
    }, plot=False)


if __name__ == "__main__":
    main()
