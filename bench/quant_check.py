#!/usr/bin/env python3
"""pi2 against llama.cpp on files made by llama.cpp's own quantizer, one per type.

    python3 bench/quant_check.py [--model smollm2-135m] [--types IQ4_NL,Q4_0] [--chunks 8] [--pure]

For each type, `llama_model_quantize` (PyPI llama-cpp-python, built as in
bench/compare_llama_cpp.py) turns the model into `target/quant/NAME-TYPE.gguf` (requantizing
where the source is already quantized; `--pure` gives every matrix whose rows allow it the
type itself instead of llama.cpp's mix, which otherwise puts Q3_K where a Q2_K file could have
Q2_K), then both engines compute llama-perplexity's running
value over the first `--chunks` chunks of 512 tokens of testdata/corpus/kjv_genesis.txt (BOS
first where the model adds one). Prints a markdown table: the tensor types in the file, both
PPLs and their relative difference (pi2 must be within 1%).
"""
import argparse, collections, json, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import pi2bench  # noqa: E402

# llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers.
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12,
          "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32}

RUNNER = r'''
import ctypes, json, math, sys
import llama_cpp
import numpy as np
a = json.loads(sys.argv[1])
if a["quantize"]:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize, p.nthread, p.pure = a["ftype"], True, 2, a["pure"]
    assert llama_cpp.llama_model_quantize(a["src"].encode(), a["dst"].encode(), ctypes.byref(p)) == 0
_default = llama_cpp.llama_model_default_params
def _params():
    p = _default(); p.use_extra_bufts = False; return p
llama_cpp.llama_model_default_params = _params
llm = llama_cpp.Llama(model_path=a["dst"], n_ctx=512, n_batch=512, n_threads=2, logits_all=True,
                      flash_attn=True, verbose=False)
add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
toks = llm.tokenize(open(a["corpus"], encoding="utf-8").read().encode(), add_bos=add_bos, special=False)
nll = count = 0
for c in range(a["chunks"]):
    chunk = toks[c * 512:(c + 1) * 512]
    if add_bos:
        chunk = [llm.token_bos()] + chunk[1:]
    llm.reset(); llm.eval(chunk)
    for pos in range(256, 511):
        row = np.asarray(llm.scores[pos], dtype=np.float64); m = row.max()
        nll += m + math.log(np.exp(row - m).sum()) - row[chunk[pos + 1]]; count += 1
print(json.dumps({"ppl": math.exp(nll / count)}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--types", default="IQ4_NL")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--pure", action="store_true", help="no type mix: the type on every matrix it fits")
    a = ap.parse_args()
    py = pi2bench.llama_python()
    subprocess.run([py, "-m", "pip", "install", "-q", "numpy"], check=True)
    src = Path(pi2bench.model_path(a.model))
    pi2 = ROOT / "target" / "release" / "pi2"
    corpus = ROOT / "testdata" / "corpus" / "kjv_genesis.txt"
    out = ROOT / "target" / "quant"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{src.name}{' (pure types)' if a.pure else ''}, first {a.chunks} chunks of 512 of kjv_genesis.txt\n")
    print("| type | tensors in the file | pi2 PPL | llama.cpp PPL | difference |")
    print("| --- | --- | ---: | ---: | ---: |")
    for ty in a.types.split(","):
        dst = out / f"{src.stem}-{ty}{'-pure' if a.pure else ''}.gguf"
        args = {"src": str(src), "dst": str(dst), "ftype": FTYPES[ty], "quantize": not dst.exists(), "pure": a.pure,
                "chunks": a.chunks, "corpus": str(corpus)}
        ref = json.loads(subprocess.run([py, "-c", RUNNER, json.dumps(args)], check=True,
                                        capture_output=True, text=True).stdout)["ppl"]
        info = subprocess.run([str(pi2), "info", "-m", str(dst), "--json"], capture_output=True, text=True)
        if info.returncode != 0:  # a type pi2 does not read: its one-line error says which
            print(f"| {ty} | pi2: {info.stderr.strip().splitlines()[-1]} | | {ref:.4f} | |")
            continue
        types = ", ".join(f"{k} {v['count']}" for k, v in sorted(json.loads(info.stdout)["tensor_types"].items()))
        run = subprocess.run([str(pi2), "perplexity", "-m", str(dst), "-f", str(corpus), "-c", "512",
                              "--chunks", str(a.chunks), "-t", "2"], capture_output=True, text=True)
        m = re.search(r"PPL = ([0-9.]+)", run.stdout + run.stderr)
        got = float(m.group(1)) if m else float("nan")
        print(f"| {ty} | {types} | {got:.4f} | {ref:.4f} | {100 * (got / ref - 1):+.2f}% |"
              if m else f"| {ty} | {types} | {run.stderr.strip().splitlines()[-1]} | {ref:.4f} | |")


if __name__ == "__main__":
    main()
