//! Grammars on the real models' vocabularies (`cargo xtask fetch-model`): whatever the logits,
//! the constrained text parses; and greedy decoding on Qwen2.5-Coder-0.5B held to a schema gives
//! JSON that validates.

use pi2_engine::{
    generate_scored, Engine, EngineConfig, GenerateConfig, Sampler, SamplerConfig, TokenConstraint,
};
use pi2_grammar::{GrammarSpec, Vocabulary};
use pi2_model::Model;
use serde_json::{json, Value};
use std::path::PathBuf;

fn model(name: &str) -> Model {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    Model::load(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch-model`)", p.display()))
}

const MODELS: [&str; 3] = [
    "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "size": {"type": "integer", "minimum": 0, "maximum": 999},
            "colour": {"enum": ["red", "green", "blue"]},
            "ok": {"type": "boolean"}
        },
        "required": ["size", "colour", "ok"],
        "additionalProperties": false
    })
}

/// Draws from random logits under the constraint until it allows the end; returns the text.
fn random_walk(m: &Model, spec: &GrammarSpec, seed: u64) -> String {
    let vocab = Vocabulary::new(&m.tokenizer).unwrap();
    let mut c = vocab.compile(spec).unwrap().start();
    let n = m.config.n_vocab;
    let eos = m
        .tokenizer
        .eos
        .or(m.tokenizer.eog.first().copied())
        .unwrap();
    let mut rng = seed;
    let mut ids = Vec::new();
    for _ in 0..400 {
        let mut logits: Vec<f32> = (0..n)
            .map(|_| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((rng >> 33) as f32 / (1u64 << 31) as f32) * 8.0
            })
            .collect();
        c.mask(&mut logits).unwrap();
        if logits[eos as usize].is_finite() {
            return String::from_utf8(m.tokenizer.decode(&ids, false)).unwrap();
        }
        let t = pi2_engine::argmax(&logits);
        assert!(
            logits[t as usize].is_finite(),
            "no token allowed after {ids:?}"
        );
        c.commit(t).unwrap();
        ids.push(t);
    }
    panic!(
        "no end after 400 tokens: {:?}",
        m.tokenizer.decode(&ids, false)
    );
}

#[test]
fn any_logits_give_valid_json_on_every_vocabulary() {
    for name in MODELS {
        let m = model(name);
        for seed in 0..4 {
            let text = random_walk(&m, &GrammarSpec::JsonSchema(schema()), seed);
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text:?}"));
            let o = v.as_object().unwrap();
            assert_eq!(o.len(), 3, "{name}: {text}");
            assert!(
                o["size"].as_u64().is_some_and(|s| s <= 999),
                "{name}: {text}"
            );
            assert!(["red", "green", "blue"].contains(&o["colour"].as_str().unwrap()));
            assert!(o["ok"].is_boolean());
        }
    }
}

#[test]
fn gbnf_and_regex_hold_on_random_logits() {
    let m = model(MODELS[0]);
    let gbnf = GrammarSpec::Gbnf(r#"root ::= ("yes" | "no") " " [0-9]{2} "!""#.into());
    for seed in 0..4 {
        let t = random_walk(&m, &gbnf, seed);
        let (word, rest) = t.split_once(' ').unwrap();
        assert!(word == "yes" || word == "no", "{t:?}");
        assert!(
            rest.len() == 3 && rest.ends_with('!') && rest[..2].bytes().all(|b| b.is_ascii_digit()),
            "{t:?}"
        );
        let r = random_walk(&m, &GrammarSpec::Regex("[a-c]{3}-[0-9]".into()), seed);
        assert!(r.len() == 5 && r.as_bytes()[3] == b'-', "{r:?}");
    }
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    let m = model(MODELS[1]);
    let vocab = Vocabulary::new(&m.tokenizer).unwrap();
    for (spec, want) in [
        (GrammarSpec::Gbnf("root ::= missing".into()), "missing"),
        (GrammarSpec::Lark("start: (".into()), "Lark"),
        (
            GrammarSpec::JsonSchema(json!({"type": "nonsense"})),
            "JSON schema",
        ),
        (GrammarSpec::JsonSchema(json!([1, 2])), "JSON object"),
        (GrammarSpec::Regex("(".into()), "regex"),
    ] {
        let e = vocab.compile(&spec).unwrap_err().to_string();
        assert!(e.contains(want), "{spec:?}: {e}");
    }
}

/// Grammars and schemas that once overflowed the stack (a 49 KB request killed the server):
/// long chains of rules and `$ref`s are refused by a named limit before compiling, or compiled
/// on the compile thread's own stack; deep nesting is refused; an unsatisfiable grammar's
/// error says what is wrong without the parser's internal state. Every call runs on a test
/// thread (2 MiB of stack): the compile never uses the caller's stack.
#[test]
fn hostile_grammars_get_a_named_limit_not_a_crash() {
    let m = model(MODELS[1]);
    let vocab = Vocabulary::new(&m.tokenizer).unwrap();
    let chain = |n: usize| {
        let mut g = String::from("root ::= r0\n");
        for i in 0..n {
            g += &format!("r{i} ::= r{}\n", i + 1);
        }
        g + &format!("r{n} ::= \"x\"\n")
    };
    let e = vocab.compile(&GrammarSpec::Gbnf(chain(3000))).unwrap_err();
    assert!(e.to_string().contains("rules, over the limit"), "{e}");
    // Just under the limit: compiled, on the compile thread's stack.
    vocab.compile(&GrammarSpec::Gbnf(chain(1990))).unwrap();

    let refs = |n: usize| {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "integer"}));
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs})
    };
    let e = vocab
        .compile(&GrammarSpec::JsonSchema(refs(10_000)))
        .unwrap_err();
    assert!(e.to_string().contains("`$ref`s, over the limit"), "{e}");

    let mut deep = json!({"type": "integer"});
    for _ in 0..100 {
        deep = json!({"type": "array", "items": deep});
    }
    let e = vocab.compile(&GrammarSpec::JsonSchema(deep)).unwrap_err();
    assert!(e.to_string().contains("nested"), "{e}");

    let e = vocab
        .compile(&GrammarSpec::Gbnf("root ::= root \"x\"".into()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.len() < 600, "a short error, not the parser's state: {e}");
}

#[test]
fn greedy_qwen_held_to_a_schema_writes_valid_json() {
    let m = model(MODELS[0]);
    let vocab = Vocabulary::new(&m.tokenizer).unwrap();
    let grammar = vocab.compile(&GrammarSpec::JsonSchema(schema())).unwrap();
    let prompt =
        "<|im_start|>user\nDescribe a small red box as JSON.<|im_end|>\n<|im_start|>assistant\n";
    let ids = m.tokenizer.encode(prompt, false, true);
    let mut e = Engine::new(
        &m,
        &EngineConfig {
            threads: 2,
            n_ctx: 256,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut s = Sampler::new(SamplerConfig::greedy())
        .with_constraint(Box::new(grammar.start()))
        .with_logprobs(2);
    let mut scored = Vec::new();
    let g = generate_scored(
        &mut e,
        &mut s,
        &mut Vec::new(),
        &ids,
        &GenerateConfig {
            max_tokens: Some(80),
            ..GenerateConfig::default()
        },
        None,
        |t, lp| {
            scored.push((t, lp.cloned()));
            true
        },
    )
    .unwrap();
    assert_eq!(g.stop, pi2_engine::StopReason::EndOfGeneration);
    let text = String::from_utf8(m.tokenizer.decode(&g.tokens, false)).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert_eq!(v["colour"], "red", "{text}");
    // Log probabilities come with every token; greedy and unmasked, the top one is the token.
    assert_eq!(scored.len(), g.tokens.len());
    for (t, lp) in scored {
        let lp = lp.unwrap();
        assert_eq!(lp.token, t);
        assert!(lp.logprob <= 0.0 && lp.top.len() == 2 && lp.top[0].1 >= lp.logprob);
    }
}
