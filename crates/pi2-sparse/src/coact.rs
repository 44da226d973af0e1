//! Each neuron's most co-active partner (highest Jaccard overlap of the tokens two neurons are
//! active on). Exact, over every pair: the pairs' token sets are bit columns, compared 64
//! tokens per popcount, in blocks of neuron pairs spread over threads, with the hardware
//! popcount where the CPU has it (x86-64's baseline has none: a software count is several
//! times slower, and this loop is the profile's largest cost).

use crate::Trace;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Co-activation of each neuron with its most co-active partner (highest Jaccard overlap of the
/// tokens they are active on) at the reference threshold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coactivation {
    /// `partner[i]`: the neuron most often active together with `i`.
    pub partner: Vec<u32>,
    /// P(partner active | i active).
    pub p_partner: Vec<f32>,
    /// Mean over active neurons of P(partner | i) / P(partner): 1 means independent.
    pub mean_lift: f32,
}

/// Neurons per block: a block pair's columns (2 x 64 x words x 8 bytes) stay in cache.
const BLOCK: usize = 64;

/// One neuron's best partner so far: highest Jaccard, then lowest index.
#[derive(Clone, Copy)]
struct Best {
    jaccard: f32,
    co: u32,
    partner: u32,
}

impl Best {
    const NONE: Best = Best {
        jaccard: -1.0,
        co: 0,
        partner: 0,
    };

    fn offer(&mut self, jaccard: f32, co: u32, partner: u32) {
        if jaccard > self.jaccard || (jaccard == self.jaccard && partner < self.partner) {
            *self = Best {
                jaccard,
                co,
                partner,
            };
        }
    }
}

/// Tokens both bit columns have set: the portable count (the reference).
pub(crate) fn co_count_ref(a: &[u64], b: &[u64]) -> u32 {
    a.iter().zip(b).map(|(x, y)| (x & y).count_ones()).sum()
}

/// The same count with the `popcnt` instruction.
///
/// # Safety
/// The CPU must have `popcnt`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt")]
unsafe fn co_count_popcnt(a: &[u64], b: &[u64]) -> u32 {
    a.iter().zip(b).map(|(x, y)| (x & y).count_ones()).sum()
}

/// The fastest count this CPU has.
fn co_counter() -> fn(&[u64], &[u64]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("popcnt") {
        // SAFETY: the feature was detected just above.
        return |a, b| unsafe { co_count_popcnt(a, b) };
    }
    co_count_ref
}

/// Each neuron's best partner in `layer` of `trace`; `counts[i]` is how many tokens neuron
/// `i` is active on.
pub(crate) fn coactivation(trace: &Trace, layer: usize, counts: &[u64]) -> Coactivation {
    coactivation_with(trace, layer, counts, co_counter())
}

fn coactivation_with(
    trace: &Trace,
    layer: usize,
    counts: &[u64],
    count: fn(&[u64], &[u64]) -> u32,
) -> Coactivation {
    let (n, tokens) = (trace.n_ff, trace.n_tokens);
    let words = tokens.div_ceil(64);
    let mut cols = vec![0u64; n * words];
    for t in 0..tokens {
        for i in trace.active(layer, t) {
            cols[i * words + t / 64] |= 1 << (t % 64);
        }
    }
    let col = |i: usize| &cols[i * words..(i + 1) * words];
    // Partner = the neuron with the highest Jaccard overlap: raw co-counts would pick whichever
    // neuron is almost always on, which says nothing about pairing.
    let jaccard = |i: usize, j: usize, co: u32| {
        let union = (counts[i] + counts[j]) as f32 - co as f32;
        if union > 0.0 {
            co as f32 / union
        } else {
            0.0
        }
    };
    // Each task takes one row block against every block from it on (each pair once), with its
    // own best-so-far for every neuron; the merge is order-free (ties to the lowest index).
    let blocks = n.div_ceil(BLOCK);
    let best = (0..blocks)
        .into_par_iter()
        .fold(
            || vec![Best::NONE; n],
            |mut best, bi| {
                let rows = bi * BLOCK..((bi + 1) * BLOCK).min(n);
                for i in rows.clone() {
                    for j in i + 1..n {
                        let co = count(col(i), col(j));
                        let jac = jaccard(i, j, co);
                        best[i].offer(jac, co, j as u32);
                        best[j].offer(jac, co, i as u32);
                    }
                }
                best
            },
        )
        .reduce(
            || vec![Best::NONE; n],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    x.offer(y.jaccard, y.co, y.partner);
                }
                a
            },
        );
    let mut partner = vec![0u32; n];
    let mut p_partner = vec![0.0f32; n];
    let (mut lift_sum, mut lift_n) = (0.0f64, 0usize);
    for i in 0..n {
        partner[i] = best[i].partner;
        if counts[i] > 0 {
            p_partner[i] = best[i].co as f32 / counts[i] as f32;
            let pj = counts[partner[i] as usize] as f64 / tokens as f64;
            if pj > 0.0 {
                lift_sum += p_partner[i] as f64 / pj;
                lift_n += 1;
            }
        }
    }
    Coactivation {
        partner,
        p_partner,
        mean_lift: if lift_n == 0 {
            1.0
        } else {
            (lift_sum / lift_n as f64) as f32
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, pair by pair in index order (the profile's former loop).
    fn naive(trace: &Trace, layer: usize, counts: &[u64]) -> Vec<(u32, f32)> {
        let n = trace.n_ff;
        let active: Vec<Vec<bool>> = (0..n)
            .map(|i| {
                (0..trace.n_tokens)
                    .map(|t| trace.active(layer, t).any(|a| a == i))
                    .collect()
            })
            .collect();
        (0..n)
            .map(|i| {
                let mut best = (0u32, -1.0f32, 0u32);
                for j in (0..n).filter(|&j| j != i) {
                    let co = (0..trace.n_tokens)
                        .filter(|&t| active[i][t] && active[j][t])
                        .count() as u32;
                    let union = (counts[i] + counts[j]) as f32 - co as f32;
                    let jac = if union > 0.0 { co as f32 / union } else { 0.0 };
                    if jac > best.1 {
                        best = (j as u32, jac, co);
                    }
                }
                let p = match counts[i] {
                    0 => 0.0,
                    c => best.2 as f32 / c as f32,
                };
                (best.0, p)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn blocked_parallel_partners_equal_the_definition(
            n in 2usize..150, tokens in 1usize..130, density in 0.0f64..1.0, seed in any::<u64>()
        ) {
            let mut trace = Trace::new(1, n, tokens);
            let mut counts = vec![0u64; n];
            let mut s = seed | 1;
            for t in 0..tokens {
                for (i, c) in counts.iter_mut().enumerate() {
                    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                    if ((s >> 11) as f64 / (1u64 << 53) as f64) < density {
                        trace.set(0, t, i);
                        *c += 1;
                    }
                }
            }
            let want = naive(&trace, 0, &counts);
            for count in [co_count_ref as fn(&[u64], &[u64]) -> u32, co_counter()] {
                let got = coactivation_with(&trace, 0, &counts, count);
                for (i, &(p, pp)) in want.iter().enumerate() {
                    prop_assert_eq!(got.partner[i], p, "neuron {}", i);
                    prop_assert_eq!(got.p_partner[i], pp);
                }
            }
        }
    }

    #[test]
    fn hardware_popcount_equals_the_reference() {
        let a: Vec<u64> = (0..97u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let b: Vec<u64> = (0..97u64)
            .map(|i| !i.wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .collect();
        assert_eq!(co_counter()(&a, &b), co_count_ref(&a, &b));
        #[cfg(target_arch = "x86_64")]
        if !std::is_x86_feature_detected!("popcnt") {
            eprintln!("SKIPPED: this CPU has no popcnt (the reference path was compared)");
        }
    }
}
