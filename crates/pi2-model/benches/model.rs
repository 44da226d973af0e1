//! GGUF header parsing and tokenizer throughput. The tokenizer bench uses the real test model
//! (`cargo xtask fetch-model`); the parser and user-defined-token benches build their own files.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pi2_model::{writer::GgufWriter, GgufFile, Model, Tokenizer, Value};
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

/// A vocabulary whose every token is user-defined (matched in the text before merging): each
/// word of Genesis, with and without a leading space, plus its characters as normal pieces.
fn bench_user_defined(c: &mut Criterion) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("testdata/corpus/kjv_genesis.txt")).unwrap();
    let text = &text[..100_000];
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut chars: Vec<char> = text.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    for ch in chars {
        tokens.push(ch.to_string());
        types.push(1);
    }
    let mut words: Vec<&str> = text.split_whitespace().collect();
    words.sort_unstable();
    words.dedup();
    for w in words {
        for t in [w.to_string(), format!(" {w}")] {
            if !tokens.contains(&t) {
                tokens.push(t);
                types.push(4);
            }
        }
    }
    let n = tokens.len();
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", Value::String("llama".into()));
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    w.meta(
        "tokenizer.ggml.scores",
        Value::Array(vec![Value::F32(0.0); n]),
    );
    let file = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let mut g = c.benchmark_group("tokenizer");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function(format!("encode_100kB_{n}_user_defined"), |b| {
        b.iter(|| tok.encode(text, false, false))
    });
    g.finish();
}

/// Checking a converted file's checksum table over its mapped tensors (what an in-memory run
/// of a converted model does once at load): 64 MiB of 616-byte rows (Q5_0 rows of 896).
fn bench_checksums(c: &mut Criterion) {
    let mut w = GgufWriter::new();
    let rows = (64usize << 20) / 616 / 16;
    for i in 0..16 {
        let data: Vec<u8> = (0..rows * 616).map(|k| (k * 31 + i) as u8).collect();
        w.tensor(&format!("blk.{i}.w"), &[616, rows as u64], 24, data);
    }
    w.with_checksums();
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    let table = pi2_model::checksum::table(&f).unwrap().unwrap();
    let mut g = c.benchmark_group("checksums");
    g.throughput(Throughput::Bytes((16 * rows * 616) as u64));
    g.bench_function("verify-mapped", |b| {
        b.iter(|| pi2_model::checksum::verify_mapped(&f, &table, |_| usize::MAX).unwrap())
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_parse,
    bench_tokenize,
    bench_user_defined,
    bench_checksums
);
criterion_main!(benches);
