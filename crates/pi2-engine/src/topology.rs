//! CPU topology: which cores are big, mid or little, and pinning threads to them.
//!
//! Phones mix core types (e.g. one prime core, a few mid cores, some efficiency cores) that differ
//! several-fold in speed; a thread left on a little core makes every parallel step wait for it.
//! Cores are grouped into clusters by their maximum frequency from
//! `/sys/devices/system/cpu/cpu*/cpufreq/cpuinfo_max_freq` (falling back to `cpu_capacity`, then
//! to one uniform cluster), fastest first.

use crate::EngineError;
use std::fmt;
use std::path::Path;

/// Where a cluster ranks by speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClusterKind {
    Big,
    Mid,
    Little,
}

impl ClusterKind {
    pub fn name(self) -> &'static str {
        match self {
            ClusterKind::Big => "big",
            ClusterKind::Mid => "mid",
            ClusterKind::Little => "little",
        }
    }
}

/// Cores sharing one maximum frequency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub kind: ClusterKind,
    /// Maximum frequency in kHz (or the `cpu_capacity` value); `None` when the OS does not say.
    pub max_freq_khz: Option<u64>,
    /// Logical CPU numbers, ascending.
    pub cpus: Vec<usize>,
}

/// The machine's online CPUs grouped into clusters, fastest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub clusters: Vec<Cluster>,
}

impl Topology {
    /// The running machine's topology (one uniform cluster where sysfs says nothing).
    pub fn detect() -> Topology {
        Self::from_sysfs(Path::new("/sys/devices/system/cpu")).unwrap_or_else(|_| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            Topology::uniform((0..n).collect())
        })
    }

    fn uniform(cpus: Vec<usize>) -> Topology {
        Topology {
            clusters: vec![Cluster {
                kind: ClusterKind::Big,
                max_freq_khz: None,
                cpus,
            }],
        }
    }

    /// Reads a sysfs CPU tree (`root` is normally `/sys/devices/system/cpu`).
    pub fn from_sysfs(root: &Path) -> Result<Topology, EngineError> {
        let err = |path: &Path, msg: String| EngineError::Sysfs {
            path: path.to_path_buf(),
            msg,
        };
        let online_path = root.join("online");
        let cpus = match std::fs::read_to_string(&online_path) {
            Ok(s) => parse_cpu_list(s.trim()).map_err(|msg| err(&online_path, msg))?,
            Err(_) => {
                let entries = std::fs::read_dir(root).map_err(|e| err(root, e.to_string()))?;
                let mut cpus: Vec<usize> = entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let name = e.file_name().into_string().ok()?;
                        name.strip_prefix("cpu")?.parse().ok()
                    })
                    .collect();
                cpus.sort_unstable();
                cpus
            }
        };
        if cpus.is_empty() {
            return Err(err(root, "no CPUs listed".into()));
        }
        let read_num = |cpu: usize, file: &str| -> Option<u64> {
            std::fs::read_to_string(root.join(format!("cpu{cpu}")).join(file))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        // One speed measure for every core, or none: mixing sources would rank cores wrongly.
        let speeds = ["cpufreq/cpuinfo_max_freq", "cpu_capacity"]
            .iter()
            .find_map(|file| {
                cpus.iter()
                    .map(|&c| read_num(c, file))
                    .collect::<Option<Vec<u64>>>()
            });
        let Some(speeds) = speeds else {
            return Ok(Topology::uniform(cpus));
        };
        let mut distinct: Vec<u64> = speeds.clone();
        distinct.sort_unstable_by(|a, b| b.cmp(a));
        distinct.dedup();
        let n = distinct.len();
        let clusters = distinct
            .iter()
            .enumerate()
            .map(|(rank, &f)| Cluster {
                kind: match rank {
                    0 => ClusterKind::Big,
                    r if r == n - 1 => ClusterKind::Little,
                    _ => ClusterKind::Mid,
                },
                max_freq_khz: Some(f),
                cpus: cpus
                    .iter()
                    .zip(&speeds)
                    .filter(|(_, &s)| s == f)
                    .map(|(&c, _)| c)
                    .collect(),
            })
            .collect();
        Ok(Topology { clusters })
    }

    /// All CPUs, fastest cluster first.
    pub fn cpus(&self) -> Vec<usize> {
        self.clusters.iter().flat_map(|c| c.cpus.clone()).collect()
    }

    /// CPUs named by a `--cores` value: cluster names (`big`, `mid`, `little`, `all`) and CPU
    /// numbers or ranges (`0-3,6`), comma-separated, in the order given (duplicates dropped).
    /// Threads are placed on them in that order, so `big,mid` fills the big cores first.
    pub fn select(&self, spec: &str) -> Result<Vec<usize>, EngineError> {
        let bad = |msg: String| EngineError::CoreSpec {
            spec: spec.to_string(),
            msg,
        };
        let all = self.cpus();
        let mut out: Vec<usize> = Vec::new();
        for part in spec.split(',').map(str::trim) {
            let picked: Vec<usize> = match part {
                "" => return Err(bad("empty item".into())),
                "all" => all.clone(),
                "big" | "mid" | "little" => {
                    let cpus: Vec<usize> = self
                        .clusters
                        .iter()
                        .filter(|c| c.kind.name() == part)
                        .flat_map(|c| c.cpus.clone())
                        .collect();
                    if cpus.is_empty() {
                        return Err(bad(format!("this machine has no {part} cores ({self})")));
                    }
                    cpus
                }
                _ => {
                    let cpus = parse_cpu_list(part).map_err(bad)?;
                    if let Some(c) = cpus.iter().find(|c| !all.contains(c)) {
                        return Err(bad(format!("CPU {c} is not online ({self})")));
                    }
                    cpus
                }
            };
            for c in picked {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Topology {
    /// `big 7 (1 core, 3.20 GHz), mid 2-6 (5 cores, 2.40 GHz), little 0-1 (2 cores, 1.80 GHz)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.clusters.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let n = c.cpus.len();
            let plural = if n == 1 { "" } else { "s" };
            write!(
                f,
                "{} {} ({n} core{plural}",
                c.kind.name(),
                format_cpu_list(&c.cpus)
            )?;
            match c.max_freq_khz {
                // cpufreq values are kHz (MHz-range numbers); cpu_capacity values are <= 1024.
                Some(k) if k > 10_000 => write!(f, ", {:.2} GHz)", k as f64 / 1e6)?,
                Some(k) => write!(f, ", capacity {k})")?,
                None => f.write_str(")")?,
            }
        }
        Ok(())
    }
}

/// Parses a kernel CPU list such as `0-3,6,8-9`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{t}` is not a CPU number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b - a > 4096 {
                    return Err(format!("bad CPU range `{part}`"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    if out.is_empty() {
        return Err("no CPUs given".into());
    }
    Ok(out)
}

/// The inverse of [`parse_cpu_list`] for sorted lists: `0-3,6`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// CPUs this process may run on (its affinity mask); `None` where the OS has no such notion.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Some((0..max).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    None
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<(), EngineError> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    unsafe {
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        if cpu >= max {
            return Err(EngineError::Pin {
                cpu,
                msg: format!("CPU numbers go up to {}", max - 1),
            });
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(EngineError::Pin {
                cpu,
                msg: std::io::Error::last_os_error().to_string(),
            });
        }
        Ok(())
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    Err(EngineError::Pin {
        cpu,
        msg: "thread pinning is only implemented for Linux and Android".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(
            parse_cpu_list("0-3,6,8-9").unwrap(),
            vec![0, 1, 2, 3, 6, 8, 9]
        );
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("").is_err());
    }

    #[test]
    fn pinning_to_an_allowed_cpu_sticks() {
        let Some(allowed) = allowed_cpus() else {
            return; // not Linux/Android: nothing to pin
        };
        let cpu = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![cpu]);
        })
        .join()
        .unwrap();
    }
}
