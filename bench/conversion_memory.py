#!/usr/bin/env python3
"""Memory of the one-command conversion: `pi2 run --mem-budget B` on a plain GGUF with an empty
cache (so it converts), its process tree's resident memory sampled every 20 ms (anonymous and
file-backed apart), optionally inside a cgroup v1 memory cap (root; page cache dropped first).
Writes docs/measurements/conversion-memory-NAME.json.

    python3 bench/conversion_memory.py --model models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \
        --budget 50% [--cap-mib 400] --name qwen0.5b
"""
import argparse, json, os, platform, re, shutil, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree(pid):
    out = [pid]
    try:
        for c in open(f"/proc/{pid}/task/{pid}/children").read().split():
            out += tree(int(c))
    except OSError:
        pass
    return out


def rss_kib(pid):
    got = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "RssShmem"):
                got[k] = int(v.split()[0])
    except OSError:
        pass
    return got.get("RssAnon", 0), got.get("RssFile", 0) + got.get("RssShmem", 0)


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--cap-mib", type=int, help="run inside a cgroup v1 memory cap of this size")
    ap.add_argument("--pi2", default=os.path.join(ROOT, "target/release/pi2"))
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="pi2-conv-")
    cmd = [a.pi2, "run", "-m", a.model, "--mem-budget", a.budget, "-p", "Hello", "-n", "4", "--json"]
    env = dict(os.environ, PI2_CACHE_DIR=cache)
    group = None
    if a.cap_mib:
        group = f"/sys/fs/cgroup/memory/pi2-conversion-{os.getpid()}"
        os.makedirs(group, exist_ok=True)
        open(f"{group}/memory.limit_in_bytes", "w").write(str(a.cap_mib << 20))
        subprocess.run(["sync"])
        open("/proc/sys/vm/drop_caches", "w").write("3")
        cmd = ["sh", "-c", f'echo $$ > {group}/cgroup.procs; exec "$@"', "sh"] + cmd
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines = []
    threading.Thread(target=lambda: err_lines.extend(p.stderr), daemon=True).start()
    peak_anon = peak_total = peak_file = 0
    while p.poll() is None:
        anon = file = 0
        for q in tree(p.pid):
            x, y = rss_kib(q)
            anon, file = anon + x, file + y
        peak_anon = max(peak_anon, anon)
        if anon + file > peak_total:
            peak_total, peak_file = anon + file, file
        time.sleep(0.02)
    out = p.stdout.read()
    seconds = time.time() - t0
    stderr = "".join(err_lines)
    converted = next((l for l in stderr.splitlines() if "converted in" in l), "")
    phases = dict((k, float(v)) for k, v in re.findall(r"(\w[\w -]*?) ([\d.]+) s", converted.split("(", 1)[-1]))
    own = re.search(r"peak memory (\d+) MiB of its own \((\d+) MiB", converted)
    result = {
        "model": os.path.basename(a.model),
        "model_bytes": os.path.getsize(a.model),
        "budget": a.budget,
        "cap_mib": a.cap_mib,
        "exit_code": p.returncode,
        "seconds": round(seconds, 1),
        "phases_s": phases,
        "sampled_peak_anon_mib": round(peak_anon / 1024),
        "sampled_peak_total_mib": round(peak_total / 1024),
        "sampled_peak_file_mib": round(peak_file / 1024),
        "reported_own_mib": int(own.group(1)) if own else None,
        "reported_resident_mib": int(own.group(2)) if own else None,
        "converted_line": converted,
        "error": None if p.returncode == 0 else stderr.strip().splitlines()[-1:],
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "command": " ".join(cmd[-12:]),
        "date": time.strftime("%Y-%m-%d"),
    }
    if group:
        result["cgroup_max_usage_mib"] = int(open(f"{group}/memory.max_usage_in_bytes").read()) >> 20
        oom = open(f"{group}/memory.oom_control").read()
        result["cgroup_oom_kills"] = int(re.search(r"oom_kill (\d+)", oom).group(1)) if "oom_kill " in oom else None
        os.rmdir(group)
    shutil.rmtree(cache, ignore_errors=True)
    path = os.path.join(ROOT, "docs/measurements", f"conversion-memory-{a.name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
