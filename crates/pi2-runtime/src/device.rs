//! This device as the planner sees it: the CPU's name and core classes, the storage a model is
//! read from (or an emulated one), their fingerprint, the per-device cache of hardware
//! profiles, and a model file's identity.

use crate::error::{Result, RuntimeError};
use crate::options::parse_emulate;
use pi2_engine::topology::Topology;
use pi2_model::Model;
use pi2_planner::hw::{CoreSpec, HardwareProfile};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where profiles of this device are cached: `$PI2_CACHE_DIR`, else `$XDG_CACHE_HOME/pi2`,
/// else `~/.cache/pi2`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PI2_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("pi2")
}

/// Where the routing of the mixture at `path` is kept between runs: a name from the file's
/// canonical path, size and modification time, so that a changed file starts afresh.
pub fn routing_file(path: &Path) -> Option<PathBuf> {
    let meta = std::fs::metadata(path).ok()?;
    let canon = std::fs::canonicalize(path).ok()?;
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    let mut h = Sha256::new();
    h.update(canon.as_os_str().as_encoded_bytes());
    h.update(meta.len().to_le_bytes());
    h.update(mtime.as_nanos().to_le_bytes());
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(cache_dir().join("routing").join(format!("{hex}.bin")))
}

/// The CPU's name as the OS reports it.
pub fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    for key in ["model name", "Hardware", "CPU part"] {
        if let Some(v) = info
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
        {
            return v.trim().to_string();
        }
    }
    std::env::consts::ARCH.to_string()
}

/// The storage device holding `path` (its device number).
fn storage_id(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).map_err(|source| RuntimeError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(format!("dev{}", meta.dev()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        Ok("unknown".into())
    }
}

/// The core classes of `topo`, as the hardware profile records them.
pub fn classes(topo: &Topology) -> Vec<CoreSpec> {
    topo.clusters
        .iter()
        .map(|c| CoreSpec {
            name: c.kind.name().to_string(),
            max_freq_khz: c.max_freq_khz,
            cpus: c.cpus.clone(),
        })
        .collect()
}

/// The storage a model at `path` is read from: its device, or the emulated one.
pub fn storage(path: &Path, emulate: Option<&str>) -> Result<String> {
    match emulate {
        Some(spec) => {
            parse_emulate(spec)?;
            Ok(format!("emulated {spec}"))
        }
        None => storage_id(path),
    }
}

/// This device's fingerprint, for a model stored at `path` (or on an emulated device).
pub fn fingerprint(path: &Path, emulate: Option<&str>) -> Result<String> {
    let fp: Vec<(Option<u64>, Vec<usize>)> = classes(&Topology::detect())
        .into_iter()
        .map(|c| (c.max_freq_khz, c.cpus))
        .collect();
    Ok(pi2_planner::hw::fingerprint(
        &cpu_name(),
        &fp,
        &pi2_planner::hw::tier_name(),
        &storage(path, emulate)?,
    ))
}

/// Where this device's hardware profile is cached.
pub fn hw_path(model_path: &Path, emulate: Option<&str>) -> Result<PathBuf> {
    Ok(cache_dir().join(format!("hw-{}.json", fingerprint(model_path, emulate)?)))
}

/// The hardware profile at `hw`, or this device's cached one.
pub fn load_hw(
    hw: Option<&Path>,
    model_path: &Path,
    emulate: Option<&str>,
) -> Result<HardwareProfile> {
    let p = match hw {
        Some(p) => p.to_path_buf(),
        None => hw_path(model_path, emulate)?,
    };
    if !p.exists() && hw.is_none() {
        return Err(RuntimeError::Unsupported(format!(
            "no hardware profile for this device at {}: run `pi2 profile-hw -m {}` first (about a minute)",
            p.display(),
            model_path.display()
        )));
    }
    Ok(HardwareProfile::load(&p)?)
}

/// A model file's identity: its header and tensor table (names, types, shapes, offsets) and
/// its size. Cheap for any model size; a re-converted or different model differs.
pub fn model_digest(model: &Model, path: &Path) -> Result<String> {
    use std::io::Read;
    let mut head = vec![0u8; model.file.data_offset as usize];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .map_err(|source| RuntimeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    let mut h = Sha256::new();
    h.update(&head);
    h.update(model.file.file_size().to_le_bytes());
    Ok(h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
