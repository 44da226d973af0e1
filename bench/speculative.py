#!/usr/bin/env python3
"""Speculative decoding under a memory cap: pi2's prompt lookup against plain pi2 decode, with
llama.cpp's own prompt lookup (and plain llama.cpp) in the same cap, on an editing workload.

    sudo python3 bench/speculative.py --model qwen2.5-coder-0.5b [--budget 50%] [--tokens 256] \
        [--rounds 3] [--threads 2] [--name NAME]

The workload: a prompt holding a 60-line Python source file (from the built-in calibration
text, PSF licence) asking for it back with one change, greedy. Every run happens inside a
cgroup v1 memory cap of the budget after the page cache is dropped, in interleaved rounds:
pi2 `run --mem-budget B --draft none|lookup` on the plain GGUF (its cached conversion, made
once before), and llama.cpp (mmap, no repacked copies) without and with
llama.cpp's own `llama-lookup` program (built from the same
sources; llama-cpp-python's lookup keeps every position's logits, which no cap of this size
holds). Reports generation t/s (prompt time excluded), pi2's draft
acceptance and bytes read per token, and whether pi2's two texts are the same. Writes
docs/measurements/speculative-NAME.json.
"""
import argparse, json, os, re, subprocess, sys, tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402


def editing_prompt():
    lines = (pi2bench.ROOT / "crates/pi2-convert/calibration/code.py.txt").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("def ") and i > 200)
    code = "\n".join(lines[start:start + 60])
    return ("<|im_start|>user\nHere is a Python file:\n```python\n" + code + "\n```\nReturn the whole file "
            "unchanged except that every `self` parameter is renamed to `this`. Output only the code."
            "<|im_end|>\n<|im_start|>assistant\n```python\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lookup", type=int, default=16, help="llama-lookup's --spec-draft-n-max")
    ap.add_argument("--name")
    ap.add_argument("--cache-dir")
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    file_bytes = os.path.getsize(model)
    cap = pi2bench.size(a.budget, file_bytes)
    env = dict(os.environ, **({"PI2_CACHE_DIR": a.cache_dir} if a.cache_dir else {}))
    prompt_file = Path(tempfile.mkdtemp()) / "prompt.txt"
    prompt_file.write_text(editing_prompt())
    subprocess.run([pi2bench.pi2(), "run", "-m", model, "-p", "x", "-n", "1", "--mem-budget", a.budget],
                   capture_output=True, check=True, env=env)
    texts = {}

    def pi2(draft):
        def step():
            out, peak, err = pi2bench.capped([pi2bench.pi2(), "run", "-m", model, "-f", str(prompt_file), "-n",
                                              str(a.tokens), "--temp", "0", "-t", str(a.threads), "--mem-budget",
                                              str(cap), "--draft", draft, "--json"], cap, env=env)
            if out is None:
                print(f"pi2 {draft}: {err}", file=sys.stderr)
                return None
            j = json.loads(out)
            texts[draft] = j["text"]
            return {"tps": j["timings"]["predicted_per_second"], "draft": j.get("draft"),
                    "bytes_per_token": j["bytes_read_per_token"]["total"], "peak": peak}
        return step

    def llama():
        def step():
            out, peak, err = pi2bench.llama(["complete", model, a.threads, a.tokens, prompt_file, 0], cap)
            if out is None:
                print(f"llama.cpp: {err}", file=sys.stderr)
                return None
            texts["llama"] = out["text"]
            return {"tps": out["n"] / out["gen_s"], "peak": peak}
        return step

    lookup_exe = pi2bench.llama_tool("llama-lookup")

    def llama_lookup():
        """llama.cpp's own `llama-lookup` (prompt lookup decoding), weights in the mapping."""
        def step():
            out, peak, err = pi2bench.capped([lookup_exe, "-m", model, "-f", str(prompt_file), "-n", str(a.tokens),
                                              "--temp", "0", "-t", str(a.threads), "-c", "4096", "--no-repack",
                                              "--spec-draft-n-max", str(a.lookup)], cap, stderr_too=True)
            if out is None:
                print(f"llama-lookup: {err}", file=sys.stderr)
                return None
            m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", out)
            if not m:
                print(f"llama-lookup printed no speed: {out[-400:]}", file=sys.stderr)
                return None
            acc = re.search(r"n_accept\s*=\s*(\d+)", out)
            return {"tps": int(m.group(1)) / float(m.group(2)), "peak": peak,
                    "accepted": int(acc.group(1)) if acc else None}
        return step

    steps = {"pi2": pi2("none"), "pi2 lookup": pi2("lookup"), "llama.cpp": llama(),
             "llama.cpp lookup": llama_lookup()}
    raw = pi2bench.interleaved(a.rounds, steps)
    rows = {k: {"tps": pi2bench.spread([r["tps"] for r in v if r]),
                "runs": [r for r in v if r]} for k, v in raw.items()}
    med = lambda k: rows[k]["tps"]["median"] if rows[k]["tps"] else float("nan")
    print(f"| engine | t/s (median of {a.rounds}) | vs pi2 plain |")
    print("| --- | ---: | ---: |")
    for k in rows:
        print(f"| {k} | {med(k):.2f} | {med(k) / med('pi2'):.2f}x |")
    same = texts.get("none") == texts.get("lookup")
    print(f"pi2 texts with and without drafts identical: {same}")
    name = a.name or Path(model).stem
    pi2bench.write(f"speculative-{name}", {
        "what": "editing workload (60-line file back with one change), greedy, inside a cgroup v1 cap, "
                "page cache dropped, interleaved rounds: generation t/s",
        "command": " ".join(sys.argv), "model": Path(model).name, "budget": a.budget, "cap_bytes": cap,
        "tokens": a.tokens, "threads": a.threads, "rows": rows, "pi2_texts_identical": same,
        "pi2_lookup_over_plain": med("pi2 lookup") / med("pi2"),
        "llama_lookup_over_plain": med("llama.cpp lookup") / med("llama.cpp"),
    }, plot=False)


if __name__ == "__main__":
    main()
