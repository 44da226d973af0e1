//! Memory as the system counts it: what this process could still take before the system or its
//! control group pushes back (the machine's `MemAvailable`, and under a cgroup memory limit, v1
//! or v2, the limit less the group's anonymous memory: page cache is reclaimable, as
//! `MemAvailable` counts it), and the most anonymous memory this process held while a piece of
//! work ran (the kernel keeps only the peak of all resident pages, mapped files' included).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Samples this process's anonymous memory (`RssAnon`) every few milliseconds on a thread of its
/// own until [`AnonPeak::finish`], keeping the largest: a peak of the memory a piece of work
/// itself held, where `VmHWM` also counts the files it mapped.
pub struct AnonPeak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnonPeak {
    /// Starts sampling (nothing is sampled where `/proc/self/status` cannot be read).
    pub fn start() -> AnonPeak {
        let (stop, peak) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::Builder::new()
            .name("pi2-memory".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Some(now) = anon_bytes() {
                        p.fetch_max(now, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
            .ok();
        AnonPeak { stop, peak, thread }
    }

    /// Stops sampling; the largest anonymous memory seen, if any was.
    pub fn finish(mut self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let last = anon_bytes().unwrap_or(0);
        Some(self.peak.load(Ordering::Relaxed).max(last)).filter(|&b| b > 0)
    }
}

impl Drop for AnonPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "RssAnon:").map(|kib| kib * 1024)
}

/// Bytes available to this process now, where the system tells (Linux and Android).
pub fn available_bytes() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| kib_field(&m, "MemAvailable:"))
        .map(|kib| kib * 1024);
    let group = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| group_available(&c, Path::new("/sys/fs/cgroup")));
    match (machine, group) {
        (Some(m), Some(g)) => Some(m.min(g)),
        (m, g) => m.or(g),
    }
}

/// `MemAvailable:`-style `key value kB` lines.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// `key value` lines of a `memory.stat`.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Room under this process's cgroup memory limit (`cgroup`: `/proc/self/cgroup`, `root` the
/// cgroup mount); `None` without a limit.
fn group_available(cgroup: &str, root: &Path) -> Option<u64> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // v2: `0::/path`, memory.max ("max": no limit) and memory.stat's `anon`.
            let dir = root.join(path);
            let Some(max) = read(dir.join("memory.max")) else {
                continue;
            };
            let Ok(limit) = max.trim().parse::<u64>() else {
                continue;
            };
            let anon = read(dir.join("memory.stat")).and_then(|s| stat_field(&s, "anon"))?;
            return Some(limit.saturating_sub(anon));
        }
        if controllers.split(',').any(|c| c == "memory") {
            // v1: memory.limit_in_bytes (a huge value: no limit) and memory.stat's `total_rss`.
            let dir = root.join("memory").join(path);
            let limit: u64 = read(dir.join("memory.limit_in_bytes"))?
                .trim()
                .parse()
                .ok()?;
            if limit >= 1 << 60 {
                return None;
            }
            let rss = read(dir.join("memory.stat")).and_then(|s| stat_field(&s, "total_rss"))?;
            return Some(limit.saturating_sub(rss));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn the_peak_of_anonymous_memory_is_seen() {
        let watch = AnonPeak::start();
        let before = anon_bytes().unwrap();
        // 64 MiB touched, held a moment, then freed: the peak keeps it.
        let mut block = vec![0u8; 64 << 20];
        block.iter_mut().step_by(4096).for_each(|b| *b = 1);
        std::thread::sleep(Duration::from_millis(50));
        drop(std::hint::black_box(block));
        let peak = watch.finish().unwrap();
        assert!(peak >= before + (60 << 20), "peak {peak}, before {before}");
    }

    #[test]
    fn limits_of_both_cgroup_versions_are_read() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory/capped");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "268435456\n").unwrap();
        std::fs::write(
            v1.join("memory.stat"),
            "cache 5\nrss 9\ntotal_rss 68435456\n",
        )
        .unwrap();
        let got = group_available("4:memory:/capped\n1:cpu:/\n", root.path());
        assert_eq!(got, Some(200_000_000));
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(group_available("4:memory:/capped\n", root.path()), None);

        let v2 = root.path().join("user.slice/app");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "1000\n").unwrap();
        std::fs::write(v2.join("memory.stat"), "anon 400\nfile 7000\n").unwrap();
        assert_eq!(
            group_available("0::/user.slice/app\n", root.path()),
            Some(600)
        );
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(group_available("0::/user.slice/app\n", root.path()), None);
        assert_eq!(group_available("", root.path()), None);
        assert_eq!(
            kib_field(
                "MemTotal: 10 kB\nMemAvailable:   2048 kB\n",
                "MemAvailable:"
            ),
            Some(2048)
        );
    }
}
