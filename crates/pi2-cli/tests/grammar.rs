//! `pi2 run --grammar/--grammar-file/--json-schema/--json-schema-file`: the output follows the
//! grammar; bad or conflicting grammars are refused in one line.

mod common;

use common::{fails_with, m, ok, root};
use serde_json::Value;

fn text(args: &[&str]) -> String {
    let model = m();
    let mut a = vec![
        "run",
        "-m",
        model.as_str(),
        "--temp",
        "0",
        "-t",
        "1",
        "--json",
    ];
    a.extend_from_slice(args);
    let v: Value = serde_json::from_str(&ok(&a)).unwrap();
    v["text"].as_str().unwrap().to_string()
}

#[test]
fn the_output_follows_a_gbnf_grammar_or_a_json_schema() {
    let t = text(&[
        "-p",
        "Is water wet? Answer:",
        "-n",
        "8",
        "--grammar",
        r#"root ::= " " ("yes" | "no") "!""#,
    ]);
    assert!(t == " yes!" || t == " no!", "{t:?}");
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"colour":{"enum":["red","blue"]},"n":{"type":"integer","minimum":0,"maximum":9}},"required":["colour","n"],"additionalProperties":false}"#,
    )
    .unwrap();
    let t = text(&[
        "-p",
        "A colour as JSON:",
        "-n",
        "64",
        "--json-schema-file",
        schema.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t:?}"));
    assert!(v["colour"] == "red" || v["colour"] == "blue", "{t}");
    assert!(v["n"].as_u64().is_some_and(|n| n <= 9), "{t}");
    let any = text(&["-p", "JSON:", "-n", "48", "-j", "{}"]);
    assert!(any.trim_start().starts_with('{'), "{any:?}");
}

#[test]
fn bad_grammars_are_refused_in_one_line() {
    let model = m();
    let base = ["run", "-m", model.as_str(), "-p", "x", "-n", "2"];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }
    fails_with(
        &with(&base, &["--grammar", "root ::= nope"]),
        "rule `nope` is used but not defined",
    );
    fails_with(
        &with(&base, &["-j", "{\"type\": \"bogus\"}"]),
        "invalid JSON schema",
    );
    fails_with(
        &with(&base, &["-j", "{not json"]),
        "--json-schema: invalid JSON schema: not JSON",
    );
    // Two grammars: clap's usage error.
    let out = common::pi2(&with(&base, &["--grammar", "root ::= \"a\"", "-j", "{}"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let missing = root().join("no-such-grammar.gbnf");
    fails_with(
        &with(&base, &["--grammar-file", missing.to_str().unwrap()]),
        "cannot read the grammar file",
    );
}
