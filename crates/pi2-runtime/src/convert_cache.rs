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
    let engine = &conversion_engine(engine);
    let mut e = Engine::new(&model, engine)?;
    let popts = ProfileOptions {
        spill_dir: Some(dir.to_path_buf()),
        ..ProfileOptions::default()
    };
    let (profile, _) = pipeline::profile(&model, source, &mut e, &tokens, &popts, progress)?;
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

/// The engine a conversion runs the dense model with: `engine`'s threads and kernels, the
/// weights read in place from the file's mapping (no packed copy: the page cache can give
/// them back under a memory cap) and a context of one calibration chunk, so that the
/// conversion's own memory stays a fraction of the model's.
fn conversion_engine(engine: &EngineConfig) -> EngineConfig {
    EngineConfig {
        repack: false,
        // A chunk and the BOS before it.
        n_ctx: ProfileOptions::default().chunk + 1,
        // The most rows of logits a calibration pass asks for (a perplexity batch, the scored
        // half of a sensitivity chunk).
        logit_rows: 128,
        ..engine.clone()
    }
}

/// The most memory the one-command conversion of the dense plain `model` holds at once, besides
/// the model's pages it reads (page cache, which the system takes back under pressure):
/// `process`, this process's own memory, twice (the written file is loaded again to verify it),
/// the engine's KV cache and buffers for a calibration chunk, and the larger of the profile's
/// activation trace and the calibration's fired bits and final hidden states (with the inputs
/// predictors are fitted on), and the clustered head's working copies.
pub fn conversion_bytes(model: &Model, engine: &EngineConfig, process: u64) -> u64 {
    let c = &model.config;
    let cfg = conversion_engine(engine);
    let chunk = ProfileOptions::default().chunk;
    let engine = pi2_engine::kv_bytes_full(model, &cfg, chunk)
        + pi2_engine::scratch_bytes(model, &cfg, chunk);
    let tokens = CALIBRATION_TOKENS;
    let bits = c.n_layer * tokens * c.n_ff.div_ceil(64) * 8;
    let predictors =
        c.ffn_act.exact_sparsity() && ConvertOptions::default().predictor != Some(None);
    let inputs = match predictors {
        true => c.n_layer * tokens * c.n_embd * 4,
        false => 0,
    };
    let calibration = bits + inputs + tokens * c.n_embd * 4;
    // The profile's trace, or the calibration's samples (never both at once).
    let recorded = bits.max(calibration);
    let head = ConvertOptions::default().layout.head.map_or(0, |h| {
        let clusters = c.n_vocab.div_ceil(h.cluster);
        4 * (2 * clusters * c.n_embd + 2 * c.n_vocab + 4096 * c.n_embd)
    });
    2 * process + (engine + recorded + head) as u64
}

/// Refuses to start the one-command conversion of `model` (at `path`) where this device cannot
/// hold it ([`conversion_bytes`] against the memory available, under a cgroup limit too), saying
/// what it needs and where to convert instead.
pub fn check_room(model: &Model, path: &Path, engine: &EngineConfig) -> Result<()> {
    let process = crate::offload::process_bytes(model);
    // The conversion's child starts as a copy of this process: that memory is held already.
    let more = conversion_bytes(model, engine, process).saturating_sub(process);
    room(path, more, crate::memory::available_bytes())
}

/// Whether `more` bytes fit in `available` (unknown: yes), else the error saying what to do.
fn room(path: &Path, more: u64, available: Option<u64>) -> Result<()> {
    let mib = |b: u64| b.div_ceil(1 << 20);
    match available {
        Some(available) if more > available => Err(RuntimeError::Unsupported(format!(
            "converting {} for the memory budget needs about {} MiB more memory and {} MiB are \
             available here: convert it on a computer (`pi2 profile`, then `pi2 convert`: \
             docs/android.md) and run the converted file, or free memory",
            path.display(),
            mib(more),
            mib(available)
        ))),
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_that_cannot_fit_is_refused_before_it_starts() {
        let p = Path::new("m.gguf");
        let err = room(p, 300 << 20, Some(100 << 20)).unwrap_err().to_string();
        assert!(err.contains("needs about 300 MiB"), "{err}");
        assert!(
            err.contains("100 MiB are available") && err.contains("pi2 convert"),
            "{err}"
        );
        assert!(room(p, 300 << 20, Some(400 << 20)).is_ok());
        assert!(room(p, 300 << 20, None).is_ok());
    }
}
