//! The slot cache replaying an activation trace agrees with the analytic hit rates pi2-sparse
//! computes from LRU stack distances (two independent implementations of the same cache).

use pi2_cache::{Lru, SlotCache};
use pi2_sparse::{hit_rates, Trace};
use proptest::prelude::*;

fn replay_lru(trace: &Trace, layer: usize, slots: usize) -> (u64, u64) {
    let mut c = SlotCache::new(trace.n_ff, trace.n_ff, 16, slots, Lru::default()).unwrap();
    for t in 0..trace.n_tokens {
        c.begin_step();
        for i in trace.active(layer, t) {
            if c.lookup(i as u32).is_none() {
                // Only a neuron used in this step is protected; with capacity >= the active
                // set there is always a victim.
                c.insert(i as u32).expect("a victim exists");
            }
        }
    }
    let g = c.stats().total();
    (g.hits, g.hits + g.misses)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn lru_replay_matches_stack_distances(
        seed in any::<u64>(),
        n_ff in 16usize..80,
        tokens in 1usize..40,
        cap_frac in 0.3f32..1.0,
    ) {
        let mut trace = Trace::new(1, n_ff, tokens);
        let mut x = seed | 1;
        let mut most = 0;
        for t in 0..tokens {
            let mut k = 0;
            for i in 0..n_ff {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                // Low neurons fire more often (a skewed, cache-friendly pattern).
                if x % 100 < (60 - 50 * i / n_ff) as u64 {
                    trace.set(0, t, i);
                    k += 1;
                }
            }
            most = most.max(k);
        }
        let counts: Vec<u64> = (0..n_ff)
            .map(|i| (0..tokens).filter(|&t| trace.active(0, t).any(|j| j == i)).count() as u64)
            .collect();
        let slots = ((cap_frac * n_ff as f32).round() as usize).max(most).max(1);
        let frac = slots as f32 / n_ff as f32;
        let (hits, total) = replay_lru(&trace, 0, slots);
        let analytic = hit_rates(&trace, 0, &counts, &[frac], &[0.0]);
        let want = analytic[0].lru as f64;
        let got = hits as f64 / total.max(1) as f64;
        prop_assert!((got - want).abs() < 1e-6, "replay {} analytic {}", got, want);
    }
}
