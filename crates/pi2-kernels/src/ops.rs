//! Matrix views, activation buffers and the row-parallel matmul built on a [`KernelSet`].

use crate::quant::{self, ActBlock, BlockQ8, BlockQ8K, QuantBlock, QK, QK_K};
use crate::simd::RowKernels;
use crate::{ActKind, KernelError, KernelSet, QuantType};
use rayon::prelude::*;

/// Evaluates `$blocks` with `$k` bound to `$ks`'s row kernels for the block type `$ty`, or
/// `$float` for F32/F16/BF16: the one place a new block format joins every operation below.
macro_rules! by_block_type {
    ($ks:expr, $ty:expr, $k:ident => $blocks:expr, float => $float:expr) => {
        match $ty {
            QuantType::Q4_0 => {
                let $k = &$ks.q4_0;
                $blocks
            }
            QuantType::Q4_1 => {
                let $k = &$ks.q4_1;
                $blocks
            }
            QuantType::Q5_0 => {
                let $k = &$ks.q5_0;
                $blocks
            }
            QuantType::Q5_1 => {
                let $k = &$ks.q5_1;
                $blocks
            }
            QuantType::Q8_0 => {
                let $k = &$ks.q8_0;
                $blocks
            }
            QuantType::Q4_K => {
                let $k = &$ks.q4_k;
                $blocks
            }
            QuantType::Q5_K => {
                let $k = &$ks.q5_k;
                $blocks
            }
            QuantType::Q6_K => {
                let $k = &$ks.q6_k;
                $blocks
            }
            QuantType::IQ4_NL => {
                let $k = &$ks.iq4_nl;
                $blocks
            }
            QuantType::MXFP4 => {
                let $k = &$ks.mxfp4;
                $blocks
            }
            QuantType::IQ4_XS => {
                let $k = &$ks.iq4_xs;
                $blocks
            }
            QuantType::Q2_K => {
                let $k = &$ks.q2_k;
                $blocks
            }
            QuantType::Q3_K => {
                let $k = &$ks.q3_k;
                $blocks
            }
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => $float,
        }
    };
}

/// A borrowed row-major weight matrix: `rows` rows of `cols` elements of type `ty`
/// (GGML layout: a row is contiguous; the row index is the output dimension).
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    /// Rows interleaved in groups of eight ([`crate::PackedMat`]): no row access, matmul only.
    packed: bool,
}

impl<'a> MatRef<'a> {
    /// View `data` as a matrix, checking size and alignment once so row access cannot fail.
    pub fn new(
        ty: QuantType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or(KernelError::RowNotBlockAligned { ty, cols })?;
        let expected = row_bytes.saturating_mul(rows);
        if data.len() != expected {
            return Err(KernelError::SizeMismatch {
                ty,
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        if !(data.as_ptr() as usize).is_multiple_of(ty.align()) {
            return Err(KernelError::Misaligned {
                ty,
                align: ty.align(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            row_bytes,
            data,
            packed: false,
        })
    }

    /// View an interleaved copy made by [`crate::PackedMat::pack`].
    pub(crate) fn packed(ty: QuantType, rows: usize, cols: usize, data: &'a [u8]) -> Self {
        let row_bytes = ty.row_bytes(cols).expect("packed from a valid matrix");
        let group = crate::packed::group_layout(ty)
            .expect("packable type")
            .bytes;
        debug_assert_eq!(
            data.len(),
            rows.div_ceil(crate::packed::GROUP_ROWS) * cols / ty.block_len() * group
        );
        Self {
            ty,
            rows,
            cols,
            row_bytes,
            data,
            packed: true,
        }
    }

    /// Whether the rows are interleaved (see [`crate::PackedMat`]).
    pub fn is_packed(&self) -> bool {
        self.packed
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The raw bytes of row `r`. Panics on an interleaved matrix, whose rows are not contiguous.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(!self.packed, "MatRef::row on an interleaved matrix");
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Rows `r` as a matrix of their own (one expert of a stacked mixture-of-experts tensor).
    /// On an interleaved matrix `r` must cover whole groups: start at a multiple of
    /// [`crate::packed::GROUP_ROWS`] and end at one or at the last row. Products over a range
    /// that starts at a multiple of 8 and ends at one (or at the last row) give bit for bit the
    /// values of the whole matrix's product, in either layout.
    pub fn rows(&self, r: std::ops::Range<usize>) -> MatRef<'a> {
        assert!(
            r.start <= r.end && r.end <= self.rows,
            "MatRef::rows out of range"
        );
        if self.packed {
            use crate::packed::GROUP_ROWS;
            assert!(
                r.start.is_multiple_of(GROUP_ROWS)
                    && (r.end.is_multiple_of(GROUP_ROWS) || r.end == self.rows),
                "MatRef::rows on an interleaved matrix must cover whole groups"
            );
            let group = self.data.len() / self.rows.div_ceil(GROUP_ROWS).max(1);
            let (g0, g1) = (r.start / GROUP_ROWS, r.end.div_ceil(GROUP_ROWS));
            return MatRef {
                rows: r.len(),
                data: &self.data[g0 * group..g1 * group],
                ..*self
            };
        }
        MatRef {
            rows: r.len(),
            data: &self.data[r.start * self.row_bytes..r.end * self.row_bytes],
            ..*self
        }
    }

    /// All bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// Row `r` expanded to f32 (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        self.ty.dequantize_row(self.row(r), out)
    }
}

/// One quantized activation vector, in the format a weight type's dot product consumes.
#[derive(Clone, Copy, Debug)]
pub enum ActRow<'a> {
    F32(&'a [f32]),
    Q8(&'a [BlockQ8]),
    Q8K(&'a [BlockQ8K]),
}

/// Activations of `n` tokens quantized for one [`ActKind`]. Reused across calls: buffers only grow.
#[derive(Debug)]
pub struct ActBuf {
    kind: ActKind,
    pub(crate) cols: usize,
    n: usize,
    f32: Vec<f32>,
    q8: Vec<BlockQ8>,
    q8k: Vec<BlockQ8K>,
    /// Integer sum of each `q8` block's quants (the offset terms of Q4_0/Q5_0 interleaved).
    q8_sums: Vec<i32>,
}

impl Default for ActBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl ActBuf {
    pub fn new() -> Self {
        Self {
            kind: ActKind::F32,
            cols: 0,
            n: 0,
            f32: Vec::new(),
            q8: Vec::new(),
            q8k: Vec::new(),
            q8_sums: Vec::new(),
        }
    }

    /// Quantize `x` (`n` rows of `cols`, token-major) for `kind`.
    pub fn quantize(&mut self, kind: ActKind, x: &[f32], cols: usize) {
        assert!(
            cols > 0 && x.len().is_multiple_of(cols),
            "ActBuf::quantize: {} not a multiple of {cols}",
            x.len()
        );
        self.kind = kind;
        self.cols = cols;
        self.n = x.len() / cols;
        match kind {
            ActKind::F32 => {
                self.f32.clear();
                self.f32.extend_from_slice(x);
            }
            ActKind::Q8 => {
                assert_eq!(cols % QK, 0);
                self.q8.resize(x.len() / QK, BlockQ8::default());
                quant::q8_act::quantize_q8(x, &mut self.q8);
                self.q8_sums.clear();
                self.q8_sums.extend(
                    self.q8
                        .iter()
                        .map(|b| b.qs.iter().map(|&q| q as i32).sum::<i32>()),
                );
            }
            ActKind::Q8K => {
                assert_eq!(cols % QK_K, 0);
                self.q8k.resize(x.len() / QK_K, BlockQ8K::default());
                quant::q8_act::quantize_q8k(x, &mut self.q8k);
            }
        }
    }

    pub fn kind(&self) -> ActKind {
        self.kind
    }

    /// Number of token rows held.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Every token's blocks of activation type `A`, token-major (empty if quantized for
    /// another kind).
    fn blocks<A: ActBlock>(&self) -> &[A] {
        if self.kind != A::KIND {
            return &[];
        }
        match A::KIND {
            ActKind::Q8 => bytemuck::cast_slice(&self.q8[..self.n * self.cols / QK]),
            ActKind::Q8K => bytemuck::cast_slice(&self.q8k[..self.n * self.cols / QK_K]),
            ActKind::F32 => &[],
        }
    }

    /// Token `t`'s activations as the kernels see them, widened to f64 exactly: each
    /// quantized element is `d * q` (an f32 times an i8, exact in f64). A dot product of these
    /// with a dequantized weight row is the real-number value the integer kernels round.
    pub fn dequantize_row(&self, t: usize, out: &mut [f64]) {
        assert_eq!(out.len(), self.cols, "ActBuf::dequantize_row: width");
        match self.row(t) {
            ActRow::F32(x) => out.iter_mut().zip(x).for_each(|(o, &v)| *o = v as f64),
            ActRow::Q8(bs) => {
                for (o, b) in out.chunks_exact_mut(QK).zip(bs) {
                    o.iter_mut()
                        .zip(&b.qs)
                        .for_each(|(o, &q)| *o = b.d as f64 * q as f64);
                }
            }
            ActRow::Q8K(bs) => {
                for (o, b) in out.chunks_exact_mut(QK_K).zip(bs) {
                    o.iter_mut()
                        .zip(&b.qs)
                        .for_each(|(o, &q)| *o = b.d as f64 * q as f64);
                }
            }
        }
    }

    /// Token `t`'s activations.
    #[inline]
    pub fn row(&self, t: usize) -> ActRow<'_> {
        match self.kind {
            ActKind::F32 => ActRow::F32(&self.f32[t * self.cols..(t + 1) * self.cols]),
            ActKind::Q8 => {
                let b = self.cols / QK;
                ActRow::Q8(&self.q8[t * b..(t + 1) * b])
            }
            ActKind::Q8K => {
                let b = self.cols / QK_K;
                ActRow::Q8K(&self.q8k[t * b..(t + 1) * b])
            }
        }
    }
}

/// Dot product of one weight row (raw bytes of type `ty`) with activations in the matching format.
///
/// Panics if the activation format does not match `ty.act_kind()` (a programming error).
#[inline]
pub fn dot_row(ks: &KernelSet, ty: QuantType, row: &[u8], act: ActRow<'_>) -> f32 {
    use bytemuck::cast_slice as c;
    fn blocks<B: QuantBlock>(k: &RowKernels<B>, row: &[u8], act: ActRow<'_>) -> Option<f32> {
        let x: &[B::Act] = match (B::Act::KIND, act) {
            (ActKind::Q8, ActRow::Q8(x)) => c(x),
            (ActKind::Q8K, ActRow::Q8K(x)) => c(x),
            _ => return None,
        };
        Some((k.dot)(c(row), x))
    }
    let got = by_block_type!(ks, ty, k => blocks(k, row, act), float => match (ty, act) {
        (QuantType::F32, ActRow::F32(x)) => Some((ks.f32)(c(row), x)),
        (QuantType::F16, ActRow::F32(x)) => Some((ks.f16)(c(row), x)),
        (QuantType::BF16, ActRow::F32(x)) => Some((ks.bf16)(c(row), x)),
        _ => None,
    });
    got.unwrap_or_else(|| panic!("dot_row: {ty} weights cannot take {act:?} activations"))
}

/// Raw output pointer shared by row-range tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint (row, token) elements; the borrow of `out` outlives the scope.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Rows per task: enough tasks to balance the pool, each a multiple of 8 rows.
pub(crate) fn chunk_rows(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    rows.div_ceil(threads * 4).next_multiple_of(8).max(8)
}

/// Rows `r0..r1` of `w` for every token; `write(t, r, v)` receives each output.
pub(crate) fn compute_rows(
    ks: &KernelSet,
    w: &MatRef<'_>,
    acts: &ActBuf,
    r0: usize,
    r1: usize,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    let n = acts.len();
    if w.packed {
        return rows_packed(ks, w, acts, r0, r1, write);
    }
    by_block_type!(ks, w.ty, k => rows_blocks(k, w, acts.blocks(), n, r0, r1, write), float => {
        for r in r0..r1 {
            for t in 0..n {
                write(t, r, dot_row(ks, w.ty, w.row(r), acts.row(t)));
            }
        }
    })
}

/// Interleaved rows `r0..r1` (`r0` a multiple of 8): each group row against up to four tokens
/// at a time.
fn rows_packed(
    ks: &KernelSet,
    w: &MatRef<'_>,
    acts: &ActBuf,
    r0: usize,
    r1: usize,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    use crate::packed::GROUP_ROWS;
    debug_assert_eq!(r0 % GROUP_ROWS, 0);
    let nb = w.cols / w.ty.block_len();
    let layout = crate::packed::group_layout(w.ty).expect("packed matrices have a group layout");
    let group_row_bytes = nb * layout.bytes;
    let n_tok = acts.len();
    let mut out = [[0.0f32; GROUP_ROWS]; 4];
    // One group row against tokens `t0..t0 + n` (at most four; missing ones repeat the last).
    let run = |g: usize, t0: usize, n: usize, out: &mut [[f32; GROUP_ROWS]; 4]| {
        let groups = &w.data[g * group_row_bytes..(g + 1) * group_row_bytes];
        let tok = |i: usize| (t0 + i).min(n_tok - 1);
        if let Some(k) = ks.x8.get_k(w.ty) {
            let x: &[BlockQ8K] = acts.blocks();
            k(
                groups,
                std::array::from_fn(|i| &x[tok(i) * nb..(tok(i) + 1) * nb]),
                n,
                out,
            );
        } else {
            let k = ks
                .x8
                .get(w.ty)
                .expect("packed matrices have an interleaved kernel");
            let x: &[BlockQ8] = acts.blocks();
            let sums = &acts.q8_sums[..x.len()];
            let xs = std::array::from_fn(|i| &x[tok(i) * nb..(tok(i) + 1) * nb]);
            let ss = std::array::from_fn(|i| &sums[tok(i) * nb..(tok(i) + 1) * nb]);
            k(groups, xs, ss, n, out);
        }
    };
    for g in r0 / GROUP_ROWS..r1.div_ceil(GROUP_ROWS) {
        let mut t0 = 0;
        while t0 < n_tok {
            let n = (n_tok - t0).min(4);
            run(g, t0, n, &mut out);
            for (i, o) in out[..n].iter().enumerate() {
                for (k, &v) in o.iter().enumerate() {
                    let r = g * GROUP_ROWS + k;
                    if r < r1 {
                        write(t0 + i, r, v);
                    }
                }
            }
            t0 += n;
        }
    }
}

/// Block-format rows: groups of four rows share each activation load, and pairs of tokens share
/// each unpacked weight block; the group's weights stay in L1 while every token passes. Every
/// kernel computes each (row, token) as the one-row kernel does, so how tokens are grouped never
/// changes a value.
fn rows_blocks<B: QuantBlock>(
    k: &RowKernels<B>,
    w: &MatRef<'_>,
    x: &[B::Act],
    n: usize,
    r0: usize,
    r1: usize,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    let bpr = w.cols / B::LEN;
    let blocks: &[B] = bytemuck::cast_slice(w.data);
    let row = |r: usize| &blocks[r * bpr..(r + 1) * bpr];
    let xt = |t: usize| &x[t * bpr..(t + 1) * bpr];
    let mut r = r0;
    while r + 4 <= r1 {
        let rs = [row(r), row(r + 1), row(r + 2), row(r + 3)];
        let mut t = 0;
        while t + 2 <= n {
            let v = (k.dot4x2)(rs, [xt(t), xt(t + 1)]);
            for (i, pair) in v.into_iter().enumerate() {
                write(t, r + i, pair[0]);
                write(t + 1, r + i, pair[1]);
            }
            t += 2;
        }
        while t < n {
            for (i, v) in (k.dot4)(rs, xt(t)).into_iter().enumerate() {
                write(t, r + i, v);
            }
            t += 1;
        }
        r += 4;
    }
    for r in r..r1 {
        for t in 0..n {
            write(t, r, (k.dot)(row(r), xt(t)));
        }
    }
}

/// Most matrices one [`matmul_many`] call takes.
pub const MAX_MATMUL_JOBS: usize = 4;

/// `out[t * w.rows + r] = dot(w.row(r), acts.row(t))` for every token `t` and row `r`,
/// split by row ranges over the current rayon pool.
///
/// `acts` must have been quantized with `w.ty.act_kind()`; `out.len() == acts.len() * w.rows`.
pub fn matmul(ks: &KernelSet, w: &MatRef<'_>, acts: &ActBuf, out: &mut [f32]) {
    matmul_many(ks, acts, &mut [(*w, out)]);
}

/// [`matmul`] for several matrices that read the same activations (Q/K/V, gate/up), as one
/// parallel region: one fork-join instead of one per matrix.
pub fn matmul_many(ks: &KernelSet, acts: &ActBuf, jobs: &mut [(MatRef<'_>, &mut [f32])]) {
    assert!(
        jobs.len() <= MAX_MATMUL_JOBS,
        "matmul_many: at most {MAX_MATMUL_JOBS} matrices"
    );
    let n = acts.len();
    // (matrix, output, rows per task, tasks) without allocating.
    let mut plan: [Option<(MatRef<'_>, OutPtr, usize, usize)>; MAX_MATMUL_JOBS] =
        [None; MAX_MATMUL_JOBS];
    let mut total = 0;
    for (slot, (w, out)) in plan.iter_mut().zip(jobs.iter_mut()) {
        assert_eq!(
            acts.kind(),
            w.ty.act_kind(),
            "matmul: activation kind mismatch"
        );
        assert_eq!(acts.cols, w.cols, "matmul: width mismatch");
        assert_eq!(out.len(), n * w.rows, "matmul: output size");
        let chunk = chunk_rows(w.rows);
        let tasks = w.rows.div_ceil(chunk);
        *slot = Some((*w, OutPtr(out.as_mut_ptr()), chunk, tasks));
        total += tasks;
    }
    (0..total).into_par_iter().for_each(|mut task| {
        for (w, ptr, chunk, tasks) in plan.iter().flatten() {
            if task >= *tasks {
                task -= tasks;
                continue;
            }
            let (r0, r1) = (task * chunk, ((task + 1) * chunk).min(w.rows));
            let rows = w.rows;
            let ptr = *ptr;
            compute_rows(ks, w, acts, r0, r1, &mut |t, r, v| {
                debug_assert!(t < n && r0 <= r && r < r1);
                // SAFETY: (t, r) lies in this task's row range of this matrix, written once.
                unsafe { *ptr.0.add(t * rows + r) = v };
            });
            return;
        }
    });
}

/// Gather-matvec: `out[i] = dot(w.row(rows[i]), x)` for the neurons in `rows` (gate/up rows of
/// the active set). Runs on the calling thread; groups of four rows share each activation load.
///
/// `x` must be quantized for `w.ty` (one token); `out.len() == rows.len()`.
pub fn gather_matvec(ks: &KernelSet, w: &MatRef<'_>, rows: &[u32], x: &ActBuf, out: &mut [f32]) {
    assert!(
        rows.iter().all(|&r| (r as usize) < w.rows),
        "gather_matvec: row index out of range"
    );
    gather_matvec_by(ks, w.ty, w.cols, |k| w.row(rows[k] as usize), x, out)
}

/// [`gather_matvec`] over rows that may live in different buffers (a neuron cache): `out[k] =
/// dot(row(k), x)` for `k < out.len()`. Each row must hold `cols` elements of `ty` and be
/// aligned for it. The same rows in the same order give bit-identical results wherever they live.
pub fn gather_matvec_by<'r>(
    ks: &KernelSet,
    ty: QuantType,
    cols: usize,
    row: impl Fn(usize) -> &'r [u8],
    x: &ActBuf,
    out: &mut [f32],
) {
    assert_eq!(
        x.kind(),
        ty.act_kind(),
        "gather_matvec: activation kind mismatch"
    );
    assert_eq!(x.cols, cols, "gather_matvec: width mismatch");
    let row_bytes = ty
        .row_bytes(cols)
        .expect("gather_matvec: whole blocks per row");
    let row = |k: usize| {
        let r = row(k);
        assert_eq!(r.len(), row_bytes, "gather_matvec: row size");
        r
    };
    fn blocks<'r, B: QuantBlock>(
        k: &RowKernels<B>,
        row: impl Fn(usize) -> &'r [u8],
        x: &[B::Act],
        out: &mut [f32],
    ) {
        let row = |i: usize| -> &[B] { bytemuck::cast_slice(row(i)) };
        let n = out.len();
        let mut outs = out.chunks_exact_mut(4);
        for (g, o) in (&mut outs).enumerate() {
            let i = 4 * g;
            o.copy_from_slice(&(k.dot4)([row(i), row(i + 1), row(i + 2), row(i + 3)], x));
        }
        let rem = outs.into_remainder();
        let first = n - rem.len();
        for (j, o) in rem.iter_mut().enumerate() {
            *o = (k.dot)(row(first + j), x);
        }
    }
    by_block_type!(ks, ty, k => blocks(k, row, x.blocks(), out), float => {
        for (k, o) in out.iter_mut().enumerate() {
            *o = dot_row(ks, ty, row(k), x.row(0));
        }
    })
}

/// Axpy-accumulate: `y += coeff[i] * w.row(rows[i])` (the down projection stored transposed, so
/// neuron i's down column is row i). Runs on the calling thread; zero coefficients are skipped.
pub fn axpy_rows(ks: &KernelSet, w: &MatRef<'_>, rows: &[u32], coeff: &[f32], y: &mut [f32]) {
    assert_eq!(
        rows.len(),
        coeff.len(),
        "axpy_rows: one coefficient per row"
    );
    assert!(
        rows.iter().all(|&r| (r as usize) < w.rows),
        "axpy_rows: row index out of range"
    );
    axpy_rows_by(ks, w.ty, |k| w.row(rows[k] as usize), coeff, y)
}

/// [`axpy_rows`] over rows that may live in different buffers: `y += coeff[k] * row(k)` for
/// `k < coeff.len()`, in that order. Each row holds `y.len()` elements of `ty`, aligned for it.
pub fn axpy_rows_by<'r>(
    ks: &KernelSet,
    ty: QuantType,
    row: impl Fn(usize) -> &'r [u8],
    coeff: &[f32],
    y: &mut [f32],
) {
    let row_bytes = ty
        .row_bytes(y.len())
        .expect("axpy_rows: whole blocks per row");
    let row = |k: usize| {
        let r = row(k);
        assert_eq!(r.len(), row_bytes, "axpy_rows: row size");
        r
    };
    fn blocks<'r, B: QuantBlock>(
        k: &RowKernels<B>,
        row: impl Fn(usize) -> &'r [u8],
        coeff: &[f32],
        y: &mut [f32],
    ) {
        for (i, &a) in coeff.iter().enumerate() {
            if a != 0.0 {
                (k.axpy)(bytemuck::cast_slice(row(i)), a, y);
            }
        }
    }
    by_block_type!(ks, ty, k => blocks(k, row, coeff, y), float => match ty {
        QuantType::F16 => {
            for (i, &a) in coeff.iter().enumerate() {
                (ks.axpy_f16)(a, bytemuck::cast_slice(row(i)), y);
            }
        }
        QuantType::BF16 => {
            for (i, &a) in coeff.iter().enumerate() {
                (ks.axpy_bf16)(a, bytemuck::cast_slice(row(i)), y);
            }
        }
        _ => {
            for (i, &a) in coeff.iter().enumerate() {
                let r: &[f32] = bytemuck::cast_slice(row(i));
                y.iter_mut().zip(r).for_each(|(o, v)| *o += a * v);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::BlockQ4_1;

    fn q4_1_matrix(rows: usize, cols: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for r in 0..rows {
            for b in 0..cols / 32 {
                let x: Vec<f32> = (0..32)
                    .map(|i| ((r * 7 + b * 3 + i) % 13) as f32 - 6.0)
                    .collect();
                bytes.extend_from_slice(bytemuck::bytes_of(&BlockQ4_1::quantize(&x)));
            }
        }
        bytes
    }

    #[test]
    fn gather_and_axpy_match_dense() {
        let (rows, cols) = (11, 64);
        let bytes = q4_1_matrix(rows, cols);
        let w = MatRef::new(QuantType::Q4_1, rows, cols, &bytes).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.3).sin()).collect();
        let mut acts = ActBuf::new();
        acts.quantize(QuantType::Q4_1.act_kind(), &x, cols);
        let mut dense = vec![0.0; rows];
        matmul(KernelSet::best(), &w, &acts, &mut dense);
        let pick = [9u32, 0, 3, 3, 10, 7];
        let mut got = vec![0.0; pick.len()];
        gather_matvec(KernelSet::best(), &w, &pick, &acts, &mut got);
        for (g, &r) in got.iter().zip(&pick) {
            assert!((g - dense[r as usize]).abs() <= 1e-4 * dense[r as usize].abs().max(1.0));
        }
        // axpy: y = 2*row9 - row3 + 0*row5
        let mut y = vec![1.0; cols];
        axpy_rows(KernelSet::best(), &w, &[9, 3, 5], &[2.0, -1.0, 0.0], &mut y);
        let (mut r9, mut r3) = (vec![0.0; cols], vec![0.0; cols]);
        w.dequantize_row(9, &mut r9);
        w.dequantize_row(3, &mut r3);
        for i in 0..cols {
            assert!((y[i] - (1.0 + 2.0 * r9[i] - r3[i])).abs() < 1e-5);
        }
    }

    #[test]
    fn matrix_view_rejects_bad_geometry() {
        let bytes = q4_1_matrix(2, 64);
        assert!(MatRef::new(QuantType::Q4_1, 2, 64, &bytes).is_ok());
        assert!(matches!(
            MatRef::new(QuantType::Q4_1, 3, 64, &bytes),
            Err(KernelError::SizeMismatch { .. })
        ));
        assert!(matches!(
            MatRef::new(QuantType::Q4_1, 2, 48, &bytes),
            Err(KernelError::RowNotBlockAligned { .. })
        ));
    }

    #[test]
    fn matmul_equals_dequantized_reference() {
        let (rows, cols, n) = (37, 96, 3);
        let bytes = q4_1_matrix(rows, cols);
        let w = MatRef::new(QuantType::Q4_1, rows, cols, &bytes).unwrap();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 17) % 29) as f32 / 10.0 - 1.4)
            .collect();
        let mut acts = ActBuf::new();
        acts.quantize(QuantType::Q4_1.act_kind(), &x, cols);
        let mut out = vec![0.0; n * rows];
        matmul(KernelSet::best(), &w, &acts, &mut out);
        // Reference: dequantized weights times dequantized (quantized) activations, in f64.
        let mut xq = vec![0.0f32; n * cols];
        for t in 0..n {
            let ActRow::Q8(blocks) = acts.row(t) else {
                unreachable!()
            };
            for (b, o) in blocks.iter().zip(xq[t * cols..].chunks_mut(32)) {
                b.dequantize(o);
            }
        }
        let mut wr = vec![0.0; cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut wr);
            for t in 0..n {
                let xt = &xq[t * cols..(t + 1) * cols];
                let want: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                let magnitude: f64 = wr
                    .iter()
                    .zip(xt)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let got = out[t * rows + r] as f64;
                // the Q4_1 min term uses the activation sum rounded to f16 (as ggml does)
                assert!(
                    (got - want).abs() < 1e-3 * magnitude.max(1.0),
                    "r{r} t{t}: {got} vs {want}"
                );
            }
        }
    }
}
