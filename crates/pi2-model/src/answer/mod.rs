//! A chat answer read back as its parts: the reasoning, the content and the function calls,
//! in the dialect its template taught the model. Three dialects cover the families' templates:
//!
//! - [`Dialect::ThinkTags`]: reasoning between `<think>` and `</think>` (Qwen3, Qwen3.5,
//!   DeepSeek-R1, SmolLM3), calls as `<tool_call>` blocks, call objects or Mistral's
//!   `[TOOL_CALLS]` (see [`calls`]); every template not named below.
//! - [`Dialect::Harmony`] (gpt-oss): messages on channels, `<|channel|>analysis<|message|>..`
//!   the reasoning, `final` the answer, and a message addressed `to=functions.NAME` a call.
//! - [`Dialect::Gemma4`]: reasoning in `<|channel>thought .. <channel|>`, calls as
//!   `<|tool_call>call:NAME{key:<|"|>text<|"|>,..}<tool_call|>`.
//!
//! A dialect's markers are control tokens in some vocabularies: [`Dialect::shown_tokens`] are
//! the ones a generation must render as text for the answer to be parsed (llama.cpp's
//! "preserved tokens"). Streamed answers are split as they arrive, holding back what may be
//! the start of a marker or a call; whole and streamed give the same parts.

pub mod calls;
mod harmony;
mod think;

pub use calls::{calls_json, Call, CallStream};
use harmony::HarmonySplit;
use think::TagSplit;

/// The answer format a template teaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    ThinkTags,
    Harmony,
    Gemma4,
}

impl Dialect {
    /// The dialect of a chat template's source.
    pub fn of_template(source: &str) -> Dialect {
        if source.contains("<|channel|>") && source.contains("<|message|>") {
            Dialect::Harmony
        } else if source.contains("<|tool_call>") || source.contains("<|channel>") {
            Dialect::Gemma4
        } else {
            Dialect::ThinkTags
        }
    }

    /// Token texts the answer must show for its parts to be read (where the vocabulary has
    /// them as control tokens, which are otherwise rendered as nothing).
    pub fn shown_tokens(self) -> &'static [&'static str] {
        match self {
            Dialect::ThinkTags => &[],
            Dialect::Harmony => &[
                "<|channel|>",
                "<|message|>",
                "<|start|>",
                "<|end|>",
                "<|constrain|>",
            ],
            Dialect::Gemma4 => &[
                "<|channel>",
                "<channel|>",
                "<|tool_call>",
                "<tool_call|>",
                "<|\"|>",
            ],
        }
    }

    /// The ids of [`Dialect::shown_tokens`] in `tok`'s vocabulary.
    pub fn shown_ids(self, tok: &crate::Tokenizer) -> Vec<crate::TokenId> {
        self.shown_tokens()
            .iter()
            .filter_map(|t| tok.token_id(t))
            .collect()
    }

    /// Whether a prompt ending in `prompt_tail` leaves the answer inside an open reasoning
    /// block (a template that opens `<think>` itself).
    pub fn opens_reasoning(self, prompt_tail: &str) -> bool {
        let tail = prompt_tail.trim_end();
        match self {
            Dialect::ThinkTags => tail.ends_with(think::THINK.open),
            Dialect::Gemma4 => tail.ends_with(think::GEMMA4.open),
            Dialect::Harmony => tail.ends_with("<|channel|>analysis<|message|>"),
        }
    }
}

/// How the reasoning is given (llama-server's `reasoning_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// All in the content, markers and all.
    None,
    /// The reasoning apart, the content without it (`deepseek`, `auto`: the default).
    Apart,
    /// The reasoning apart and the whole text, markers and all, in the content
    /// (`deepseek-legacy`).
    ApartAndInContent,
}

/// Splits an answer's text, piece by piece, into reasoning and content (content that may hold
/// calls: see [`CallStream`]).
#[derive(Clone, Debug)]
pub struct Channels {
    format: ReasoningFormat,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Tags(TagSplit),
    Harmony(HarmonySplit),
}

/// Parts of an answer's text: (reasoning, content).
pub type Parts = (String, String);

impl Channels {
    /// A splitter for an answer in `dialect`; `opened`: the prompt left the answer inside the
    /// reasoning block ([`Dialect::opens_reasoning`]).
    pub fn new(dialect: Dialect, format: ReasoningFormat, opened: bool) -> Self {
        let kind = match dialect {
            Dialect::ThinkTags => Kind::Tags(TagSplit::new(think::THINK, opened)),
            Dialect::Gemma4 => Kind::Tags(TagSplit::new(think::GEMMA4, opened)),
            Dialect::Harmony => Kind::Harmony(HarmonySplit::new(opened)),
        };
        Channels { format, kind }
    }

    /// The reasoning and the content `text` adds (either may be empty).
    pub fn feed(&mut self, text: &str) -> Parts {
        if self.format == ReasoningFormat::None {
            return (String::new(), text.to_string());
        }
        let (r, c) = match &mut self.kind {
            Kind::Tags(s) => s.feed(text),
            Kind::Harmony(s) => s.feed(text),
        };
        self.shape(text, r, c)
    }

    /// What is held back at the end: a marker never finished is text (of the reasoning,
    /// inside an unclosed block).
    pub fn finish(&mut self) -> Parts {
        if self.format == ReasoningFormat::None {
            return (String::new(), String::new());
        }
        let (r, c) = match &mut self.kind {
            Kind::Tags(s) => s.finish(),
            Kind::Harmony(s) => s.finish(),
        };
        self.shape("", r, c)
    }

    fn shape(&self, text: &str, reasoning: String, content: String) -> Parts {
        match self.format {
            ReasoningFormat::ApartAndInContent => (reasoning, text.to_string()),
            _ => (reasoning, content),
        }
    }

    /// A whole answer's reasoning (`None` when it has none) and content.
    pub fn whole(mut self, text: &str) -> (Option<String>, String) {
        let (mut r, mut c) = self.feed(text);
        let (r2, c2) = self.finish();
        r.push_str(&r2);
        c.push_str(&c2);
        ((!r.is_empty()).then_some(r), c)
    }
}

/// Bytes at the end of `s` that begin `tag` (so may become it).
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    /// The same split whole and fed in pieces of every size.
    pub fn split(
        text: &str,
        dialect: Dialect,
        format: ReasoningFormat,
        opened: bool,
    ) -> (Option<String>, String) {
        let whole = Channels::new(dialect, format, opened).whole(text);
        let chars: Vec<char> = text.chars().collect();
        for size in 1..chars.len() {
            let mut s = Channels::new(dialect, format, opened);
            let (mut r, mut c) = (String::new(), String::new());
            for piece in chars.chunks(size) {
                let (a, b) = s.feed(&piece.iter().collect::<String>());
                r.push_str(&a);
                c.push_str(&b);
            }
            let (a, b) = s.finish();
            r.push_str(&a);
            c.push_str(&b);
            assert_eq!(((!r.is_empty()).then_some(r), c), whole, "pieces of {size}");
        }
        whole
    }
}
