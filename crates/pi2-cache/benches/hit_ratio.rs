//! Eviction policies replaying an activation trace: the time per access, with each policy's hit
//! ratio printed once (criterion measures speed; the ratio is what the policy is for).
//!
//! The trace is the one `pi2 profile -o P.json` wrote (`P.trace`) when `PI2_TRACE=P.trace` is set, else a
//! synthetic skewed trace (Zipf-like neuron popularity) of the SmolLM2-135M shape.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pi2_cache::{EvictionPolicy, Fifo, Frequent, Lru, SlotCache};
use pi2_sparse::Trace;

fn synthetic() -> Trace {
    let (layers, n_ff, tokens) = (4, 1536, 256);
    let mut t = Trace::new(layers, n_ff, tokens);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for l in 0..layers {
        for tok in 0..tokens {
            for i in 0..n_ff {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // P(fire) falls with the neuron's rank: 0.9 for the first, ~0.1 deep in the tail.
                let p = 0.9 / (1.0 + i as f64 / 64.0) + 0.1;
                if (x % 10_000) as f64 / 10_000.0 < p * 0.5 {
                    t.set(l, tok, i);
                }
            }
        }
    }
    t
}

fn replay<P: EvictionPolicy>(trace: &Trace, slots: usize, policy: P) -> (u64, u64) {
    let n = trace.n_ff;
    let mut c = SlotCache::new(trace.n_layer * n, n, 1024, slots, policy).unwrap();
    for t in 0..trace.n_tokens {
        for l in 0..trace.n_layer {
            c.begin_step();
            for i in trace.active(l, t) {
                let key = (l * n + i) as u32;
                if c.lookup(key).is_none() {
                    c.insert(key);
                }
            }
        }
    }
    let g = c.stats().total();
    (g.hits, g.hits + g.misses)
}

fn bench(c: &mut Criterion) {
    let trace = match std::env::var_os("PI2_TRACE") {
        Some(p) => Trace::read(std::path::Path::new(&p)).expect("PI2_TRACE"),
        None => synthetic(),
    };
    let accesses: u64 = (0..trace.n_layer)
        .flat_map(|l| (0..trace.n_tokens).map(move |t| (l, t)))
        .map(|(l, t)| trace.active(l, t).count() as u64)
        .sum();
    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(accesses));
    for frac in [0.25f64, 0.5] {
        let slots = (frac * (trace.n_layer * trace.n_ff) as f64) as usize;
        for (name, ratio) in [
            ("lru", replay(&trace, slots, Lru::default())),
            ("fifo", replay(&trace, slots, Fifo::default())),
            ("frequent", replay(&trace, slots, Frequent::default())),
        ] {
            println!(
                "hit ratio {name} at {:.0}% of the neurons: {:.4}",
                frac * 100.0,
                ratio.0 as f64 / ratio.1 as f64
            );
        }
        g.bench_function(format!("lru-{:.0}%", frac * 100.0), |b| {
            b.iter(|| replay(&trace, slots, Lru::default()))
        });
        g.bench_function(format!("fifo-{:.0}%", frac * 100.0), |b| {
            b.iter(|| replay(&trace, slots, Fifo::default()))
        });
        g.bench_function(format!("frequent-{:.0}%", frac * 100.0), |b| {
            b.iter(|| replay(&trace, slots, Frequent::default()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
