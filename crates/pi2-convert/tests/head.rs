//! The sparse output head's guarantee on generated output matrices: no row left out can beat
//! the row chosen (greedy), every row of the top-k is computed, computed rows equal the dense
//! product bit for bit (row layout and interleaved), ties keep the lowest id, and rows built to
//! defeat the low-rank score (large, far from the basis) are still never wrongly left out.

use half::f16;
use pi2_convert::head::{build_head, HiddenMoment};
use pi2_engine::{head_logits, HeadNeed, HeadScratch, SparseHead};
use pi2_kernels::{matmul, ActBuf, KernelSet, MatRef, PackedMat, QuantType};
use proptest::prelude::*;

const D: usize = 128;

/// SplitMix64: test data from a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn normal(r: &mut Rng) -> f32 {
    // Sum of uniforms: close enough to normal for shaping test data.
    (0..4).map(|_| r.uniform()).sum::<f32>() - 2.0
}

/// A structured output matrix (rank-8 signal plus noise), with `adversarial` rows of large
/// norm along directions the hidden states rarely take, and row 3 duplicated at row 5 (a tie).
fn matrix(seed: u64, vocab: usize, adversarial: usize) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let basis: Vec<f32> = (0..8 * D).map(|_| normal(&mut r)).collect();
    let mut w = vec![0.0f32; vocab * D];
    for (i, row) in w.chunks_exact_mut(D).enumerate() {
        let a: Vec<f32> = (0..8).map(|_| normal(&mut r) * 0.1).collect();
        for (j, x) in row.iter_mut().enumerate() {
            *x = (0..8).map(|k| a[k] * basis[k * D + j]).sum::<f32>() + 0.01 * normal(&mut r);
        }
        if i >= vocab - adversarial {
            // Big weights on the last coordinates, where the hidden states are small.
            for x in &mut row[D - 16..] {
                *x += 2.0 * normal(&mut r);
            }
        }
    }
    let dup: Vec<f32> = w[3 * D..4 * D].to_vec();
    w[5 * D..6 * D].copy_from_slice(&dup);
    w
}

/// Hidden states mostly in the first coordinates, a little elsewhere; `tail` scales the last
/// 16 coordinates (where the adversarial rows are large).
fn hidden(r: &mut Rng, tail: f32) -> Vec<f32> {
    (0..D)
        .map(|j| {
            let scale = if j < 16 {
                3.0
            } else if j >= D - 16 {
                tail
            } else {
                0.02
            };
            scale * normal(r)
        })
        .collect()
}

fn quantize(w: &[f32]) -> Vec<u8> {
    w.chunks_exact(D)
        .flat_map(|r| QuantType::Q8_0.quantize_row(r).unwrap())
        .collect()
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Runs `tokens` hidden states through dense and sparse heads; returns the rows computed.
fn check(
    seed: u64,
    vocab: usize,
    adversarial: usize,
    tail: f32,
    top_k: usize,
    packed: bool,
) -> usize {
    let ks = KernelSet::best();
    let bytes = quantize(&matrix(seed, vocab, adversarial));
    let mapped = MatRef::new(QuantType::Q8_0, vocab, D, &bytes).unwrap();
    let mut r = Rng::new(seed ^ 0xabc);
    let mut moment = HiddenMoment::new(D);
    for _ in 0..64 {
        moment.add(&hidden(&mut r, 0.02));
    }
    let f = build_head(&mapped, &moment, 32).unwrap();
    let groups: Vec<usize> = f.groups.iter().map(|&g| g as usize).collect();
    let coef = MatRef::new(QuantType::Q8_0, vocab, 32, &f.coef).unwrap();
    let head = SparseHead::from_parts(groups, &f.basis, coef, &f.bounds).unwrap();
    let pack = PackedMat::pack(&mapped);
    let out = match (&pack, packed) {
        (Some(p), true) => p.mat(),
        _ => mapped,
    };
    head.check(&out).unwrap();
    let need = HeadNeed {
        top_k,
        ..HeadNeed::greedy()
    };
    let (mut acts, mut scratch) = (ActBuf::new(), HeadScratch::default());
    let (mut dense, mut sparse) = (vec![0.0; vocab], vec![0.0; vocab]);
    let mut computed = 0;
    for _ in 0..8 {
        let h = hidden(&mut r, tail);
        acts.quantize(QuantType::Q8_0.act_kind(), &h, D);
        matmul(ks, &out, &acts, &mut dense);
        let (rows, _) = head_logits(ks, &head, &need, &out, &acts, &mut scratch, &mut sparse);
        computed += rows;
        assert_eq!(argmax(&sparse), argmax(&dense), "greedy token differs");
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| dense[b].total_cmp(&dense[a]));
        let kth = dense[order[top_k - 1]];
        for i in 0..vocab {
            if sparse[i] == f32::NEG_INFINITY {
                assert!(
                    dense[i] < kth,
                    "row {i} ({}) left out but reaches the top {top_k}",
                    dense[i]
                );
            } else {
                assert_eq!(
                    sparse[i].to_bits(),
                    dense[i].to_bits(),
                    "row {i} not bit-identical"
                );
            }
        }
    }
    computed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn greedy_never_leaves_out_the_winner(seed in 0u64..1000, packed: bool) {
        check(seed, 1024, 0, 0.02, 1, packed);
    }

    #[test]
    fn top_k_is_covered(seed in 0u64..1000, k in 2usize..40) {
        check(seed, 1024, 0, 0.02, k, true);
    }

    #[test]
    fn adversarial_rows_are_kept_when_they_can_win(seed in 0u64..1000, tail in 0.0f32..1.0) {
        check(seed, 1024, 64, tail, 1, true);
    }
}

#[test]
fn the_bound_prunes_when_hidden_states_fit_the_basis() {
    // 8 steps of a 1024-row matrix: far fewer rows computed than the dense 8192.
    let rows = check(7, 1024, 0, 0.02, 1, true);
    assert!(rows < 8 * 1024 / 4, "{rows} rows computed in 8 steps");
}

#[test]
fn ties_keep_the_lowest_id() {
    // Rows 3 and 5 are equal and point along the hidden state: the maximum, tied.
    let vocab = 256;
    let mut w = matrix(11, vocab, 0);
    let h = hidden(&mut Rng::new(5), 0.02);
    let n = h.iter().map(|x| x * x).sum::<f32>().sqrt();
    for row in [3, 5] {
        for (x, &v) in w[row * D..(row + 1) * D].iter_mut().zip(&h) {
            *x = 5.0 * v / n;
        }
    }
    let bytes = quantize(&w);
    let out = MatRef::new(QuantType::Q8_0, vocab, D, &bytes).unwrap();
    let mut moment = HiddenMoment::new(D);
    moment.add(&h);
    let mut r = Rng::new(1);
    for _ in 0..32 {
        moment.add(&hidden(&mut r, 0.02));
    }
    let f = build_head(&out, &moment, 32).unwrap();
    let groups = f.groups.iter().map(|&g| g as usize).collect();
    let coef = MatRef::new(QuantType::Q8_0, vocab, 32, &f.coef).unwrap();
    let head = SparseHead::from_parts(groups, &f.basis, coef, &f.bounds).unwrap();
    let mut acts = ActBuf::new();
    acts.quantize(QuantType::Q8_0.act_kind(), &h, D);
    let mut dense = vec![0.0; vocab];
    matmul(KernelSet::best(), &out, &acts, &mut dense);
    let mut sparse = vec![0.0; vocab];
    let need = HeadNeed::greedy();
    head_logits(
        KernelSet::best(),
        &head,
        &need,
        &out,
        &acts,
        &mut HeadScratch::default(),
        &mut sparse,
    );
    assert_eq!(dense[3].to_bits(), dense[5].to_bits());
    assert_eq!(argmax(&dense), 3);
    assert_eq!(argmax(&sparse), 3);
    assert_eq!(
        sparse[5].to_bits(),
        dense[5].to_bits(),
        "the tied row is a candidate"
    );
}

#[test]
fn f16_bounds_round_up() {
    // Every stored bound is at least the value it stands for: a smaller one would break the
    // guarantee. Checked through a head's own norms: the row norm column.
    let vocab = 64;
    let w = matrix(3, vocab, 0);
    let bytes = quantize(&w);
    let out = MatRef::new(QuantType::Q8_0, vocab, D, &bytes).unwrap();
    let mut moment = HiddenMoment::new(D);
    moment.add(&hidden(&mut Rng::new(2), 0.02));
    let f = build_head(&out, &moment, 32).unwrap();
    let mut row = vec![0.0f32; D];
    for i in 0..vocab {
        out.dequantize_row(i, &mut row);
        let n = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        let stored: f16 = f.bounds[vocab + i];
        assert!(stored.to_f64() >= n, "row {i}: stored {stored} < {n}");
    }
}
