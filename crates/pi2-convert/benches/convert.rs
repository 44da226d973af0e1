//! Conversion cost on a synthetic model: sample collection (a dense calibration run with an
//! observer) and fitting plus writing the bundle image (predictors, hot-first re-layout).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pi2_convert::{calibrate, collect_samples, convert, ConvertConfig};
use pi2_engine::{Engine, EngineConfig};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model};
use pi2_sparse::{Activation, ModelInfo};

fn bench_convert(c: &mut Criterion) {
    let spec = SynthSpec {
        n_embd: 256,
        n_ff: 768,
        n_layer: 2,
        n_head: 8,
        n_head_kv: 4,
        weight_type: QuantType::Q4_0,
        ..SynthSpec::default()
    };
    let m = Model::from_file(GgufFile::from_bytes(&build(&spec).to_bytes()).unwrap()).unwrap();
    let cfg = EngineConfig {
        threads: 1,
        n_ctx: 512,
        ..EngineConfig::default()
    };
    let toks: Vec<u32> = (0..256u32)
        .map(|i| (i * 37 + 11) % m.config.n_vocab as u32)
        .collect();
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: 2,
        n_embd: spec.n_embd,
        n_ff: spec.n_ff,
        activation: Activation::Silu,
        file_name: "synth".into(),
        file_bytes: 0,
    };
    let mut e = Engine::new(&m, &cfg).unwrap();
    let cal = calibrate(&mut e, &toks, 128, 0.5, info).unwrap();
    let (profile, th) = (cal.profile, cal.thresholds);

    let mut g = c.benchmark_group("convert");
    g.sample_size(10);
    g.throughput(Throughput::Elements(toks.len() as u64));
    g.bench_function("collect_samples_256_tokens", |b| {
        b.iter(|| collect_samples(&mut e, &toks, 128, &th, true, |_| {}).unwrap())
    });
    let samples = collect_samples(&mut e, &toks, 128, &th, true, |_| {}).unwrap();
    let cc = ConvertConfig::default();
    g.throughput(Throughput::Elements((2 * spec.n_ff) as u64));
    g.bench_function("fit_and_lay_out_2x768_neurons", |b| {
        b.iter(|| {
            let (w, _) = convert(&m, &profile, &th, samples.clone(), &cc).unwrap();
            let mut image = Vec::with_capacity(1 << 22);
            w.write(&mut image).unwrap();
            image.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_convert);
criterion_main!(benches);
