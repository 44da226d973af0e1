#!/usr/bin/env python3
"""Reference outputs of llama.cpp for a GGUF model, in the format of testdata/golden/.

    python3 bench/llama_reference.py --model models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \
        --out testdata/golden/qwen2.5-coder-0.5b [--chunks 8]

llama.cpp is PyPI llama-cpp-python, built from source into target/llama-cpp-venv by
bench/pi2bench.py's recipe (CPU flags read from /proc/cpuinfo, AMX off). Weights stay
in the GGUF layout (no repacked extra buffers), flash attention on, f16 KV cache, 2 threads,
as the SmolLM2 reference in testdata/golden was made. Writes:

- tokenize.json: the 34 strings of the SmolLM2 reference, ids with and without special-token
  parsing, piece bytes;
- greedy.json: 8 prompts (6 plain, 2 rendered with the model's chat template through jinja2),
  32 argmax steps each (not stopping at end of generation) with the chosen logit, the runner-up,
  the margin, and the chosen logit again from one batch without flash attention
  (`logit_batch_no_fa`: how far llama.cpp's own roundings move it);
- logits.json + logits_f16/logits_last_NAME.f16: last-position logits of 3 prompts (top-20, L2
  norm; the full vector as little-endian f16);
- perplexity.json: llama-perplexity's method (c=512, scored second halves) on the first
  --chunks chunks of testdata/corpus/kjv_genesis.txt, running values after each chunk.
"""
import argparse, hashlib, json, math, os, struct, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import pi2bench  # noqa: E402  (the venv recipe)

RUNNER = r'''
import json, math, struct, sys
import llama_cpp
import numpy as np
args = json.loads(sys.argv[1])

# Plain GGUF layout: no repacked extra buffers (the reference must not depend on them).
_default = llama_cpp.llama_model_default_params
def _params():
    p = _default()
    p.use_extra_bufts = False
    return p
llama_cpp.llama_model_default_params = _params

llm = llama_cpp.Llama(model_path=args["model"], n_ctx=2048, n_batch=2048, n_ubatch=512,
                      n_threads=2, n_threads_batch=2, logits_all=True, flash_attn=True,
                      verbose=False)
plain = llama_cpp.Llama(model_path=args["model"], n_ctx=2048, n_batch=2048, n_ubatch=512,
                        n_threads=2, n_threads_batch=2, logits_all=True, flash_attn=False,
                        verbose=False)
vocab = llm.n_vocab()
meta = {k: v for k, v in llm.metadata.items()}

add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", "false") == "true")

def tok(text, special, bos=False):
    return llm.tokenize(text.encode("utf-8"), add_bos=bos, special=special)

def last_logits(ids):
    llm.reset()
    llm.eval(ids)
    return [float(v) for v in llm.scores[llm.n_tokens - 1]]

def top2(row):
    best = max(range(len(row)), key=lambda i: (row[i], -i))
    second = max((i for i in range(len(row)) if i != best), key=lambda i: (row[i], -i))
    return best, second

out = {"vocab": vocab, "meta": meta}
# Tokenizer.
cases = []
for text in args["strings"]:
    a, b = tok(text, True), tok(text, False)
    pieces = [llm.detokenize([i], special=True).hex() for i in a]
    cases.append({"text": text, "ids_parse_special": a, "ids_no_parse_special": b,
                  "ids_add_special_parse_special": llm.tokenize(text.encode("utf-8"), add_bos=True, special=True),
                  "pieces_hex_parse_special": pieces,
                  "detok_roundtrip_equal": llm.detokenize(a, special=True).decode("utf-8", "replace") == text})
out["tokenize"] = cases

# Chat prompts through the model's own template.
import jinja2
# As transformers renders chat templates: trimmed blocks, loop controls.
env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                         extensions=["jinja2.ext.loopcontrols"])
env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(Exception(m))
# A file without a template: Gemma's documented turn format when the vocabulary has its turn
# tokens (pi2 does the same), else ChatML (llama.cpp's default).
GEMMA_TURNS = ("{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\\n\\n' %}"
               "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
               "{% for m in turns %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' "
               "+ (prefix if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
source = meta.get("tokenizer.chat_template")
if source is None:
    has_turns = len(tok("<start_of_turn><end_of_turn>", True)) == 2
    source = GEMMA_TURNS if has_turns else CHATML
template = env.from_string(source)
def render(messages):
    return template.render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")

greedy = []
for case in args["prompts"]:
    text = render(case["messages"]) if "messages" in case else case["text"]
    chat = "messages" in case
    # BOS as the model asks (the template is rendered without one, as llama.cpp strips it).
    ids = tok(text, chat, add_bos)
    llm.reset()
    llm.eval(ids)
    steps, gen = [], []
    for _ in range(args["n_gen"]):
        row = [float(v) for v in llm.scores[llm.n_tokens - 1]]
        best, second = top2(row)
        steps.append({"id": best, "logit": row[best], "runner_up": second, "margin": row[best] - row[second]})
        gen.append(best)
        llm.eval([best])
    # llama.cpp's own numeric noise at each step: the chosen token's logit when the whole
    # sequence runs as one batch without flash attention (another rounding of the same maths).
    plain.reset()
    plain.eval(ids + gen[:-1])
    for i, st in enumerate(steps):
        st["logit_batch_no_fa"] = float(plain.scores[len(ids) - 1 + i][st["id"]])
    greedy.append({"name": case["name"], "chat_template_applied": chat, "messages": case.get("messages"), "text": text,
                   "parse_special": chat, "add_special": add_bos, "prompt_ids": ids, "generated_ids": gen,
                   "generated_text": llm.detokenize(gen).decode("utf-8", "replace"), "steps": steps})
out["greedy"] = greedy

logits = []
for case in greedy[: args["n_logits"]]:
    row = last_logits(case["prompt_ids"])
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:20]
    logits.append({"name": case["name"], "text": case["text"], "parse_special": case["parse_special"],
                   "prompt_ids": case["prompt_ids"], "position": len(case["prompt_ids"]) - 1,
                   "default": {"top20": [[i, row[i]] for i in order],
                               "l2_norm": math.sqrt(sum(v * v for v in row))},
                   "full": row})
out["logits"] = logits

# Perplexity: llama-perplexity's chunks (add_special as the model says; BOS replaces the first
# token of each chunk when the model adds one), scored second halves.
text = open(args["corpus"], encoding="utf-8").read()
tokens = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)
n_ctx, running, nll, count = 512, [], 0.0, 0
n_chunk = len(tokens) // n_ctx
for c in range(min(args["chunks"], n_chunk)):
    chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
    if add_bos:
        chunk = [llm.token_bos()] + chunk[1:]
    llm.reset()
    llm.eval(chunk)
    for pos in range(n_ctx // 2, n_ctx - 1):
        row = np.asarray(llm.scores[pos], dtype=np.float64)
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        nll += lse - row[chunk[pos + 1]]
        count += 1
    running.append(math.exp(nll / count))
out["perplexity"] = {"n_tokens": len(tokens), "chunks_512": n_chunk, "running_ppl": running,
                     "add_bos": add_bos}
print(json.dumps(out))
'''

PLAIN = [
    ("plain_capital", "The capital of France is"),
    ("plain_story", "Once upon a time, in a small village,"),
    ("plain_science", "Photosynthesis is the process by which"),
    ("plain_code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("plain_single_token", "Hello"),
    ("plain_long", "The history of the Roman Empire spans more than a thousand years. It began with the "
     "founding of the city of Rome, according to legend in 753 BC, and grew from a small kingdom into a "
     "republic and later an empire that dominated the Mediterranean world. Historians often divide this "
     "history into several periods, and the most important of these is"),
]
CHAT = [
    ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_system_math", [{"role": "system", "content": "You are a concise math tutor."},
                          {"role": "user", "content": "What is 7 times 8?"}]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunks", type=int, default=8)
    a = ap.parse_args()
    py = pi2bench.llama_python()
    subprocess.run([py, "-m", "pip", "install", "-q", "jinja2", "numpy", "typing-extensions", "diskcache"],
                   check=True)
    strings = [c["text"] for c in json.load(open(ROOT / "testdata/golden/tokenize.json"))["cases"]]
    prompts = [{"name": n, "text": t} for n, t in PLAIN] + [{"name": n, "messages": m} for n, m in CHAT]
    args = {"model": a.model, "strings": strings, "prompts": prompts, "n_gen": 32, "n_logits": 3,
            "chunks": a.chunks, "corpus": str(ROOT / "testdata/corpus/kjv_genesis.txt")}
    res = json.loads(subprocess.run([py, "-c", RUNNER, json.dumps(args)], check=True,
                                    capture_output=True, text=True).stdout)
    model = Path(a.model)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    flags = pi2bench.cmake_args()
    meta = {"model": {"file": model.name, "sha256": digest, "size_bytes": model.stat().st_size},
            "llama_cpp": {"source": pi2bench.LLAMA_CPP_PYTHON + " built from source",
                          "cmake_args": flags, "repack": "use_extra_bufts=false: weights in plain GGUF layout"},
            "settings": {"n_ctx": 2048, "n_batch": 2048, "n_ubatch": 512, "threads": 2,
                         "flash_attn": True, "kv_cache": "f16", "sampling": "argmax of raw logits, lowest id wins ties",
                         "stop": "does not stop at end of generation: 32 tokens"},
            "script": "bench/llama_reference.py"}
    out = Path(a.out)
    (out / "logits_f16").mkdir(parents=True, exist_ok=True)
    dump = lambda name, body: (out / name).write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    dump("tokenize.json", {"meta": meta, "cases": res["tokenize"]})
    dump("greedy.json", {"meta": meta, "cases": res["greedy"]})
    for c in res["logits"]:
        full = c.pop("full")
        (out / "logits_f16" / f"logits_last_{c['name']}.f16").write_bytes(
            b"".join(struct.pack("<e", v) for v in full))
    dump("logits.json", {"meta": meta, "cases": res["logits"]})
    p = res["perplexity"]
    dump("perplexity.json", {"meta": dict(meta, method="llama-perplexity's chunking: c=512, each chunk from "
                                          "an empty cache, positions 256..510 predict 257..511"),
                             "corpora": [dict(name="kjv_genesis", file="corpus/kjv_genesis.txt", **p)]})
    print(f"wrote {out}: {len(res['tokenize'])} strings, {len(res['greedy'])} prompts, "
          f"PPL after {len(p['running_ppl'])} chunks {p['running_ppl'][-1]:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
