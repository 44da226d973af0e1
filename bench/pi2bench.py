"""What every bench script shares: the binaries, llama.cpp (built from PyPI for this CPU), its
runner, cgroup memory caps, interleaved rounds with medians and spreads, and results kept as JSON
in docs/measurements/ (plots drawn from those files by bench/plot.py).

Scripts import it as `import pi2bench` (they live beside it).
"""
import contextlib, datetime, json, os, statistics, subprocess, sys, time, venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PI2 = ROOT / "target" / "release" / "pi2"
LLAMA_VENV = ROOT / "target" / "llama-cpp-venv"
PLOT_VENV = ROOT / "target" / "plot-venv"
RUNNER = ROOT / "bench" / "llama_runner.py"
MEASUREMENTS = ROOT / "docs" / "measurements"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the llama.cpp (0c1e57098) of testdata/golden


def pi2():
    """The release pi2 binary, built if missing."""
    if not PI2.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "pi2-cli"], cwd=ROOT, check=True)
    return str(PI2)


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine():
    """What a figure was measured on: CPU, its vector features, cores, memory, commit, date."""
    flags = cpu_flags()
    feats = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu_name(), "features": feats, "cores": os.cpu_count(),
            "mem_gib": round(mem / 2**20, 1), "commit": commit + ("+dirty" if dirty else ""),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": os.getloadavg()[0]}


def cmake_args():
    """Native builds crash in ggml's AMX code here, so features are set by hand from the CPU's
    own flags (a VNNI build dies with SIGILL on a CPU without VNNI)."""
    flags = cpu_flags()
    on = lambda f: "ON" if f else "OFF"
    avx512 = {"avx512f", "avx512bw", "avx512vl"} <= flags
    return (f"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2={on('avx2' in flags)} -DGGML_FMA={on('fma' in flags)} "
            f"-DGGML_F16C={on('f16c' in flags)} -DGGML_AVX512={on(avx512)} "
            f"-DGGML_AVX512_VNNI={on(avx512 and 'avx512_vnni' in flags)} -DGGML_AVX_VNNI={on('avx_vnni' in flags)} "
            f"-DGGML_AVX512_BF16={on(avx512 and 'avx512_bf16' in flags)} "
            f"-DGGML_AVX512_VBMI={on(avx512 and 'avx512vbmi' in flags)} "
            "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")


def llama_python():
    """The Python of a venv holding llama-cpp-python built from source for this CPU."""
    py = LLAMA_VENV / "bin" / "python"
    stamp = LLAMA_VENV / "pi2-cmake-args"
    args = cmake_args()
    built = stamp.read_text() if stamp.exists() else None
    if built == args and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return str(py)
    print(f"installing {LLAMA_CPP_PYTHON} into {LLAMA_VENV} with CMAKE_ARGS={args!r} (builds llama.cpp, "
          "several minutes)", file=sys.stderr)
    venv.create(LLAMA_VENV, with_pip=True)
    env = dict(os.environ, CMAKE_ARGS=args, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    subprocess.run([py, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall", "--no-deps", "--no-binary",
                    "llama-cpp-python", LLAMA_CPP_PYTHON], env=env, check=True)
    # Its runtime dependencies (wheels), installed after so the source build stays pinned.
    subprocess.run([py, "-m", "pip", "install", "-q", "numpy", "typing-extensions", "diskcache", "jinja2"],
                   check=True)
    stamp.write_text(args)
    return str(py)


def llama(args, cap=None):
    """Runs bench/llama_runner.py ARGS in the llama.cpp venv (inside a memory cap of `cap`
    bytes when given) and returns (its JSON answer or None, peak bytes or None, error or None)."""
    cmd = [llama_python(), str(RUNNER), *map(str, args)]
    if cap:
        out, peak, err = capped(cmd, cap)
    else:
        p = subprocess.run(cmd, capture_output=True, text=True)
        out, peak, err = (p.stdout, None, None) if p.returncode == 0 else (None, None, p.stderr[-300:])
    return (json.loads(out.strip().splitlines()[-1]) if out else None), peak, err


def model_path(spec):
    """A path, or a catalogue name resolved (and fetched) by `pi2 fetch-model`."""
    if Path(spec).exists():
        return spec
    out = subprocess.run([pi2(), "fetch-model", spec], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def cgroup_root():
    for line in open("/proc/self/cgroup"):
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1] == "memory":
            return Path("/sys/fs/cgroup/memory") / parts[2].lstrip("/")
    sys.exit("no cgroup v1 memory controller (cgroup v1 and root are needed for memory caps)")


@contextlib.contextmanager
def _cgroup(cap_bytes):
    """A fresh cgroup v1 memory cap of cap_bytes, the page cache dropped; yields (the group's
    folder, a preexec_fn that moves a child into it); removed on leaving."""
    cg = cgroup_root() / f"pi2bench{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(cap_bytes))
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        yield cg, lambda: Path(cg / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def capped(cmd, cap_bytes, env=None, stderr_too=False):
    """Runs cmd inside a fresh cgroup v1 memory cap of cap_bytes, the page cache dropped first.
    Returns (stdout (and stderr after it when `stderr_too`) or None, peak bytes of the group,
    error line or None)."""
    with _cgroup(cap_bytes) as (cg, pre):
        out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre, env=env)
        peak = int((cg / "memory.max_usage_in_bytes").read_text())
    if out.returncode != 0:
        # Killed by the cap (-9) or refused: a row that says so, not the end of the sweep.
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return None, peak, f"exit {out.returncode}: {last[:200]}"
    return out.stdout + (out.stderr if stderr_too else ""), peak, None


@contextlib.contextmanager
def capped_process(cmd, cap_bytes, env=None):
    """Starts cmd inside a fresh cgroup v1 memory cap of cap_bytes (page cache dropped first)
    and yields the running process (stderr piped); kills it on leaving."""
    with _cgroup(cap_bytes) as (_, pre):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=pre, env=env)
        try:
            yield proc
        finally:
            proc.kill()
            proc.wait()


def peak_rss(pid):
    """Peak resident memory of a running process, bytes (VmHWM)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def size(spec, file_bytes):
    """`50%` of file_bytes, or `2G`, `300M`, `4096`."""
    spec = spec.strip()
    if spec.endswith("%"):
        return int(file_bytes * float(spec[:-1]) / 100)
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(spec[:-1]) * mult[spec[-1].upper()]) if spec[-1].upper() in mult else int(spec)


def interleaved(rounds, steps):
    """Runs each of `steps` ({name: fn returning a number or None}) once per round, in turn, so
    slow phases of a shared machine hit every step; returns {name: [value per round]}."""
    out = {name: [] for name in steps}
    for r in range(rounds):
        for name, fn in steps.items():
            v = fn()
            out[name].append(v)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return out


def spread(xs):
    """Median, min and max of the finite values of xs (None when there are none)."""
    xs = [x for x in xs if x is not None and x == x]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def write(name, data, plot=True):
    """Writes docs/measurements/NAME.json (with the machine) and, when it holds a `plot`
    section and `plot`, NAME.svg through bench/plot.py."""
    MEASUREMENTS.mkdir(parents=True, exist_ok=True)
    path = MEASUREMENTS / f"{name}.json"
    data = {"machine": machine(), **data}
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    if plot and "plot" in data:
        subprocess.run([plot_python(), str(ROOT / "bench" / "plot.py"), str(path)], check=True)
    return path


def plot_python():
    """The Python of a venv holding matplotlib (target/plot-venv), made on first use."""
    py = PLOT_VENV / "bin" / "python"
    if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode != 0 if py.exists() else True:
        venv.create(PLOT_VENV, with_pip=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib"], check=True)
    return str(py)


def llama_tool(name):
    """A llama.cpp program (e.g. `llama-lookup`) built from the same pinned llama-cpp-python
    sdist and CPU options as the venv, under target/llama-cpp-tools (cmake from PyPI)."""
    tools = ROOT / "target" / "llama-cpp-tools"
    exe = tools / "build" / "bin" / name
    stamp = tools / "pi2-cmake-args"
    if exe.exists() and stamp.exists() and stamp.read_text() == cmake_args():
        return str(exe)
    py = llama_python()
    tools.mkdir(parents=True, exist_ok=True)
    src = tools / "src"
    if not src.exists():
        subprocess.run([py, "-m", "pip", "download", "-q", LLAMA_CPP_PYTHON, "--no-binary", "llama-cpp-python",
                        "--no-deps", "-d", str(tools)], check=True)
        tarball = next(tools.glob("llama_cpp_python-*.tar.gz"))
        subprocess.run(["tar", "xzf", str(tarball), "-C", str(tools)], check=True)
        next(tools.glob("llama_cpp_python-*/")).joinpath("vendor", "llama.cpp").rename(src)
    subprocess.run([py, "-m", "pip", "install", "-q", "cmake"], check=True)
    cmake = str(Path(py).parent / "cmake")
    print(f"building llama.cpp's {name} (several minutes)", file=sys.stderr)
    subprocess.run([cmake, "-S", str(src), "-B", str(tools / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TESTS=OFF",
                    *cmake_args().split()], check=True, capture_output=True)
    subprocess.run([cmake, "--build", str(tools / "build"), "--target", name, "-j", str(os.cpu_count() or 2)],
                   check=True, capture_output=True)
    stamp.write_text(cmake_args())
    return str(exe)
