#!/usr/bin/env python3
"""Quality against FFN bytes: one sparsity level for every layer vs per-layer sparsity chosen by
sensitivity (`pi2 convert --sparsity auto`), on text never used for calibration.

    python3 bench/sparsity_quality.py --model qwen2.5-coder-0.5b --profile P.json \
        [--targets 1,3,6,10] [--uniform 0.1,0.2,0.3,0.4,0.5] [--down-type q5_0] \
        [--text testdata/corpus/kjv_genesis.txt] [--chunks 8] [--out target/sparsity-quality]

For each --targets value T, `pi2 convert --max-ppl-increase T --predictor none` makes a file
(its thresholds checked on held-out calibration tokens); `pi2 perplexity` then measures on
--text: the first file dense (`--dense`), the same file with one level for every layer
(`--sparsity S`, thresholds from its profile), and every auto file as converted. Each point is
PPL against the FFN bytes sparse decode reads per token (every gate row, the confirmed neurons'
up rows and down columns; no predictor). Prints a markdown table and writes OUT/quality.svg.
"""
import argparse, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PI2 = ROOT / "target" / "release" / "pi2"
CAL = ROOT / "testdata" / "corpus" / "kjv_calibration.txt"


def pi2(*args):
    out = subprocess.run([str(PI2), *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pi2 {' '.join(args)} failed: {out.stderr[-1500:]}")
    return out.stdout + out.stderr


def perplexity(model, text, chunks, *extra):
    out = pi2("perplexity", "-m", str(model), "-f", str(text), "-c", "512", "--chunks", str(chunks), *extra)
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", out).group(1))
    m = re.search(r"FFN bytes ([0-9.]+) of dense", out)
    return ppl, float(m.group(1)) if m else 1.0


def svg(dense, series):
    w, h, l, r, t, b = 640, 400, 60, 20, 40, 60
    pts = [p for _, _, ps in series for p in ps]
    ymax = max([100 * (p[1] / dense - 1) for p in pts] + [3.0]) * 1.1
    ymin = min([100 * (p[1] / dense - 1) for p in pts] + [0.0]) * 1.1
    x0, x1 = min(p[0] for p in pts + [(0.6, 0)]), 1.0
    px = lambda x: l + (x - x0) / (x1 - x0) * (w - l - r)
    py = lambda y: h - b - (y - ymin) / (ymax - ymin) * (h - t - b)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="{l}" y="20">perplexity increase over dense (%) against FFN bytes read per token</text>',
           f'<line x1="{l}" y1="{h - b}" x2="{w - r}" y2="{h - b}" stroke="black"/>',
           f'<line x1="{l}" y1="{t}" x2="{l}" y2="{h - b}" stroke="black"/>',
           f'<line x1="{l}" y1="{py(3):.1f}" x2="{w - r}" y2="{py(3):.1f}" stroke="gray" stroke-dasharray="4"/>',
           f'<text x="{w - r}" y="{py(3) - 4:.1f}" text-anchor="end" fill="gray">+3%</text>']
    for k in range(6):
        x = x0 + (x1 - x0) * k / 5
        out.append(f'<text x="{px(x):.1f}" y="{h - b + 16}" text-anchor="middle">{x:.2f}</text>')
        y = ymin + (ymax - ymin) * k / 5
        out.append(f'<text x="{l - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:+.1f}</text>')
    out.append(f'<text x="{(l + w - r) / 2}" y="{h - b + 34}" text-anchor="middle">FFN bytes per token, share of dense</text>')
    for i, (label, colour, ps) in enumerate(series):
        ps = sorted(ps)
        line = " ".join(f"{px(x):.1f},{py(100 * (y / dense - 1)):.1f}" for x, y, _ in ps)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y, tag in ps:
            cx, cy = px(x), py(100 * (y / dense - 1))
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{colour}"/>')
            out.append(f'<text x="{cx + 5:.1f}" y="{cy - 5:.1f}" fill="{colour}" font-size="10">{tag}</text>')
        out.append(f'<text x="{l + 10}" y="{t + 14 * (i + 1)}" fill="{colour}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--targets", default="1,3,6,10")
    ap.add_argument("--uniform", default="0.1,0.2,0.3,0.4,0.5")
    ap.add_argument("--down-type", default=None)
    ap.add_argument("--text", default=str(ROOT / "testdata" / "corpus" / "kjv_genesis.txt"))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "target" / "sparsity-quality"))
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
    (out / "quality.svg").write_text(svg(dense, [("one level for every layer", "#d62728", uniform),
                                                ("per layer by sensitivity (auto)", "#1f77b4", auto)]))
    print(f"wrote {out / 'quality.svg'}")


if __name__ == "__main__":
    main()
