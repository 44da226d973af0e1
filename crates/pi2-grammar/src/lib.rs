//! pi2-grammar: constrained decoding. A [`Vocabulary`] (built once per model from its
//! tokenizer) compiles a [`GrammarSpec`] — a JSON schema, any JSON object, a Lark or GBNF
//! grammar, a regex — into a [`Grammar`]; each generation starts a [`Constraint`] from it, which
//! the sampler asks before every draw ([`pi2_engine::TokenConstraint`]): tokens the grammar
//! forbids get a logit of negative infinity, so the text always parses.
//!
//! The grammar engine is llguidance (an Earley parser over a lazy lexer and a token trie).
//!
//! ```no_run
//! # fn demo(model: &pi2_model::Model) -> Result<(), pi2_grammar::GrammarError> {
//! use pi2_grammar::{GrammarSpec, Vocabulary};
//! let vocab = Vocabulary::new(&model.tokenizer)?;
//! let grammar = vocab.compile(&GrammarSpec::JsonObject)?;
//! let sampler = pi2_engine::Sampler::new(pi2_engine::SamplerConfig::greedy())
//!     .with_constraint(Box::new(grammar.start()));
//! # Ok(()) }
//! ```

mod gbnf;
mod limits;

pub use gbnf::gbnf_to_lark;
pub use limits::{
    COMPILE_TIME, MAX_COMPILES, MAX_GRAMMAR_BYTES, MAX_RULES, MAX_SCHEMA_DEPTH, MAX_SCHEMA_REFS,
};

use limits::{check_size, Permit, COMPILE_STACK};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use pi2_model::tokenizer::{TokenType, Tokenizer};
use pi2_model::TokenId;
use std::sync::Arc;

/// Why a grammar could not be made or followed.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("the model's vocabulary cannot drive a grammar: {0}")]
    Vocabulary(String),
    #[error("invalid {kind}: {msg}")]
    Invalid { kind: &'static str, msg: String },
    /// Over a limit checked before any compiling; the message names the limit.
    #[error("{kind} too large: {msg}")]
    TooLarge { kind: &'static str, msg: String },
    /// Compiling took longer than [`COMPILE_TIME`], or no place to compile in came free within it.
    #[error("{0}")]
    Busy(String),
}

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (OpenAI's `json_schema`, llama.cpp's `json_schema`).
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A grammar in llama.cpp's GBNF (translated to Lark, [`gbnf_to_lark`]).
    Gbnf(String),
    /// Text matching a regular expression (Rust `regex` syntax).
    Regex(String),
}

impl GrammarSpec {
    /// A JSON schema given as text (`{}`: any JSON object), as `--json-schema`, the C API and
    /// Python take it.
    pub fn json_schema_text(text: &str) -> Result<Self, GrammarError> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| GrammarError::Invalid {
                kind: "JSON schema",
                msg: format!("not JSON: {e}"),
            })?;
        Ok(match v.as_object().is_some_and(|o| o.is_empty()) {
            true => GrammarSpec::JsonObject,
            false => GrammarSpec::JsonSchema(v),
        })
    }

    fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonObject | GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::Lark(_) => "Lark grammar",
            GrammarSpec::Gbnf(_) => "GBNF grammar",
            GrammarSpec::Regex(_) => "regex",
        }
    }
}

/// A model's tokens as the grammar engine sees them: each token's bytes in a trie, control
/// tokens kept out of text. Building it takes a fraction of a second on a 150k vocabulary:
/// make one per model and share it.
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
}

impl Vocabulary {
    /// The vocabulary of `tok`; the grammar's end is its end-of-sequence token (or its first
    /// end-of-generation token).
    pub fn new(tok: &Tokenizer) -> Result<Arc<Self>, GrammarError> {
        let n_vocab = tok.vocab_size();
        let eos = tok
            .eos
            .or_else(|| tok.eog.first().copied())
            .ok_or_else(|| GrammarError::Vocabulary("it has no end-of-sequence token".into()))?;
        let words: Vec<Vec<u8>> = (0..n_vocab as TokenId)
            .map(|id| match tok.token_type(id) {
                // Control tokens are never text: the marker byte keeps the lexer off them.
                Some(TokenType::Control | TokenType::Unknown | TokenType::Unused) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
                    w
                }
                _ => tok.token_bytes(id, false),
            })
            .collect();
        let mut info = TokRxInfo::new(n_vocab as u32, eos);
        info.tok_bos = tok.bos;
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // Errors say what is wrong, not the parser's internal state.
        factory.limits_mut().verbose_errors = false;
        Ok(Arc::new(Self {
            factory: Arc::new(factory),
            n_vocab,
        }))
    }

    /// Compiles `spec`; an invalid schema or grammar is refused here, before any decoding, and
    /// one over the limits above ([`MAX_RULES`], ...) before any compiling. The compile runs on
    /// a thread of its own (a known stack, whatever thread calls) and the caller waits at most
    /// [`COMPILE_TIME`].
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        check_size(spec)?;
        let started = std::time::Instant::now();
        let permit = Permit::take(COMPILE_TIME).ok_or_else(|| {
            GrammarError::Busy(format!(
                "{MAX_COMPILES} grammars have been compiling for over {} s: retry later",
                COMPILE_TIME.as_secs()
            ))
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        let (factory, n_vocab, spec2) = (self.factory.clone(), self.n_vocab, spec.clone());
        let spawned = std::thread::Builder::new()
            .name("pi2-grammar".into())
            .stack_size(COMPILE_STACK)
            .spawn(move || {
                let _ = tx.send(compile_on(&factory, n_vocab, &spec2));
                drop(permit);
            });
        if let Err(e) = spawned {
            return Err(GrammarError::Busy(format!(
                "cannot start a thread to compile the grammar: {e}"
            )));
        }
        match rx.recv_timeout(COMPILE_TIME.saturating_sub(started.elapsed())) {
            Ok(r) => r,
            Err(_) => Err(GrammarError::Busy(format!(
                "the {} took over {} s to compile: simplify it",
                spec.kind(),
                COMPILE_TIME.as_secs()
            ))),
        }
    }
}

/// Compiles `spec` with `factory`, on the calling thread.
fn compile_on(
    factory: &ParserFactory,
    n_vocab: usize,
    spec: &GrammarSpec,
) -> Result<Grammar, GrammarError> {
    let invalid = |msg: String| GrammarError::Invalid {
        kind: spec.kind(),
        msg,
    };
    let top = match spec {
        GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_json_defaults(
            serde_json::json!({"type": "object"}),
        )),
        GrammarSpec::JsonSchema(s) => {
            if !s.is_object() {
                return Err(invalid("a schema is a JSON object".into()));
            }
            TopLevelGrammar::from_json_schema(with_json_defaults(s.clone()))
        }
        GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        GrammarSpec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf_to_lark(g).map_err(invalid)?),
        GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
    };
    let parser = factory
        .create_parser(top)
        .map_err(|e| invalid(e.to_string()))?;
    let matcher = Matcher::new(Ok(parser));
    if let Some(e) = matcher.get_error() {
        return Err(invalid(e));
    }
    Ok(Grammar {
        proto: matcher,
        n_vocab,
    })
}

/// Whitespace between JSON tokens: what models write (newlines and indents), but never
/// without end — small models in JSON mode otherwise loop on blank lines (llama.cpp bounds it
/// too). A schema's own `x-guidance` options win.
const JSON_WHITESPACE: &str = r"[\x20\x09\x0A\x0D]{0,20}";

/// Integers a schema leaves unbounded get JSON's safe range (2^53 - 1 either way): without an
/// end to their digits, greedy decoding can append zeros for ever (llama.cpp caps integers at
/// 16 digits for the same reason).
const SAFE_INTEGER: i64 = (1 << 53) - 1;

fn with_json_defaults(mut schema: serde_json::Value) -> serde_json::Value {
    bound_integers(&mut schema);
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    schema
}

fn bound_integers(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            if o.get("type").and_then(|t| t.as_str()) == Some("integer") {
                let low = ["minimum", "exclusiveMinimum"]
                    .iter()
                    .any(|k| o.contains_key(*k));
                let high = ["maximum", "exclusiveMaximum"]
                    .iter()
                    .any(|k| o.contains_key(*k));
                if !low {
                    o.insert("minimum".into(), (-SAFE_INTEGER).into());
                }
                if !high {
                    o.insert("maximum".into(), SAFE_INTEGER.into());
                }
            }
            o.values_mut().for_each(bound_integers);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

/// A compiled grammar: [`Grammar::start`] gives each generation its own [`Constraint`].
pub struct Grammar {
    proto: Matcher,
    n_vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// A constraint at the grammar's start.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: self.proto.deep_clone(),
            n_vocab: self.n_vocab,
        }
    }
}

/// One generation's place in a [`Grammar`].
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
}

impl Constraint {
    /// The tokens allowed next (only the end once the grammar is complete).
    pub fn allowed(&mut self) -> Result<SimpleVob, String> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())
    }

    /// Whether the text so far is a complete match.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

impl pi2_engine::TokenConstraint for Constraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.allowed()?;
        let n = self.n_vocab.min(logits.len());
        // Rows of the output head past the vocabulary (padding) are never allowed.
        for l in &mut logits[n..] {
            *l = f32::NEG_INFINITY;
        }
        allowed.iter_unset_entries(|i| {
            if let Some(l) = logits[..n].get_mut(i) {
                *l = f32::NEG_INFINITY;
            }
        });
        Ok(())
    }

    fn commit(&mut self, token: TokenId) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
