//! gpt-oss's harmony answers: after the prompt's `<|start|>assistant`, messages of the form
//! `[ to=R]<|channel|>C[ to=R][ <|constrain|>T]<|message|>BODY<|end|>`, the next one opening
//! with `<|start|>assistant`. Channel `analysis` is the reasoning, `final` (and a `commentary`
//! message to no one, a preamble) the content; a message to `functions.NAME` is a call, passed
//! on as a `<tool_call>` block of the content so calls have one reader ([`super::calls`]).

use super::{partial_tag, Parts};
use serde_json::json;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
/// A header longer than this is not one: the text is content.
const MAX_HEADER: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Before a message's `<|message|>`: its header is gathered in `pending`.
    Header,
    /// Inside a message's body.
    Body(Body),
    /// Text outside harmony's form: all content.
    Plain,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of the named function; its arguments are gathered in `call_args`.
    Call(String),
}

#[derive(Clone, Debug)]
pub struct HarmonySplit {
    state: State,
    pending: String,
    call_args: String,
}

impl HarmonySplit {
    pub fn new(opened: bool) -> Self {
        let state = match opened {
            true => State::Body(Body::Reasoning),
            false => State::Header,
        };
        HarmonySplit {
            state,
            pending: String::new(),
            call_args: String::new(),
        }
    }

    pub fn feed(&mut self, text: &str) -> Parts {
        self.pending.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match &self.state {
                State::Plain => {
                    content.push_str(&std::mem::take(&mut self.pending));
                    break;
                }
                State::Header => match self.pending.find(MESSAGE) {
                    Some(at) if at <= MAX_HEADER => {
                        let body = header_body(&self.pending[..at]);
                        self.pending.drain(..at + MESSAGE.len());
                        self.state = State::Body(body);
                    }
                    _ if self.pending.len() > MAX_HEADER || !may_open(&self.pending) => {
                        self.state = State::Plain;
                    }
                    _ => break,
                },
                State::Body(body) => {
                    let body = body.clone();
                    let (text, ended) = self.take_body();
                    match &body {
                        Body::Reasoning => reasoning.push_str(&text),
                        Body::Content => content.push_str(&text),
                        Body::Call(_) => self.call_args.push_str(&text),
                    }
                    if !ended {
                        break;
                    }
                    if let Body::Call(name) = body {
                        content.push_str(&self.call_block(&name));
                    }
                    self.state = State::Header;
                }
            }
        }
        (reasoning, content)
    }

    /// The body text that can be passed on, and whether the body ended (at `<|end|>`, or at a
    /// `<|start|>` with no `<|end|>` before it).
    fn take_body(&mut self) -> (String, bool) {
        let end = [END, START]
            .iter()
            .filter_map(|m| self.pending.find(m).map(|at| (at, m.len())))
            .min();
        match end {
            Some((at, len)) => {
                let text = self.pending[..at].to_string();
                // `<|start|>` begins the next header; `<|end|>` is dropped.
                let drop = if len == END.len() && self.pending[at..].starts_with(END) {
                    len
                } else {
                    0
                };
                self.pending.drain(..at + drop);
                (text, true)
            }
            None => {
                let keep = partial_tag(&self.pending, END).max(partial_tag(&self.pending, START));
                let cut = self.pending.len() - keep;
                let text = self.pending[..cut].to_string();
                self.pending.drain(..cut);
                (text, false)
            }
        }
    }

    /// A finished call as the content's `<tool_call>` block; arguments that are not JSON (an
    /// answer cut short) stay text.
    fn call_block(&mut self, name: &str) -> String {
        let args = std::mem::take(&mut self.call_args);
        match serde_json::from_str::<serde_json::Value>(args.trim()) {
            Ok(value) => {
                let call = json!({"name": name, "arguments": value});
                format!("<tool_call>\n{call}\n</tool_call>")
            }
            Err(_) => args,
        }
    }

    pub fn finish(&mut self) -> Parts {
        let rest = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Plain) {
            State::Body(Body::Reasoning) => (rest, String::new()),
            State::Body(Body::Call(name)) => {
                self.call_args.push_str(&rest);
                (String::new(), self.call_block(&name))
            }
            _ => (String::new(), rest),
        }
    }
}

/// Whether `text` may still become a message header (a `<|start|>`, `<|channel|>` or ` to=`
/// opening, whole or begun).
fn may_open(text: &str) -> bool {
    let t = text.trim_start();
    [START, CHANNEL, "to="]
        .iter()
        .any(|m| t.starts_with(m) || m.starts_with(t))
}

/// What a header (`<|start|>assistant<|channel|>final`, `<|channel|>commentary
/// to=functions.f <|constrain|>json`, ...) makes its body.
fn header_body(header: &str) -> Body {
    let channel = header
        .rsplit(CHANNEL)
        .next()
        .filter(|_| header.contains(CHANNEL))
        .and_then(|c| c.split(|ch: char| ch.is_whitespace() || ch == '<').next())
        .unwrap_or("");
    let recipient = header
        .split("to=")
        .skip(1)
        .filter_map(|r| r.split(|ch: char| ch.is_whitespace() || ch == '<').next())
        .find(|r| !r.is_empty() && *r != "assistant");
    match (recipient, channel) {
        (Some(r), _) => Body::Call(r.strip_prefix("functions.").unwrap_or(r).to_string()),
        (None, "analysis") => Body::Reasoning,
        (None, _) => Body::Content,
    }
}

#[cfg(test)]
mod tests {
    use crate::answer::calls::parse_calls;
    use crate::answer::test_util::split;
    use crate::answer::{Dialect, ReasoningFormat};

    const APART: ReasoningFormat = ReasoningFormat::Apart;

    fn harmony(text: &str, opened: bool) -> (Option<String>, String) {
        split(text, Dialect::Harmony, APART, opened)
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let t = "<|channel|>analysis<|message|>2 + 2 is 4.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.";
        assert_eq!(
            harmony(t, false),
            (Some("2 + 2 is 4.".into()), "It is 4.".into())
        );
        // A prompt that opened the analysis; a preamble on commentary is content.
        let t = "Thinking.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.";
        assert_eq!(
            harmony(t, true),
            (Some("Thinking.".into()), "Checking.Done.".into())
        );
        // Text outside the form stays content; the whole text with the legacy format.
        assert_eq!(harmony("Just text.", false), (None, "Just text.".into()));
        let t = "<|channel|>analysis<|message|>Hm.<|end|>";
        assert_eq!(
            split(
                t,
                Dialect::Harmony,
                ReasoningFormat::ApartAndInContent,
                false
            ),
            (Some("Hm.".into()), t.into())
        );
    }

    #[test]
    fn a_message_to_a_function_is_a_call() {
        let names = ["get_weather".to_string()];
        for t in [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
        ] {
            let (reasoning, content) = harmony(t, false);
            assert_eq!(reasoning.as_deref(), Some("Need weather."));
            let (rest, calls) = parse_calls(&content, &names, Dialect::Harmony);
            assert_eq!(rest, "");
            assert_eq!(calls, vec![("get_weather".into(), "{\"city\":\"Paris\"}".into())]);
        }
        // Cut short: the arguments stay text.
        let t = "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Par";
        assert_eq!(harmony(t, false), (None, "{\"city\": \"Par".into()));
    }
}
