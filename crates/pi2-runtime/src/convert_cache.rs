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
    // One parsed model at a time: a large vocabulary's tokenizer is tens of MiB, and under a
    // tight memory cap two of them at once thrash the page cache instead of finishing.
    if is_converted(&Model::load(source)?) {
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
    let model = Model::load(source)?;
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

/// The SHA-256 of `path` (hex), remembered in `<cache>/sha256-stamps.json` with the file's
/// stamp ([`pi2_catalog::sha256_stamped`]): an unchanged file is not read again.
pub fn file_sha256(path: &Path) -> Result<String> {
    Ok(pi2_catalog::sha256_stamped(path, &stamps_path())?)
}

/// Where checksums of files are remembered.
pub fn stamps_path() -> PathBuf {
    crate::device::cache_dir().join("sha256-stamps.json")
}
