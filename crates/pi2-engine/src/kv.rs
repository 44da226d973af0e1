//! The key/value cache: per layer, f16 keys and values (llama.cpp's default: half the memory
//! of f32, and the rounding the reference outputs were made with). Global layers keep every
//! position, growing as positions are used. Sliding-window layers keep a ring of the last
//! `window - 1 + batch` positions: each token of a batch still sees its whole window while the
//! batch is written, and decode needs no more than the window.

use half::f16;

/// One layer's cache as attention reads it: position `p` is at slot `p % ring`; a sliding
/// layer's query attends to the last `window` positions only.
pub(crate) struct KvView<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub ring: usize,
    pub window: Option<usize>,
}

struct LayerKv {
    k: Vec<f16>,
    v: Vec<f16>,
    /// Sliding-window length, if the layer slides.
    window: Option<usize>,
    /// Positions the buffers address (slot = position % ring): `n_ctx` for global layers.
    ring: usize,
}

pub(crate) struct KvCache {
    layers: Vec<LayerKv>,
    /// Positions held.
    pub len: usize,
    /// One past the highest position written since the cache was last emptied: sliding
    /// layers hold positions from `high - ring` on.
    high: usize,
    /// Positions it may hold.
    n_ctx: usize,
}

/// Positions a sliding layer's ring needs for batches of `n_batch` tokens.
pub(crate) fn ring_len(window: usize, n_batch: usize, n_ctx: usize) -> usize {
    (window - 1 + n_batch.max(1)).min(n_ctx)
}

/// Bytes of a full KV cache of `n_ctx` positions for model `c`, with batches of up to
/// `n_batch` tokens (sliding-window layers hold their window plus one batch).
pub fn kv_bytes(c: &pi2_model::ModelConfig, n_ctx: usize, n_batch: usize) -> usize {
    let positions: usize = (0..c.n_layer)
        .map(|li| match c.window(li) {
            Some(w) => ring_len(w, n_batch, n_ctx),
            None => n_ctx,
        })
        .sum();
    2 * positions * c.kv_dim() * std::mem::size_of::<f16>()
}

impl KvCache {
    /// A cache for layers with these windows (`None`: global).
    pub fn new(windows: impl IntoIterator<Item = Option<usize>>, n_ctx: usize) -> Self {
        let layers = windows
            .into_iter()
            .map(|window| LayerKv {
                k: Vec::new(),
                v: Vec::new(),
                window,
                ring: match window {
                    Some(w) => ring_len(w, 1, n_ctx),
                    None => n_ctx,
                },
            })
            .collect();
        Self {
            layers,
            len: 0,
            high: 0,
            n_ctx,
        }
    }

    /// Stores layer `li`'s keys and values of positions `pos0..pos0 + n` (`kvd` wide each)
    /// and returns the layer's cache. Global layers grow in steps (decode does not reallocate
    /// every token); a sliding layer's ring widens when a batch needs more room.
    pub fn append(
        &mut self,
        li: usize,
        pos0: usize,
        k: &[f32],
        v: &[f32],
        kvd: usize,
    ) -> KvView<'_> {
        let n = k.len() / kvd;
        let high = self.high;
        let n_ctx = self.n_ctx;
        let l = &mut self.layers[li];
        match l.window {
            Some(w) => {
                let need = ring_len(w, n, n_ctx);
                if need > l.ring || l.k.len() < l.ring * kvd {
                    l.relayout(need.max(l.ring), kvd, high.max(pos0));
                }
            }
            None => {
                // Address space for the whole context at once, memory as positions are
                // written: the buffers never move, and what they hold is what has been used
                // (an offload charges it as it grows).
                if l.k.capacity() < n_ctx * kvd {
                    l.k.reserve_exact(n_ctx * kvd - l.k.len());
                    l.v.reserve_exact(n_ctx * kvd - l.v.len());
                }
                let need = (pos0 + n) * kvd;
                if l.k.len() < need {
                    l.k.resize(need, f16::ZERO);
                    l.v.resize(need, f16::ZERO);
                }
            }
        }
        for (t, (kr, vr)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
            let slot = (pos0 + t) % l.ring * kvd;
            for (dst, &src) in l.k[slot..slot + kvd].iter_mut().zip(kr) {
                *dst = f16::from_f32(src);
            }
            for (dst, &src) in l.v[slot..slot + kvd].iter_mut().zip(vr) {
                *dst = f16::from_f32(src);
            }
        }
        if li + 1 == self.layers.len() {
            self.high = self.high.max(pos0 + n);
        }
        let l = &self.layers[li];
        KvView {
            k: bytemuck::cast_slice(&l.k[..]),
            v: bytemuck::cast_slice(&l.v[..]),
            ring: l.ring,
            window: l.window,
        }
    }

    /// Keep the first `n` positions, or none when a sliding layer has already overwritten
    /// part of what position `n` would attend to. Returns the positions kept.
    pub fn truncate(&mut self, n: usize) -> usize {
        let n = n.min(self.len);
        let lost = self.layers.iter().any(|l| match l.window {
            Some(w) => n.saturating_sub(w - 1) < self.high.saturating_sub(l.ring),
            None => false,
        });
        self.len = if lost { 0 } else { n };
        if self.len == 0 {
            self.high = 0;
        }
        self.len
    }

    /// Bytes held now (of a global layer, the positions written; its reserved address space
    /// beyond them is not memory).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l.window {
                Some(_) => (l.k.capacity() + l.v.capacity()) * 2,
                None => (l.k.len() + l.v.len()) * 2,
            })
            .sum()
    }

    /// Bytes held once positions up to `end` are written by a batch of `n` (`kvd` wide).
    pub fn bytes_at(&self, end: usize, n: usize, kvd: usize) -> usize {
        let end = end.min(self.n_ctx);
        self.layers
            .iter()
            .map(|l| match l.window {
                Some(w) => 2 * 2 * kvd * ring_len(w, n, self.n_ctx).max(l.ring),
                None => 2 * 2 * kvd * end.max(l.k.len() / kvd.max(1)),
            })
            .sum()
    }
}

impl LayerKv {
    /// Widen the ring to `ring` positions, moving the positions still held (those below
    /// `high`, the last `self.ring` of them) to their new slots.
    fn relayout(&mut self, ring: usize, kvd: usize, high: usize) {
        let (mut k, mut v) = (vec![f16::ZERO; ring * kvd], vec![f16::ZERO; ring * kvd]);
        if !self.k.is_empty() {
            for p in high.saturating_sub(self.ring)..high {
                let (from, to) = (p % self.ring * kvd, p % ring * kvd);
                k[to..to + kvd].copy_from_slice(&self.k[from..from + kvd]);
                v[to..to + kvd].copy_from_slice(&self.v[from..from + kvd]);
            }
        }
        (self.k, self.v, self.ring) = (k, v, ring);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(view: &KvView<'_>, p: usize, kvd: usize) -> Vec<f32> {
        assert!(view.window.is_none_or(|w| w <= view.ring));
        let s = p % view.ring * kvd;
        view.k[s..s + kvd]
            .iter()
            .map(|&b| f16::from_bits(b).to_f32())
            .collect()
    }

    #[test]
    fn global_layers_hold_the_positions_written() {
        let mut kv = KvCache::new([None, None], 8);
        let view = kv.append(1, 0, &[1.0, 2.0], &[3.0, 4.0], 2);
        assert_eq!((view.k.len(), view.ring), (2, 8));
        assert_eq!(f16::from_bits(view.v[1]).to_f32(), 4.0);
        assert_eq!(
            kv.bytes(),
            8,
            "one position of one layer: 2 values of k and v, 2 bytes each"
        );
        assert_eq!(
            kv.bytes_at(4, 1, 2),
            2 * 2 * 2 * 4 * 2,
            "four positions of both layers"
        );
        let view = kv.append(1, 1, &[5.0, 6.0], &[7.0, 8.0], 2);
        assert_eq!(view.k.len(), 4, "the positions written");
        assert_eq!(read(&view, 1, 2), [5.0, 6.0]);
        assert_eq!(kv.bytes(), 2 * 2 * 2 * 2);
    }

    #[test]
    fn sliding_layers_keep_every_window_a_batch_needs() {
        let (w, kvd) = (4, 1);
        let mut kv = KvCache::new([Some(w)], 64);
        // Decode: a ring of the window.
        for p in 0..10 {
            let view = kv.append(0, p, &[p as f32], &[0.0], kvd);
            assert_eq!(view.ring, w);
            for q in p + 1 - w.min(p + 1)..=p {
                assert_eq!(read(&view, q, kvd), [q as f32], "decode {p} sees {q}");
            }
            kv.len = p + 1;
        }
        // A batch of 5: the ring widens to w - 1 + 5 and the held positions move with it.
        let batch: Vec<f32> = (10..15).map(|p| p as f32).collect();
        let view = kv.append(0, 10, &batch, &[0.0; 5], kvd);
        assert_eq!(view.ring, w - 1 + 5);
        for q in 10 + 1 - w..15 {
            assert_eq!(read(&view, q, kvd), [q as f32], "batch sees {q}");
        }
        kv.len = 15;
        assert!(kv.bytes() <= 2 * 2 * (w - 1 + 5));
        // Going back 4 positions keeps what position 11 attends to; going back to 3 cannot.
        assert_eq!(kv.truncate(11), 11);
        assert_eq!(kv.truncate(3), 0);
    }
}
