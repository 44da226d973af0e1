//! The cost of constrained decoding per token on Qwen2.5-Coder-0.5B's 151k vocabulary: a mask
//! and a commit for each token of a JSON answer (compare with a decode step, `pi2 bench`).

use criterion::{criterion_group, criterion_main, Criterion};
use pi2_engine::TokenConstraint;
use pi2_grammar::{GrammarSpec, Vocabulary};
use pi2_model::Model;
use std::path::PathBuf;

fn per_token(c: &mut Criterion) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf");
    let Ok(m) = Model::load(&p) else {
        eprintln!("skipped: {} missing (cargo xtask fetch-model)", p.display());
        return;
    };
    let vocab = Vocabulary::new(&m.tokenizer).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "tags"]
    });
    let answer =
        "{\n  \"name\": \"Ada Lovelace\",\n  \"age\": 36,\n  \"tags\": [\"maths\", \"engines\"]\n}";
    let ids = m.tokenizer.encode(answer, false, false);
    let grammar = vocab.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mut logits = vec![0.0f32; m.config.n_vocab];
    c.bench_function(
        &format!("json_schema mask+commit x{} tokens", ids.len()),
        |b| {
            b.iter(|| {
                let mut con = grammar.start();
                for &t in &ids {
                    con.mask(&mut logits).unwrap();
                    con.commit(t).unwrap();
                }
            })
        },
    );
    c.bench_function("vocabulary build (151k tokens)", |b| {
        b.iter(|| Vocabulary::new(&m.tokenizer).unwrap())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = per_token
}
criterion_main!(benches);
