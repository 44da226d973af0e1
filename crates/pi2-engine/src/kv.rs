//! The key/value cache: per layer, f16 keys and values (llama.cpp's default: half the memory
//! of f32, and the rounding the reference outputs were made with). Global layers keep every
//! position, growing as positions are used. Sliding-window layers keep a ring of the last
//! `window - 1 + batch` positions: each token of a batch still sees its whole window while the
//! batch is written, and decode needs no more than the window. A convolution layer (LFM2)
//! keeps, in the same ring, one f32 row per position of what it convolves: its state is the
//! positions it holds, so truncating the cache rolls it back too.

mod file;
pub(crate) use file::{get, get_bytes, put};

use crate::states::{slots_for, Keep, Snapshots};
use half::f16;
use pi2_model::{Mixer, ModelConfig};

/// One layer's cache as attention reads it: position `p` is at slot `p % ring`; a sliding
/// layer's query attends to the last `window` positions only.
pub(crate) struct KvView<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub ring: usize,
    pub window: Option<usize>,
}

/// A convolution layer's cache: position `p`'s row of `width` f32 values at slot `p % ring`.
pub(crate) struct StateView<'a> {
    cells: &'a [f16],
    pub ring: usize,
    width: usize,
}

impl StateView<'_> {
    /// Value `i` of position `p`'s row (exact: stored as the two halves of its bits).
    pub fn value(&self, p: usize, i: usize) -> f32 {
        let at = (p % self.ring * self.width + i) * 2;
        let (lo, hi) = (self.cells[at].to_bits(), self.cells[at + 1].to_bits());
        f32::from_bits(lo as u32 | (hi as u32) << 16)
    }

    /// The causal convolution of the rows of positions `pos0..` (`out`'s rows, `width` each):
    /// channel `ch` of position `p` is `sum_j taps[ch][j] * row(p + 1 + j - len)[ch]` with
    /// `len` taps per channel, oldest first, positions before the first counting zero (as
    /// llama.cpp's `ssm_conv` sums them, tap by tap).
    pub fn convolve(&self, taps: &[f32], pos0: usize, out: &mut [f32]) {
        let len = taps.len() / self.width;
        for (t, row) in out.chunks_exact_mut(self.width).enumerate() {
            let p = pos0 + t;
            for (ch, o) in row.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for (j, &w) in taps[ch * len..(ch + 1) * len].iter().enumerate() {
                    if let Some(q) = (p + 1 + j).checked_sub(len) {
                        sum += self.value(q, ch) * w;
                    }
                }
                *o = sum;
            }
        }
    }
}

/// What a layer keeps per position.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cells {
    /// A key and a value of this width each, in f16.
    KeyValue(usize),
    /// One row of this width in f32 (a convolution's input).
    State(usize),
}

impl Cells {
    /// f16 cells per position of the key and of the value buffer.
    fn widths(self) -> (usize, usize) {
        match self {
            Cells::KeyValue(w) => (w, w),
            Cells::State(w) => (2 * w, 0),
        }
    }
}

/// What one layer keeps: its window (`None`: global), its cells per position, and the f32
/// values of its recurrent state (0: none).
#[derive(Clone, Copy, Debug)]
struct LayerShape {
    window: Option<usize>,
    cells: Cells,
    state: usize,
}

/// Each layer's shape: an attention layer keeps its window of keys and values; a convolution
/// layer its taps' span of `B * x` rows; a delta net its taps' span of Q, K and V rows and
/// its recurrent states.
fn layer_shapes(c: &ModelConfig) -> impl Iterator<Item = LayerShape> + '_ {
    (0..c.n_layer).map(|li| match c.mixer(li) {
        // A layer that attends to another's keys and values keeps none.
        Mixer::Attention if c.kv_source(li) != li => LayerShape {
            window: None,
            cells: Cells::KeyValue(0),
            state: 0,
        },
        Mixer::Attention => LayerShape {
            window: c.window(li),
            cells: Cells::KeyValue(c.kv_dim(li)),
            state: 0,
        },
        Mixer::ShortConv { taps } => LayerShape {
            window: Some(taps),
            cells: Cells::State(c.n_embd),
            state: 0,
        },
        Mixer::DeltaNet(dn) => LayerShape {
            window: Some(dn.taps),
            cells: Cells::State(dn.conv_dim()),
            state: dn.state_len(),
        },
    })
}

struct LayerKv {
    k: Vec<f16>,
    v: Vec<f16>,
    /// Sliding-window length, if the layer slides.
    window: Option<usize>,
    /// Positions the buffers address (slot = position % ring): `n_ctx` for global layers.
    ring: usize,
    cells: Cells,
    /// A recurrent layer's states.
    states: Option<Snapshots>,
}

pub(crate) struct KvCache {
    layers: Vec<LayerKv>,
    /// The last layer that keeps anything: its writes mark how far the cache has been written.
    last_kept: usize,
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
pub fn kv_bytes(c: &ModelConfig, n_ctx: usize, n_batch: usize) -> usize {
    layer_shapes(c)
        .map(|l| {
            let positions = match l.window {
                Some(w) => ring_len(w, n_batch, n_ctx),
                None => n_ctx,
            };
            let (k, v) = l.cells.widths();
            positions * (k + v) * std::mem::size_of::<f16>()
                + l.state * 4 * slots_for(n_batch, Keep::Last)
        })
        .sum()
}

impl KvCache {
    /// An empty cache for model `c`'s layers.
    pub fn new(c: &ModelConfig, n_ctx: usize) -> Self {
        Self::with_layers(layer_shapes(c), n_ctx)
    }

    fn with_layers(shapes: impl IntoIterator<Item = LayerShape>, n_ctx: usize) -> Self {
        let layers: Vec<LayerKv> = shapes
            .into_iter()
            .map(|l| LayerKv {
                k: Vec::new(),
                v: Vec::new(),
                window: l.window,
                ring: match l.window {
                    Some(w) => ring_len(w, 1, n_ctx),
                    None => n_ctx,
                },
                cells: l.cells,
                states: (l.state > 0).then(|| Snapshots::new(l.state)),
            })
            .collect();
        let last_kept = (layers.iter())
            .rposition(|l| l.cells.widths() != (0, 0))
            .unwrap_or(0);
        Self {
            layers,
            last_kept,
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
        debug_assert_eq!(self.layers[li].cells, Cells::KeyValue(kvd));
        let l = self.room(li, pos0, k.len() / kvd);
        for (t, (kr, vr)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
            let slot = (pos0 + t) % l.ring * kvd;
            for (dst, &src) in l.k[slot..slot + kvd].iter_mut().zip(kr) {
                *dst = f16::from_f32(src);
            }
            for (dst, &src) in l.v[slot..slot + kvd].iter_mut().zip(vr) {
                *dst = f16::from_f32(src);
            }
        }
        self.view(li)
    }

    /// Layer `li`'s cache as it stands (a layer that attends to another's without writing:
    /// Gemma 4's shared KV, whose positions that layer wrote earlier in the same pass).
    pub fn view(&self, li: usize) -> KvView<'_> {
        let l = &self.layers[li];
        KvView {
            k: bytemuck::cast_slice(&l.k[..]),
            v: bytemuck::cast_slice(&l.v[..]),
            ring: l.ring,
            window: l.window,
        }
    }

    /// Whether layer `li`'s buffers address positions up to `end` (written by some pass).
    pub fn holds(&self, li: usize, end: usize) -> bool {
        let l = &self.layers[li];
        let (kw, _) = l.cells.widths();
        match l.window {
            Some(_) => end <= l.ring && l.k.len() >= l.ring * kw,
            None => l.k.len() >= end * kw,
        }
    }

    /// Stores convolution layer `li`'s rows of positions `pos0..pos0 + n` (`width` f32 each,
    /// exactly) and returns the layer's rows.
    pub fn append_state(
        &mut self,
        li: usize,
        pos0: usize,
        rows: &[f32],
        width: usize,
    ) -> StateView<'_> {
        debug_assert_eq!(self.layers[li].cells, Cells::State(width));
        let l = self.room(li, pos0, rows.len() / width);
        for (t, row) in rows.chunks_exact(width).enumerate() {
            let slot = (pos0 + t) % l.ring * 2 * width;
            for (dst, &src) in l.k[slot..slot + 2 * width].chunks_exact_mut(2).zip(row) {
                let bits = src.to_bits();
                dst[0] = f16::from_bits(bits as u16);
                dst[1] = f16::from_bits((bits >> 16) as u16);
            }
        }
        let l = &self.layers[li];
        StateView {
            cells: &l.k,
            ring: l.ring,
            width,
        }
    }

    /// Recurrent layer `li`'s states.
    pub fn states(&mut self, li: usize) -> &mut Snapshots {
        self.layers[li]
            .states
            .as_mut()
            .expect("a recurrent layer keeps states")
    }

    /// Makes layer `li` address positions `pos0..pos0 + n`. Global layers grow in steps
    /// (decode does not reallocate every token); a sliding layer's ring widens when a batch
    /// needs more room.
    fn room(&mut self, li: usize, pos0: usize, n: usize) -> &mut LayerKv {
        let (high, n_ctx) = (self.high, self.n_ctx);
        if li == self.last_kept {
            self.high = self.high.max(pos0 + n);
        }
        let l = &mut self.layers[li];
        let (kw, vw) = l.cells.widths();
        match l.window {
            Some(w) => {
                let need = ring_len(w, n, n_ctx);
                if need > l.ring || l.k.len() < l.ring * kw {
                    l.relayout(need.max(l.ring), high.max(pos0));
                }
            }
            None => {
                // Address space for the whole context at once, memory as positions are
                // written: the buffers never move, and what they hold is what has been used
                // (an offload charges it as it grows).
                if l.k.capacity() < n_ctx * kw {
                    l.k.reserve_exact(n_ctx * kw - l.k.len());
                    l.v.reserve_exact(n_ctx * vw - l.v.len());
                }
                if l.k.len() < (pos0 + n) * kw {
                    l.k.resize((pos0 + n) * kw, f16::ZERO);
                    l.v.resize((pos0 + n) * vw, f16::ZERO);
                }
            }
        }
        l
    }

    /// Keep the first `n` positions, or none when a sliding layer has already overwritten
    /// part of what position `n` would attend to. Returns the positions kept.
    pub fn truncate(&mut self, n: usize) -> usize {
        let n = n.min(self.len);
        let lost = self.layers.iter().any(|l| {
            let window_lost = match l.window {
                Some(w) => n.saturating_sub(w - 1) < self.high.saturating_sub(l.ring),
                None => false,
            };
            window_lost || l.states.as_ref().is_some_and(|s| !s.can_keep(n))
        });
        self.len = if lost { 0 } else { n };
        if self.len == 0 {
            self.high = 0;
        }
        for s in self.layers.iter_mut().filter_map(|l| l.states.as_mut()) {
            s.truncate(self.len);
        }
        self.len
    }

    /// Bytes held now (of a global layer, the positions written; its reserved address space
    /// beyond them is not memory).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                let cells = match l.window {
                    Some(_) => (l.k.capacity() + l.v.capacity()) * 2,
                    None => (l.k.len() + l.v.len()) * 2,
                };
                cells + l.states.as_ref().map_or(0, Snapshots::bytes)
            })
            .sum()
    }

    /// Bytes held once positions up to `end` are written by a batch of `n` (keeping `keep`
    /// of its recurrent states).
    pub fn bytes_at(&self, end: usize, n: usize, keep: Keep) -> usize {
        let end = end.min(self.n_ctx);
        self.layers
            .iter()
            .map(|l| {
                let (kw, vw) = l.cells.widths();
                let positions = match l.window {
                    Some(w) => ring_len(w, n, self.n_ctx).max(l.ring),
                    None => end.max(l.k.len() / kw.max(1)),
                };
                2 * (kw + vw) * positions + l.states.as_ref().map_or(0, |s| s.bytes_after(n, keep))
            })
            .sum()
    }
}

impl LayerKv {
    /// Widen the ring to `ring` positions, moving the positions still held (those below
    /// `high`, the last `self.ring` of them) to their new slots.
    fn relayout(&mut self, ring: usize, high: usize) {
        let (kw, vw) = self.cells.widths();
        let (mut k, mut v) = (vec![f16::ZERO; ring * kw], vec![f16::ZERO; ring * vw]);
        if !self.k.is_empty() {
            for p in high.saturating_sub(self.ring)..high {
                let (from, to) = (p % self.ring, p % ring);
                k[to * kw..(to + 1) * kw].copy_from_slice(&self.k[from * kw..(from + 1) * kw]);
                v[to * vw..(to + 1) * vw].copy_from_slice(&self.v[from * vw..(from + 1) * vw]);
            }
        }
        (self.k, self.v, self.ring) = (k, v, ring);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(window: Option<usize>, cells: Cells) -> LayerShape {
        LayerShape {
            window,
            cells,
            state: 0,
        }
    }

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
        let mut kv = KvCache::with_layers([shape(None, Cells::KeyValue(2)); 2], 8);
        let view = kv.append(1, 0, &[1.0, 2.0], &[3.0, 4.0], 2);
        assert_eq!((view.k.len(), view.ring), (2, 8));
        assert_eq!(f16::from_bits(view.v[1]).to_f32(), 4.0);
        assert_eq!(
            kv.bytes(),
            8,
            "one position of one layer: 2 values of k and v, 2 bytes each"
        );
        assert_eq!(
            kv.bytes_at(4, 1, Keep::Last),
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
        let mut kv = KvCache::with_layers([shape(Some(w), Cells::KeyValue(kvd))], 64);
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

    #[test]
    fn convolution_rows_are_exact_and_roll_back_with_the_cache() {
        let (taps, width) = (3, 2);
        let mut kv = KvCache::with_layers([shape(Some(taps), Cells::State(width))], 64);
        let row = |p: usize| [p as f32 + 0.1, -(p as f32) / 3.0];
        let prompt: Vec<f32> = (0..6).flat_map(row).collect();
        let view = kv.append_state(0, 0, &prompt, width);
        for p in 0..6 {
            assert_eq!(
                [view.value(p, 0), view.value(p, 1)],
                row(p),
                "f32 bits kept"
            );
        }
        kv.len = 6;
        for p in 6..9 {
            let view = kv.append_state(0, p, &row(p), width);
            for q in p + 1 - taps..=p {
                assert_eq!([view.value(q, 0), view.value(q, 1)], row(q));
            }
            kv.len = p + 1;
        }
        assert_eq!(
            kv.bytes(),
            2 * 2 * width * (taps - 1 + 6),
            "the ring a batch of 6 needed"
        );
        // Back one position: what position 8 convolves is still held.
        assert_eq!(kv.truncate(8), 8);
    }
}
