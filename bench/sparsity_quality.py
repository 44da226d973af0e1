#!/usr/bin/env python3
"""Quality against FFN bytes: one sparsity level for every layer vs per-layer sparsity chosen by
sensitivity (`pi2 convert --sparsity auto`), on text never used for calibration.

    python3 bench/sparsity_quality.py --model qwen2.5-coder-0.5b --profile P.json \
        [--targets 1,3,6,10] [--uniform 0.1,0.2,0.3,0.4,0.5] [--down-type q5_0] \
        [--text testdata/corpus/kjv_genesis.txt] [--chunks 8] [--name sparsity-quality]

For each --targets value T, `pi2 convert --max-ppl-increase T --predictor none` makes a file
(its thresholds checked on held-out calibration tokens); `pi2 perplexity` then measures on
--text: the first file dense (`--dense`), the same file with one level for every layer
(`--sparsity S`, thresholds from its profile), and every auto file as converted. Each point is
PPL against the FFN bytes sparse decode reads per token (every gate row, the confirmed neurons'
up rows and down columns; no predictor). Prints a markdown table and writes NAME.json and
NAME.svg into docs/measurements/ (bench/pi2bench.py).
"""
import argparse, re, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi2bench  # noqa: E402

ROOT = pi2bench.ROOT
CAL = ROOT / "testdata" / "corpus" / "kjv_calibration.txt"


def pi2(*args):
    out = subprocess.run([pi2bench.pi2(), *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pi2 {' '.join(args)} failed: {out.stderr[-1500:]}")
    return out.stdout + out.stderr


def perplexity(model, text, chunks, *extra):
    out = pi2("perplexity", "-m", str(model), "-f", str(text), "-c", "512", "--chunks", str(chunks), *extra)
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", out).group(1))
    m = re.search(r"FFN bytes ([0-9.]+) of dense", out)
    return ppl, float(m.group(1)) if m else 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--targets", default="1,3,6,10")
    ap.add_argument("--uniform", default="0.1,0.2,0.3,0.4,0.5")
    ap.add_argument("--down-type", default=None)
    ap.add_argument("--text", default=str(ROOT / "testdata" / "corpus" / "kjv_genesis.txt"))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "target" / "sparsity-quality"), help="converted files go here")
    ap.add_argument("--name", default="sparsity-quality", help="docs/measurements/NAME.json and .svg")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for t in a.targets.split(","):
        f = out / f"auto-{t}.gguf"
        args = ["convert", "-m", a.model, "--profile", a.profile, "-f", str(CAL), "--predictor", "none",
                "--max-ppl-increase", t, "-o", str(f), "--force"]
        if a.down_type:
            args += ["--down-type", a.down_type]
        pi2(*args)
        files.append((t, f))
    dense, _ = perplexity(files[0][1], a.text, a.chunks, "--dense")
    print(f"| FFN sparsity choice | PPL | vs dense | FFN bytes / dense |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| dense | {dense:.4f} | | 1.000 |")
    uniform, auto = [], []
    for s in a.uniform.split(","):
        ppl, by = perplexity(files[0][1], a.text, a.chunks, "--sparsity", s)
        uniform.append((by, ppl, s))
        print(f"| {s} in every layer | {ppl:.4f} | {100 * (ppl / dense - 1):+.2f}% | {by:.3f} |", flush=True)
    for t, f in files:
        ppl, by = perplexity(f, a.text, a.chunks)
        auto.append((by, ppl, f"{t}%"))
        print(f"| auto, --max-ppl-increase {t} | {ppl:.4f} | {100 * (ppl / dense - 1):+.2f}% | {by:.3f} |", flush=True)
    pct = lambda ps: [{"x": by, "y": 100 * (ppl / dense - 1), "label": tag} for by, ppl, tag in ps]
    pi2bench.write(a.name, {
        "what": "perplexity on held-out text against FFN bytes read per token (share of dense)",
        "command": " ".join(sys.argv), "model": Path(a.model).name, "text": Path(a.text).name,
        "chunks": a.chunks, "dense_ppl": dense,
        "series": {"one level for every layer": pct(uniform), "per layer by sensitivity (auto)": pct(auto)},
        "plot": {"kind": "curve", "title": "perplexity increase against FFN bytes per token",
                 "x": "FFN bytes per token, share of dense", "y": "perplexity increase over dense (%)",
                 "hline": 3.0},
    })


if __name__ == "__main__":
    main()
