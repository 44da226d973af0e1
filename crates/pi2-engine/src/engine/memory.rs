//! What an engine holds and will hold, for memory budgets: the KV cache at the start and when
//! the context is full, and the working buffers.

use super::Engine;

impl Engine<'_> {
    /// Bytes the KV cache holds after a first batch of `n_batch` tokens (what an offload
    /// charges at the start; later positions are charged as they are written).
    pub fn kv_bytes_start(&self, n_batch: usize) -> usize {
        crate::kv::kv_bytes(&self.model.config, n_batch.clamp(1, self.n_ctx), n_batch)
    }

    /// Bytes the KV cache holds when the context is full, with batches of up to `n_batch`
    /// tokens (sliding-window layers hold their window plus one batch).
    pub fn kv_bytes_full(&self, n_batch: usize) -> usize {
        crate::kv::kv_bytes(&self.model.config, self.n_ctx, n_batch)
    }

    /// Working buffers for batches of up to `n_batch` tokens (activations, predictor scores,
    /// cluster partials) with logits for the last one ([`Logits::Last`](super::Logits::Last); each further row of
    /// logits takes `4 * n_vocab` bytes more), an upper estimate for memory budgets.
    pub fn scratch_bytes(&self, n_batch: usize) -> usize {
        let c = &self.model.config;
        let n = n_batch.max(1);
        let per_token = 8 * c.n_embd + c.q_dim() + 2 * c.kv_dim() + 4 * c.n_ff;
        // The sparse head's buffers (its factors are mapped tensors, which an offload counts as
        // resident; it packs no copy under a budget).
        let head = self.head.head.map_or(0, |h| h.scratch_bytes());
        4 * (n * per_token + c.n_vocab + self.threads() * n * c.n_embd + 2 * c.n_ff * 3)
            + 4 * self.n_ctx * rayon::current_num_threads().max(self.threads())
            + head
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }
}
