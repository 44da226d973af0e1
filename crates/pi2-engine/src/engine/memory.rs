//! What an engine holds and will hold, for memory budgets: the KV cache at the start and when
//! the context is full, and the working buffers. Free functions of the model and the
//! configuration, so that an offload is sized before the engine that runs it is built.

use super::{Engine, EngineConfig};
use pi2_model::Model;

/// Bytes the KV cache of an engine built with `cfg` holds after a first batch of `n_batch`
/// tokens (what an offload charges at the start; later positions are charged as they are
/// written).
pub fn kv_bytes_start(model: &Model, cfg: &EngineConfig, n_batch: usize) -> usize {
    let n_ctx = cfg.context(model);
    crate::kv::kv_bytes(&model.config, n_batch.clamp(1, n_ctx.max(1)), n_batch)
}

/// Bytes the KV cache holds when the context is full, with batches of up to `n_batch` tokens
/// (sliding-window layers hold their window plus one batch).
pub fn kv_bytes_full(model: &Model, cfg: &EngineConfig, n_batch: usize) -> usize {
    crate::kv::kv_bytes(&model.config, cfg.context(model), n_batch)
}

/// Working buffers for batches of up to `n_batch` tokens (activations, predictor scores,
/// cluster partials) with `cfg.logit_rows` rows of logits (one for [`Logits::Last`](super::Logits::Last);
/// each further row takes `4 * n_vocab` bytes more), an upper estimate for memory budgets.
pub fn scratch_bytes(model: &Model, cfg: &EngineConfig, n_batch: usize) -> usize {
    let c = &model.config;
    let n = n_batch.max(1);
    let threads = cfg.threads.max(1);
    // A gated Q projection is twice as wide; a delta net's widest rows (Q, K and V, before
    // and after its convolution, its output and gate) and one recurrent state.
    let (q, kv) = c.widest_qkv();
    let q = q * (1 + c.attn_output_gate as usize);
    let (delta_rows, state) = (0..c.n_layer)
        .filter_map(|li| match c.mixer(li) {
            pi2_model::Mixer::DeltaNet(dn) => {
                Some((2 * dn.conv_dim() + 2 * dn.value_dim(), dn.state_len()))
            }
            _ => None,
        })
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let ff = c.n_ff.max(c.n_ff_shared).max(c.n_ff_dense);
    // Per-layer inputs (Gemma 4): every layer's slice, and one layer's gate.
    let per_layer = c.n_embd_per_layer * (c.n_layer + 1);
    let per_token = 8 * c.n_embd + q + 2 * kv + (4 * ff).max(delta_rows) + per_layer;
    // A clustered head's logits in stored order and its centroid scores.
    let head = match model.file.get(pi2_model::bundle::KEY_HEAD_CLUSTER) {
        Some(_) => 2 * c.n_vocab,
        None => 0,
    };
    4 * (n * per_token
        + cfg.logit_rows.clamp(1, n) * c.n_vocab
        + head
        + threads * n * c.n_embd
        + 2 * c.n_ff * 3
        + state)
        // Not rayon::current_num_threads(): asking starts rayon's global pool, and sizing must
        // not start threads (a caller may fork after it, and a child's pool would be dead).
        + 4 * cfg.context(model) * attention_threads().max(threads)
}

/// Threads rayon's global pool has or will have (`RAYON_NUM_THREADS`, else the CPUs), without
/// starting it.
fn attention_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Engine<'_> {
    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }
}
