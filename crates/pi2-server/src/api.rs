//! The OpenAI wire format: requests as clients send them, checked into a [`Job`]'s settings,
//! and the JSON bodies of answers, stream chunks and errors.

pub use crate::error::ApiError;
use pi2_engine::SamplerConfig;
use serde::Deserialize;
use serde_json::{json, Value};

/// One request body for both endpoints: chat sends `messages`, completions `prompt`. Fields
/// pi2 does not serve are refused by name unless they ask for nothing ([`crate::fields`]);
/// known ones of the wrong type are refused.
#[derive(Debug, Default, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt: Option<Prompt>,
    pub max_tokens: Option<u64>,
    /// llama-server's name for `max_tokens`.
    pub n_predict: Option<i64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over (llama-server: 0 off, -1 the whole context).
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Token ids (as strings, as OpenAI sends them) to biases added to their logits.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u64>,
    /// llama-server's: keep generating past end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    /// Completions: the answer's text starts with the prompt's.
    pub echo: Option<bool>,
    /// Speculative decoding for this request: `lookup` (prompt lookup) or `none`; unset: the
    /// server's `--draft`.
    pub draft: Option<String>,
    /// The output's shape (read by [`crate::guided`]).
    pub response_format: Option<crate::wire::ResponseFormat>,
    /// llama-server's: a GBNF grammar the output follows.
    pub grammar: Option<String>,
    /// llama-server's: a JSON schema the output follows.
    pub json_schema: Option<Value>,
    pub logprobs: Option<crate::wire::Logprobs>,
    pub top_logprobs: Option<u64>,
    /// llama-server's: the alternatives scored per token (native `/completion`:
    /// `completion_probabilities`; elsewhere the endpoint's `logprobs` with that many).
    pub n_probs: Option<u64>,
    /// Variables for the chat template (llama-server's; e.g. Qwen3's `enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// How a thinking model's reasoning is given (llama-server's; see `pi2_model::answer`).
    pub reasoning_format: Option<String>,
    /// How much a thinking model thinks (OpenAI's; a template variable, as llama-server).
    pub reasoning_effort: Option<String>,
    /// The template's opening of the assistant's turn after the messages (default true).
    pub add_generation_prompt: Option<bool>,
    /// Continue the last (assistant) message instead of opening a turn: `true` or `"content"`.
    pub continue_final_message: Option<Value>,
    /// `/infill`: the text before and after the cursor, and other files for context.
    pub input_prefix: Option<String>,
    pub input_suffix: Option<String>,
    pub input_extra: Option<Vec<ExtraChunk>>,
    /// Functions the model may call (read by [`crate::tools`]).
    pub tools: Option<Vec<crate::wire::Tool>>,
    pub tool_choice: Option<crate::wire::ToolChoice>,
    /// `false`: at most one call per answer.
    pub parallel_tool_calls: Option<bool>,
}

/// How a chat prompt ends ([`CompletionRequest::chat_ending`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatEnding {
    /// Every message closed; then the assistant's turn opened if `add_generation_prompt`.
    Close { add_generation_prompt: bool },
    /// The last message's text is where the answer goes on (prefill).
    Continue,
}

/// One file given to `/infill` for context.
#[derive(Debug, Deserialize)]
pub struct ExtraChunk {
    pub text: String,
    pub filename: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls, sent back with the conversation.
    pub tool_calls: Option<Vec<crate::wire::InToolCall>>,
    /// A `tool` turn: the call it answers, and the function's name.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant turn's reasoning, given back to templates that show it.
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    /// Token ids.
    Ids(Vec<u64>),
    /// Text and token ids, in order (llama-server's mixed prompt).
    Mixed(Vec<PromptPiece>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptPiece {
    Text(String),
    Id(u64),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// A prompt's tokens, and its text when it is text (for `echo`).
pub type PromptText<'a> = (Vec<u32>, Option<&'a str>);

/// Most choices one request asks for (`n`), and answers (prompts times choices).
pub const MAX_CHOICES: usize = 8;
pub const MAX_ANSWERS: usize = 16;
/// Most stop strings, and longest, accepted (OpenAI allows 4).
const MAX_STOPS: usize = 16;
/// Roles a message may have (`developer` is the OpenAI SDK's name for `system`).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];
const MAX_STOP_LEN: usize = 256;

impl CompletionRequest {
    /// Parses a body; the error names the field that is wrong.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
        let Some(fields) = value.as_object() else {
            return Err(ApiError::bad("the body must be a JSON object"));
        };
        crate::fields::check(fields)?;
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ApiError::bad(format!("`{path}`: {}", e.into_inner())).param(path)
        })
    }

    /// The messages as the template takes them, checked: a known role and text content in each.
    pub fn chat_messages(&self) -> Result<Vec<pi2_model::Message>, ApiError> {
        let msgs = self
            .messages
            .as_ref()
            .ok_or_else(|| ApiError::bad("`messages` is required").param("messages"))?;
        if msgs.is_empty() {
            return Err(ApiError::bad("`messages` is empty").param("messages"));
        }
        msgs.iter()
            .enumerate()
            .map(|(i, m)| {
                if !ROLES.contains(&m.role.as_str()) {
                    return Err(ApiError::bad(format!(
                        "role `{}` is not one of {}",
                        m.role,
                        ROLES.join(", ")
                    ))
                    .param(format!("messages[{i}].role")));
                }
                let calls = m.tool_calls.as_deref().unwrap_or(&[]);
                let content = match &m.content {
                    None if !calls.is_empty() => String::new(),
                    None => {
                        return Err(ApiError::bad(
                            "`content` is required (a string or a list of text parts)",
                        )
                        .param(format!("messages[{i}].content")))
                    }
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => text.push_str(t),
                                (kind, _) => {
                                    return Err(ApiError::bad(format!(
                                        "content part of type `{kind}`: only text is supported"
                                    ))
                                    .param(format!("messages[{i}].content")))
                                }
                            }
                        }
                        text
                    }
                };
                // The OpenAI SDK's `developer` is the templates' `system`.
                let role = match m.role.as_str() {
                    "developer" => "system",
                    r => r,
                };
                let mut msg = pi2_model::Message::new(role, &content);
                msg.tool_call_id = m.tool_call_id.clone();
                msg.reasoning_content = m.reasoning_content.clone();
                msg.name = m.name.clone();
                msg.tool_calls = calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| pi2_model::ToolCall {
                        id: c.id.clone().unwrap_or_else(|| format!("call_{i}_{k}")),
                        kind: "function".into(),
                        function: pi2_model::FunctionCall {
                            name: c.function.name.clone(),
                            // Templates take the arguments as an object: OpenAI sends JSON text.
                            arguments: match &c.function.arguments {
                                Value::String(t) => serde_json::from_str(t)
                                    .unwrap_or_else(|_| Value::String(t.clone())),
                                v => v.clone(),
                            },
                        },
                    })
                    .collect();
                Ok(msg)
            })
            .collect()
    }

    /// How this request drafts: its `draft` field, else the server's `default`; `model` needs
    /// a server started with `--draft-model` (`has_model`), `self` one under a memory budget
    /// (`offloads`: without one every neuron is resident and a self-draft costs a whole step).
    pub fn drafts(
        &self,
        default: Drafts,
        has_model: bool,
        offloads: bool,
    ) -> Result<Drafts, ApiError> {
        let refuse = |msg: String| Err(ApiError::bad(msg).param("draft"));
        match self.draft.as_deref() {
            None => Ok(default),
            Some("none") => Ok(Drafts::None),
            Some("lookup") => Ok(Drafts::Lookup),
            Some("model") if has_model => Ok(Drafts::Model),
            Some("model") => refuse("`draft`: `model` needs a server started with --draft-model".into()),
            Some("self") if offloads => Ok(Drafts::SelfDraft),
            Some("self") => refuse("`draft`: `self` drafts from what a memory budget keeps resident and needs a server started with --mem-budget (use `lookup`)".into()),
            Some(other) => refuse(format!(
                "`draft` is `lookup`, `model`, `self` or `none`, not `{other}`"
            )),
        }
    }

    /// The completion prompt's text.
    pub fn prompt_text(&self) -> Result<&str, ApiError> {
        match &self.prompt {
            Some(Prompt::Text(t)) => Ok(t),
            Some(Prompt::Texts(v)) if v.len() == 1 => Ok(&v[0]),
            Some(Prompt::Texts(_)) => {
                Err(ApiError::bad("`prompt`: one prompt per request").param("prompt"))
            }
            Some(Prompt::Ids(_) | Prompt::Mixed(_)) => Err(ApiError::bad(
                "`prompt` is token ids here: `echo` needs it as text",
            )
            .param("prompt")),
            None => Err(ApiError::bad("`prompt` is required").param("prompt")),
        }
    }

    /// A completion's prompts (OpenAI's list of texts: one answer each, in order) as tokens,
    /// and their texts (for `echo`); one prompt otherwise.
    pub fn prompts(
        &self,
        tok: &pi2_model::tokenizer::Tokenizer,
    ) -> Result<Vec<PromptText<'_>>, ApiError> {
        match &self.prompt {
            Some(Prompt::Texts(v)) if v.len() > 1 => {
                if v.len() * self.n.unwrap_or(1).max(1) as usize > MAX_ANSWERS {
                    return Err(ApiError::bad(format!(
                        "`prompt`: {} prompts of `n` = {} choices each are more than {MAX_ANSWERS} answers",
                        v.len(),
                        self.n.unwrap_or(1)
                    ))
                    .param("prompt"));
                }
                if self.streams() {
                    return Err(ApiError::bad(
                        "`prompt`: a list of prompts is answered whole: drop `stream` or send one prompt per request",
                    )
                    .param("prompt"));
                }
                Ok(v.iter()
                    .map(|t| (tok.encode(t, true, true), Some(t.as_str())))
                    .collect())
            }
            _ => Ok(vec![(self.prompt_tokens(tok)?, self.prompt_text().ok())]),
        }
    }

    /// A completion's prompt as tokens: text (control tokens parsed, as llama-server takes a
    /// prompt: the model's whole input), token ids (checked against `n_vocab`), or both mixed
    /// (text after the first piece gets no BOS).
    pub fn prompt_tokens(
        &self,
        tok: &pi2_model::tokenizer::Tokenizer,
    ) -> Result<Vec<u32>, ApiError> {
        let n_vocab = tok.vocab_size() as u64;
        let id = |i: u64| match i < n_vocab {
            true => Ok(i as u32),
            false => Err(ApiError::bad(format!(
                "`prompt`: {i} is not a token id (the vocabulary has {n_vocab})"
            ))
            .param("prompt")),
        };
        match &self.prompt {
            Some(Prompt::Ids(ids)) => ids.iter().map(|&i| id(i)).collect(),
            Some(Prompt::Mixed(pieces)) => {
                let mut out = Vec::new();
                for (k, p) in pieces.iter().enumerate() {
                    match p {
                        PromptPiece::Text(t) => out.extend(tok.encode(t, k == 0, true)),
                        PromptPiece::Id(i) => out.push(id(*i)?),
                    }
                }
                Ok(out)
            }
            _ => Ok(tok.encode(self.prompt_text()?, true, true)),
        }
    }

    /// The model's chat template, with this request's `chat_template_kwargs` set (a copy
    /// only when it sets any).
    /// How the chat prompt ends, as llama-server decides it: a trailing assistant message is
    /// continued (prefilled), as is any last message with `continue_final_message`; otherwise
    /// the assistant's turn is opened unless `add_generation_prompt` is false.
    pub fn chat_ending(&self, msgs: &[pi2_model::Message]) -> Result<ChatEnding, ApiError> {
        let asked = match &self.continue_final_message {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(Value::String(s)) if s == "content" => true,
            Some(v) => {
                return Err(ApiError::bad(format!(
                    "`continue_final_message` {v} is not supported: pi2 continues a message's content (`true` or \"content\")"
                ))
                .param("continue_final_message"))
            }
        };
        let last_is_assistant = msgs.last().is_some_and(|m| m.role == "assistant");
        let prefill = !asked && last_is_assistant;
        if prefill && msgs.len() >= 2 && msgs[msgs.len() - 2].role == "assistant" {
            return Err(ApiError::bad(
                "two or more assistant messages end the list: one can be continued",
            )
            .param("messages"));
        }
        if !(asked || prefill) {
            return Ok(ChatEnding::Close {
                add_generation_prompt: self.add_generation_prompt.unwrap_or(true),
            });
        }
        if asked && self.add_generation_prompt == Some(true) {
            return Err(ApiError::bad(
                "`add_generation_prompt` and `continue_final_message` cannot both be true",
            )
            .param("add_generation_prompt"));
        }
        if msgs.last().is_some_and(|m| !m.tool_calls.is_empty()) {
            return Err(
                ApiError::bad("an assistant message with tool calls cannot be continued")
                    .param("messages"),
            );
        }
        Ok(ChatEnding::Continue)
    }

    pub fn template<'t>(
        &self,
        template: &'t pi2_model::ChatTemplate,
    ) -> Result<std::borrow::Cow<'t, pi2_model::ChatTemplate>, ApiError> {
        let mut vars = self.chat_template_kwargs.clone().unwrap_or_default();
        // OpenAI's `reasoning_effort`, as llama-server gives it to the template (gpt-oss reads
        // it); `none` turns thinking off (`enable_thinking: false`, Qwen3's variable).
        match self.reasoning_effort.as_deref() {
            None => {}
            Some("none") => {
                vars.remove("reasoning_effort");
                vars.insert("enable_thinking".into(), false.into());
            }
            Some(e @ ("minimal" | "low" | "medium" | "high")) => {
                vars.insert("reasoning_effort".into(), e.into());
            }
            Some(other) => {
                return Err(ApiError::bad(format!(
                "`reasoning_effort` is `none`, `minimal`, `low`, `medium` or `high`, not `{other}`"
            ))
                .param("reasoning_effort"))
            }
        }
        match Some(&vars).filter(|v| !v.is_empty()) {
            Some(vars) => template
                .with_variables(vars)
                .map(std::borrow::Cow::Owned)
                .map_err(|e| {
                    ApiError::bad(format!("`chat_template_kwargs`: {e}"))
                        .param("chat_template_kwargs")
                }),
            None => Ok(std::borrow::Cow::Borrowed(template)),
        }
    }

    /// Sampling settings (pi2's defaults for what is absent), range-checked.
    /// The sampling settings, checked (token ids of `logit_bias` against `n_vocab`).
    pub fn sampler(&self, n_vocab: usize, n_ctx: usize) -> Result<SamplerConfig, ApiError> {
        let d = SamplerConfig::default();
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id = k
                .parse::<u32>()
                .ok()
                .filter(|&t| (t as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "`logit_bias`: `{k}` is not a token id of this model (0..{n_vocab})"
                    ))
                    .param("logit_bias")
                })?;
            logit_bias.push((id, b));
        }
        let top_k = self.top_k.unwrap_or(d.top_k as u64);
        let cfg = SamplerConfig {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: match self.repeat_last_n {
                None => d.repeat_last_n,
                Some(-1) => n_ctx,
                Some(n) if (0..=n_ctx as i64).contains(&n) => n as usize,
                Some(n) => {
                    return Err(ApiError::bad(format!(
                        "`repeat_last_n` is {n}; it must be -1 (the context) or 0..{n_ctx}"
                    ))
                    .param("repeat_last_n"))
                }
            },
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            seed: self.seed.unwrap_or_else(pi2_runtime::options::clock_seed),
        };
        if let Some((name, v, want)) = pi2_runtime::options::sampling_problem(&cfg) {
            return Err(ApiError::bad(format!("`{name}` is {v}; it must be {want}")).param(name));
        }
        Ok(cfg)
    }

    /// How many choices to answer (`n`, OpenAI's): up to [`MAX_CHOICES`], each sampled with
    /// the request's seed plus its index; streamed or on llama-server's native routes, one.
    pub fn choices(&self, kind: Kind) -> Result<usize, ApiError> {
        match self.n {
            None | Some(1) => Ok(1),
            Some(n) if n == 0 || n > MAX_CHOICES as u64 => {
                Err(ApiError::bad(format!("`n` is {n}; it must be 1 to {MAX_CHOICES}")).param("n"))
            }
            Some(_) if self.streams() => Err(ApiError::bad(
                "`n` above 1 is answered whole: drop `stream` or ask one choice per request",
            )
            .param("n")),
            Some(_) if kind.native() => {
                Err(ApiError::bad("`n` is for /v1/completions and /v1/chat/completions").param("n"))
            }
            Some(n) => Ok(n as usize),
        }
    }

    /// `max_tokens` (or `max_completion_tokens`), refused beyond the context.
    pub fn max_tokens(&self, n_ctx: usize) -> Result<Option<usize>, ApiError> {
        // llama-server's `n_predict`: -1 (or absent) means no limit of its own.
        let n_predict = match self.n_predict {
            Some(n) if n >= 0 => Some(n as u64),
            Some(-1) | None => None,
            Some(n) => {
                return Err(ApiError::bad(format!(
                    "`n_predict` is {n}; it must be -1 (no limit) or 0 and more"
                ))
                .param("n_predict"))
            }
        };
        let Some(m) = self.max_tokens.or(self.max_completion_tokens).or(n_predict) else {
            return Ok(None);
        };
        if m == 0 {
            return Err(
                ApiError::bad("`max_tokens` is 0; it must be 1 or more").param("max_tokens")
            );
        }
        // Past the context the answer ends where the context does, with `length`, as
        // llama-server ends it.
        Ok((m < n_ctx as u64).then_some(m as usize))
    }

    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS || stops.iter().any(|s| s.len() > MAX_STOP_LEN) {
            return Err(ApiError::bad(format!(
                "`stop`: at most {MAX_STOPS} strings of at most {MAX_STOP_LEN} bytes"
            ))
            .param("stop"));
        }
        Ok(stops)
    }

    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }
}

/// Where a request's drafts come from (speculative decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drafts {
    /// One token per forward pass.
    None,
    /// Prompt lookup: n-grams of the context.
    Lookup,
    /// The server's draft model.
    Model,
    /// The model itself from what is resident under the budget.
    SelfDraft,
}

impl Drafts {
    pub fn as_str(self) -> &'static str {
        match self {
            Drafts::None => "none",
            Drafts::Lookup => "lookup",
            Drafts::Model => "model",
            Drafts::SelfDraft => "self",
        }
    }
}

/// Why generation ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    /// The answer is function calls.
    ToolCalls,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// What one generation did: counts and times for `usage` and `timings`.
#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the slot's KV cache (not evaluated again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_ms: f64,
    pub predicted_ms: f64,
    /// Speculative decoding: tokens drafted, and of those kept (llama-server's names).
    pub draft_n: usize,
    pub draft_n_accepted: usize,
    /// The stop string that ended the answer, if one did.
    pub stop_word: Option<String>,
}

impl Summary {
    pub fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    /// llama-server's `timings`.
    pub fn timings(&self) -> Value {
        let evaluated = self.prompt_tokens - self.cached_tokens;
        let per = |ms: f64, n: usize| if n == 0 { 0.0 } else { ms / n as f64 };
        let rate = |ms: f64, n: usize| if ms <= 0.0 { 0.0 } else { n as f64 * 1e3 / ms };
        json!({
            "cache_n": self.cached_tokens,
            "prompt_n": evaluated,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": per(self.prompt_ms, evaluated),
            "prompt_per_second": rate(self.prompt_ms, evaluated),
            "predicted_n": self.completion_tokens,
            "predicted_ms": self.predicted_ms,
            // As `pi2 run --json` and llama-server: generated tokens over generation time.
            "predicted_per_token_ms": per(self.predicted_ms, self.completion_tokens),
            "predicted_per_second": rate(self.predicted_ms, self.completion_tokens),
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
        })
    }
}

/// Which endpoint: shapes of the answer and its chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
    /// llama-server's native `/completion`.
    Native,
    /// llama-server's `/infill`: a native completion of a fill-in-the-middle prompt.
    Infill,
}

impl Kind {
    /// Whether answers take llama-server's native shape.
    pub fn native(self) -> bool {
        matches!(self, Kind::Native | Kind::Infill)
    }
}

/// The fields every answer and chunk carries.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    /// A stream's usage in a chunk of its own, with no choices (OpenAI's
    /// `stream_options.include_usage`); otherwise in the last chunk, as llama-server sends it.
    pub usage_chunk: bool,
    /// Native answers: the prompt's text and the settings the answer was made with.
    pub prompt: String,
    pub settings: Value,
}

/// What OpenAI's `system_fingerprint` names: the build that answered.
const FINGERPRINT: &str = concat!("pi2-", env!("CARGO_PKG_VERSION"));

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion | Kind::Native | Kind::Infill, _) => "text_completion",
        }
    }

    /// The whole answer (`logprobs`: its tokens' scores, when asked for).
    pub fn answer(&self, text: &str, s: &Summary, logprobs: Option<Value>) -> Value {
        let choice = match self.kind {
            Kind::Native | Kind::Infill => return crate::native::answer(self, text, s, logprobs),
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": s.finish.as_str(),
                "logprobs": logprobs,
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text,
                "finish_reason": s.finish.as_str(),
                "logprobs": logprobs,
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [choice],
            "usage": s.usage(),
            "timings": s.timings(),
        })
    }

    /// A stream chunk: text (`role` on the first chat chunk) with its tokens' scores when
    /// asked for, or the end (`finish` with usage and timings).
    pub fn chunk(
        &self,
        text: Option<&str>,
        first: bool,
        end: Option<&Summary>,
        logprobs: Option<Value>,
    ) -> Value {
        let finish = end.map(|s| s.finish.as_str());
        let choice = match self.kind {
            Kind::Native | Kind::Infill => return crate::native::chunk(text, end, logprobs),
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                match text {
                    Some(t) => {
                        delta.insert("content".into(), t.into());
                    }
                    // The role's chunk says there is no text yet, as llama-server and OpenAI do.
                    None if first => {
                        delta.insert("content".into(), Value::Null);
                    }
                    None => {}
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs})
            }
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
        };
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [choice],
        });
        if let Some(s) = end.filter(|_| !self.usage_chunk) {
            v["usage"] = s.usage();
            v["timings"] = s.timings();
        }
        v
    }

    /// The chunk that carries a stream's usage alone (`usage_chunk`): no choices.
    pub fn usage(&self, s: &Summary) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [],
            "usage": s.usage(),
            "timings": s.timings(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn wrong_types_and_unserved_fields_are_named() {
        let e = CompletionRequest::parse(br#"{"prompt":"x","temperature":"hot"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
        let e = CompletionRequest::parse(br#"{"messages":[{"role":1}]}"#).unwrap_err();
        assert!(e.message.contains("messages[0].role"), "{}", e.message);
        let e = CompletionRequest::parse(b"{nope").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = CompletionRequest::parse(b"[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{}", e.message);
        let r = CompletionRequest::parse(br#"{"prompt":"x","logit_bias":{},"user":"u"}"#).unwrap();
        assert_eq!(r.prompt_text().unwrap(), "x");
        let e = CompletionRequest::parse(br#"{"prompt":"x","typical_p":0.5}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("typical_p"), "{}", e.message);
    }

    #[test]
    fn settings_are_range_checked() {
        let r = |s: &str| CompletionRequest::parse(s.as_bytes()).unwrap();
        assert!(r(r#"{"temperature":-1}"#).sampler(1000, 512).is_err());
        assert!(r(r#"{"top_p":0}"#).sampler(1000, 512).is_err());
        assert!(r(r#"{"min_p":2}"#).sampler(1000, 512).is_err());
        assert!(r(r#"{"n":2}"#).choices(Kind::Chat).is_ok_and(|n| n == 2));
        assert!(r(r#"{"n":0}"#).choices(Kind::Chat).is_err());
        assert!(r(r#"{"n":2,"stream":true}"#).choices(Kind::Chat).is_err());
        assert!(r(r#"{"presence_penalty":3}"#).sampler(1000, 512).is_err());
        assert!(r(r#"{"logit_bias":{"5":101}}"#).sampler(1000, 512).is_err());
        let e = r(r#"{"logit_bias":{"1000":1}}"#)
            .sampler(1000, 512)
            .unwrap_err();
        assert!(
            e.message.contains("`1000` is not a token id"),
            "{}",
            e.message
        );
        let b = r(r#"{"logit_bias":{"7":-100},"frequency_penalty":0.5}"#)
            .sampler(1000, 512)
            .unwrap();
        assert_eq!(
            (b.logit_bias, b.frequency_penalty),
            (vec![(7, -100.0)], 0.5)
        );
        assert_eq!(
            r(r#"{"temperature":0}"#)
                .sampler(1000, 512)
                .unwrap()
                .temperature,
            0.0
        );
        assert_eq!(r(r#"{"max_tokens":5000}"#).max_tokens(4096).unwrap(), None);
        assert!(r(r#"{"max_tokens":0}"#).max_tokens(4096).is_err());
        assert_eq!(r(r#"{"max_tokens":5}"#).max_tokens(4096).unwrap(), Some(5));
        assert!(r(r#"{"stop":["a","b"]}"#).stops().is_ok());
        assert!(CompletionRequest::parse(br#"{"max_tokens":-1}"#).is_err());
        let parts = r(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#);
        assert_eq!(parts.chat_messages().unwrap()[0].content, "hi");
        let image = r(r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#);
        assert!(image.chat_messages().is_err());
    }
}
