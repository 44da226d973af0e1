//! What an offloaded model streams through buffers rather than reading row by row: a unit's
//! whole FFN for a dense batch (prefill staging, the next unit read while one computes) and
//! the attention projections of the layers that do not fit the budget (the next streamed
//! layer read while the current one computes).

use super::layout::pad;
use super::{Offload, Part};
use crate::residency::Tag;
use pi2_io::{IoError, Request};
use pi2_kernels::MatRef;
use std::sync::atomic::Ordering::{AcqRel, Acquire};

impl Offload {
    /// Byte ranges of a staged unit's gate, up and down blocks.
    fn stage_parts(&self, unit: usize) -> [(Part, usize, usize); 3] {
        let l = &self.layers[unit];
        let n = self.n_ff;
        let g = (l.gate, 0, n * l.gate.row_bytes);
        let u_at = pad(g.2);
        let u = (l.up, u_at, n * l.up.row_bytes);
        let d_at = u_at + pad(u.2);
        [g, u, (l.down, d_at, n * l.down.row_bytes)]
    }

    /// Starts staging unit `u` whole into buffer `b`: its pinned rows (the first rows of each
    /// matrix, the file keeping neurons hottest first) are copied from memory, the rest read.
    fn read_stage(&mut self, u: usize, b: usize) -> Result<(), IoError> {
        let parts = self.stage_parts(u);
        let hot = &self.hot[u];
        let pinned = [(0, hot.n_gate), (hot.up_at, hot.n), (hot.down_at, hot.n)];
        let stage = &mut self.stage[b];
        let mut reqs = Vec::with_capacity(3);
        for ((p, at, len), (hot_at, rows)) in parts.into_iter().zip(pinned) {
            let kept = (rows * p.row_bytes).min(len);
            stage[at..at + kept].copy_from_slice(&hot.buf[hot_at..hot_at + kept]);
            if kept < len {
                reqs.push(Request {
                    offset: p.offset + kept as u64,
                    len: len - kept,
                    // SAFETY: inside the staging buffer (sized for the largest unit).
                    dst: unsafe { stage.as_mut_ptr().add(at + kept) },
                    tag: Tag::Stage.encode(),
                });
            }
        }
        self.stage_unit[b] = Some(u);
        self.stats.stage_bytes += reqs.iter().map(|r| r.len as u64).sum::<u64>();
        // SAFETY: the buffer is not read until `wait_stage` has received every completion.
        unsafe { self.reader.submit(&reqs) }
    }

    fn wait_stage(&mut self) -> Result<(), IoError> {
        while self.reader.outstanding() > 0 {
            match self.reader.recv().and_then(|c| c.result.map(|()| c.tag)) {
                Ok(tag) => self.received(Tag::decode(tag)),
                Err(e) => {
                    self.fail();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Start reading layer `li`'s attention projections into buffer `b`.
    fn read_attention(&mut self, li: usize, b: usize) -> Result<(), IoError> {
        let a = self.attn[li];
        let base = self.attn_buf[b].as_mut_ptr();
        let reqs = a.mats.map(|m| Request {
            offset: m.offset,
            len: m.len,
            // SAFETY: inside the buffer (sized for the largest layer).
            dst: unsafe { base.add(m.at) },
            tag: Tag::Attention.encode(),
        });
        self.attn_buf_layer[b] = Some(li);
        self.attn_pending.fetch_add(reqs.len() as u64, AcqRel);
        self.stats.attn_layer_reads += 1;
        self.stats.attn_bytes += a.mats.iter().map(|m| m.len as u64).sum::<u64>();
        // SAFETY: the buffer is not read until every attention read has been received
        // (`wait_attention`), and not written by anything else meanwhile.
        let submitted = unsafe { self.reader.submit(&reqs) };
        if submitted.is_err() {
            self.attn_pending.fetch_sub(reqs.len() as u64, AcqRel);
            self.attn_buf_layer[b] = None;
        }
        submitted
    }

    fn wait_attention(&mut self) -> Result<(), IoError> {
        self.wait_until(|o| o.attn_pending.load(Acquire) == 0)
    }

    /// Whether layer `li`'s attention streams from flash; if it does, make it resident (wait for
    /// its read, issuing it now if no earlier call prefetched it) and start reading the next
    /// streamed layer into the other buffer: after the last layer, the first streamed one,
    /// which the next token needs after the resident layers.
    pub(crate) fn stream_attention(&mut self, li: usize) -> Result<bool, IoError> {
        if li < self.stream_from {
            return Ok(false);
        }
        let b = match self.attn_buf_layer.iter().position(|&x| x == Some(li)) {
            Some(b) => b,
            None => {
                self.wait_attention()?;
                self.read_attention(li, 0)?;
                0
            }
        };
        self.wait_attention()?;
        let next = if li + 1 < self.attn.len() {
            li + 1
        } else {
            self.stream_from
        };
        if next != li && self.attn_buf_layer[1 - b] != Some(next) {
            self.read_attention(next, 1 - b)?;
        }
        Ok(true)
    }

    /// The q, k, v and output projections of streamed layer `li` (after
    /// [`Offload::stream_attention`] returned true for it).
    pub(crate) fn attention_mats(&self, li: usize) -> [MatRef<'_>; 4] {
        let b = self
            .attn_buf_layer
            .iter()
            .position(|&x| x == Some(li))
            .expect("the layer was streamed in");
        let buf = &self.attn_buf[b];
        self.attn[li].mats.map(|m| {
            MatRef::new(m.ty, m.rows, m.cols, &buf[m.at..m.at + m.len]).expect("checked at load")
        })
    }

    /// Make unit `u`'s whole FFN resident in a staging buffer (returned) and start reading unit
    /// `next` into the other one, so prefill computes while the next unit streams in.
    pub(crate) fn stage_unit(&mut self, u: usize, next: Option<usize>) -> Result<usize, IoError> {
        self.wait_stage()?;
        let b = match self.stage_unit.iter().position(|&x| x == Some(u)) {
            Some(b) => b,
            None => {
                self.read_stage(u, 0)?;
                self.wait_stage()?;
                0
            }
        };
        self.stats.dense_layer_reads += 1;
        if let Some(n) = next {
            self.read_stage(n, 1 - b)?;
        }
        Ok(b)
    }

    /// Whether a checked batch of `n` tokens reads unit `u`'s neurons through the cache (each
    /// token's step reads what is missing, and what one token read stays for the next: about
    /// the union of what they need) rather than staging the unit whole: whichever reads less,
    /// the cache's row-sized reads counted at half a stage's speed (measured on
    /// Qwen2.5-Coder-0.5B at 50% and 90% budgets: 0.53), at the misses per token and layer so far (none yet: the cache).
    pub(crate) fn batch_through_cache(&self, u: usize, n: usize) -> bool {
        let st = &self.stats;
        if st.token_layers == 0 {
            // Nothing measured yet: the cache, whose steps measure the misses.
            return true;
        }
        let miss = st.decode_bytes as f64 / st.token_layers as f64;
        let l = &self.layers[u];
        let whole = (self.n_ff * (l.gate.row_bytes + l.up.row_bytes + l.down.row_bytes)) as f64;
        n as f64 * miss * 2.0 < whole
    }

    /// The staged gate, up and transposed down matrices of unit `u` in buffer `b`.
    pub(crate) fn stage_mats(
        &self,
        b: usize,
        u: usize,
        d: usize,
    ) -> (MatRef<'_>, MatRef<'_>, MatRef<'_>) {
        let buf = &self.stage[b];
        let [g, up, dn] = self.stage_parts(u).map(|(p, at, len)| {
            MatRef::new(p.ty, self.n_ff, d, &buf[at..at + len]).expect("checked at load")
        });
        (g, up, dn)
    }

    /// Unit `u`'s gate, up and transposed down matrices when every row of it is pinned and
    /// it runs dense so (its FFN computed from memory, [`super::OffloadConfig::dense_layers`]).
    pub(crate) fn pinned_mats(&self, u: usize, d: usize) -> Option<[MatRef<'_>; 3]> {
        let (hot, l) = (self.hot.get(u)?, &self.layers[u]);
        let chosen = (self.dense_layers.as_ref()).is_some_and(|d| d.get(u) == Some(&true));
        if !chosen || hot.n < self.n_ff || hot.n_gate < self.n_ff {
            return None;
        }
        let n = self.n_ff;
        let block = |p: &super::layout::Part, at: usize| {
            MatRef::new(p.ty, n, d, &hot.buf[at..at + n * p.row_bytes]).expect("checked at load")
        };
        Some([
            block(&l.gate, 0),
            block(&l.up, hot.up_at),
            block(&l.down, hot.down_at),
        ])
    }
}
