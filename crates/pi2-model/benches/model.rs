//! GGUF header parsing and tokenizer throughput. The tokenizer bench uses the real test model
//! (`cargo xtask fetch-model`); the parser bench builds its own file.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pi2_model::{writer::GgufWriter, GgufFile, Model, Value};
use std::path::PathBuf;

fn bench_parse(c: &mut Criterion) {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()));
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(
            (0..50_000)
                .map(|i| Value::String(format!("tok{i}")))
                .collect(),
        ),
    );
    for i in 0..200 {
        w.tensor(&format!("blk.{i}.w"), &[64, 64], 0, vec![0u8; 64 * 64 * 4]);
    }
    let bytes = w.to_bytes();
    let mut g = c.benchmark_group("gguf");
    g.throughput(Throughput::Elements(50_000));
    g.bench_function("parse_50k_vocab_200_tensors", |b| {
        b.iter(|| GgufFile::from_bytes(&bytes).unwrap())
    });
    g.finish();
}

fn bench_tokenize(c: &mut Criterion) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let Ok(model) = Model::load(&path) else {
        eprintln!(
            "tokenizer bench skipped: no model at {} (cargo xtask fetch-model)",
            path.display()
        );
        return;
    };
    let text = std::fs::read_to_string(root.join("testdata/corpus/kjv_genesis.txt")).unwrap();
    let text = &text[..20_000];
    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("encode_genesis_20kB", |b| {
        b.iter(|| model.tokenizer.encode(text, false, false))
    });
    g.finish();
}

criterion_group!(benches, bench_parse, bench_tokenize);
criterion_main!(benches);
