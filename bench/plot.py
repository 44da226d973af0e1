#!/usr/bin/env python3
"""Draws a measurement's picture from its JSON (docs/measurements/NAME.json -> NAME.svg), with
matplotlib. Run by bench/pi2bench.py's `write`; run it again to redraw.

    python bench/plot.py docs/measurements/NAME.json

The JSON's `plot.kind` says what to draw:
- `caps`: decode t/s against the memory cap (share of the model file), one line per engine with
  the rounds' spread as error bars, and each engine's in-memory speed as a dashed line; with a
  single cap, a bar per engine with its value and the ratio, in-memory speeds as a note.
- `curve`: named series of labelled (x, y) points (`series`), with axis names from `plot.x`
  and `plot.y` and an optional dashed `plot.hline`.
"""
import json, sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"pi2": "#1f77b4", "llama.cpp": "#d62728", "pi2 dense": "#7f7f7f"}


def one_cap(data, ax, share):
    """A single cap: each engine's decode speed inside it as a bar (the rounds' spread as error
    bars, the value written on it), the ratio in the legend, in-memory speeds as a note: lines at
    in-memory speed would squash the point of the picture into dots near zero."""
    bars = []
    for engine in ("llama.cpp", "pi2", "pi2 dense"):
        t = next((p["tps"] for p in data["points"] if p["engine"] == engine and p["cap_share"]
                  and p["tps"]), None)
        if t:
            bars.append((engine, t))
    xs = range(len(bars))
    med = [t["median"] for _, t in bars]
    err = [[t["median"] - t["min"] for _, t in bars], [t["max"] - t["median"] for _, t in bars]]
    ax.bar(xs, med, yerr=err, capsize=4, color=[COLOURS[e] for e, _ in bars])
    for x, (_, t) in zip(xs, bars):
        ax.annotate(f"{t['median']:.2f} t/s", (x, t["max"]), textcoords="offset points",
                    xytext=(0, 5), ha="center", fontsize=9)
    ax.set_xticks(list(xs), [("plain dense (no budget)" if e == "pi2 dense" else e) for e, _ in bars])
    speeds = dict((e, t["median"]) for e, t in bars)
    ratio = (f"pi2 = {speeds['pi2'] / speeds['llama.cpp']:.2f}x llama.cpp"
             if "pi2" in speeds and "llama.cpp" in speeds else "")
    mem = [f"{e} {p['tps']['median']:.1f}" for e in ("llama.cpp", "pi2") for p in data["points"]
           if p["engine"] == e and p["cap"] == "memory" and p["tps"]]
    note = f"inside a cap of {100 * share:.0f}% of the file" + (f": {ratio}" if ratio else "")
    if mem:
        note += "\nin memory (no cap), t/s: " + ", ".join(mem)
    ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=8)
    ax.set_ylabel("decode tokens per second")
    ax.set_ylim(0, max(med) * 1.35)
    ax.grid(alpha=0.3, axis="y")


def caps(data, ax):
    shares = {p["cap_share"] for p in data["points"] if p["cap_share"] and p["tps"]}
    if len(shares) == 1:
        return one_cap(data, ax, shares.pop())
    for engine in ("llama.cpp", "pi2", "pi2 dense"):
        pts = sorted((p["cap_share"], p["tps"]) for p in data["points"]
                     if p["engine"] == engine and p["cap_share"] and p["tps"])
        if pts:
            xs = [100 * x for x, _ in pts]
            med = [t["median"] for _, t in pts]
            err = [[t["median"] - t["min"] for _, t in pts], [t["max"] - t["median"] for _, t in pts]]
            what = "plain dense (no budget)" if engine == "pi2 dense" else engine
            ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=COLOURS[engine],
                        label=f"{what} inside the cap")
        mem = next((p["tps"] for p in data["points"] if p["engine"] == engine and p["cap"] == "memory"
                    and p["tps"]), None)
        if mem:
            ax.axhline(mem["median"], linestyle="--", linewidth=1, color=COLOURS[engine],
                       label=f"{engine} in memory ({mem['median']:.1f} t/s)")
    ax.set_xlabel("memory cap, % of the model file")
    ax.set_ylabel("decode tokens per second")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def curve(data, ax):
    spec = data["plot"]
    for name, pts in data["series"].items():
        pts = sorted(pts, key=lambda p: p["x"])
        ax.plot([p["x"] for p in pts], [p["y"] for p in pts], marker="o", label=name)
        for p in pts:
            ax.annotate(str(p.get("label", "")), (p["x"], p["y"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    if "hline" in spec:
        ax.axhline(spec["hline"], linestyle="--", linewidth=1, color="gray")
    ax.set_xlabel(spec["x"])
    ax.set_ylabel(spec["y"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main():
    path = Path(sys.argv[1])
    data = json.loads(path.read_text())
    spec = data["plot"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    {"caps": caps, "curve": curve}[spec["kind"]](data, ax)
    m = data.get("machine", {})
    ax.set_title(spec.get("title", path.stem), fontsize=10)
    foot = "\n".join(x for x in (spec.get("caption"), f"{m.get('cpu', '')}, {m.get('cores', '')} cores, "
                                  f"commit {m.get('commit', '')}, {m.get('date', '')}") if x)
    fig.text(0.01, 0.01, foot, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = path.with_suffix(".svg")
    fig.savefig(out)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
