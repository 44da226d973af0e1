//! The C API's grammars and embeddings: output held to a GBNF grammar or a JSON schema, bad
//! grammars refused with a status and the reason, embeddings normalized and ranking similar
//! texts closer, small buffers and unknown pooling answered with a status.

mod common;

use common::{generate, last_error, open, smollm2};
use pi2_capi::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};

fn session() -> *mut pi2_session {
    common::session(open(&smollm2(), None))
}

#[test]
fn grammars_and_schemas_hold_the_output() {
    let s = session();
    let mut o = pi2_generate_options_default();
    o.temperature = 0.0;
    o.max_tokens = 48;
    let g = CString::new(r#"root ::= " " ("yes" | "no") "!""#).unwrap();
    o.grammar = g.as_ptr();
    let (st, text) = generate(s, "Is water wet? Answer:", &o);
    assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
    assert!(text == " yes!" || text == " no!", "{text:?}");
    o.grammar = null();
    let schema = CString::new(
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":9}},"required":["n"],"additionalProperties":false}"#,
    )
    .unwrap();
    o.json_schema = schema.as_ptr();
    let (st, text) = generate(s, "A digit as JSON:", &o);
    assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(v["n"].as_u64().is_some_and(|n| n <= 9), "{text}");
    // Both, or a broken one: refused with the reason.
    o.grammar = g.as_ptr();
    assert_eq!(generate(s, "x", &o).0, pi2_status::PI2_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("set one"), "{}", last_error());
    let bad = CString::new("root ::= nope").unwrap();
    o.json_schema = null();
    o.grammar = bad.as_ptr();
    assert_eq!(generate(s, "x", &o).0, pi2_status::PI2_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("`nope` is used but not defined"),
        "{}",
        last_error()
    );
    let not_json = CString::new("{nope").unwrap();
    o.grammar = null();
    o.json_schema = not_json.as_ptr();
    assert_eq!(generate(s, "x", &o).0, pi2_status::PI2_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("not JSON"), "{}", last_error());
}

fn embed(
    s: *mut pi2_session,
    text: &str,
    pooling: u32,
    room: usize,
) -> (pi2_status, Vec<f32>, usize) {
    let t = CString::new(text).unwrap();
    let mut v = vec![0f32; room];
    let mut n = 0;
    // SAFETY: valid string, buffer of `room` floats and out-pointer.
    let st = unsafe { pi2_embed(s, t.as_ptr(), pooling, v.as_mut_ptr(), room, &mut n) };
    (st, v, n)
}

#[test]
fn embeddings_are_normalized_and_rank_similar_texts_closer() {
    let s = session();
    let mean = pi2_pooling::PI2_POOLING_MEAN as u32;
    let (st, _, d) = embed(s, "x", mean, 0);
    assert_eq!(st, pi2_status::PI2_ERR_BUFFER_TOO_SMALL);
    assert_eq!(d, 576, "SmolLM2-135M's n_embd");
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let [a, b, c] = [
        "The cat sat on the mat.",
        "A kitten was sitting on the rug.",
        "Quarterly tax filings are due in April.",
    ]
    .map(|t| {
        let (st, v, _) = embed(s, t, mean, d);
        assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
        v
    });
    assert!((dot(&a, &a) - 1.0).abs() < 1e-4);
    assert!(dot(&a, &b) > dot(&a, &c));
    assert_eq!(embed(s, "x", 7, d).0, pi2_status::PI2_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("PI2_POOLING_MEAN"),
        "{}",
        last_error()
    );
    // SAFETY: a NULL text and a NULL out-pointer are refused, not read.
    unsafe {
        let mut n = 0;
        assert_eq!(
            pi2_embed(s, null(), mean, null_mut(), 0, &mut n),
            pi2_status::PI2_ERR_INVALID_ARGUMENT
        );
        let t = CString::new("x").unwrap();
        assert_eq!(
            pi2_embed(s, t.as_ptr(), mean, null_mut(), 0, null_mut()),
            pi2_status::PI2_ERR_INVALID_ARGUMENT
        );
    }
}
