//! The offloaded FFN for an engine: the budget's regions sized with the engine's own KV cache
//! and batch buffers, hot neurons pinned by the converted model's frequencies.

use crate::error::Result;
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
    Ok(Offload::new(
        model,
        sparse,
        path,
        engine.kv_bytes_full() as u64,
        engine.scratch_bytes(n_batch) as u64,
        freq.as_deref(),
        cfg,
    )?)
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
        engine.kv_bytes_full() as u64,
        engine.scratch_bytes(n_batch) as u64,
    )?)
}
