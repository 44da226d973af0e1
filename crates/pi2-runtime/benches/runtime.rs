//! Session start-up cost on a synthetic model: checking options, loading sparse weights and
//! making a ready engine (dense, and offloaded under a budget, which sizes the regions and opens
//! the reader).

use criterion::{criterion_group, criterion_main, Criterion};
use pi2_convert::{calibrate, convert, write_file, ConvertConfig};
use pi2_engine::Engine;
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::Model;
use pi2_runtime::{prepare, EngineOptions, SessionOptions};
use pi2_sparse::{Activation, ModelInfo};

fn bench_sessions(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        n_embd: 256,
        n_ff: 768,
        n_layer: 4,
        n_head: 8,
        n_head_kv: 4,
        weight_type: QuantType::Q4_0,
        ..SynthSpec::default()
    };
    let src = dir.path().join("src.gguf");
    std::fs::write(&src, build(&spec).to_bytes()).unwrap();
    let m = Model::load(&src).unwrap();
    let opts = SessionOptions {
        engine: EngineOptions {
            threads: Some(1),
            n_ctx: 512,
            ..EngineOptions::default()
        },
        ..SessionOptions::default()
    };
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: spec.n_layer,
        n_embd: spec.n_embd,
        n_ff: spec.n_ff,
        activation: Activation::Silu,
        file_name: "src.gguf".into(),
        file_bytes: 0,
    };
    let toks: Vec<u32> = (0..256u32).map(|i| (i * 37 + 11) % 256).collect();
    let mut e = Engine::new(&m, &opts.engine.config().unwrap()).unwrap();
    let cal = calibrate(&mut e, &toks, 128, 0.5, info).unwrap();
    let (w, _) = convert(
        &m,
        &cal.profile,
        &cal.thresholds,
        cal.samples,
        &ConvertConfig::default(),
    )
    .unwrap();
    let conv = dir.path().join("conv.gguf");
    write_file(&w, &conv, &src, false).unwrap();
    let cm = Model::load(&conv).unwrap();
    let offloaded = SessionOptions {
        mem_budget: Some("50%".into()),
        ..opts.clone()
    };

    let mut g = c.benchmark_group("session");
    g.sample_size(20);
    g.bench_function("dense_engine", |b| {
        b.iter(|| {
            prepare(&m, &src, &opts)
                .unwrap()
                .engine(64)
                .unwrap()
                .n_ctx()
        })
    });
    g.bench_function("offloaded_engine_50pct", |b| {
        b.iter(|| {
            let p = prepare(&cm, &conv, &offloaded).unwrap();
            let n = p.engine(64).unwrap().n_ctx();
            n
        })
    });
    g.finish();
}

criterion_group!(benches, bench_sessions);
criterion_main!(benches);
