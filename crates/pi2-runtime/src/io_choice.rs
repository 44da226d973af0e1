//! The reader's engine and depth for a device, measured once and cached per device
//! (`io-<fingerprint>.json` beside the hardware profiles), so every offloaded run reads at the
//! rate its device gives without anyone passing `--io-engine` or `--io-depth`.

use crate::device::{cache_dir, fingerprint};
use crate::error::Result;
use pi2_io::{IoEngine, ReaderChoice};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Time per measured point: about a second for the whole measurement.
const POINT_TIME: Duration = Duration::from_millis(120);

/// The cached file's format.
const VERSION: u32 = 1;

/// What is cached: the choice and the figures it came from (MB/s per engine and depth).
#[derive(Serialize, Deserialize)]
struct Cached {
    version: u32,
    engine: String,
    depth: usize,
    uring_depth: Option<usize>,
    measured: Vec<(String, usize, f64)>,
}

/// The engine and depth to read with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoChoice {
    pub engine: IoEngine,
    pub depth: usize,
    /// The best io_uring depth (`None`: no io_uring on this device).
    pub uring_depth: Option<usize>,
}

impl From<&ReaderChoice> for IoChoice {
    fn from(c: &ReaderChoice) -> Self {
        IoChoice {
            engine: c.engine,
            depth: c.depth,
            uring_depth: c.uring_depth,
        }
    }
}

fn engine_name(e: IoEngine) -> &'static str {
    match e {
        IoEngine::Pread => "pread",
        IoEngine::Uring => "uring",
    }
}

/// The choice for the device holding `path`: from this process's memory, the per-device cache,
/// or measured now (and cached). A measurement that fails (an unreadable file is reported
/// where it is opened for real) gives the portable default, `pread` four reads per group.
pub fn for_device(path: &Path) -> Result<IoChoice> {
    static SEEN: OnceLock<Mutex<HashMap<String, IoChoice>>> = OnceLock::new();
    let fp = fingerprint(path, None)?;
    let seen = SEEN.get_or_init(Default::default);
    if let Some(c) = seen.lock().expect("io choice table").get(&fp) {
        return Ok(*c);
    }
    let file = cache_dir().join(format!("io-{fp}.json"));
    let choice = match load(&file) {
        Some(c) => c,
        None => match pi2_io::measure_choice(path, POINT_TIME) {
            Ok(measured) => {
                let c = IoChoice::from(&measured);
                save(&file, &measured);
                c
            }
            Err(_) => IoChoice {
                engine: IoEngine::Pread,
                depth: 4,
                uring_depth: None,
            },
        },
    };
    seen.lock().expect("io choice table").insert(fp, choice);
    Ok(choice)
}

/// Measures the device holding `path` again and caches the choice (`pi2 profile-io --reader`).
pub fn remeasure(path: &Path) -> Result<ReaderChoice> {
    let fp = fingerprint(path, None)?;
    let measured =
        pi2_io::measure_choice(path, POINT_TIME).map_err(|e| crate::RuntimeError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
    save(&cache_dir().join(format!("io-{fp}.json")), &measured);
    Ok(measured)
}

fn load(file: &Path) -> Option<IoChoice> {
    let c: Cached = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    let engine = match c.engine.as_str() {
        "pread" => IoEngine::Pread,
        "uring" => IoEngine::Uring,
        _ => return None,
    };
    let valid = |d: usize| (1..=crate::options::MAX_IO_DEPTH).contains(&d);
    (c.version == VERSION && valid(c.depth) && c.uring_depth.is_none_or(valid)).then_some(
        IoChoice {
            engine,
            depth: c.depth,
            uring_depth: c.uring_depth,
        },
    )
}

/// Best effort: a cache that cannot be written only means measuring again next time.
fn save(file: &Path, c: &ReaderChoice) {
    let cached = Cached {
        version: VERSION,
        engine: engine_name(c.engine).into(),
        depth: c.depth,
        uring_depth: c.uring_depth,
        measured: c
            .points
            .iter()
            .map(|p| (p.engine.to_string(), p.depth, p.bytes_per_sec / 1e6))
            .collect(),
    };
    let Some(dir) = file.parent() else { return };
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok()
        && serde_json::to_vec_pretty(&cached)
            .ok()
            .is_some_and(|b| std::fs::write(&tmp, b).is_ok());
    if !ok || std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_choice_round_trips_and_a_damaged_one_is_measured_again() {
        let dir = std::env::temp_dir().join(format!("pi2-io-choice-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("io-x.json");
        let measured = pi2_io::choice::choose(vec![]);
        save(&file, &measured);
        assert_eq!(load(&file), Some(IoChoice::from(&measured)));
        std::fs::write(&file, br#"{"version":1,"engine":"uring","depth":0}"#).unwrap();
        assert_eq!(load(&file), None);
        std::fs::write(&file, b"\xff").unwrap();
        assert_eq!(load(&file), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
