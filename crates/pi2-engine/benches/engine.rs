//! Engine throughput on the real test model (`cargo xtask fetch-model`): prefill of 64 tokens
//! and single-token decode, at 1 and 2 threads. `pi2 bench` gives the llama-bench style table.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pi2_engine::{Engine, EngineConfig, Logits};
use pi2_model::Model;
use std::path::PathBuf;

fn bench_engine(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let Ok(model) = Model::load(&path) else {
        eprintln!(
            "engine bench skipped: no model at {} (cargo xtask fetch-model)",
            path.display()
        );
        return;
    };
    let prompt: Vec<u32> = (0..64).map(|i| 100 + i * 7).collect();
    let mut g = c.benchmark_group("smollm2_135m_q4_1");
    g.sample_size(10);
    for threads in [1, 2] {
        let mut e = Engine::new(
            &model,
            &EngineConfig {
                threads,
                n_ctx: 1024,
                tier: None,
                ..Default::default()
            },
        )
        .unwrap();
        g.throughput(Throughput::Elements(prompt.len() as u64));
        g.bench_with_input(BenchmarkId::new("prefill_64", threads), &threads, |b, _| {
            b.iter(|| {
                e.truncate(0);
                e.forward(&prompt, Logits::Last).unwrap()[0]
            })
        });
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(
            BenchmarkId::new("decode_at_64", threads),
            &threads,
            |b, _| {
                b.iter(|| {
                    e.truncate(64);
                    e.forward(&[42], Logits::Last).unwrap()[0]
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench_engine);
criterion_main!(benches);
