//! Row-interleaved ("x8") copies of 32-element block matrices for dense matvec and GEMM.
//!
//! In GGML's row layout every block carries its own f16 scale, so a SIMD dot product spends
//! most of its instructions per block on one row's scale and on a horizontal sum. Here eight
//! rows are interleaved block column by block column: one *group* holds the same block of rows
//! `8g..8g+8`, its eight scales side by side, and its quants arranged so that 32-bit lane `r` of
//! every 32-byte load holds four consecutive quants of row `r`. One broadcast of four
//! activations then serves all eight rows, the eight scales convert in one instruction, and
//! the lanes of the accumulator are the eight outputs: no horizontal sums.
//!
//! Group layout (offsets in bytes; the group is exactly eight of the type's blocks long):
//! - `d[8]`: f16 scales, row order;
//! - `m[8]`: f16 minimums (Q4_1, Q5_1);
//! - `qh[32]` (Q5_0, Q5_1): byte `4r + i`, bit `k` = fifth bit of row `r`'s element
//!   `e(k) + i`, where `e(k) = 4k` for `k < 4` and `16 + 4(k - 4)` after;
//! - `qs`: 4/5-bit formats: 4 loads of 32 bytes; byte `32j + 4r + i` = row `r`'s native
//!   `qs[4j + i]` (low nibble element `4j + i`, high nibble element `16 + 4j + i`).
//!   Q8_0: 8 loads; byte `32j + 4r + i` = row `r`'s element `4j + i`.
//!
//! Rows past the matrix's end (the last group of a matrix whose rows are not a multiple of 8)
//! are zero blocks: scale 0, they contribute nothing and their outputs are dropped.

use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8, BlockQ8_0, QK};
use crate::{MatRef, QuantType};

mod kquant;
pub use kquant::Rows8KFn;
pub(crate) use kquant::{bsum32_pairs, rows8k_ref_fn};

/// Rows per group.
pub const GROUP_ROWS: usize = 8;

/// Byte offsets inside one group of a packable type (`None`: the type has no such field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupLayout {
    /// f16 minimums `m[8]` (Q4_1, Q5_1).
    pub min: Option<usize>,
    /// f16 super-minimums `dmin[8]` (Q4_K, Q5_K).
    pub dmin: Option<usize>,
    /// Sub-block scale pairs (k-quants, see `kquant`).
    pub sc: Option<usize>,
    /// Sub-block minimum pairs (Q4_K, Q5_K).
    pub mn: Option<usize>,
    /// High quant bits.
    pub qh: Option<usize>,
    /// Low quant bits (or the whole quants of Q8_0).
    pub qs: usize,
    /// The whole group.
    pub bytes: usize,
}

/// The group layout of `ty`, or `None` if `ty` has no interleaved form.
pub(crate) fn group_layout(ty: QuantType) -> Option<GroupLayout> {
    if let Some(l) = kquant::layout(ty) {
        return Some(l);
    }
    let (min, qh) = match ty {
        QuantType::Q4_0 | QuantType::Q8_0 => (false, false),
        QuantType::Q4_1 => (true, false),
        QuantType::Q5_0 => (false, true),
        QuantType::Q5_1 => (true, true),
        _ => return None,
    };
    // d[8] (16 bytes), then m[8] (16), then qh (32), then the quants.
    let layout = GroupLayout {
        min: min.then_some(16),
        qh: qh.then_some(16 + 16 * min as usize),
        qs: 16 + 16 * min as usize + 32 * qh as usize,
        bytes: GROUP_ROWS * ty.block_bytes(),
        ..GroupLayout::default()
    };
    debug_assert_eq!(
        layout.qs + if ty == QuantType::Q8_0 { 256 } else { 128 },
        layout.bytes
    );
    Some(layout)
}

/// Element of a 4/5-bit block that bit `k` of a packed `qh` byte describes, for lane byte `i`.
fn qh_element(k: usize, i: usize) -> usize {
    if k < 4 {
        4 * k + i
    } else {
        16 + 4 * (k - 4) + i
    }
}

/// An owned row-interleaved copy of a matrix; [`PackedMat::mat`] views it for [`crate::matmul`].
#[derive(Clone, Debug)]
pub struct PackedMat {
    ty: QuantType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl PackedMat {
    /// Interleave `m`'s rows, or `None` if its type has no interleaved form (F32, F16) or it
    /// is already interleaved.
    pub fn pack(m: &MatRef<'_>) -> Option<PackedMat> {
        Self::pack_with(m, |_| {})
    }

    /// [`PackedMat::pack`], calling `done(rows)` each time the first `rows` rows are copied
    /// (every 1024 rows and at the end), so the caller can drop the source pages as it goes.
    pub fn pack_with(m: &MatRef<'_>, mut done: impl FnMut(usize)) -> Option<PackedMat> {
        let layout = group_layout(m.ty)?;
        if m.is_packed() {
            return None;
        }
        let nb = m.cols / m.ty.block_len();
        let groups = m.rows.div_ceil(GROUP_ROWS);
        let mut data = vec![0u8; groups * nb * layout.bytes];
        let bb = m.ty.block_bytes();
        for (g, gdata) in data.chunks_exact_mut(nb * layout.bytes).enumerate() {
            for (b, grp) in gdata.chunks_exact_mut(layout.bytes).enumerate() {
                for r in 0..GROUP_ROWS.min(m.rows - g * GROUP_ROWS) {
                    let row = m.row(g * GROUP_ROWS + r);
                    put_block(m.ty, &layout, &row[b * bb..(b + 1) * bb], r, grp);
                }
            }
            let rows = ((g + 1) * GROUP_ROWS).min(m.rows);
            if rows.is_multiple_of(1024) || rows == m.rows {
                done(rows);
            }
        }
        Some(PackedMat {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data,
        })
    }

    /// The matrix view the kernels take.
    pub fn mat(&self) -> MatRef<'_> {
        MatRef::packed(self.ty, self.rows, self.cols, &self.data)
    }

    /// Bytes held (the same as the row layout, plus padding rows of the last group).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Writes row `r`'s block (raw bytes of `ty`) into its lanes of `grp`.
fn put_block(ty: QuantType, layout: &GroupLayout, blk: &[u8], r: usize, grp: &mut [u8]) {
    if kquant::layout(ty).is_some() {
        return kquant::put_block(ty, layout, blk, r, grp);
    }
    let (d, m, qh, qs): (u16, u16, Option<u32>, Vec<u8>) = match ty {
        QuantType::Q4_0 => {
            let b: BlockQ4_0 = bytemuck::pod_read_unaligned(blk);
            (b.d, 0, None, b.qs.to_vec())
        }
        QuantType::Q4_1 => {
            let b: BlockQ4_1 = bytemuck::pod_read_unaligned(blk);
            (b.d, b.m, None, b.qs.to_vec())
        }
        QuantType::Q5_0 => {
            let b: BlockQ5_0 = bytemuck::pod_read_unaligned(blk);
            (b.d, 0, Some(u32::from_le_bytes(b.qh)), b.qs.to_vec())
        }
        QuantType::Q5_1 => {
            let b: BlockQ5_1 = bytemuck::pod_read_unaligned(blk);
            (b.d, b.m, Some(u32::from_le_bytes(b.qh)), b.qs.to_vec())
        }
        QuantType::Q8_0 => {
            let b: BlockQ8_0 = bytemuck::pod_read_unaligned(blk);
            (b.d, 0, None, bytemuck::cast_slice(&b.qs).to_vec())
        }
        _ => unreachable!("group_layout admits only 32-element formats"),
    };
    grp[2 * r..2 * r + 2].copy_from_slice(&d.to_le_bytes());
    if let Some(at) = layout.min {
        grp[at + 2 * r..at + 2 * r + 2].copy_from_slice(&m.to_le_bytes());
    }
    if let (Some(at), Some(h)) = (layout.qh, qh) {
        for i in 0..4 {
            let mut byte = 0u8;
            for k in 0..8 {
                byte |= (((h >> qh_element(k, i)) & 1) as u8) << k;
            }
            grp[at + 4 * r + i] = byte;
        }
    }
    for (j, chunk) in qs.chunks_exact(4).enumerate() {
        let at = layout.qs + 32 * j + 4 * r;
        grp[at..at + 4].copy_from_slice(chunk);
    }
}

/// Row `r`'s block back out of a group (raw bytes of `ty`): the inverse of `put_block`.
pub(crate) fn take_block(ty: QuantType, grp: &[u8], r: usize) -> Vec<u8> {
    let layout = group_layout(ty).expect("packable type");
    if kquant::layout(ty).is_some() {
        return kquant::take_block(ty, &layout, grp, r);
    }
    let d = u16::from_le_bytes([grp[2 * r], grp[2 * r + 1]]);
    let m = layout
        .min
        .map(|at| u16::from_le_bytes([grp[at + 2 * r], grp[at + 2 * r + 1]]))
        .unwrap_or(0);
    let n_loads = if ty == QuantType::Q8_0 { 8 } else { 4 };
    let mut qs = Vec::with_capacity(4 * n_loads);
    for j in 0..n_loads {
        let at = layout.qs + 32 * j + 4 * r;
        qs.extend_from_slice(&grp[at..at + 4]);
    }
    let mut h = 0u32;
    if let Some(at) = layout.qh {
        for i in 0..4 {
            let byte = grp[at + 4 * r + i];
            for k in 0..8 {
                h |= (((byte >> k) & 1) as u32) << qh_element(k, i);
            }
        }
    }
    let mut qs16 = [0u8; QK / 2];
    if ty != QuantType::Q8_0 {
        qs16.copy_from_slice(&qs);
    }
    let qh = h.to_le_bytes();
    match ty {
        QuantType::Q4_0 => bytemuck::bytes_of(&BlockQ4_0 { d, qs: qs16 }).to_vec(),
        QuantType::Q4_1 => bytemuck::bytes_of(&BlockQ4_1 { d, m, qs: qs16 }).to_vec(),
        QuantType::Q5_0 => bytemuck::bytes_of(&BlockQ5_0 { d, qh, qs: qs16 }).to_vec(),
        QuantType::Q5_1 => bytemuck::bytes_of(&BlockQ5_1 { d, m, qh, qs: qs16 }).to_vec(),
        QuantType::Q8_0 => {
            let mut q = [0i8; QK];
            q.copy_from_slice(bytemuck::cast_slice(&qs));
            bytemuck::bytes_of(&BlockQ8_0 { d, qs: q }).to_vec()
        }
        _ => unreachable!("packable type"),
    }
}

/// Scalar reference of the interleaved kernels: `out[t][r]` = row `r` of the group row
/// `groups` (all `nb` block columns) dotted with token `t`, each row through its format's
/// reference dot product.
pub(crate) fn rows8_ref(
    ty: QuantType,
    groups: &[u8],
    x: &[&[BlockQ8]],
    out: &mut [[f32; GROUP_ROWS]],
) {
    let layout = group_layout(ty).expect("packable type");
    // `r` picks a row of every token's output: the index is the clearer form here.
    #[allow(clippy::needless_range_loop)]
    for r in 0..GROUP_ROWS {
        let row = aligned(
            groups
                .chunks_exact(layout.bytes)
                .flat_map(|g| take_block(ty, g, r)),
        );
        let row = &bytemuck::cast_slice(&row.0)[..row.1];
        for (t, xt) in x.iter().enumerate() {
            let act = crate::ActRow::Q8(xt);
            out[t][r] = crate::dot_row(&crate::KernelSet::scalar(), ty, row, act);
        }
    }
}

/// Bytes copied into 8-aligned storage (block views need their fields aligned): the words and
/// the byte length.
pub(crate) fn aligned(bytes: impl Iterator<Item = u8>) -> (Vec<u64>, usize) {
    let bytes: Vec<u8> = bytes.collect();
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(&bytes);
    (words, bytes.len())
}

/// An interleaved kernel: one group row (`groups`, every block column) against up to four
/// tokens' activations `x[t]` with their per-block integer sums `sums[t]`; fills `out[t]` for
/// `t < n` (`n` in 1..=4).
pub type Rows8Fn = fn(&[u8], [&[BlockQ8]; 4], [&[i32]; 4], usize, &mut [[f32; GROUP_ROWS]; 4]);

/// The scalar reference as a [`Rows8Fn`] for `ty`.
pub(crate) fn rows8_ref_fn(ty: QuantType) -> Rows8Fn {
    macro_rules! for_ty {
        ($t:expr) => {
            |g, x, _sums, n, out| rows8_ref($t, g, &x[..n], &mut out[..n])
        };
    }
    match ty {
        QuantType::Q4_0 => for_ty!(QuantType::Q4_0),
        QuantType::Q4_1 => for_ty!(QuantType::Q4_1),
        QuantType::Q5_0 => for_ty!(QuantType::Q5_0),
        QuantType::Q5_1 => for_ty!(QuantType::Q5_1),
        _ => for_ty!(QuantType::Q8_0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for r in 0..rows {
            let x: Vec<f32> = (0..cols)
                .map(|c| (((r * 31 + c * 7) % 23) as f32 - 11.0) * 0.13)
                .collect();
            out.extend(ty.quantize_row(&x).unwrap());
        }
        out
    }

    #[test]
    fn pack_then_take_round_trips_every_block() {
        for ty in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q5_0,
            QuantType::Q5_1,
            QuantType::Q8_0,
        ] {
            let (rows, cols) = (13, 96);
            let bytes = matrix(ty, rows, cols);
            let m = MatRef::new(ty, rows, cols, &bytes).unwrap();
            let p = PackedMat::pack(&m).unwrap();
            let layout = group_layout(ty).unwrap();
            assert_eq!(p.bytes(), 2 * 3 * layout.bytes);
            let bb = ty.block_bytes();
            for row in 0..rows {
                for b in 0..cols / QK {
                    let (g, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
                    let grp = &p.data[(g * 3 + b) * layout.bytes..][..layout.bytes];
                    assert_eq!(
                        take_block(ty, grp, r),
                        m.row(row)[b * bb..(b + 1) * bb],
                        "{ty} row {row} block {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn unpackable_types_are_refused() {
        let bytes = vec![0u8; 64];
        let m = MatRef::new(QuantType::F16, 2, 16, &bytes).unwrap();
        assert!(PackedMat::pack(&m).is_none());
        let q = matrix(QuantType::Q8_0, 8, 32);
        let p = PackedMat::pack(&MatRef::new(QuantType::Q8_0, 8, 32, &q).unwrap()).unwrap();
        assert!(PackedMat::pack(&p.mat()).is_none(), "already interleaved");
    }
}
