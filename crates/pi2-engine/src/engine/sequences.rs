//! Several sequences on one engine: each keeps its own KV cache ([`SequenceCache`]) while the
//! weights, the neuron cache and the memory budget are the engine's. A decode step of several
//! sequences runs as one pass ([`Engine::forward_sequences`]): attention per sequence on its
//! own cache, the FFN and the head once for all of them, so under a budget the neurons the
//! tokens share are read once.

use super::Engine;
use super::Pass;
use crate::error::EngineError;
use crate::kv::KvCache;
use crate::mixer;
use crate::states::Keep;
use pi2_model::TokenId;

/// One sequence's KV cache, kept outside the engine that runs it (see
/// [`Engine::swap_sequence`] and [`Engine::forward_sequences`]).
pub struct SequenceCache(pub(crate) KvCache);

impl SequenceCache {
    /// Tokens it holds.
    pub fn len(&self) -> usize {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Bytes of memory it holds.
    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }
}

impl Engine<'_> {
    /// An empty KV cache for another sequence of this engine.
    pub fn new_sequence(&self) -> SequenceCache {
        let c = &self.model.config;
        SequenceCache(KvCache::new(c, self.n_ctx))
    }

    /// Swaps the engine's own sequence with `seq`: the engine's calls ([`Engine::forward`],
    /// [`Engine::truncate`], ...) then work on what `seq` held; swap again to give it back.
    pub fn swap_sequence(&mut self, seq: &mut SequenceCache) {
        std::mem::swap(&mut self.kv, &mut seq.0);
    }

    /// Bytes of KV cache (and the positions they hold) of this engine's sequences that the
    /// next passes do not touch: a memory budget charges them with the engine's own (set it
    /// before each pass whenever other sequences grew).
    pub fn set_parked_kv(&mut self, bytes: usize, positions: usize) {
        self.parked_kv = (bytes, positions);
    }

    /// Forgets the engine's own sequence and gives its KV cache's memory back (a cache only
    /// grows otherwise: [`Engine::truncate`] keeps the memory for the next tokens).
    pub fn release(&mut self) {
        let c = &self.model.config;
        self.kv = KvCache::new(c, self.n_ctx);
    }

    /// One decode step for each of several sequences at once: `tokens[i]` follows what
    /// `seqs[i]` holds. Returns one logits row per sequence, each what that sequence's own
    /// one-token step computes, bit for bit (as [`Engine::forward_decode`] keeps a checked
    /// draft's). Under a memory budget the batch reads about the union of its tokens' neurons
    /// once, and the caches' growth is charged with [`Engine::set_parked_kv`]'s bytes and the
    /// engine's own sequence.
    pub fn forward_sequences(
        &mut self,
        seqs: &mut [&mut SequenceCache],
        tokens: &[TokenId],
    ) -> Result<&[f32], EngineError> {
        let c = &self.model.config;
        if tokens.is_empty() {
            return Err(EngineError::Empty);
        }
        if seqs.len() != tokens.len() {
            return Err(EngineError::Shared(format!(
                "{} tokens for {} sequences: one token each is needed",
                tokens.len(),
                seqs.len()
            )));
        }
        if !self.checks_batches_as_decode() {
            return Err(EngineError::Shared(
                "a sparse mixture-of-experts model routes a batch's experts densely, unlike its one-token steps: run one sequence at a time".into(),
            ));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::BadToken(bad, c.n_vocab));
        }
        if let Some(s) = seqs.iter().find(|s| s.0.len + 1 > self.n_ctx) {
            return Err(EngineError::ContextFull {
                needed: s.0.len + 1,
                n_ctx: self.n_ctx,
            });
        }
        self.prepare();
        let pool = self.pool.clone();
        pool.install(|| self.sequences_inner(seqs, tokens))?;
        Ok(&self.s.logits[..tokens.len() * c.n_vocab])
    }

    fn sequences_inner(
        &mut self,
        seqs: &mut [&mut SequenceCache],
        tokens: &[TokenId],
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let (n, d) = (tokens.len(), c.n_embd);
        let grown: usize = (seqs.iter())
            .map(|s| s.0.bytes_at(s.0.len + 1, 1, Keep::Last))
            .sum();
        let (parked, parked_positions) = self.parked_kv;
        let positions =
            self.kv.len + parked_positions + seqs.iter().map(|s| s.0.len + 1).sum::<usize>();
        let kv = self.kv.bytes() + parked + grown;
        self.store.charge_kv(kv as u64, positions)?;
        self.embed(tokens)?;
        // Rows swap between the stream and its normalized copy: both hold every token.
        crate::scratch::grow(&mut self.s.xn, n * d);
        for (li, l) in m.weights.layers.iter().enumerate() {
            self.route_before_attention(li, l, n, Pass::Decode)?;
            let mats = self.store.attention(li)?;
            for (t, seq) in seqs.iter_mut().enumerate() {
                // Row t is a one-token pass at its own sequence's next position.
                let pos = seq.0.len;
                self.s
                    .rope
                    .fill(&self.inv_freq, self.model.config.rope_mscale, pos, 1);
                if let Some(fl) = &self.inv_freq_local {
                    self.s
                        .rope_local
                        .fill(fl, self.model.config.rope_mscale, pos, 1);
                }
                super::forward::swap_rows(&mut self.s, t, d);
                let (s, kv) = (&mut self.s, &mut seq.0);
                mixer::block(&self.ks, f, c, l, mats, s, kv, li, pos, 1, Keep::Last);
                super::forward::swap_rows(&mut self.s, t, d);
            }
            self.ffn_layer(li, l, n, Pass::Decode, None)?;
        }
        for seq in seqs.iter_mut() {
            seq.0.len += 1;
        }
        self.head(n, 0, None)
    }
}
