//! Many row blocks against one token's activations in one parallel region (a clustered head
//! computes thousands of small clusters of output rows per token: through [`crate::matmul`]
//! each would pay a fork-join of its own).

use crate::ops::{chunk_rows, compute_rows, OutPtr};
use crate::{ActBuf, KernelSet, MatRef};
use rayon::prelude::*;

/// `out[at + i] = w.row(i) . acts` for every row `i` of every `(w, at)` in `blocks`, for one
/// token (`acts.len() == 1`); rows outside the blocks are left as they are. The results are
/// [`crate::matmul`]'s on each block, bit for bit. Blocks must not overlap in `out`.
pub fn matvec_blocks(
    ks: &KernelSet,
    acts: &ActBuf,
    blocks: &[(MatRef<'_>, usize)],
    out: &mut [f32],
) {
    assert_eq!(acts.len(), 1, "matvec_blocks: one token");
    for (w, at) in blocks {
        assert_eq!(
            acts.kind(),
            w.ty.act_kind(),
            "matvec_blocks: activation kind"
        );
        assert_eq!(acts.cols, w.cols, "matvec_blocks: width mismatch");
        assert!(at + w.rows <= out.len(), "matvec_blocks: output size");
    }
    let total: usize = blocks.iter().map(|(w, _)| w.rows).sum();
    let chunk = chunk_rows(total);
    // Pieces of at most `chunk` rows (block-relative starts at multiples of 8, as interleaved
    // matrices need), gathered into tasks of about `chunk` rows.
    let mut pieces = Vec::new();
    let mut tasks = vec![0];
    let mut rows_in_task = 0;
    for (b, (w, _)) in blocks.iter().enumerate() {
        let mut r0 = 0;
        while r0 < w.rows {
            let r1 = (r0 + chunk).min(w.rows);
            pieces.push((b, r0, r1));
            rows_in_task += r1 - r0;
            if rows_in_task >= chunk {
                tasks.push(pieces.len());
                rows_in_task = 0;
            }
            r0 = r1;
        }
    }
    if *tasks.last().expect("starts with 0") != pieces.len() {
        tasks.push(pieces.len());
    }
    let ptr = OutPtr(out.as_mut_ptr());
    tasks.par_windows(2).for_each(|task| {
        let ptr = &ptr;
        for &(b, r0, r1) in &pieces[task[0]..task[1]] {
            let (w, at) = &blocks[b];
            compute_rows(ks, w, acts, r0, r1, &mut |_, r, v| {
                // SAFETY: row `r` of block `b` lies inside `out` (checked above), blocks do not
                // overlap and each piece's rows are written by this task alone.
                unsafe { *ptr.0.add(at + r) = v };
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{matmul, PackedMat, QuantType};

    /// Every block's rows equal `matmul` on that block alone, bit for bit, on the file's row
    /// layout and on interleaved copies, for many small blocks and a few large ones.
    #[test]
    fn blocks_equal_matmul_per_block() {
        let ks = KernelSet::best();
        let (rows, cols) = (1024, 256);
        for ty in [QuantType::Q8_0, QuantType::Q4_0] {
            let values: Vec<f32> = (0..rows * cols)
                .map(|i| (((i * 7919) % 251) as f32 - 125.0) / 97.0)
                .collect();
            let bytes: Vec<u8> = values
                .chunks_exact(cols)
                .flat_map(|r| ty.quantize_row(r).unwrap())
                .collect();
            let plain = MatRef::new(ty, rows, cols, &bytes).unwrap();
            let packed = PackedMat::pack(&plain);
            let mats = [Some(plain), packed.as_ref().map(PackedMat::mat)];
            let x: Vec<f32> = (0..cols).map(|i| ((i % 13) as f32 - 6.0) / 5.0).collect();
            let mut acts = ActBuf::new();
            acts.quantize(ty.act_kind(), &x, cols);
            for (layout, m) in ["rows", "interleaved"].into_iter().zip(mats) {
                let Some(m) = m else { continue };
                for ranges in [
                    (0..rows / 16)
                        .map(|c| (c * 16, c * 16 + 8))
                        .collect::<Vec<_>>(),
                    vec![(0, 40), (64, 72), (512, 1000)],
                    vec![(0, rows)],
                ] {
                    let mut want = vec![-1.0f32; rows];
                    for &(a, b) in &ranges {
                        matmul(ks, &m.rows(a..b), &acts, &mut want[a..b]);
                    }
                    let blocks: Vec<_> = ranges.iter().map(|&(a, b)| (m.rows(a..b), a)).collect();
                    let mut got = vec![-1.0f32; rows];
                    matvec_blocks(ks, &acts, &blocks, &mut got);
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty} {layout}: {} ranges", ranges.len());
                }
            }
        }
    }
}
