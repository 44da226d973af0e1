#!/usr/bin/env python3
"""llama.cpp's own server test suite (`tools/server/tests`, from the llama-cpp-python source
package on PyPI) run unchanged against `pi2 serve`, through a stand-in `llama-server` that maps
llama-server's flags to pi2's and its hub models to local ones. Writes per-file pass/fail counts
as JSON.

    python bench/llama_server_suite.py --suite /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/tools/server/tests \\
        --out docs/measurements/llama-server-suite.json

The suite's tests check llama-server's own tiny models' words in places (stories260K's "Ben",
"mom"...): with other models those fail whatever the server does, and so do routes pi2 does not
serve (rerank, router, LoRA, vision, MCP, Anthropic/Responses APIs). The figure is for comparing
pi2 with itself over time, file by file; the failure lines say why each test failed.
Needs the suite's requirements (pytest, openai, requests, ...) in the running Python.
"""

import argparse
import json
import os
import platform
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# llama-server's hub models -> the test models (`cargo xtask fetch-model`).
MODELS = {
    "stories260K-infill": "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",  # FIM tokens
    "tinygemma3": "gemma-3-270m-q4_k_m.gguf",
    "": "SmolLM2-135M-Instruct.Q4_1.gguf",  # everything else
}

# What the stand-in drops: hub and download switches (models are mapped above), the suite's
# server-wide sampling defaults (pi2's are llama-server's: temperature 0.8), its default
# `--no-jinja` (pi2 renders every template with Jinja), and presets' flags
# for routes pi2 does not serve (its `load_all` starts every preset once: a refused flag would
# fail the whole session, where the route's own tests should fail). Everything else reaches
# `pi2 serve` as given, which takes llama-server's names or refuses them by name.
DROPPED = {
    "--offline": 0, "--hf-file": 1, "--temp": 1, "--seed": 1, "--n-gpu-layers": 1,
    "--reranking": 0, "--no-models-autoload": 0, "--verbose": 0, "--no-jinja": 0,
}

SHIM = '''#!{python}
import os, sys
args = sys.argv[1:]
models, dropped, pi2 = {models!r}, {dropped!r}, {pi2!r}
out, model, i = [], None, 0
while i < len(args):
    a = args[i]
    if a in dropped:
        i += 1 + dropped[a]
        continue
    if a in ("--hf-repo", "--model-url", "--model", "-m"):
        name = args[i + 1]
        hit = next((f for key, f in models.items() if key and key in name), models[""])
        model = name if a in ("--model", "-m") and os.path.exists(name) else os.path.join({models_dir!r}, hit)
        i += 2
        continue
    if a == "--n-predict":
        a = "-n"
    out.append(a)
    i += 1
os.execv(pi2, [pi2, "serve", "-m", model or os.path.join({models_dir!r}, models[""])] + out)
'''


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, help="llama.cpp's tools/server/tests folder")
    ap.add_argument("--pi2", default=str(ROOT / "target" / "release" / "pi2"))
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("files", nargs="*", help="unit/test_*.py files (default: all)")
    a = ap.parse_args()
    suite = Path(a.suite).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        shim = Path(tmp) / "llama-server"
        shim.write_text(SHIM.format(python=sys.executable, models=MODELS, dropped=DROPPED,
                                    pi2=str(Path(a.pi2).resolve()), models_dir=str(Path(a.models).resolve())))
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(shim)}
        files = a.files or sorted(str(p.relative_to(suite)) for p in (suite / "unit").glob("test_*.py"))
        started = time.time()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        "-o", f"faulthandler_timeout={a.timeout}", *files],
                       cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elapsed = time.time() - started
        per_file, failures = tally(report.read_text())
    totals = {k: sum(f[k] for f in per_file.values()) for k in ("passed", "failed", "skipped")}
    out = {
        "what": "llama.cpp's server test suite run unchanged against pi2 serve",
        "suite": str(suite), "cpu": cpu_name(), "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"), "seconds": round(elapsed),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "models": MODELS, "totals": totals, "files": per_file, "failures": failures,
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(totals))


def tally(xml: str):
    """Per-file counts and each failure's first line, from pytest's JUnit XML."""
    import xml.etree.ElementTree as ET
    per_file, failures = {}, {}
    for case in ET.fromstring(xml).iter("testcase"):
        file = case.get("classname", "").split(".")[-1]
        counts = per_file.setdefault(file, {"passed": 0, "failed": 0, "skipped": 0})
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            counts["skipped"] += 1
        elif bad is not None:
            counts["failed"] += 1
            msg = re.sub(r"\s+", " ", bad.get("message", "") or "")[:200]
            failures[f"{file}::{case.get('name')}"] = msg
        else:
            counts["passed"] += 1
    return per_file, failures


if __name__ == "__main__":
    main()
