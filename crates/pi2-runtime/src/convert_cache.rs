//! The one-command flow: a plain GGUF asked to run under a memory budget is profiled and
//! converted once, on the built-in calibration text with the default options, into the
//! per-user cache (`<cache>/converted/`, see [`crate::device::cache_dir`]), and later runs reuse
//! that file. The cache key is the source file's SHA-256, pi2's converted-file format version
//! and a digest of the conversion recipe (the default options and calibration size), so neither
//! a changed model file nor changed defaults are served a stale conversion; the SHA-256 itself is
//! remembered with the file's size, modification time and inode ([`file_sha256`]) so that an
//! unchanged file is not read again.

use crate::error::{Result, RuntimeError};
use pi2_convert::pipeline::{self, ConvertOptions, ProfileOptions};
use pi2_engine::{Engine, EngineConfig};
use pi2_model::Model;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Calibration tokens the one-command conversion profiles and calibrates on.
pub const CALIBRATION_TOKENS: usize = 4096;

/// Whether the model file is already a pi2 conversion.
pub fn is_converted(model: &Model) -> bool {
    model.file.get(pi2_model::bundle::KEY_VERSION).is_some()
}

/// Where the conversion of a file with `sha256` lives.
pub fn cached_path(source: &Path, sha256: &str) -> PathBuf {
    let stem = source
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    crate::device::cache_dir().join("converted").join(format!(
        "{stem}-{}-v{}-{}.gguf",
        &sha256[..16.min(sha256.len())],
        pi2_model::bundle::FORMAT_VERSION,
        recipe()
    ))
}

/// A short digest of everything the one-command conversion does besides reading the model:
/// a release that changes a default makes a new cache entry instead of reusing an old one.
fn recipe() -> String {
    let text = format!(
        "{:?}|{:?}|{CALIBRATION_TOKENS}",
        ProfileOptions::default(),
        ConvertOptions::default()
    );
    Sha256::digest(text.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What [`converted`] did.
#[derive(Clone, Debug)]
pub struct Conversion {
    /// The converted file to run.
    pub path: PathBuf,
    /// Whether it was made now (else found in the cache).
    pub made: bool,
}

/// The converted file for `source`: `source` itself if it is already converted, else its cached
/// conversion, made now (profile and convert, `engine` running the dense model) if there is
/// none; `notice` is called once before a conversion starts, with where it will go, and
/// `progress` with each phase.
pub fn converted(
    source: &Path,
    engine: &EngineConfig,
    notice: impl FnOnce(&Path),
    progress: pipeline::Progress<'_>,
) -> Result<Conversion> {
    let model = Model::load(source)?;
    if is_converted(&model) {
        return Ok(Conversion {
            path: source.to_path_buf(),
            made: false,
        });
    }
    let sha = file_sha256(source)?;
    let path = cached_path(source, &sha);
    if path.exists() && Model::load(&path).is_ok_and(|m| is_converted(&m)) {
        return Ok(Conversion { path, made: false });
    }
    let dir = path.parent().expect("the cache path has a folder");
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Io {
        path: dir.display().to_string(),
        msg: e.to_string(),
    })?;
    notice(&path);
    let tokens = pi2_convert::calibration::builtin_tokens(&model, CALIBRATION_TOKENS)?;
    let mut e = Engine::new(&model, engine)?;
    let popts = ProfileOptions::default();
    let (profile, _trace) = pipeline::profile(&model, source, &mut e, &tokens, &popts, progress)?;
    drop(e);
    let copts = ConvertOptions::default();
    pipeline::convert_file(
        &model,
        source,
        Some(&profile),
        &tokens,
        engine,
        &copts,
        &path,
        true,
        progress,
    )?;
    Ok(Conversion { path, made: true })
}

/// The SHA-256 of `path` (hex), remembered in `<cache>/sha256-stamps.json` with the file's size,
/// modification time, inode and change time: an unchanged file is not read again, a changed one always is.
pub fn file_sha256(path: &Path) -> Result<String> {
    let io = |e: std::io::Error| RuntimeError::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let canonical = path.canonicalize().map_err(io)?;
    let stamp = Stamp::of(&meta);
    let stamps_path = crate::device::cache_dir().join("sha256-stamps.json");
    let mut stamps: serde_json::Map<String, serde_json::Value> = std::fs::read(&stamps_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let key = canonical.display().to_string();
    if let Some(sha) = stamps.get(&key).and_then(|v| stamp.matches(v)) {
        return Ok(sha);
    }
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let sha: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    stamps.insert(key, stamp.with(&sha));
    // Remembering is an optimisation: a cache folder that cannot be written costs a re-read.
    if let Some(dir) = stamps_path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = stamps_path.with_extension(format!("json.{}", std::process::id()));
    if std::fs::write(&tmp, serde_json::to_vec(&stamps).unwrap_or_default()).is_ok() {
        let _ = std::fs::rename(&tmp, &stamps_path);
    }
    Ok(sha)
}

/// What identifies a file's contents without reading them: size, modification time, inode and
/// change time (which no user can set back, so a rewrite that restores the modification time
/// is still seen).
struct Stamp {
    size: u64,
    mtime_ns: i128,
    inode: u64,
    ctime_ns: i128,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        #[cfg(unix)]
        let (inode, ctime_ns) = {
            use std::os::unix::fs::MetadataExt;
            (
                meta.ino(),
                meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
            )
        };
        #[cfg(not(unix))]
        let (inode, ctime_ns) = (0, 0);
        Self {
            size: meta.len(),
            mtime_ns,
            inode,
            ctime_ns,
        }
    }

    fn with(&self, sha: &str) -> serde_json::Value {
        serde_json::json!({
            "size": self.size,
            "mtime_ns": self.mtime_ns.to_string(),
            "inode": self.inode,
            "ctime_ns": self.ctime_ns.to_string(),
            "sha256": sha,
        })
    }

    /// The remembered SHA-256 if `v` was recorded for this very stamp.
    fn matches(&self, v: &serde_json::Value) -> Option<String> {
        let same = v.get("size")?.as_u64()? == self.size
            && v.get("mtime_ns")?.as_str()? == self.mtime_ns.to_string()
            && v.get("inode")?.as_u64()? == self.inode
            && v.get("ctime_ns")?.as_str()? == self.ctime_ns.to_string();
        same.then(|| v.get("sha256")?.as_str().map(String::from))?
    }
}
