//! Cache hit rates over an activation trace, for every cache size at once.
//!
//! The cache PowerInfer-2 uses per layer: the `hot` most frequent neurons pinned, the rest of the
//! capacity an LRU over the others. Pinned neurons always hit; for the LRU part, an access hits
//! iff its LRU stack distance (distinct other neurons touched since its last use) is below the
//! LRU capacity, so one pass computing stack distances (a Fenwick tree over access times) gives
//! the hit rate of every capacity. First uses are misses (a cold start, as after loading).

use crate::Trace;
use serde::{Deserialize, Serialize};

/// Hit rates at one cache size (a fraction of the layer's neurons).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HitPoint {
    pub cache_fraction: f32,
    /// All capacity an LRU.
    pub lru: f32,
    /// All capacity pinned to the most frequent neurons (no replacement).
    pub pinned: f32,
    /// The best split between pinned and LRU among those tried, and its pinned fraction.
    pub best: f32,
    pub best_pinned_fraction: f32,
}

/// Pinned sizes measured in one pass over the trace: one lane each.
const LANES: usize = 8;
type Lanes = [i32; LANES];

/// A Fenwick tree over time whose entries count in up to [`LANES`] lanes at once.
struct Fenwick(Vec<Lanes>);

impl Fenwick {
    fn add(&mut self, mut i: usize, v: &Lanes, sign: i32) {
        i += 1;
        while i < self.0.len() {
            for (a, b) in self.0[i].iter_mut().zip(v) {
                *a += sign * b;
            }
            i += i & i.wrapping_neg();
        }
    }

    /// Sums over positions `0..i`.
    fn prefix(&self, mut i: usize) -> Lanes {
        let mut s = [0; LANES];
        while i > 0 {
            for (a, b) in s.iter_mut().zip(&self.0[i]) {
                *a += b;
            }
            i &= i - 1;
        }
        s
    }
}

/// Per pinned set (`pinned_sizes`, ascending, at most [`LANES`]: the top `h` neurons of
/// `rank` order pinned), the histogram of LRU stack distances among the neurons not pinned,
/// and per neuron its accesses.
///
/// One pass serves every pinned set: a neuron is LRU-managed in the sets that do not pin it,
/// a prefix of the lanes since the sets are nested, so each neuron's use marks those lanes of
/// a tree over time and the distance in every lane comes from one query. Each neuron marks
/// only the time of its latest use, so at most `n` marks exist at once: time is renumbered
/// (marks kept in order) whenever it reaches the tree's few-times-`n` capacity, and the tree
/// stays cache-sized whatever the trace's length.
fn stack_distances(
    trace: &Trace,
    layer: usize,
    rank: &[usize],
    pinned_sizes: &[usize],
) -> (Vec<Vec<u64>>, Vec<u64>) {
    let n = trace.n_ff;
    let m = pinned_sizes.len();
    debug_assert!(m <= LANES && pinned_sizes.is_sorted());
    // Lanes in which each neuron is not pinned: 0..lanes[i].
    let masks: Vec<Lanes> = (0..=LANES)
        .map(|k| std::array::from_fn(|l| (l < k) as i32))
        .collect();
    let lanes: Vec<u8> = rank
        .iter()
        .map(|&r| pinned_sizes.iter().filter(|&&h| h <= r).count() as u8)
        .collect();
    let capacity = 3 * n.max(16);
    let mut tree = Fenwick(vec![[0; LANES]; capacity + 1]);
    let mut last: Vec<Option<usize>> = vec![None; n];
    let mut hist = vec![vec![0u64; n + 1]; m];
    let mut accesses = vec![0u64; n];
    let mut now = 0usize;
    // Marks in the tree per lane (neurons used so far): all of them lie before `now`.
    let mut marks: Lanes = [0; LANES];
    for t in 0..trace.n_tokens {
        for i in trace.active(layer, t) {
            accesses[i] += 1;
            let k = lanes[i] as usize;
            if k == 0 {
                continue;
            }
            if now == capacity {
                now = renumber(&mut tree, &mut last, &lanes, &masks);
            }
            let mask = &masks[k];
            // A first use (no `last`) is a miss at every size.
            if let Some(p) = last[i] {
                // Distinct neurons used since p: marks after p (each neuron marks only its
                // latest use).
                let before = tree.prefix(p + 1);
                for (l, h) in hist.iter_mut().enumerate().take(k) {
                    h[(marks[l] - before[l]) as usize] += 1;
                }
                tree.add(p, mask, -1);
            } else {
                for (a, b) in marks.iter_mut().zip(mask) {
                    *a += b;
                }
            }
            tree.add(now, mask, 1);
            last[i] = Some(now);
            now += 1;
        }
    }
    (hist, accesses)
}

/// Moves the marks to times `0..m` in their order (distances between them are unchanged),
/// rebuilds the tree in linear time and returns `m`, the next free time.
fn renumber(
    tree: &mut Fenwick,
    last: &mut [Option<usize>],
    lanes: &[u8],
    masks: &[Lanes],
) -> usize {
    let mut marks: Vec<(usize, usize)> = last
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.map(|p| (p, i)))
        .collect();
    marks.sort_unstable();
    tree.0.fill([0; LANES]);
    for (new, &(_, i)) in marks.iter().enumerate() {
        last[i] = Some(new);
        tree.0[new + 1] = masks[lanes[i] as usize];
    }
    let len = tree.0.len();
    for j in 1..len {
        let parent = j + (j & j.wrapping_neg());
        if parent < len {
            let child = tree.0[j];
            for (a, b) in tree.0[parent].iter_mut().zip(&child) {
                *a += b;
            }
        }
    }
    marks.len()
}

/// Hit rates of one layer at each cache fraction in `sizes`, given per-neuron activation counts
/// (to rank the pinned set). The pinned/LRU split is searched over `pinned_steps` fractions.
pub fn hit_rates(
    trace: &Trace,
    layer: usize,
    counts: &[u64],
    sizes: &[f32],
    pinned_steps: &[f32],
) -> Vec<HitPoint> {
    let n = trace.n_ff;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
    let mut rank = vec![0; n];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    let cap = |f: f32| ((f * n as f32).round() as usize).min(n);
    let mut pinned_sizes: Vec<usize> = pinned_steps.iter().map(|&f| cap(f)).collect();
    pinned_sizes.sort_unstable();
    pinned_sizes.dedup();
    // For each pinned size, the LRU distance histogram of the rest (cumulated) and the hits
    // of the pinned neurons.
    let mut splits: Vec<(usize, Vec<u64>, u64)> = Vec::new();
    let mut accesses = vec![0u64; n];
    if pinned_sizes.is_empty() {
        for t in 0..trace.n_tokens {
            trace.active(layer, t).for_each(|i| accesses[i] += 1);
        }
    }
    for group in pinned_sizes.chunks(LANES) {
        let (hists, seen) = stack_distances(trace, layer, &rank, group);
        accesses = seen;
        for (&h, hist) in group.iter().zip(hists) {
            let mut cum = vec![0u64; hist.len() + 1];
            for d in 0..hist.len() {
                cum[d + 1] = cum[d] + hist[d];
            }
            let pinned_hits = order[..h].iter().map(|&i| accesses[i]).sum();
            splits.push((h, cum, pinned_hits));
        }
    }
    let total: u64 = accesses.iter().sum();
    let rate = |hits: u64| {
        if total == 0 {
            0.0
        } else {
            hits as f32 / total as f32
        }
    };
    // Pinned-only: the accesses of the top-C neurons.
    let mut top_prefix = vec![0u64; n + 1];
    for (k, &i) in order.iter().enumerate() {
        top_prefix[k + 1] = top_prefix[k] + accesses[i];
    }
    sizes
        .iter()
        .map(|&f| {
            let c = cap(f);
            let with = |(h, cum, pinned_hits): &(usize, Vec<u64>, u64)| {
                // An LRU of capacity k hits the accesses with distance < k.
                let k = c - h;
                pinned_hits + cum[k.min(cum.len() - 1)]
            };
            let lru = splits.iter().find(|s| s.0 == 0).map_or(0, &with);
            let (best_hits, best_h) = splits
                .iter()
                .filter(|s| s.0 <= c)
                .map(|s| (with(s), s.0))
                .chain(std::iter::once((top_prefix[c], c)))
                .max_by_key(|&(hits, _)| hits)
                .unwrap_or((0, 0));
            HitPoint {
                cache_fraction: f,
                lru: rate(lru),
                pinned: rate(top_prefix[c]),
                best: rate(best_hits),
                best_pinned_fraction: best_h as f32 / n.max(1) as f32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A straightforward LRU + pinned cache, for checking the stack-distance shortcut.
    fn simulate(trace: &Trace, layer: usize, pinned: &[usize], lru_cap: usize) -> u64 {
        let mut lru: Vec<usize> = Vec::new(); // most recent last
        let mut hits = 0;
        for t in 0..trace.n_tokens {
            for i in trace.active(layer, t) {
                if pinned.contains(&i) {
                    hits += 1;
                    continue;
                }
                if let Some(p) = lru.iter().position(|&x| x == i) {
                    hits += 1;
                    lru.remove(p);
                } else if lru.len() == lru_cap && lru_cap > 0 {
                    lru.remove(0);
                }
                if lru_cap > 0 {
                    lru.push(i);
                }
            }
        }
        hits
    }

    #[test]
    fn stack_distances_agree_with_a_plain_lru() {
        let (n, tokens) = (40, 120);
        let mut trace = Trace::new(1, n, tokens);
        let mut rng = 12345u64;
        let mut counts = vec![0u64; n];
        for t in 0..tokens {
            for (i, count) in counts.iter_mut().enumerate() {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Low neurons fire more often: a skewed, realistic pattern.
                if (rng >> 33) % 100 < (60 - i as u64).max(5) {
                    trace.set(0, t, i);
                    *count += 1;
                }
            }
        }
        let total: u64 = counts.iter().sum();
        let sizes = [0.1, 0.25, 0.5, 0.75, 1.0];
        // More pinned sizes than one pass's lanes, unordered, one twice.
        let steps = [0.5, 0.0, 0.1, 0.2, 0.05, 0.3, 0.35, 0.4, 0.45, 0.15, 0.1];
        let points = hit_rates(&trace, 0, &counts, &sizes, &steps);
        let only_lru = hit_rates(&trace, 0, &counts, &sizes, &[]);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        for (p, q) in points.iter().zip(&only_lru) {
            assert_eq!(p.pinned, q.pinned);
            let c = (p.cache_fraction * n as f32).round() as usize;
            let want_lru = simulate(&trace, 0, &[], c) as f32 / total as f32;
            assert!((p.lru - want_lru).abs() < 1e-6, "{p:?} lru {want_lru}");
            let h = (p.best_pinned_fraction * n as f32).round() as usize;
            let want_best = simulate(&trace, 0, &order[..h], c - h) as f32 / total as f32;
            assert!((p.best - want_best).abs() < 1e-6, "{p:?} best {want_best}");
            assert!(p.best >= p.lru - 1e-6 && p.best >= p.pinned - 1e-6);
        }
        // A cache of every neuron misses only first uses.
        let full = points.last().unwrap();
        assert!(full.pinned > 0.999 && full.best > 0.999);
    }
}
