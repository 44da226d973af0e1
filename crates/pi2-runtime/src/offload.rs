//! The offloaded FFN for an engine: the budget's regions sized with the engine's own KV cache
//! and batch buffers, hot neurons pinned by the converted model's frequencies.

use crate::error::{Result, RuntimeError};
use pi2_engine::{Engine, Offload, OffloadConfig, SparseFfn};
use pi2_model::Model;
use std::path::Path;

/// The offloaded FFN under `cfg`, for `engine` (its KV cache and buffers for batches of
/// `n_batch` tokens count against the budget). Direct I/O that the file system refuses falls
/// back to buffered reads; [`Offload::engine`] says why.
pub fn build(
    cfg: &OffloadConfig,
    model: &Model,
    path: &Path,
    sparse: &SparseFfn<'_>,
    engine: &Engine<'_>,
    n_batch: usize,
) -> Result<Offload> {
    let freq = pi2_engine::unit_frequencies(model)?;
    let (kv, scratch) = (
        engine.kv_bytes_full(n_batch) as u64,
        engine.scratch_bytes(n_batch) as u64,
    );
    match Offload::new(model, sparse, path, kv, scratch, freq.as_deref(), cfg) {
        Err(pi2_engine::EngineError::Budget(pi2_cache::CacheError::OverBudget {
            minimum, ..
        })) => Err(too_small(
            cfg.budget, minimum, model, sparse, engine, n_batch,
        )),
        other => Ok(other?),
    }
}

/// A budget below the least: what it needs, what the context's KV cache takes of that, and
/// what to change (a larger budget, or the largest context that fits this one).
fn too_small(
    budget: u64,
    minimum: u64,
    model: &Model,
    sparse: &SparseFfn<'_>,
    engine: &Engine<'_>,
    n_batch: usize,
) -> RuntimeError {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let human = |b: u64| match b {
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b if b < 1 << 30 => format!("{:.1} MiB", mib(b)),
        b => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
    };
    let (kv, n_ctx) = (engine.kv_bytes_full(n_batch) as u64, engine.n_ctx());
    let scratch = engine.scratch_bytes(n_batch) as u64;
    let without_kv = pi2_engine::min_budget(model, sparse, 0, scratch).unwrap_or(minimum);
    let per_token = kv / n_ctx.max(1) as u64;
    let fitting_ctx = match budget.checked_sub(without_kv) {
        Some(room) if per_token > 0 => (room / per_token) as usize,
        _ => 0,
    };
    let context = match fitting_ctx {
        c if c >= 64 => format!(", or lower -c to {} to fit this budget", c.min(n_ctx - 1)),
        _ => String::new(),
    };
    RuntimeError::option(
        "--mem-budget",
        format!(
            "{} is too small for this model: it needs at least {}, of which the KV cache for \
             -c {n_ctx} takes {} and the buffers for {n_batch}-token batches {}; pass \
             --mem-budget {}M or more{context}",
            human(budget),
            human(minimum),
            human(kv),
            human(scratch),
            mib(minimum).ceil() as u64,
        ),
    )
}

/// The smallest budget `engine` can offload `model` under (batches of `n_batch`).
pub fn min_budget(
    model: &Model,
    sparse: &SparseFfn<'_>,
    engine: &Engine<'_>,
    n_batch: usize,
) -> Result<u64> {
    Ok(pi2_engine::min_budget(
        model,
        sparse,
        engine.kv_bytes_full(n_batch) as u64,
        engine.scratch_bytes(n_batch) as u64,
    )?)
}
