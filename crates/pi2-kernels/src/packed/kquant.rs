//! Interleaved groups of the k-quants (Q4_K, Q5_K, Q6_K): eight rows' super-blocks of 256.
//!
//! The quants are laid out as for the 32-element formats (32-bit lane `r` of every 32-byte
//! load = four consecutive quants of row `r`); the sub-block scales (and Q4_K/Q5_K minimums)
//! are unpacked to one byte each and stored in *pairs*: 16 bytes per pair of sub-blocks
//! `(2p, 2p + 1)`, bytes `2r, 2r + 1` for row `r`. Widened to i16, a pair vector has row `r`'s
//! two scales in lane `r`, which is what `madd` needs both for the scaled sums and for the
//! minimum/offset terms against the activations' pair sums.
//!
//! Offsets (bytes):
//! - Q4_K (1184): `d[8]` 0, `dmin[8]` 16, scale pairs 32 (4 x 16), minimum pairs 96 (4 x 16),
//!   `qs` 160: load `8j + c` (chunk `j` < 4, column `c` < 8), lane bytes = row's native
//!   `qs[32j + 4c + i]` (low nibble: sub-block `2j`, high: `2j + 1`).
//! - Q5_K (1440): as Q4_K, then `qh` 160: load `c` < 8, lane bytes = native `qh[4c + i]`
//!   (bit `2j` / `2j + 1`: fifth bit of the low / high nibble of chunk `j`), `qs` 416.
//! - Q6_K (1680): `d[8]` 0, scale pairs 16 (8 x 16, signed), `ql` 144: load `8(2n + a) + c`
//!   (half `n` < 2, `a` < 2, `c` < 8), lane bytes = native `ql[64n + 32a + 4c + i]`; `qh` 1168:
//!   load `8n + c`, lane bytes = native `qh[32n + 4c + i]`.

use super::{GroupLayout, GROUP_ROWS};
use crate::quant::{scale_min_k4, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, K_SCALE_SIZE};
use crate::QuantType;

/// The k-quant group layouts.
pub(crate) fn layout(ty: QuantType) -> Option<GroupLayout> {
    let l = match ty {
        QuantType::Q4_K => GroupLayout {
            dmin: Some(16),
            sc: Some(32),
            mn: Some(96),
            qs: 160,
            bytes: 1184,
            ..GroupLayout::default()
        },
        QuantType::Q5_K => GroupLayout {
            dmin: Some(16),
            sc: Some(32),
            mn: Some(96),
            qh: Some(160),
            qs: 416,
            bytes: 1440,
            ..GroupLayout::default()
        },
        QuantType::Q6_K => GroupLayout {
            sc: Some(16),
            qs: 144,
            qh: Some(1168),
            bytes: 1680,
            ..GroupLayout::default()
        },
        _ => return None,
    };
    Some(l)
}

/// Copies 4-byte column `c` of `src` into row `r`'s lane of load `load` at `at`.
fn put_lane(grp: &mut [u8], at: usize, load: usize, r: usize, src: &[u8]) {
    let o = at + 32 * load + 4 * r;
    grp[o..o + 4].copy_from_slice(src);
}

fn take_lane(grp: &[u8], at: usize, load: usize, r: usize) -> [u8; 4] {
    let o = at + 32 * load + 4 * r;
    grp[o..o + 4].try_into().expect("four bytes")
}

/// Writes row `r`'s super-block (raw bytes of `ty`) into its lanes of `grp`.
pub(super) fn put_block(ty: QuantType, l: &GroupLayout, blk: &[u8], r: usize, grp: &mut [u8]) {
    let put16 = |grp: &mut [u8], at: usize, v: u16| {
        grp[at + 2 * r..at + 2 * r + 2].copy_from_slice(&v.to_le_bytes())
    };
    let sc_at = l.sc.expect("k-quant layout");
    let pair = |grp: &mut [u8], at: usize, p: usize, a: u8, b: u8| {
        grp[at + 16 * p + 2 * r] = a;
        grp[at + 16 * p + 2 * r + 1] = b;
    };
    match ty {
        QuantType::Q6_K => {
            let b: BlockQ6K = bytemuck::pod_read_unaligned(blk);
            put16(grp, 0, b.d);
            for p in 0..8 {
                pair(
                    grp,
                    sc_at,
                    p,
                    b.scales[2 * p] as u8,
                    b.scales[2 * p + 1] as u8,
                );
            }
            for n in 0..2 {
                for c in 0..8 {
                    for a in 0..2 {
                        let src = &b.ql[64 * n + 32 * a + 4 * c..][..4];
                        put_lane(grp, l.qs, 8 * (2 * n + a) + c, r, src);
                    }
                    let qh_at = l.qh.expect("Q6_K has qh");
                    put_lane(grp, qh_at, 8 * n + c, r, &b.qh[32 * n + 4 * c..][..4]);
                }
            }
        }
        _ => {
            let (d, dmin, scales, qh, qs) = if ty == QuantType::Q5_K {
                let b: BlockQ5K = bytemuck::pod_read_unaligned(blk);
                (b.d, b.dmin, b.scales, Some(b.qh), b.qs)
            } else {
                let b: BlockQ4K = bytemuck::pod_read_unaligned(blk);
                (b.d, b.dmin, b.scales, None, b.qs)
            };
            put16(grp, 0, d);
            put16(grp, l.dmin.expect("k4 layout"), dmin);
            let mn_at = l.mn.expect("k4 layout");
            for p in 0..4 {
                let (s0, m0) = scale_min_k4(2 * p, &scales);
                let (s1, m1) = scale_min_k4(2 * p + 1, &scales);
                pair(grp, sc_at, p, s0, s1);
                pair(grp, mn_at, p, m0, m1);
            }
            for j in 0..4 {
                for c in 0..8 {
                    put_lane(grp, l.qs, 8 * j + c, r, &qs[32 * j + 4 * c..][..4]);
                }
            }
            if let (Some(at), Some(qh)) = (l.qh, qh) {
                for c in 0..8 {
                    put_lane(grp, at, c, r, &qh[4 * c..][..4]);
                }
            }
        }
    }
}

/// Packs eight 6-bit scales and minimums into Q4_K/Q5_K's 12 bytes (inverse of
/// `scale_min_k4`).
fn pack_scales(sc: [u8; 8], mn: [u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut q = [0u8; K_SCALE_SIZE];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    q
}

/// Row `r`'s super-block back out of a group (raw bytes of `ty`).
pub(super) fn take_block(ty: QuantType, l: &GroupLayout, grp: &[u8], r: usize) -> Vec<u8> {
    let get16 = |at: usize| u16::from_le_bytes([grp[at + 2 * r], grp[at + 2 * r + 1]]);
    let sc_at = l.sc.expect("k-quant layout");
    let pair = |at: usize, p: usize| (grp[at + 16 * p + 2 * r], grp[at + 16 * p + 2 * r + 1]);
    match ty {
        QuantType::Q6_K => {
            let mut b: BlockQ6K = bytemuck::Zeroable::zeroed();
            b.d = get16(0);
            for p in 0..8 {
                let (s0, s1) = pair(sc_at, p);
                b.scales[2 * p] = s0 as i8;
                b.scales[2 * p + 1] = s1 as i8;
            }
            for n in 0..2 {
                for c in 0..8 {
                    for a in 0..2 {
                        let o = 64 * n + 32 * a + 4 * c;
                        b.ql[o..o + 4].copy_from_slice(&take_lane(
                            grp,
                            l.qs,
                            8 * (2 * n + a) + c,
                            r,
                        ));
                    }
                    let qh_at = l.qh.expect("Q6_K has qh");
                    let o = 32 * n + 4 * c;
                    b.qh[o..o + 4].copy_from_slice(&take_lane(grp, qh_at, 8 * n + c, r));
                }
            }
            bytemuck::bytes_of(&b).to_vec()
        }
        _ => {
            let mut sc = [0u8; 8];
            let mut mn = [0u8; 8];
            let mn_at = l.mn.expect("k4 layout");
            for p in 0..4 {
                (sc[2 * p], sc[2 * p + 1]) = pair(sc_at, p);
                (mn[2 * p], mn[2 * p + 1]) = pair(mn_at, p);
            }
            let mut qs = [0u8; 128];
            for j in 0..4 {
                for c in 0..8 {
                    let o = 32 * j + 4 * c;
                    qs[o..o + 4].copy_from_slice(&take_lane(grp, l.qs, 8 * j + c, r));
                }
            }
            let (d, dmin, scales) = (get16(0), get16(l.dmin.expect("k4")), pack_scales(sc, mn));
            match l.qh {
                Some(at) => {
                    let mut qh = [0u8; 32];
                    for c in 0..8 {
                        qh[4 * c..4 * c + 4].copy_from_slice(&take_lane(grp, at, c, r));
                    }
                    let b = BlockQ5K {
                        d,
                        dmin,
                        scales,
                        qh,
                        qs,
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
                None => {
                    let b = BlockQ4K {
                        d,
                        dmin,
                        scales,
                        qs,
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
            }
        }
    }
}

/// An interleaved k-quant kernel: one group row against up to four tokens' Q8_K activations;
/// fills `out[t]` for `t < n` (`n` in 1..=4).
pub type Rows8KFn = fn(&[u8], [&[BlockQ8K]; 4], usize, &mut [[f32; GROUP_ROWS]; 4]);

/// Scalar reference: every row unpacked and dotted through its format's reference.
fn rows8k_ref(ty: QuantType, groups: &[u8], x: &[&[BlockQ8K]], out: &mut [[f32; GROUP_ROWS]]) {
    let l = layout(ty).expect("k-quant");
    // `r` picks a row of every token's output: the index is the clearer form here.
    #[allow(clippy::needless_range_loop)]
    for r in 0..GROUP_ROWS {
        let row = super::aligned(
            groups
                .chunks_exact(l.bytes)
                .flat_map(|grp| take_block(ty, &l, grp, r)),
        );
        let row = &bytemuck::cast_slice(&row.0)[..row.1];
        for (t, xt) in x.iter().enumerate() {
            let act = crate::ActRow::Q8K(xt);
            out[t][r] = crate::dot_row(&crate::KernelSet::scalar(), ty, row, act);
        }
    }
}

/// The scalar reference as a [`Rows8KFn`] for `ty`.
pub(crate) fn rows8k_ref_fn(ty: QuantType) -> Rows8KFn {
    match ty {
        QuantType::Q4_K => |g, x, n, out| rows8k_ref(QuantType::Q4_K, g, &x[..n], &mut out[..n]),
        QuantType::Q5_K => |g, x, n, out| rows8k_ref(QuantType::Q5_K, g, &x[..n], &mut out[..n]),
        _ => |g, x, n, out| rows8k_ref(QuantType::Q6_K, g, &x[..n], &mut out[..n]),
    }
}

/// Per pair of 32-element sub-blocks `(2p, 2p + 1)`, their activation sums packed as two i16
/// in one i32 (the `madd` partner of the minimum pairs).
pub(crate) fn bsum32_pairs(x: &BlockQ8K) -> [i32; 4] {
    std::array::from_fn(|p| {
        let s = |k: usize| (x.bsums[2 * k] as i32 + x.bsums[2 * k + 1] as i32) as i16;
        (s(2 * p) as u16 as u32 | ((s(2 * p + 1) as u16 as u32) << 16)) as i32
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QK_K;

    #[test]
    fn scales_pack_round_trips() {
        let sc: [u8; 8] = std::array::from_fn(|i| (i as u8 * 9 + 5) % 64);
        let mn: [u8; 8] = std::array::from_fn(|i| (i as u8 * 23 + 1) % 64);
        let q = pack_scales(sc, mn);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (sc[j], mn[j]));
        }
    }

    #[test]
    fn random_blocks_round_trip() {
        for ty in [QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K] {
            let l = layout(ty).unwrap();
            let bb = ty.block_bytes();
            assert_eq!(
                l.bytes,
                GROUP_ROWS * bb + if ty == QuantType::Q6_K { 0 } else { 32 }
            );
            let mut s = 0x1234_5678u32;
            let blocks: Vec<Vec<u8>> = (0..GROUP_ROWS)
                .map(|_| {
                    (0..bb)
                        .map(|_| {
                            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                            (s >> 24) as u8
                        })
                        .collect()
                })
                .collect();
            let mut grp = vec![0u8; l.bytes];
            for (r, b) in blocks.iter().enumerate() {
                put_block(ty, &l, b, r, &mut grp);
            }
            for (r, b) in blocks.iter().enumerate() {
                assert_eq!(&take_block(ty, &l, &grp, r), b, "{ty} row {r}");
            }
        }
        assert_eq!(QK_K, 256);
    }
}
