//! Chat for Python: OpenAI-style messages (tool calls and tool results included) and offered
//! tools through the model's template, and the answer read back in the template's dialect
//! ([`pi2_model::answer`]): reasoning, content and calls, whole or piece by piece.

use crate::{NativeModel, Pi2Error};
use pi2_model::answer::calls::{calls_lark, tools_prompt};
use pi2_model::answer::{CallStream, Channels, ReasoningFormat};
use pi2_model::{ChatTemplate, FunctionCall, Message, TokenId, ToolCall};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;

/// A message as `pi2/__init__.py` passes it: role, content, the calls an assistant turn made
/// (`(id, name, arguments JSON text)`), the call a `tool` turn answers, its function's name,
/// and an assistant turn's reasoning given back.
pub type PyMessage = (
    String,
    String,
    Vec<(String, String, String)>,
    Option<String>,
    Option<String>,
    Option<String>,
);

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

fn messages(messages: Vec<PyMessage>) -> PyResult<Vec<Message>> {
    if messages.is_empty() {
        return Err(PyValueError::new_err("there are no messages"));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, (role, content, calls, call_id, name, reasoning))| {
            if !ROLES.contains(&role.as_str()) {
                return Err(PyValueError::new_err(format!(
                    "messages[{i}]['role'] is {role:?}: use one of {}",
                    ROLES.join(", ")
                )));
            }
            // The OpenAI SDK's `developer` is the templates' `system`.
            let role = if role == "developer" { "system" } else { &role };
            let mut m = Message::new(role, &content);
            m.tool_call_id = call_id;
            m.name = name;
            m.reasoning_content = reasoning;
            m.tool_calls = calls
                .into_iter()
                .map(|(id, name, args)| ToolCall {
                    id,
                    kind: "function".into(),
                    // Templates take the arguments as an object: OpenAI gives JSON text.
                    function: FunctionCall {
                        name,
                        arguments: serde_json::from_str(&args).unwrap_or(Value::String(args)),
                    },
                })
                .collect();
            Ok(m)
        })
        .collect()
}

fn tools_value(tools: Option<&str>) -> PyResult<Option<Value>> {
    tools
        .map(|t| {
            serde_json::from_str::<Value>(t)
                .ok()
                .filter(Value::is_array)
                .ok_or_else(|| PyValueError::new_err("tools must be a list of function tools"))
        })
        .transpose()
}

/// The messages as the template takes them: with `tools` where it reads them, else the tools
/// stated in the system message.
fn with_tools(
    template: &ChatTemplate,
    mut msgs: Vec<Message>,
    tools: &Option<Value>,
) -> (Vec<Message>, Option<Value>) {
    match tools {
        Some(t) if !template.reads_tools() => {
            let prompt = tools_prompt(t);
            match msgs.first_mut().filter(|m| m.role == "system") {
                Some(m) => m.content = format!("{}\n\n{prompt}", m.content),
                None => msgs.insert(0, Message::new("system", &prompt)),
            }
            (msgs, None)
        }
        _ => (msgs, tools.clone()),
    }
}

impl NativeModel {
    fn template(&self) -> PyResult<ChatTemplate> {
        self.loaded()?
            .model()
            .chat_template()
            .map_err(|e| Pi2Error::new_err(e.to_string()))
    }
}

/// What `NativeModel`'s chat methods do (`lib.rs` holds the one `#[pymethods]` block).
impl NativeModel {
    /// The chat template applied to `messages` (and `tools`, JSON text).
    pub(crate) fn render_chat(
        &self,
        messages: Vec<PyMessage>,
        add_generation_prompt: bool,
        tools: Option<&str>,
    ) -> PyResult<String> {
        let template = self.template()?;
        let (msgs, tools) = with_tools(&template, self::messages(messages)?, &tools_value(tools)?);
        template
            .render_with_tools(&msgs, tools.as_ref(), add_generation_prompt)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The tokens of a chat prompt: message text never becomes control tokens.
    pub(crate) fn chat_prompt(
        &self,
        messages: Vec<PyMessage>,
        tools: Option<&str>,
    ) -> PyResult<Vec<TokenId>> {
        let template = self.template()?;
        let (msgs, tools) = with_tools(&template, self::messages(messages)?, &tools_value(tools)?);
        let m = self.loaded()?.model();
        template
            .encode_with_tools(&m.tokenizer, &msgs, tools.as_ref(), true)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// A reader of the answer to chat prompt `prompt`: `reasoning_format` `auto`/`deepseek`,
    /// `deepseek-legacy` or `none` (as llama-server's); `tools`: the functions offered, whose
    /// calls it reads (`None`: no calls are read).
    pub(crate) fn reader(
        &self,
        prompt: Vec<TokenId>,
        reasoning_format: &str,
        tools: Option<Vec<String>>,
    ) -> PyResult<AnswerReader> {
        let format = match reasoning_format {
            "auto" | "deepseek" => ReasoningFormat::Apart,
            "deepseek-legacy" => ReasoningFormat::ApartAndInContent,
            "none" => ReasoningFormat::None,
            other => {
                return Err(PyValueError::new_err(format!(
                    "reasoning_format={other:?}: use auto, deepseek, deepseek-legacy or none"
                )))
            }
        };
        let dialect = self.template()?.dialect();
        let tok = &self.loaded()?.model().tokenizer;
        let tail = tok.decode(&prompt[prompt.len().saturating_sub(8)..], true);
        let opened = dialect.opens_reasoning(&String::from_utf8_lossy(&tail));
        Ok(AnswerReader {
            channels: Channels::new(dialect, format, opened),
            calls: tools.as_ref().map(|_| CallStream::new(dialect)),
            names: tools.unwrap_or_default(),
        })
    }
}

/// A chat answer read as it comes: `push(text)` gives the `(reasoning, content)` it adds
/// (text that may start a marker or a call is held), `finish()` the rest and the calls.
#[pyclass(module = "pi2._native")]
pub struct AnswerReader {
    channels: Channels,
    calls: Option<CallStream>,
    names: Vec<String>,
}

#[pymethods]
impl AnswerReader {
    fn push(&mut self, text: &str) -> (String, String) {
        let (reasoning, content) = self.channels.feed(text);
        match &mut self.calls {
            Some(c) => (reasoning, c.push(&content)),
            None => (reasoning, content),
        }
    }

    /// `(reasoning, content, calls)`: what was held, and each call as `(name, arguments)`.
    fn finish(&mut self) -> (String, String, Vec<(String, String)>) {
        let (reasoning, content) = self.channels.finish();
        match self.calls.take() {
            Some(mut c) => {
                let mut shown = c.push(&content);
                let (rest, calls) = c.finish(&self.names);
                shown.push_str(&rest);
                (reasoning, shown, calls)
            }
            None => (reasoning, content, Vec::new()),
        }
    }
}

/// The grammar (Lark) a required call is held to: calls of `functions` (`(name, parameters
/// JSON text or None)`), one or with `parallel` several.
#[pyfunction]
pub fn calls_grammar(functions: Vec<(String, Option<String>)>, parallel: bool) -> PyResult<String> {
    let parsed: Vec<(String, Option<Value>)> = functions
        .into_iter()
        .map(|(name, params)| {
            let params = params
                .map(|p| serde_json::from_str(&p))
                .transpose()
                .map_err(|e| PyValueError::new_err(format!("{name}'s parameters: {e}")))?;
            Ok((name, params))
        })
        .collect::<PyResult<_>>()?;
    let refs: Vec<(&str, Option<&Value>)> = parsed
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_ref()))
        .collect();
    Ok(calls_lark(&refs, parallel))
}
