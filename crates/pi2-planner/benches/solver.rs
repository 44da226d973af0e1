//! Planning cost: replaying a recording through the cache, and a whole solve.

use criterion::{criterion_group, criterion_main, Criterion};
use pi2_planner::model::{replay, Residency};
use pi2_planner::synthetic::{toy_hardware, toy_model, ToyResidency};
use pi2_planner::{plan, Constraints, CostModel, Objective, Space};

fn bench(c: &mut Criterion) {
    let m = toy_model(8, 1024, 32);
    let res = ToyResidency::for_model(&m, 1 << 20);
    let split = res.split(res.min_budget() + 2048 * 408, 0.5).unwrap();
    c.bench_function("replay_8x1024x32", |b| {
        b.iter(|| replay(&m, &split).unwrap())
    });
    let hw = toy_hardware(2, 4.0, 80.0);
    // A whole solve simulates hundreds of plans: a smaller recording, every 4th step simulated
    // (as `pi2 plan` does), ten samples.
    let m = toy_model(4, 512, 16);
    let res = ToyResidency::for_model(&m, 1 << 20);
    let mut g = c.benchmark_group("solve");
    g.sample_size(10);
    g.bench_function("plan_fastest_mid_memory", |b| {
        b.iter(|| {
            let mut cm = CostModel::new(&hw, &m, &res, 64, 64);
            cm.io_stride = 4;
            let cons = Constraints {
                // Halfway between the smallest budget and the whole model.
                mem_limit: (res.min_budget() + res.in_memory_bytes()) / 2,
                classes: vec![],
                max_threads: 0,
                min_decode_tps: 0.0,
                objective: Objective::Fastest,
            };
            plan(&cm, &cons, &Space::default()).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
