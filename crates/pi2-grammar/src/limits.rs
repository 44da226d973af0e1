//! What one grammar may cost before it is compiled, and how many compile at once: a request
//! must not be able to exhaust the stack, the CPU or the caller's time.

use crate::{GrammarError, GrammarSpec};

/// Largest grammar, regex or schema text compiled (bytes).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;
/// Most rules a GBNF or Lark grammar may define: real grammars have tens (llama.cpp's
/// `json.gbnf`: 10), and each rule costs stack depth when rules reference one another.
pub const MAX_RULES: usize = 2000;
/// Most `$ref`s a JSON schema may hold, and its deepest nesting of objects and arrays.
pub const MAX_SCHEMA_REFS: usize = 2000;
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Longest a compile may take before the caller is answered with an error (the compile ends
/// in the background, bounded by the grammar engine's own fuel limits).
pub const COMPILE_TIME: std::time::Duration = std::time::Duration::from_secs(10);
/// Compiles under way at once; more wait for a place (at most [`COMPILE_TIME`]).
pub const MAX_COMPILES: usize = 2;
/// The compiling thread's stack: grammar engines recurse along chains of rules and `$ref`s,
/// and the limits above keep the deepest accepted chain well inside this.
pub(crate) const COMPILE_STACK: usize = 64 << 20;

/// One of [`MAX_COMPILES`] places to compile in, given back when dropped (by the compiling
/// thread, so a compile that outlives its caller's wait still holds its place).
pub(crate) struct Permit;

static PLACES: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

impl Permit {
    /// A place, waiting at most `wait` for one.
    pub(crate) fn take(wait: std::time::Duration) -> Option<Permit> {
        let taken = PLACES.lock().unwrap_or_else(|e| e.into_inner());
        let (mut taken, _) = FREED
            .wait_timeout_while(taken, wait, |n| *n >= MAX_COMPILES)
            .unwrap_or_else(|e| e.into_inner());
        (*taken < MAX_COMPILES).then(|| {
            *taken += 1;
            Permit
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        *PLACES.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        FREED.notify_one();
    }
}

/// The limits checked before compiling, so that no grammar's size or depth reaches the
/// grammar engine's recursion.
pub(crate) fn check_size(spec: &GrammarSpec) -> Result<(), GrammarError> {
    let too_large = |msg: String| GrammarError::TooLarge {
        kind: spec.kind(),
        msg,
    };
    let text = match spec {
        GrammarSpec::Lark(t) | GrammarSpec::Gbnf(t) | GrammarSpec::Regex(t) => t.len(),
        GrammarSpec::JsonSchema(v) => {
            let (refs, depth) = schema_shape(v);
            if refs > MAX_SCHEMA_REFS {
                return Err(too_large(format!(
                    "{refs} `$ref`s, over the limit of {MAX_SCHEMA_REFS}"
                )));
            }
            if depth > MAX_SCHEMA_DEPTH {
                return Err(too_large(format!(
                    "nested {depth} deep, over the limit of {MAX_SCHEMA_DEPTH}"
                )));
            }
            0
        }
        GrammarSpec::JsonObject => 0,
    };
    if text > MAX_GRAMMAR_BYTES {
        return Err(too_large(format!(
            "{text} bytes, over the limit of {MAX_GRAMMAR_BYTES}"
        )));
    }
    let rules = match spec {
        GrammarSpec::Gbnf(t) => t.matches("::=").count(),
        // A Lark rule or terminal is defined by a name and `:` at the start of a line.
        GrammarSpec::Lark(t) => t
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                let name = l.split(':').next().unwrap_or("");
                l.contains(':')
                    && !name.is_empty()
                    && name
                        .trim_end()
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_?!.".contains(c))
            })
            .count(),
        _ => 0,
    };
    if rules > MAX_RULES {
        return Err(too_large(format!(
            "{rules} rules, over the limit of {MAX_RULES}"
        )));
    }
    Ok(())
}

/// A schema's `$ref` count and nesting depth (objects and arrays), without recursion.
fn schema_shape(v: &serde_json::Value) -> (usize, usize) {
    let (mut refs, mut deepest) = (0, 0);
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            serde_json::Value::Object(o) => {
                refs += usize::from(o.contains_key("$ref"));
                stack.extend(o.values().map(|c| (c, d + 1)));
            }
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    (refs, deepest)
}
