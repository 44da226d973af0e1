//! The vocabulary matrices under a budget. A separate token embedding is never resident: a
//! batch's lookups read their rows. The output matrix keeps its first rows resident (through
//! the file mapping) and, when the budget is short, reads the rest every time logits are
//! computed, in chunks through two buffers: the product of one chunk overlaps the read of the
//! next, and the last chunks' buffers take the next call's first chunks at once, so those reads
//! overlap everything up to the next LM head. With tied weights the embedding lookups of
//! resident rows use the mapping.
//!
//! Resident and streamed rows start at multiples of 8, where a whole-matrix product groups
//! rows too, so the logits are bit-identical to the in-memory ones.

use super::layout::{pad, VocabLayout, EMBD_BATCH, PAD};
use super::Offload;
use crate::residency::Tag;
use crate::weights::Table;
use pi2_io::{AlignedBuf, IoError, Request};
use pi2_kernels::{matmul, ActBuf, KernelSet, MatRef};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Release},
};

/// Requests of one lookup round (embedding rows) or one batch of output pieces, kept to reuse
/// their allocation.
struct Requests(Vec<Request>);

// SAFETY: the pointers address this offload's own embedding or chunk buffers; they are only
// written through by the reader between `submit` and the completions waited for.
unsafe impl Send for Requests {}
unsafe impl Sync for Requests {}

/// Reads of the vocabulary matrices and their buffers.
pub(crate) struct VocabStream {
    layout: VocabLayout,
    /// The first output rows, resident through the file mapping.
    resident: usize,
    chunk_rows: usize,
    bufs: [AlignedBuf; 2],
    buf_chunk: [Option<usize>; 2],
    pub(crate) pending: [AtomicU64; 2],
    embd_buf: AlignedBuf,
    embd_reqs: Requests,
    /// Per request: the batch row it fills and its buffer slot.
    embd_rows: Vec<(usize, usize)>,
    pub(crate) embd_pending: AtomicU64,
    /// Logits of one chunk for batches of several rows (scattered into place after).
    tmp: Vec<f32>,
    /// The sparse head's streamed row ranges of one call, the batches of them that fill a
    /// buffer, and one batch's requests (kept for their allocation).
    pieces: Vec<(usize, usize)>,
    batches: Vec<(usize, usize)>,
    piece_reqs: Requests,
}

impl VocabStream {
    pub(crate) fn new(layout: VocabLayout, streamed_rows: usize) -> Self {
        let out = layout.output;
        let chunk_rows = layout.chunk_rows();
        let buf = |on: bool| AlignedBuf::new(if on { chunk_rows * out.row_bytes } else { 0 }, PAD);
        let embd_buf = AlignedBuf::new(EMBD_BATCH * pad(layout.lookup_row_bytes()), PAD);
        Self {
            layout,
            resident: out.rows - streamed_rows,
            chunk_rows,
            bufs: [buf(streamed_rows > 0), buf(streamed_rows > 0)],
            buf_chunk: [None, None],
            pending: [AtomicU64::new(0), AtomicU64::new(0)],
            embd_buf,
            embd_reqs: Requests(Vec::with_capacity(EMBD_BATCH)),
            embd_rows: Vec::with_capacity(EMBD_BATCH),
            embd_pending: AtomicU64::new(0),
            tmp: Vec::new(),
            pieces: Vec::new(),
            batches: Vec::new(),
            piece_reqs: Requests(Vec::new()),
        }
    }

    /// Output rows read from flash per LM head.
    pub(crate) fn streamed_rows(&self) -> usize {
        self.layout.output.rows - self.resident
    }

    pub(crate) fn embedding_row_bytes(&self) -> usize {
        self.layout.embd.row_bytes
    }

    /// Whether embedding lookups go through [`Offload::embed`].
    pub(crate) fn streams_embedding(&self) -> bool {
        !self.layout.tied || self.resident < self.layout.output.rows
    }

    /// Forget what the buffers held (after a failed read).
    pub(crate) fn forget(&mut self) {
        self.buf_chunk = [None, None];
        self.pending.iter().for_each(|p| p.store(0, Release));
        self.embd_pending.store(0, Release);
    }

    fn n_chunks(&self) -> usize {
        self.streamed_rows().div_ceil(self.chunk_rows)
    }
}

impl Offload {
    /// Rows of `table` for `tokens` into `x` (rows of the table's width): from the mapping
    /// `embd` where resident, else read from flash.
    pub(crate) fn embed(
        &mut self,
        table: Table,
        embd: &MatRef<'_>,
        tokens: &[u32],
        x: &mut [f32],
    ) -> Result<(), IoError> {
        let d = embd.cols;
        let (e, resident) = match (table, self.vocab.layout.per_layer) {
            (Table::PerLayer, Some(p)) => (p, 0),
            _ => (
                self.vocab.layout.embd,
                match self.vocab.layout.tied {
                    true => self.vocab.resident,
                    false => 0,
                },
            ),
        };
        let slot = pad(e.row_bytes);
        for (g, group) in tokens.chunks(EMBD_BATCH).enumerate() {
            let base = self.vocab.embd_buf.as_mut_ptr();
            self.vocab.embd_reqs.0.clear();
            self.vocab.embd_rows.clear();
            for (j, &tok) in group.iter().enumerate() {
                let row = g * EMBD_BATCH + j;
                let tok = tok as usize;
                if tok < resident {
                    embd.dequantize_row(tok, &mut x[row * d..(row + 1) * d]);
                    continue;
                }
                self.vocab.embd_reqs.0.push(Request {
                    offset: e.offset + (tok * e.row_bytes) as u64,
                    len: e.row_bytes,
                    // SAFETY: slot `j` of the buffer (sized for a whole group).
                    dst: unsafe { base.add(j * slot) },
                    tag: Tag::Embedding.encode(),
                });
                self.vocab.embd_rows.push((row, j));
            }
            let n = self.vocab.embd_reqs.0.len() as u64;
            if n == 0 {
                continue;
            }
            self.vocab.embd_pending.fetch_add(n, AcqRel);
            // SAFETY: the buffer is not read until every row has been received below.
            if let Err(err) = unsafe { self.reader.submit(&self.vocab.embd_reqs.0) } {
                self.vocab.embd_pending.fetch_sub(n, AcqRel);
                return Err(err);
            }
            self.stats.embd_rows += n;
            self.wait_until(|o| o.vocab.embd_pending.load(Acquire) == 0)?;
            let v = &self.vocab;
            for &(row, j) in &v.embd_rows {
                let at = j * slot;
                let one = MatRef::new(e.ty, 1, d, &v.embd_buf[at..at + e.row_bytes])
                    .expect("checked at load");
                one.dequantize_row(0, &mut x[row * d..(row + 1) * d]);
            }
        }
        Ok(())
    }

    /// Whether the LM head reads rows from flash ([`Offload::lm_head`]).
    pub(crate) fn streams_output(&self) -> bool {
        self.vocab.streamed_rows() > 0
    }

    /// Output rows held in memory (the first, in stored order): every row when none stream.
    pub(crate) fn output_resident_rows(&self) -> usize {
        match self.streams_output() {
            true => self.vocab.resident,
            false => usize::MAX,
        }
    }

    /// Logits of `n` token rows (`acts`, quantized for the output matrix) into `logits`
    /// (`n` rows of the vocabulary): resident rows from the mapping `out`, the rest streamed.
    pub(crate) fn lm_head(
        &mut self,
        ks: &KernelSet,
        out: &MatRef<'_>,
        acts: &ActBuf,
        n: usize,
        logits: &mut [f32],
    ) -> Result<(), IoError> {
        let (r, c, chunks) = (
            self.vocab.resident,
            self.vocab.chunk_rows,
            self.vocab.n_chunks(),
        );
        // This call's first chunks, unless the last call read them ahead.
        if !self.vocab.buf_chunk.contains(&Some(0)) {
            self.wait_until(|o| o.vocab.pending.iter().all(|p| p.load(Acquire) == 0))?;
            for i in 0..chunks.min(2) {
                self.read_out_chunk(i, i)?;
            }
        }
        // One product for a single token; chunk-sized pieces for batches (bounded scratch).
        let piece = if n == 1 { r.max(1) } else { c };
        for a in (0..r).step_by(piece) {
            let e = (a + piece).min(r);
            product(ks, &out.rows(a..e), acts, n, a, logits, &mut self.vocab.tmp);
        }
        let o = self.vocab.layout.output;
        for i in 0..chunks {
            let b = self
                .vocab
                .buf_chunk
                .iter()
                .position(|&x| x == Some(i))
                .expect("each chunk is read two chunks ahead");
            self.wait_until(|o| o.vocab.pending[b].load(Acquire) == 0)?;
            let (a, e) = (r + i * c, (r + (i + 1) * c).min(o.rows));
            let v = &mut self.vocab;
            let m = MatRef::new(o.ty, e - a, o.cols, &v.bufs[b][..(e - a) * o.row_bytes])
                .expect("checked at load");
            product(ks, &m, acts, n, a, logits, &mut v.tmp);
            // The chunk two on, wrapping to the next call's first ones.
            self.read_out_chunk((i + 2) % chunks, b)?;
        }
        Ok(())
    }

    /// Logits of one token for the output rows in `ranges` (sorted, disjoint, starting and
    /// ending at multiples of 8 or the end) into `logits` (a whole vocabulary row; other rows
    /// untouched): resident rows from the mapping `out`, the rest read from flash into the
    /// chunk buffers, one buffer's pieces in flight while the other's are multiplied (the
    /// sparse head's exact rows). Returns the bytes read.
    pub(crate) fn lm_head_rows(
        &mut self,
        ks: &KernelSet,
        out: &MatRef<'_>,
        acts: &ActBuf,
        ranges: &[(usize, usize)],
        logits: &mut [f32],
    ) -> Result<u64, IoError> {
        let r = self.vocab.resident;
        let o = self.vocab.layout.output;
        // The chunk buffers are reused here: let reads ahead land, then forget them.
        self.wait_until(|o| o.vocab.pending.iter().all(|p| p.load(Acquire) == 0))?;
        self.vocab.buf_chunk = [None, None];
        let cap = self.vocab.bufs[0].len();
        let max_rows = (cap / o.row_bytes.max(1)) / 8 * 8;
        let mut pieces = std::mem::take(&mut self.vocab.pieces);
        pieces.clear();
        // The resident rows of every range in one parallel region.
        let resident: Vec<_> = (ranges.iter().filter(|&&(a, _)| a < r))
            .map(|&(a, e)| (out.rows(a..e.min(r)), a))
            .collect();
        pi2_kernels::matvec_blocks(ks, acts, &resident, logits);
        for &(a, e) in ranges {
            let mut a = a.max(r);
            while a < e {
                let m = (a + max_rows).min(e);
                pieces.push((a, m));
                a = m;
            }
        }
        // Batches of pieces that fill one buffer each (pieces at PAD-aligned places).
        let mut batches = std::mem::take(&mut self.vocab.batches);
        batches.clear();
        let mut used = cap;
        for (k, &(a, e)) in pieces.iter().enumerate() {
            let len = pad((e - a) * o.row_bytes);
            if used + len > cap {
                batches.push((k, k));
                used = 0;
            }
            used += len;
            batches.last_mut().expect("pushed above").1 = k + 1;
        }
        let mut read = 0;
        let result = (|| {
            if let Some(&first) = batches.first() {
                read += self.read_out_pieces(&pieces[first.0..first.1], 0)?;
            }
            for (j, &(p0, p1)) in batches.iter().enumerate() {
                let b = j % 2;
                if let Some(&(q0, q1)) = batches.get(j + 1) {
                    read += self.read_out_pieces(&pieces[q0..q1], 1 - b)?;
                }
                self.wait_until(|o| o.vocab.pending[b].load(Acquire) == 0)?;
                let mut at = 0;
                let buf = &self.vocab.bufs[b];
                let blocks: Vec<_> = (pieces[p0..p1].iter())
                    .map(|&(a, e)| {
                        let len = (e - a) * o.row_bytes;
                        let m = MatRef::new(o.ty, e - a, o.cols, &buf[at..at + len])
                            .expect("checked at load");
                        at += pad(len);
                        (m, a)
                    })
                    .collect();
                pi2_kernels::matvec_blocks(ks, acts, &blocks, logits);
            }
            Ok(read)
        })();
        self.vocab.pieces = pieces;
        self.vocab.batches = batches;
        result
    }

    /// Reads `pieces` (row ranges of the output matrix) into buffer `b`, one after another at
    /// PAD-aligned places. Returns the bytes asked for.
    fn read_out_pieces(&mut self, pieces: &[(usize, usize)], b: usize) -> Result<u64, IoError> {
        let v = &mut self.vocab;
        let o = v.layout.output;
        let base = v.bufs[b].as_mut_ptr();
        let reqs = &mut v.piece_reqs.0;
        reqs.clear();
        let mut at = 0;
        for &(a, e) in pieces {
            let len = (e - a) * o.row_bytes;
            reqs.push(Request {
                offset: o.offset + (a * o.row_bytes) as u64,
                len,
                // SAFETY: inside buffer `b`: the batches were cut to its size.
                dst: unsafe { base.add(at) },
                tag: Tag::Output(b).encode(),
            });
            at += pad(len);
        }
        let bytes: u64 = reqs.iter().map(|q| q.len as u64).sum();
        let n = reqs.len() as u64;
        v.pending[b].fetch_add(n, AcqRel);
        self.stats.out_chunk_reads += n;
        self.stats.out_bytes += bytes;
        // SAFETY: the buffer is not read until every piece has been received, and not written
        // by anything else meanwhile.
        let submitted = unsafe { self.reader.submit(&self.vocab.piece_reqs.0) };
        if submitted.is_err() {
            self.vocab.pending[b].fetch_sub(n, AcqRel);
        }
        submitted.map(|()| bytes)
    }

    fn read_out_chunk(&mut self, i: usize, b: usize) -> Result<(), IoError> {
        let v = &mut self.vocab;
        let o = &v.layout.output;
        let first = v.resident + i * v.chunk_rows;
        let rows = v.chunk_rows.min(o.rows - first);
        let req = Request {
            offset: o.offset + (first * o.row_bytes) as u64,
            len: rows * o.row_bytes,
            dst: v.bufs[b].as_mut_ptr(),
            tag: Tag::Output(b).encode(),
        };
        v.buf_chunk[b] = Some(i);
        v.pending[b].fetch_add(1, AcqRel);
        self.stats.out_chunk_reads += 1;
        self.stats.out_bytes += req.len as u64;
        // SAFETY: the buffer is not read until its completion has been received, and not
        // written by anything else meanwhile.
        let submitted = unsafe { self.reader.submit(&[req]) };
        if submitted.is_err() {
            self.vocab.pending[b].fetch_sub(1, AcqRel);
            self.vocab.buf_chunk[b] = None;
        }
        submitted
    }
}

/// Logits of rows `first..first + w.rows` for `n` token rows (`n` rows of `vocab` in `logits`).
fn product(
    ks: &KernelSet,
    w: &MatRef<'_>,
    acts: &ActBuf,
    n: usize,
    first: usize,
    logits: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    let vocab = logits.len() / n;
    if n == 1 {
        return matmul(ks, w, acts, &mut logits[first..first + w.rows]);
    }
    tmp.resize(n * w.rows, 0.0);
    matmul(ks, w, acts, tmp);
    for (t, part) in tmp.chunks_exact(w.rows).enumerate() {
        logits[t * vocab + first..t * vocab + first + w.rows].copy_from_slice(part);
    }
}
