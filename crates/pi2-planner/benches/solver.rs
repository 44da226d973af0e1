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
    c.bench_function("plan_fastest_half_memory", |b| {
        b.iter(|| {
            let cm = CostModel::new(&hw, &m, &res, 64, 64);
            let cons = Constraints {
                mem_limit: res.in_memory_bytes() / 2,
                classes: vec![],
                max_threads: 0,
                min_decode_tps: 0.0,
                objective: Objective::Fastest,
            };
            plan(&cm, &cons, &Space::default()).unwrap()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
