//! What a request asks of the output's shape and of its scores: `response_format`
//! (`json_object`, `json_schema`), llama-server's `grammar` (GBNF) and `json_schema`, read into
//! one [`GrammarSpec`]; `logprobs` and `top_logprobs` read into how many alternatives to report,
//! and the answers' `logprobs` objects in OpenAI's two shapes (chat and legacy completions).

use crate::api::{CompletionRequest, Kind};
use crate::error::ApiError;
use crate::wire::{Logprobs, ResponseFormat};
use pi2_engine::TokenLogprob;
use pi2_grammar::GrammarSpec;
use pi2_model::tokenizer::Tokenizer;
use serde_json::Value;

/// Most alternatives per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

impl CompletionRequest {
    /// The grammar the output must follow, from whichever one field asks for it.
    pub fn grammar_spec(&self) -> Result<Option<GrammarSpec>, ApiError> {
        let mut asked = Vec::new();
        if let Some(f) = &self.response_format {
            if let Some(spec) = format_spec(f)? {
                asked.push(("response_format", spec));
            }
        }
        if let Some(g) = self.grammar.as_deref().filter(|g| !g.trim().is_empty()) {
            asked.push(("grammar", GrammarSpec::Gbnf(g.to_string())));
        }
        if let Some(s) = self.json_schema.as_ref().filter(|s| !s.is_null()) {
            asked.push(("json_schema", GrammarSpec::JsonSchema(s.clone())));
        }
        match asked.len() {
            0 => Ok(None),
            1 => Ok(asked.pop().map(|a| a.1)),
            _ => Err(ApiError::bad(format!(
                "`{}` and `{}` both constrain the output: send one",
                asked[0].0, asked[1].0
            ))
            .param(asked[1].0)),
        }
    }

    /// How many alternatives to report with each token's log probability (`None`: no log
    /// probabilities). Chat sends `logprobs: true` and `top_logprobs: N`; completions
    /// `logprobs: N`.
    pub fn top_logprobs(&self, kind: Kind) -> Result<Option<usize>, ApiError> {
        let range = |name: &str, n: u64| {
            if n > MAX_TOP_LOGPROBS {
                return Err(ApiError::bad(format!(
                    "`{name}` is {n}; it must be 0..{MAX_TOP_LOGPROBS}"
                ))
                .param(name));
            }
            Ok(n as usize)
        };
        let n_probs = self.n_probs.filter(|&n| n > 0);
        if kind.native() {
            if self.logprobs.is_some() || self.top_logprobs.is_some() {
                return Err(ApiError::bad(
                    "/completion scores tokens with `n_probs` (`logprobs` is the OpenAI routes')",
                )
                .param("logprobs"));
            }
            return n_probs.map(|n| range("n_probs", n)).transpose();
        }
        let top = match (kind, &self.logprobs) {
            // llama-server's `n_probs` asks for the endpoint's scores with that many alternatives.
            (_, None) if n_probs.is_some() => range("n_probs", n_probs.unwrap_or(0))?,
            (_, None) | (_, Some(Logprobs::On(false))) => {
                if self.top_logprobs.is_some_and(|n| n > 0) {
                    return Err(ApiError::bad("`top_logprobs` needs `logprobs: true`")
                        .param("top_logprobs"));
                }
                return Ok(None);
            }
            (Kind::Chat, Some(Logprobs::On(true))) => {
                range("top_logprobs", self.top_logprobs.unwrap_or(0))?
            }
            (Kind::Chat, Some(Logprobs::Top(_))) => return Err(ApiError::bad(
                "chat `logprobs` is true or false; the number of alternatives is `top_logprobs`",
            )
            .param("logprobs")),
            (Kind::Completion, Some(Logprobs::Top(n))) => range("logprobs", *n)?,
            (Kind::Completion, Some(Logprobs::On(true))) => 0,
            // Answered above.
            (Kind::Native | Kind::Infill, _) => 0,
        };
        if kind == Kind::Completion && self.echo == Some(true) {
            return Err(ApiError::bad(
                "`logprobs` with `echo` would score the prompt too, which pi2 does not do: drop one",
            )
            .param("logprobs"));
        }
        Ok(Some(top))
    }
}

fn format_spec(f: &ResponseFormat) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: &str| Err(ApiError::bad(m.to_string()).param("response_format"));
    match f.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(match &f.schema {
            Some(s) => GrammarSpec::JsonSchema(s.clone()),
            None => GrammarSpec::JsonObject,
        })),
        "json_schema" => match f.json_schema.as_ref().and_then(|j| j.schema.as_ref()) {
            Some(s) => Ok(Some(GrammarSpec::JsonSchema(s.clone()))),
            None => bad("`response_format`: `json_schema` needs `json_schema.schema`"),
        },
        other => bad(&format!(
            "`response_format` type `{other}` is not one of text, json_object, json_schema"
        )),
    }
}

/// The `logprobs` object of an answer or chunk of `kind`.
pub fn logprobs_value(kind: Kind, tok: &Tokenizer, lps: &[TokenLogprob], offset: usize) -> Value {
    match kind {
        Kind::Chat => pi2_runtime::logprobs::chat(tok, lps),
        Kind::Completion => pi2_runtime::logprobs::completion(tok, lps, offset),
        Kind::Native | Kind::Infill => crate::native::probabilities(tok, lps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(s: &str) -> CompletionRequest {
        CompletionRequest::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn one_field_asks_for_a_grammar() {
        let schema = json!({"type": "object"});
        let r = req(
            r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"},"strict":true}}}"#,
        );
        assert_eq!(
            r.grammar_spec().unwrap(),
            Some(GrammarSpec::JsonSchema(schema.clone()))
        );
        let r = req(r#"{"response_format":{"type":"json_object"}}"#);
        assert_eq!(r.grammar_spec().unwrap(), Some(GrammarSpec::JsonObject));
        let r = req(r#"{"response_format":{"type":"text"},"grammar":"root ::= \"a\""}"#);
        assert_eq!(
            r.grammar_spec().unwrap(),
            Some(GrammarSpec::Gbnf("root ::= \"a\"".into()))
        );
        let r = req(r#"{"json_schema":{"type":"object"}}"#);
        assert_eq!(
            r.grammar_spec().unwrap(),
            Some(GrammarSpec::JsonSchema(schema))
        );
        assert_eq!(req("{}").grammar_spec().unwrap(), None);
        for (body, param) in [
            (
                r#"{"response_format":{"type":"json_object"},"grammar":"root ::= \"a\""}"#,
                "grammar",
            ),
            (r#"{"response_format":{"type":"xml"}}"#, "response_format"),
            (
                r#"{"response_format":{"type":"json_schema"}}"#,
                "response_format",
            ),
        ] {
            let e = req(body).grammar_spec().unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
    }

    #[test]
    fn logprobs_as_chat_and_completions_send_them() {
        let chat = |s: &str| req(s).top_logprobs(Kind::Chat);
        let text = |s: &str| req(s).top_logprobs(Kind::Completion);
        assert_eq!(
            chat(r#"{"logprobs":true,"top_logprobs":3}"#).unwrap(),
            Some(3)
        );
        assert_eq!(chat(r#"{"logprobs":true}"#).unwrap(), Some(0));
        assert_eq!(chat(r#"{"logprobs":false}"#).unwrap(), None);
        assert!(chat(r#"{"top_logprobs":3}"#).is_err());
        assert!(chat(r#"{"logprobs":true,"top_logprobs":21}"#).is_err());
        assert!(chat(r#"{"logprobs":2}"#).is_err());
        assert_eq!(text(r#"{"logprobs":2}"#).unwrap(), Some(2));
        assert!(text(r#"{"logprobs":2,"echo":true}"#).is_err());
    }
}
