//! `pi2 embed`: normalized vectors, similar sentences closer than unrelated ones, pooling
//! choices, clear refusals.

mod common;

use common::{fails_with, m, ok};
use serde_json::Value;

fn vectors(extra: &[&str], texts: &[&str]) -> Vec<Vec<f64>> {
    let model = m();
    let mut a = vec!["embed", "-m", model.as_str(), "-t", "1"];
    a.extend_from_slice(extra);
    a.extend_from_slice(texts);
    let v: Value = serde_json::from_str(&ok(&a)).unwrap();
    serde_json::from_value(v["embeddings"].clone()).unwrap()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn similar_sentences_are_closer_than_unrelated_ones() {
    let texts = [
        "The cat sat on the mat.",
        "A kitten was sitting on the rug.",
        "Quarterly tax filings are due in April.",
    ];
    for pooling in ["mean", "last"] {
        let e = vectors(&["--pooling", pooling], &texts);
        assert_eq!(e.len(), 3);
        for v in &e {
            assert!((dot(v, v) - 1.0).abs() < 1e-4, "{pooling}: not normalized");
        }
        assert!(dot(&e[0], &e[1]) > dot(&e[0], &e[2]), "{pooling}");
    }
    let cls = vectors(&["--pooling", "cls"], &texts[..2]);
    assert_eq!(cls.len(), 2);
}

#[test]
fn bad_embed_options_are_refused() {
    let model = m();
    fails_with(
        &[
            "embed",
            "-m",
            model.as_str(),
            "-c",
            "4",
            "one two three four five six seven",
        ],
        "longer than the context",
    );
    let out = common::pi2(&["embed", "-m", model.as_str(), "--pooling", "max", "x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not one of mean, cls, last"));
}
