//! Where each neuron goes in the file. Hot first (by how many calibration tokens fire it), so a
//! budget's pinned prefix holds the most frequent neurons; then, inside bands of that order,
//! co-activation placement (as in Ripple, arXiv 2410.19274): each neuron is followed by the one
//! of its band it fires with most often (Jaccard overlap of the tokens they fire on), so that
//! neurons read together share pages and merge into fewer, larger reads. Bands keep the cost
//! linear in neurons (`band` squared pair counts per band) and the pinned prefix within one
//! band of the frequency order.

use rayon::prelude::*;

/// Neurons per band of the frequency order inside which co-activation places them.
pub const PLACEMENT_BAND: usize = 512;

/// The tokens each neuron fires on, as bit columns (`words` u64 per neuron).
pub struct FiringColumns {
    words: usize,
    bits: Vec<u64>,
}

impl FiringColumns {
    /// Columns for `n` neurons over `tokens` tokens, none firing yet.
    pub fn new(n: usize, tokens: usize) -> Self {
        let words = tokens.div_ceil(64);
        Self {
            words,
            bits: vec![0; n * words],
        }
    }

    /// Neuron `i` fired on token `t`.
    pub fn set(&mut self, i: usize, t: usize) {
        self.bits[i * self.words + t / 64] |= 1 << (t % 64);
    }

    fn column(&self, i: usize) -> &[u64] {
        &self.bits[i * self.words..(i + 1) * self.words]
    }

    fn count(&self, i: usize) -> u32 {
        self.column(i).iter().map(|w| w.count_ones()).sum()
    }

    fn neurons(&self) -> usize {
        self.bits.len() / self.words.max(1)
    }
}

/// The file order of the neurons firing as `cols` says: hot first (stable: ties keep the
/// model's order), and with `band > 1` chained by co-activation inside each band of `band`
/// neurons of that order (each band starts with its most frequent neuron).
pub fn placement(cols: &FiringColumns, band: usize) -> Vec<u32> {
    let n = if cols.words == 0 { 0 } else { cols.neurons() };
    let counts: Vec<u32> = (0..n).map(|i| cols.count(i)).collect();
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(counts[i as usize]));
    if band <= 1 {
        return order;
    }
    order
        .par_chunks(band)
        .flat_map_iter(|b| chain(cols, &counts, b))
        .collect()
}

/// `band` reordered: from its first neuron, always to the unplaced one with the highest
/// Jaccard overlap with the last placed (ties: the earlier in `band`).
fn chain(cols: &FiringColumns, counts: &[u32], band: &[u32]) -> Vec<u32> {
    let m = band.len();
    let mut jaccard = vec![0f32; m * m];
    for a in 0..m {
        let ca = cols.column(band[a] as usize);
        for b in a + 1..m {
            let cb = cols.column(band[b] as usize);
            let co: u32 = ca.iter().zip(cb).map(|(x, y)| (x & y).count_ones()).sum();
            let union = counts[band[a] as usize] + counts[band[b] as usize] - co;
            let j = if union == 0 {
                0.0
            } else {
                co as f32 / union as f32
            };
            jaccard[a * m + b] = j;
            jaccard[b * m + a] = j;
        }
    }
    let mut placed = vec![false; m];
    let mut out = Vec::with_capacity(m);
    let mut cur = 0;
    for _ in 0..m {
        placed[cur] = true;
        out.push(band[cur]);
        let row = &jaccard[cur * m..(cur + 1) * m];
        let next = (0..m)
            .filter(|&k| !placed[k])
            .fold(None, |best: Option<usize>, k| match best {
                Some(b) if row[b] >= row[k] => Some(b),
                _ => Some(k),
            });
        match next {
            Some(k) => cur = k,
            None => break,
        }
    }
    out
}

/// Pages of `per_page` neurons (in `order`) holding at least one neuron that fires, summed
/// over tokens: what reading the fired neurons of each token costs at that granularity.
pub fn pages_touched(cols: &FiringColumns, order: &[u32], per_page: usize, tokens: usize) -> u64 {
    let per_page = per_page.max(1);
    (0..tokens)
        .map(|t| {
            order
                .chunks(per_page)
                .filter(|page| {
                    page.iter()
                        .any(|&i| cols.column(i as usize)[t / 64] >> (t % 64) & 1 == 1)
                })
                .count() as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Neurons in groups of 8 that fire together (each group on its own random tokens), the
    /// groups' members scattered over the model's order.
    fn planted(groups: usize, tokens: usize, seed: u64) -> (FiringColumns, usize) {
        let n = groups * 8;
        let mut cols = FiringColumns::new(n, tokens);
        let mut s = seed | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for g in 0..groups {
            for t in 0..tokens {
                // A fifth of the tokens, the same for every member; member k also fires alone
                // on about k/32 of the others, so frequency order scatters the group.
                let together = next() % 5 == 0;
                for k in 0..8 {
                    if together || next() % 32 < k as u64 {
                        // Member k of group g sits at k * groups + g: far from its group.
                        cols.set(k * groups + g, t);
                    }
                }
            }
        }
        (cols, n)
    }

    #[test]
    fn groups_that_fire_together_end_up_together() {
        let (cols, n) = planted(32, 256, 7);
        let freq = placement(&cols, 1);
        let placed = placement(&cols, n);
        let mut sorted = placed.clone();
        sorted.sort();
        assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
        // The planted order: each group's members on one page.
        let groups: Vec<u32> = (0..32u32)
            .flat_map(|g| (0..8).map(move |k| k * 32 + g))
            .collect();
        let by_freq = pages_touched(&cols, &freq, 8, 256);
        let by_coact = pages_touched(&cols, &placed, 8, 256);
        let best = pages_touched(&cols, &groups, 8, 256);
        assert!(
            by_coact < by_freq * 4 / 5 && by_coact < best * 6 / 5,
            "co-activation placement touched {by_coact} pages, frequency order {by_freq}, the planted groups {best}"
        );
    }

    proptest! {
        /// Any firing: a permutation, hot first across bands (every neuron of a band fires at
        /// most as often as every neuron of the band before), bands the frequency order's.
        #[test]
        fn placement_is_a_banded_permutation(
            n in 1usize..300,
            tokens in 1usize..130,
            band in 1usize..70,
            seed in any::<u64>(),
        ) {
            let mut cols = FiringColumns::new(n, tokens);
            let mut s = seed | 1;
            for i in 0..n {
                for t in 0..tokens {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    if s % (1 + (i as u64 % 5)) == 0 {
                        cols.set(i, t);
                    }
                }
            }
            let freq = placement(&cols, 1);
            let placed = placement(&cols, band);
            let mut sorted = placed.clone();
            sorted.sort();
            prop_assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
            for (a, b) in freq.chunks(band).zip(placed.chunks(band)) {
                let (mut a, mut b) = (a.to_vec(), b.to_vec());
                a.sort();
                b.sort();
                prop_assert_eq!(a, b);
            }
            let counts: Vec<u32> = freq.iter().map(|&i| cols.count(i as usize)).collect();
            prop_assert!(counts.windows(2).all(|w| w[0] >= w[1]));
        }
    }
}
