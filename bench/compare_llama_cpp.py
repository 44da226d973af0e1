#!/usr/bin/env python3
"""pi2 vs llama.cpp on the same GGUF, interleaved, on this machine.

llama.cpp comes from PyPI (`llama-cpp-python`, built from source with CPU flags read from
/proc/cpuinfo: a native build crashes in ggml's AMX code here). Nothing of llama.cpp is vendored.

    python3 bench/compare_llama_cpp.py [--model PATH|NAME] [--rounds 3] [--reps 3] [--threads 1,2]
        [--n-prompt 128] [--n-gen 128] [--load]

Each round runs `pi2 bench -o json` and the same tests through llama.cpp (one process each),
alternating, so slow phases of a noisy machine hit both. Prints a markdown table of the median
over rounds of each round's mean t/s, the pi2/llama.cpp ratio of those medians, and every
round's value. `--load` keeps a `nice -n 19` busy loop on CPU 0 running throughout (a shared
machine's background work). llama.cpp runs with its defaults (repacked weights where it has
them), one `Llama.eval` call per generated token.
"""
import argparse, json, statistics, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402


def background_load():
    """A busy loop at nice 19 pinned to CPU 0: the 'anything else running' of a shared machine."""
    return subprocess.Popen(["taskset", "-c", "0", "nice", "-n", "19", sys.executable, "-c", "while True: pass"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF path or a catalogue name")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--load", action="store_true",
                    help="run everything beside a nice -n 19 busy loop on CPU 0")
    ap.add_argument("--pi2", default=None, help="the pi2 binary (default: target/release/pi2)")
    ap.add_argument("--name", help="also write docs/measurements/in-memory-NAME.json")
    ap.add_argument("--pi2-args", default="", help="extra arguments for pi2 bench (space-separated)")
    a = ap.parse_args()
    a.pi2 = a.pi2 or pi2bench.pi2()
    pi2bench.llama_python()
    model = pi2bench.model_path(a.model)
    load = background_load() if a.load else None
    rounds = {}  # (engine, threads, test) -> [mean t/s of each round]
    try:
        for r in range(a.rounds):
            for t in a.threads.split(","):
                out = subprocess.run([a.pi2, "bench", "-m", model, "-t", t, "-p", str(a.n_prompt), "-n", str(a.n_gen),
                                      "-r", str(a.reps), "-o", "json", *a.pi2_args.split()],
                                     capture_output=True, text=True, check=True).stdout
                for row in json.loads(out):
                    if row.get("ffn", "dense") != "dense" and "ffn" in row:
                        continue
                    rounds.setdefault(("pi2", int(t), row["test"]), []).append(statistics.mean(row["samples_ts"]))
                out, _, err = pi2bench.llama(["bench", model, t, a.n_prompt, a.n_gen, a.reps])
                if out is None:
                    sys.exit(f"llama.cpp failed: {err}")
                for test, v in out.items():
                    rounds.setdefault(("llama.cpp", int(t), test), []).append(statistics.mean(v))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        if load:
            load.kill()
    print(f"{Path(model).name}, {a.rounds} interleaved rounds of {a.reps} repetitions"
          f"{', beside a nice -n 19 busy loop on CPU 0' if a.load else ''}; median of the round means")
    print("| threads | test | pi2 t/s | llama.cpp t/s | ratio | pi2 rounds | llama.cpp rounds |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    rows = []
    for t in a.threads.split(","):
        for test in (f"pp{a.n_prompt}", f"tg{a.n_gen}"):
            p, l = rounds[("pi2", int(t), test)], rounds[("llama.cpp", int(t), test)]
            mp, ml = statistics.median(p), statistics.median(l)
            fmt = lambda xs: " ".join(f"{x:.1f}" for x in xs)
            print(f"| {t} | {test} | {mp:.1f} | {ml:.1f} | {mp / ml:.2f}x | {fmt(p)} | {fmt(l)} |")
            rows.append({"threads": int(t), "test": test, "pi2": pi2bench.spread(p),
                         "llama.cpp": pi2bench.spread(l), "ratio": mp / ml})
    if a.name:
        pi2bench.write(f"in-memory-{a.name}", {
            "what": "pi2 vs llama.cpp in memory, interleaved rounds, median of round means",
            "command": " ".join(sys.argv), "model": Path(model).name, "rounds": a.rounds, "reps": a.reps,
            "load": a.load, "rows": rows})

if __name__ == "__main__":
    main()
