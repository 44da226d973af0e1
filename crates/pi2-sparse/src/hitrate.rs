//! Cache hit rates over an activation trace, for every cache size at once.
//!
//! The cache PowerInfer-2 uses per layer: the `hot` most frequent neurons pinned, the rest of the
//! capacity an LRU over the others. Pinned neurons always hit; for the LRU part, an access hits
//! iff its LRU stack distance (distinct other neurons touched since its last use) is below the
//! LRU capacity, so one pass computing stack distances (a Fenwick tree over access times) gives
//! the hit rate of every capacity. First uses are misses (a cold start, as after loading).

use crate::Trace;
use rayon::prelude::*;
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

struct Fenwick(Vec<i32>);

impl Fenwick {
    fn add(&mut self, mut i: usize, v: i32) {
        i += 1;
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }
    /// Sum over positions `0..i`.
    fn prefix(&self, mut i: usize) -> i32 {
        let mut s = 0;
        while i > 0 {
            s += self.0[i];
            i &= i - 1;
        }
        s
    }
}

/// `hist[d]` = accesses with LRU stack distance `d` among neurons not in `pinned`, plus the
/// pinned hits and the total number of accesses.
///
/// Each neuron marks the time of its latest use in a Fenwick tree over time, so at most `n`
/// marks exist at once: time is renumbered (marks kept in order) whenever it reaches the
/// tree's few-times-`n` capacity. The tree then stays cache-sized whatever the trace's length,
/// where a tree over every access would not (the profile's largest cost before).
fn stack_distances(trace: &Trace, layer: usize, pinned: &[bool]) -> (Vec<u64>, u64, u64) {
    let n = trace.n_ff;
    let capacity = 4 * n.max(16);
    let mut tree = Fenwick(vec![0; capacity + 1]);
    let mut last: Vec<Option<usize>> = vec![None; n];
    let mut hist = vec![0u64; n + 1];
    let (mut pinned_hits, mut total) = (0u64, 0u64);
    let mut now = 0usize;
    // Marks in the tree (neurons used so far): all of them lie before `now`.
    let mut marks = 0i32;
    for t in 0..trace.n_tokens {
        for i in trace.active(layer, t) {
            total += 1;
            if pinned[i] {
                pinned_hits += 1;
                continue;
            }
            if now == capacity {
                now = renumber(&mut tree, &mut last);
            }
            // A first use (no `last`) is a miss at every size.
            if let Some(p) = last[i] {
                // Distinct neurons used since p: marks after p (each neuron marks only its
                // latest use).
                let d = marks - tree.prefix(p + 1);
                hist[d as usize] += 1;
                tree.add(p, -1);
            } else {
                marks += 1;
            }
            tree.add(now, 1);
            last[i] = Some(now);
            now += 1;
        }
    }
    (hist, pinned_hits, total)
}

/// Moves the marks to times `0..m` in their order (distances between them are unchanged) and
/// returns `m`, the next free time.
fn renumber(tree: &mut Fenwick, last: &mut [Option<usize>]) -> usize {
    let mut marks: Vec<(usize, usize)> = last
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.map(|p| (p, i)))
        .collect();
    marks.sort_unstable();
    tree.0.fill(0);
    for (new, &(_, i)) in marks.iter().enumerate() {
        last[i] = Some(new);
        tree.add(new, 1);
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
    let total: u64 = counts.iter().sum();
    let rate = |hits: u64| {
        if total == 0 {
            0.0
        } else {
            hits as f32 / total as f32
        }
    };
    let cap = |f: f32| ((f * n as f32).round() as usize).min(n);
    // Pinned-only: the accesses of the top-C neurons.
    let mut top_prefix = vec![0u64; n + 1];
    for (k, &i) in order.iter().enumerate() {
        top_prefix[k + 1] = top_prefix[k] + counts[i];
    }
    // For each pinned size, the LRU distance histogram of the rest (cumulated).
    let splits: Vec<(usize, Vec<u64>, u64)> = pinned_steps
        .par_iter()
        .map(|&f| {
            let h = cap(f);
            let mut pinned = vec![false; n];
            for &i in &order[..h] {
                pinned[i] = true;
            }
            let (hist, pinned_hits, _) = stack_distances(trace, layer, &pinned);
            let mut cum = vec![0u64; hist.len() + 1];
            for d in 0..hist.len() {
                cum[d + 1] = cum[d] + hist[d];
            }
            (h, cum, pinned_hits)
        })
        .collect();
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
        let steps = [0.0, 0.1, 0.2, 0.5];
        let points = hit_rates(&trace, 0, &counts, &sizes, &steps);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        for p in &points {
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
