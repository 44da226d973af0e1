#!/usr/bin/env python3
"""How close each engine's quantized arithmetic stays to the file's exact (dequantized) values.

    python3 bench/quant_closeness.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--chunks 8]

For each model, llama.cpp's quantizer (PyPI llama-cpp-python, built as in
bench/compare_llama_cpp.py) writes an F32 copy holding the quantized file's weights exactly
(`target/quant/NAME-F32.gguf`); then llama-perplexity's running value over the first `--chunks`
chunks of 512 tokens of testdata/corpus/kjv_genesis.txt comes from llama.cpp and from pi2 on every
kernel tier this CPU runs (`--all-tiers`; else the best), on the quantized file and on its F32
copy. Both engines re-quantize
activations to 8 bits for the quantized file, so neither equals the F32 value; the question is
how far each strays. Writes docs/measurements/quant-closeness.json.
"""
import argparse, json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import pi2bench  # noqa: E402
from quant_check import RUNNER  # noqa: E402
from tier_agreement import tiers  # noqa: E402

CORPUS = ROOT / "testdata" / "corpus" / "kjv_genesis.txt"


def llama_ppl(py, src, dst, chunks):
    args = {"src": str(src), "dst": str(dst), "ftype": 0, "quantize": not Path(dst).exists(),
            "pure": False, "chunks": chunks, "corpus": str(CORPUS)}
    out = subprocess.run([py, "-c", RUNNER, json.dumps(args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ppl"]


def pi2_ppl(model, chunks, tier):
    out = subprocess.run([str(ROOT / "target" / "release" / "pi2"), "perplexity", "-m", str(model), "-f",
                          str(CORPUS), "-c", "512", "--chunks", str(chunks), "-t", "2", "--kernel-tier", tier,
                          "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ppl"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--name", default="quant-closeness", help="docs/measurements/NAME.json")
    ap.add_argument("--all-tiers", action="store_true",
                    help="every kernel tier on the quantized file (they agree bit for bit; the "
                         "scalar one is slow), not only the best")
    a = ap.parse_args()
    py = pi2bench.llama_python()
    subprocess.run([py, "-m", "pip", "install", "-q", "numpy"], check=True)
    (ROOT / "target" / "quant").mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        src = Path(pi2bench.model_path(name))
        f32 = ROOT / "target" / "quant" / f"{src.stem}-F32.gguf"
        llama_f32 = llama_ppl(py, src, f32, a.chunks)
        llama_q = llama_ppl(py, src, src, a.chunks)
        best = tiers()[-1]
        pi2_f32 = pi2_ppl(f32, a.chunks, best)
        pi2_q = {t: pi2_ppl(src, a.chunks, t) for t in (tiers() if a.all_tiers else [best])}
        row = {"model": src.name, "chunks": a.chunks, "llama_cpp": {"f32_copy": llama_f32, "quantized": llama_q},
               "pi2": {"f32_copy": pi2_f32, "quantized": pi2_q},
               "llama_cpp_quantized_vs_f32": llama_q / llama_f32 - 1,
               "pi2_quantized_vs_f32": {t: v / pi2_f32 - 1 for t, v in pi2_q.items()}}
        rows.append(row)
        print(json.dumps(row, indent=1))
    pi2bench.write(a.name, {"what": "perplexity of the quantized file against its exact F32 copy, "
                                       "llama.cpp and pi2 (every tier)", "command": " ".join(sys.argv),
                                       "cpu": pi2bench.cpu_name(), "rows": rows})


if __name__ == "__main__":
    main()
