//! Chat templates: the model's `tokenizer.chat_template` (Jinja) rendered with minijinja.

use crate::error::{ModelError, Result};
use crate::tokenizer::{TokenId, Tokenizer};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

/// Stands for a message's text when finding the template's markup: a character no template
/// writes and no trim removes (U+2063, invisible separator).
const MARK: &str = "\u{2063}pi2";

/// One chat message: its role and text, and for tool use the calls an assistant turn made
/// or the call a `tool` turn answers (as OpenAI and transformers' templates name them).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a `tool` turn answers for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, given back (Qwen3's template shows it for the turns after
    /// the last user message; gpt-oss's reads it as `thinking`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// gpt-oss's name for the reasoning: set by the render for harmony templates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) thinking: Option<String>,
}

/// A function call an assistant turn made.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function's name and its arguments (a JSON object, as templates expect them).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
            thinking: None,
        }
    }
}

/// Gemma's turns, used when a model without a template has Gemma's turn tokens: a system
/// message goes before the first user turn, the assistant is `model`, texts are trimmed.
pub const GEMMA: &str = "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}{% for message in turns %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// ChatML, used when a model carries no template and lacks Gemma's turn tokens (llama.cpp
/// uses ChatML for every model without a template).
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The `length` filter, with Jinja2's 0 for an undefined value.
fn length(v: minijinja::Value) -> std::result::Result<usize, Error> {
    if v.is_undefined() {
        return Ok(0);
    }
    v.len().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot calculate length of value of type {}", v.kind()),
        )
    })
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// Drop a leading `bos_token` from the output (see [`ChatTemplate::strip_leading_bos`]).
    strip_bos: bool,
    /// The template reads a `tools` variable (it can show the model functions to call).
    reads_tools: bool,
    /// How the answers it asks for are written.
    dialect: crate::answer::Dialect,
    /// Variables the caller set ([`ChatTemplate::with_variables`]): today's date variables
    /// are not put over them.
    given: Vec<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

/// Variables every render sets itself: a caller's own variables may not take their names.
const RENDER_VARIABLES: [&str; 5] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "tools",
];

impl ChatTemplate {
    /// This template with `vars` set for every render (llama-server's `chat_template_kwargs`,
    /// e.g. Qwen3's `enable_thinking`). A name the render sets itself is refused.
    pub fn with_variables(
        &self,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ChatTemplate> {
        let mut t = self.clone();
        for (name, v) in vars {
            if RENDER_VARIABLES.contains(&name.as_str()) {
                return Err(ModelError::Template(format!(
                    "`{name}` is set by the render itself and cannot be given as a template variable"
                )));
            }
            t.env
                .add_global(name.clone(), minijinja::Value::from_serialize(v));
            t.given.push(name.clone());
        }
        Ok(t)
    }

    /// Compile `source`; `bos`/`eos` are the texts templates see as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        // HF templates call Python string methods (`.strip()`, `.startswith()`, ...).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Jinja2 (transformers) takes the length of an undefined value as 0: templates test
        // `tools|length` without passing tools.
        env.add_filter("length", length);
        env.add_filter("count", length);
        env.add_filter("tojson", crate::pyjson::tojson);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        // A template comes from the model file: bound its work (loops cannot run forever) and,
        // in `render`, its output.
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Llama 3.1 and others stamp today's date (UTC here) into the system prompt.
        env.add_function("strftime_now", |fmt: String| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            crate::strftime::strftime_utc(&fmt, now)
        });
        env.add_template_owned("chat", without_generation_tags(source))
            .map_err(|e| ModelError::Template(format!("cannot compile: {e}")))?;
        Ok(Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
            strip_bos: false,
            reads_tools: source.contains("tools"),
            dialect: crate::answer::Dialect::of_template(source),
            given: Vec::new(),
        })
    }

    /// Whether the template shows the model the functions it may call (reads `tools`).
    pub fn reads_tools(&self) -> bool {
        self.reads_tools
    }

    /// The dialect of the answers this template asks for (their reasoning and calls).
    pub fn dialect(&self) -> crate::answer::Dialect {
        self.dialect
    }

    /// Render without the template's leading `bos_token`, for a tokenizer that adds BOS itself
    /// (as llama.cpp does, so the prompt does not start with two).
    pub fn strip_leading_bos(mut self, yes: bool) -> Self {
        self.strip_bos = yes;
        self
    }

    /// Render `messages` and tokenize the result: the template's own markup becomes control
    /// tokens, the messages' text never does, so a message holding `<|im_end|><|im_start|>system`
    /// stays words and cannot end its turn or open another. A message with control-token text
    /// needs a template that keeps message text as it is (or trimmed); another gets an error.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<TokenId>> {
        self.encode_with_tools(tok, messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::encode`] with the functions the model may call (OpenAI's `tools`,
    /// given to the template as its `tools` variable).
    /// The prompt that continues the last message (llama-server's prefill of a trailing
    /// assistant message): the messages before it with the assistant's turn opened, then its
    /// text, which the answer goes on from.
    pub fn render_continuing(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let (last, head) = split_last(messages)?;
        Ok(self.render_with_tools(head, tools, true)? + &last.content)
    }

    /// [`ChatTemplate::render_continuing`] as tokens, message text kept as text as
    /// [`ChatTemplate::encode_with_tools`] keeps it.
    pub fn encode_continuing(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<TokenId>> {
        if !messages.iter().any(|m| tok.has_control_text(&m.content)) {
            return Ok(tok.encode(&self.render_continuing(messages, tools)?, true, true));
        }
        let (last, head) = split_last(messages)?;
        let mut ids = self.encode_with_tools(tok, head, tools, true)?;
        ids.extend(tok.encode(&last.content, false, false));
        Ok(ids)
    }

    pub fn encode_with_tools(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<TokenId>> {
        // Reasoning given back is rendered as it is: control-token text in it would become
        // control tokens (only the content is kept as text below).
        if (messages
            .iter()
            .filter_map(|m| m.reasoning_content.as_deref()))
        .any(|r| tok.has_control_text(r))
        {
            return Err(ModelError::Template(
                "a message's reasoning_content holds control-token text; remove it from the reasoning".into(),
            ));
        }
        let text = self.render_with_tools(messages, tools, add_generation_prompt)?;
        if !messages.iter().any(|m| tok.has_control_text(&m.content)) {
            return Ok(tok.encode(&text, true, true));
        }
        // Render again with a mark for each message's text: what lies between the marks is
        // markup, which the real text must repeat around each message's text.
        let marked: Vec<Message> = (0..messages.len())
            .map(|i| Message {
                content: format!("{MARK}{i}{MARK}"),
                ..messages[i].clone()
            })
            .collect();
        let skeleton = self.render_with_tools(&marked, tools, add_generation_prompt)?;
        let changed = || {
            ModelError::Template(
                "the chat template changes message text, so control-token text inside a message cannot be kept as text; remove it from the message".into(),
            )
        };
        let mut spans = Vec::new();
        let (mut at, mut rest) = (0, skeleton.as_str());
        for (i, m) in messages.iter().enumerate() {
            let mark = format!("{MARK}{i}{MARK}");
            let Some(found) = rest.find(&mark) else {
                continue; // the template leaves this message out
            };
            let markup = &rest[..found];
            if !text[at..].starts_with(markup) {
                return Err(changed());
            }
            at += markup.len();
            rest = &rest[found + mark.len()..];
            let next_markup = &rest[..rest.find(MARK).unwrap_or(rest.len())];
            let content = [m.content.as_str(), m.content.trim()]
                .into_iter()
                .find(|c| {
                    text[at..].starts_with(c) && text[at + c.len()..].starts_with(next_markup)
                })
                .ok_or_else(changed)?;
            spans.push(at..at + content.len());
            at += content.len();
        }
        if text[at..] != *rest {
            return Err(changed());
        }
        Ok(tok.encode_marked(&text, true, &spans))
    }

    /// Render `messages`, ending with the assistant prompt when `add_generation_prompt`.
    ///
    /// On Linux and Android the template runs in a forked child under a memory cap
    /// ([`TEMPLATE_MEMORY`] plus 16 bytes per byte of messages) and a deadline
    /// ([`TEMPLATE_DEADLINE`]): a template that would exhaust memory or time ends in an error
    /// naming it, never in this process running out of either.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with the template's `tools` variable set.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        // gpt-oss's template reads an assistant turn's reasoning as `thinking` (llama.cpp's
        // adjustment for it).
        let harmony: Vec<Message>;
        let messages = match self.dialect {
            crate::answer::Dialect::Harmony => {
                harmony = (messages.iter())
                    .map(|m| Message {
                        thinking: m.reasoning_content.clone(),
                        ..m.clone()
                    })
                    .collect();
                &harmony[..]
            }
            _ => messages,
        };
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            self.render_isolated(messages, tools, add_generation_prompt)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            self.render_here(messages, tools, add_generation_prompt)
        }
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn render_isolated(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        use crate::isolate::{run, Failure};
        let input = input_bytes(messages, tools);
        // A tag byte, then the text or the error's own words.
        let work = || match self.render_here(messages, tools, add_generation_prompt) {
            Ok(text) => [&[0u8][..], text.as_bytes()].concat(),
            Err(ModelError::Template(why)) => [&[1u8][..], why.as_bytes()].concat(),
            Err(e) => [&[1u8][..], e.to_string().as_bytes()].concat(),
        };
        let memory = TEMPLATE_MEMORY.saturating_add(16 * input as u64);
        let max = 1 + render_limit(input).max(4096);
        let bytes = run(work, memory, TEMPLATE_DEADLINE, max).map_err(|f| {
            ModelError::Template(match f {
                Failure::Limits => format!(
                    "the model's chat template needed more than {} MiB or {} s to render (a template that builds huge strings or loops); pass the prompt already formatted, without --chat",
                    memory >> 20,
                    TEMPLATE_DEADLINE.as_secs()
                ),
                Failure::Panicked => "rendering the chat template failed unexpectedly (a bug in pi2; please report it with the model file)".into(),
                Failure::System(e) => format!("cannot render the chat template: {e}"),
            })
        })?;
        let text = String::from_utf8_lossy(&bytes[1.min(bytes.len())..]).into_owned();
        match bytes.first() {
            Some(0) => Ok(text),
            Some(1) => Err(ModelError::Template(text)),
            _ => Err(ModelError::Template(
                "the template renderer returned nothing".into(),
            )),
        }
    }

    /// Today's date as llama.cpp gives every template (UTC here): `date_string` ("28 Nov
    /// 2026", which Llama 3.x's templates print in the system prompt) and `datetime` ("Nov 28
    /// 2026"), unless the caller set them.
    fn today(&self) -> minijinja::Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let vars: std::collections::BTreeMap<&str, String> =
            [("date_string", "%d %b %Y"), ("datetime", "%b %d %Y")]
                .into_iter()
                .filter(|(name, _)| !self.given.iter().any(|g| g == name))
                .map(|(name, fmt)| (name, crate::strftime::strftime_utc(fmt, now)))
                .collect();
        minijinja::Value::from_serialize(vars)
    }

    /// Render in this process (bounded in steps and output, not in memory).
    fn render_here(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ModelError::Template(e.to_string()))?;
        let input = input_bytes(messages, tools);
        let mut out = Capped {
            bytes: Vec::new(),
            limit: render_limit(input),
        };
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
            tools => tools.map_or(minijinja::Value::UNDEFINED, minijinja::Value::from_serialize),
            ..self.today()
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => {
                let text = String::from_utf8(out.bytes)
                    .map_err(|_| ModelError::Template("rendered text is not UTF-8".into()))?;
                Ok(match text.strip_prefix(self.bos.as_str()) {
                    Some(rest) if self.strip_bos && !self.bos.is_empty() => rest.to_string(),
                    _ => text,
                })
            }
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ModelError::Template(format!(
                "the model's chat template ran over {TEMPLATE_FUEL} steps (it may loop forever); pass the prompt already formatted, without --chat"
            ))),
            Err(_) if out.bytes.len() >= out.limit => Err(ModelError::Template(format!(
                "the model's chat template wrote over {} bytes for {input} bytes of messages; pass the prompt already formatted, without --chat",
                out.limit
            ))),
            Err(e) => Err(ModelError::Template(format!("cannot render: {e}"))),
        }
    }
}

/// `source` without `{% generation %}` / `{% endgeneration %}` (HF's markers of the assistant's
/// text for training masks; they render nothing, and minijinja does not know the tag).
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` after the opening `{%` (in `{%}` they overlap: not a tag).
        let Some(len) = rest[start + 2..].find("%}").map(|l| l + 2) else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner =
            tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner == "generation" || inner == "endgeneration" {
            // A comment keeps the tag's whitespace control.
            let lead = if tag.starts_with("{%-") { "-" } else { "" };
            let trail = if tag.ends_with("-%}") { "-" } else { "" };
            out.push_str(&format!("{{#{lead} {trail}#}}"));
        } else {
            out.push_str(tag);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

fn input_bytes(messages: &[Message], tools: Option<&serde_json::Value>) -> usize {
    let calls = |m: &Message| -> usize {
        m.tool_calls
            .iter()
            .map(|c| c.function.name.len() + c.function.arguments.to_string().len() + 32)
            .sum()
    };
    let tools = tools.map_or(0, |t| t.to_string().len());
    messages
        .iter()
        .map(|m| {
            let reasoning = m.reasoning_content.as_ref().map_or(0, String::len);
            m.role.len() + m.content.len() + reasoning + calls(m)
        })
        .sum::<usize>()
        + tools
}

/// Rendered bytes allowed for `input` bytes of messages.
fn render_limit(input: usize) -> usize {
    MIN_RENDER_LIMIT.saturating_add(input.saturating_mul(8))
}

/// Template steps (minijinja fuel) one render may take: real templates need a few hundred per
/// message.
pub const TEMPLATE_FUEL: u64 = 5_000_000;
/// Memory a render may take beyond 16 bytes per byte of messages (real templates need well
/// under one MiB; this also stays inside the room an offload budget keeps for later
/// allocations).
pub const TEMPLATE_MEMORY: u64 = 16 << 20;
/// Time a render may take (real ones take milliseconds).
pub const TEMPLATE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// Rendered bytes allowed beyond eight times the messages' own.
const MIN_RENDER_LIMIT: usize = 1 << 20;

/// A writer that refuses to grow past `limit` bytes.
struct Capped {
    bytes: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.bytes
                .extend_from_slice(&buf[..self.limit - self.bytes.len()]);
            return Err(std::io::Error::other("rendered text too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The last message and those before it.
fn split_last(messages: &[Message]) -> Result<(&Message, &[Message])> {
    messages
        .split_last()
        .ok_or_else(|| ModelError::Template("no message to continue".into()))
}

#[cfg(test)]
mod tests {

    #[test]
    fn template_variables_reach_the_template_and_reserved_names_are_refused() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ messages[0]['content'] }}",
            "",
            "",
        )
        .unwrap();
        let msgs = [Message::new("user", "hi")];
        assert_eq!(t.render(&msgs, true).unwrap(), "hi");
        let vars = serde_json::json!({"enable_thinking": false});
        let off = t.with_variables(vars.as_object().unwrap()).unwrap();
        assert_eq!(off.render(&msgs, true).unwrap(), "/no_think hi");
        // The original is unchanged.
        assert_eq!(t.render(&msgs, true).unwrap(), "hi");
        let bad = serde_json::json!({"messages": []});
        let e = t.with_variables(bad.as_object().unwrap()).unwrap_err();
        assert!(
            e.to_string().contains("`messages` is set by the render"),
            "{e}"
        );
    }

    use super::*;

    #[test]
    fn hostile_templates_stop_with_a_clear_error() {
        let msgs = [Message::new("user", "hi")];
        // Loops that would never end in practice.
        let t = ChatTemplate::new(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let err = t.render(&msgs, true).unwrap_err().to_string();
        assert!(err.contains("steps"), "{err}");
        // Output blow-up.
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let err = t.render(&msgs, true).unwrap_err().to_string();
        assert!(err.contains("bytes"), "{err}");
        // Recursion.
        let t = ChatTemplate::new(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "",
            "",
        )
        .unwrap();
        assert!(t.render(&msgs, true).is_err());
    }

    /// Strings that double in a few steps, or one step that asks for a huge string, end in an
    /// error naming the template's memory (the renderer runs capped in a child process).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn templates_that_exhaust_memory_or_time_end_in_an_error() {
        let msgs = [Message::new("user", "hi")];
        let doubling = format!(
            "{{% set s = 'xy' %}}{}{{{{ s|length }}}}",
            "{% set s = s ~ s %}".repeat(40)
        );
        let namespaced = "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}";
        let wide = "{{ 'x'|indent(100000000000, true) }}";
        let replaced = format!(
            "{{% set s = 'aaaaaaaaaaaaaaaa' %}}{}{{{{ s|length }}}}",
            "{% set s = s|replace('a', s) %}".repeat(5)
        );
        let t0 = std::time::Instant::now();
        for src in [&doubling[..], namespaced, wide, &replaced] {
            let t = ChatTemplate::new(src, "", "").unwrap();
            let err = t.render(&msgs, true).unwrap_err().to_string();
            assert!(
                err.contains("needed more than 16 MiB") || err.contains("bytes"),
                "{src}: {err}"
            );
        }
        assert!(t0.elapsed() < TEMPLATE_DEADLINE);
        // Normal renders are unchanged and repeat.
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        for _ in 0..3 {
            let s = t.render(&msgs, true).unwrap();
            assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        }
    }

    #[test]
    fn loop_controls_dates_and_generation_tags() {
        let msgs = [
            Message::new("system", "s"),
            Message::new("user", "a"),
            Message::new("assistant", "b"),
        ];
        // break / continue.
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}{% if m.role == 'user' %}{% break %}{% endif %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&msgs, false).unwrap(), "a");
        // strftime_now gives today's date in the asked format.
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        let year: i32 = t.render(&msgs, false).unwrap().parse().unwrap();
        assert!((2024..2200).contains(&year));
        // Today's date as llama.cpp gives every template (Llama 3.x prints `date_string`),
        // unless the caller set it.
        let t = ChatTemplate::new("{{ date_string }}|{{ datetime }}", "", "").unwrap();
        let today = t.render(&msgs, false).unwrap();
        let (date, datetime) = today.split_once('|').unwrap();
        assert_eq!(date.split(' ').count(), 3, "{today}");
        assert_eq!(date.rsplit(' ').next(), datetime.rsplit(' ').next());
        let mut vars = serde_json::Map::new();
        vars.insert("date_string".into(), "26 Jul 2024".into());
        let fixed = t.with_variables(&vars).unwrap();
        assert!(fixed
            .render(&msgs, false)
            .unwrap()
            .starts_with("26 Jul 2024|"));
        // An assistant turn's reasoning given back: as `reasoning_content`, and for a harmony
        // template (gpt-oss) as `thinking` too.
        let mut turn = Message::new("assistant", "4");
        turn.reasoning_content = Some("2 + 2".into());
        let show = "{% for m in messages %}{{ m.reasoning_content | default('-') }}/{{ m.thinking | default('-') }};{% endfor %}";
        let t = ChatTemplate::new(show, "", "").unwrap();
        assert_eq!(t.render(&[turn.clone()], false).unwrap(), "2 + 2/-;");
        let harmony = format!("{show}{{# <|channel|>final<|message|> #}}");
        let t = ChatTemplate::new(&harmony, "", "").unwrap();
        assert_eq!(t.render(&[turn], false).unwrap(), "2 + 2/2 + 2;");
        // {% generation %} markers render nothing, with whitespace control too.
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'assistant' %}{%- generation -%}[{{ m.content }}]{% endgeneration %}{% endif %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&msgs, false).unwrap(), "[b]");
        // `{%}` is no tag (found by the template fuzz target): an error, not a panic.
        assert!(ChatTemplate::new("a{%}% endif %}", "", "").is_err());
        // Their whitespace control still applies.
        let t = ChatTemplate::new("x  {%- generation -%}  y{% endgeneration %}", "", "").unwrap();
        assert_eq!(t.render(&msgs, false).unwrap(), "xy");
    }

    #[test]
    fn gemma_turns_render() {
        let t = ChatTemplate::new(GEMMA, "<bos>", "<eos>").unwrap();
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", " hi "),
            Message::new("assistant", "Hello."),
            Message::new("user", "Bye"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let t = t.strip_leading_bos(true);
        let s = t.render(&[Message::new("user", "hi")], true).unwrap();
        assert_eq!(
            s,
            "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_renders() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let s = t.render(&[Message::new("user", "hi")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_methods_and_exceptions() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0]['content'].strip() }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  x ")], false).unwrap(),
            "x"
        );
        let err = t.render(&[Message::new("system", "x")], false).unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
    }
}
