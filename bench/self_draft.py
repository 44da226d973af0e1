#!/usr/bin/env python3
"""Self-drafts (`--draft self`: the model itself from what the budget keeps resident) against
plain decode under memory caps, on free generation.

    sudo python3 bench/self_draft.py --model qwen2.5-coder-0.5b [--budgets 50%,75%,90%] \
        [--tokens 64] [--rounds 2] [--threads 2] [--name NAME]

Prompts: the golden greedy prompts (a sentence to continue, a function to write, a chat
question), greedy. Every run happens inside a cgroup v1 memory cap of the budget after the page
cache is dropped, in interleaved rounds: `pi2 run --mem-budget B --draft none|self` on the plain
GGUF (its cached conversion, made once before). Reports generation t/s (prompt time excluded),
acceptance, tokens per forward pass, bytes read per token, and whether the two texts are the
same. Writes docs/measurements/self-draft-NAME.json.
"""
import argparse, json, os, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

PROMPTS = {
    "sentence": "The capital of France is",
    "code": "def fibonacci(n):",
    "chat": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--budgets", default="50%,75%,90%")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name")
    ap.add_argument("--cache-dir")
    a = ap.parse_args()
    model = pi2bench.model_path(a.model)
    file_bytes = Path(model).stat().st_size
    env = dict(os.environ, **({"PI2_CACHE_DIR": a.cache_dir} if a.cache_dir else {}))
    texts = {}

    def pi2(budget, prompt, draft):
        cap = pi2bench.size(budget, file_bytes)

        def step():
            out, peak, err = pi2bench.capped([pi2bench.pi2(), "run", "-m", model, "-p", PROMPTS[prompt], "-n",
                                              str(a.tokens), "--temp", "0", "--ignore-eos", "-t", str(a.threads),
                                              "--mem-budget", str(cap), "--draft", draft, "--json"], cap, env=env)
            if out is None:
                print(f"pi2 {budget} {prompt} {draft}: {err}", file=sys.stderr)
                return None
            j = json.loads(out)
            texts[(budget, prompt, draft)] = j["generated_ids"]
            d = j.get("draft") or {}
            return {"tps": j["timings"]["predicted_per_second"], "acceptance": d.get("acceptance"),
                    "tokens_per_pass": d.get("tokens_per_pass"),
                    "bytes_per_token": j["bytes_read_per_token"]["total"], "peak": peak}
        return step

    budgets = a.budgets.split(",")
    # The conversion for the budgets, made once before any timing.
    for b in budgets:
        pi2(b, "sentence", "none")()
    steps = {f"{b} {p} {d}": pi2(b, p, d) for b in budgets for p in PROMPTS for d in ("none", "self")}
    raw = pi2bench.interleaved(a.rounds, steps)
    rows = {}
    print("| budget | prompt | plain t/s | self t/s | self / plain | acceptance | tokens per pass | MB read per token plain / self | same text |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for b in budgets:
        for p in PROMPTS:
            runs = {d: [r for r in raw[f"{b} {p} {d}"] if r] for d in ("none", "self")}
            if not runs["none"] or not runs["self"]:
                continue
            med = {d: pi2bench.spread([r["tps"] for r in runs[d]])["median"] for d in runs}
            last = runs["self"][-1]
            same = texts.get((b, p, "none")) == texts.get((b, p, "self"))
            mb = {d: runs[d][-1]["bytes_per_token"] / 1e6 for d in runs}
            rows[f"{b} {p}"] = {"plain_tps": med["none"], "self_tps": med["self"], "ratio": med["self"] / med["none"],
                                "acceptance": last["acceptance"], "tokens_per_pass": last["tokens_per_pass"],
                                "mb_per_token_plain": mb["none"], "mb_per_token_self": mb["self"],
                                "same_text": same, "runs": runs}
            print(f"| {b} | {p} | {med['none']:.2f} | {med['self']:.2f} | {med['self'] / med['none']:.2f}x | "
                  f"{last['acceptance']:.2f} | {last['tokens_per_pass']:.2f} | {mb['none']:.0f} / {mb['self']:.0f} | {same} |")
    name = a.name or Path(model).stem.lower().split("-instruct")[0]
    pi2bench.write(f"self-draft-{name}", {
        "what": "free generation (golden greedy prompts), greedy, --ignore-eos, inside a cgroup v1 cap of the "
                "budget, page cache dropped, interleaved rounds: generation t/s with and without self-drafts",
        "command": " ".join(sys.argv), "model": Path(model).name, "tokens": a.tokens, "threads": a.threads,
        "rounds": a.rounds, "rows": rows,
    }, plot=False)


if __name__ == "__main__":
    main()
