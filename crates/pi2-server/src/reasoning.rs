//! A thinking model's reasoning apart from its answer (llama-server's `reasoning_format`): text
//! between `<think>` and `</think>` (Qwen3, Qwen3.5, DeepSeek-R1) goes to `reasoning_content`,
//! the rest to `content`. A template that opens the think block itself (the prompt ends in
//! `<think>`) starts the answer inside it. Streamed text is split as it arrives; a piece that
//! may be the start of a tag waits for the next.

use crate::error::ApiError;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How the reasoning is given (llama-server's `reasoning_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// All in `content`, tags and all.
    None,
    /// `reasoning_content` apart, `content` without it (`deepseek`, `auto`: the default).
    DeepSeek,
    /// `reasoning_content` apart and the whole text, tags and all, in `content`.
    DeepSeekLegacy,
}

impl Format {
    pub fn parse(v: Option<&str>) -> Result<Format, ApiError> {
        match v {
            None | Some("auto") | Some("deepseek") => Ok(Format::DeepSeek),
            Some("none") => Ok(Format::None),
            Some("deepseek-legacy") => Ok(Format::DeepSeekLegacy),
            Some(other) => Err(ApiError::bad(format!(
                "`reasoning_format` is `auto`, `deepseek`, `deepseek-legacy` or `none`, not `{other}`"
            ))
            .param("reasoning_format")),
        }
    }
}

/// Whether a rendered prompt leaves the answer inside an open think block.
pub fn opens_thinking(prompt_tail: &str) -> bool {
    prompt_tail.trim_end().ends_with(OPEN)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// At the start: a think block may open.
    Start,
    Thinking,
    /// Just after the block: the blank lines before the answer are dropped.
    Closed,
    Answer,
}

/// Splits an answer's text, piece by piece, into reasoning and content.
#[derive(Clone, Debug)]
pub struct Split {
    format: Format,
    state: State,
    /// Text held back: it may be the start of a tag.
    pending: String,
}

impl Split {
    pub fn new(format: Format, forced_open: bool) -> Self {
        let state = match forced_open {
            true => State::Thinking,
            false => State::Start,
        };
        Split {
            format,
            state,
            pending: String::new(),
        }
    }

    /// The reasoning and the content `text` adds (either may be empty).
    pub fn feed(&mut self, text: &str) -> (String, String) {
        let whole = match self.format {
            Format::None => return (String::new(), text.to_string()),
            Format::DeepSeekLegacy => text.to_string(),
            Format::DeepSeek => String::new(),
        };
        self.pending.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.pending = rest.to_string();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(t) {
                        break; // Maybe a tag: wait.
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.pending.find(CLOSE) {
                    Some(at) => {
                        reasoning.push_str(&self.pending[..at]);
                        self.pending.drain(..at + CLOSE.len());
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, CLOSE);
                        let cut = self.pending.len() - keep;
                        reasoning.push_str(&self.pending[..cut]);
                        self.pending.drain(..cut);
                        break;
                    }
                },
                State::Closed => {
                    let t = self.pending.trim_start();
                    if t.is_empty() {
                        self.pending.clear();
                        break;
                    }
                    self.pending = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    content.push_str(&self.pending);
                    self.pending.clear();
                    break;
                }
            }
        }
        match self.format {
            Format::DeepSeekLegacy => (reasoning, whole),
            _ => (reasoning, content),
        }
    }

    /// What is held back at the end: a tag never finished is text (of the reasoning, inside
    /// an unclosed block).
    pub fn finish(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.pending);
        match (self.format, self.state) {
            (Format::DeepSeekLegacy | Format::None, _) => (String::new(), String::new()),
            (_, State::Thinking) => (rest, String::new()),
            _ => (String::new(), rest),
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
mod tests {
    use super::*;

    /// The same split whole and fed in pieces of every size.
    fn split(text: &str, format: Format, forced: bool) -> (Option<String>, String) {
        let whole = Split::new(format, forced).whole(text);
        for size in 1..text.len() {
            let mut s = Split::new(format, forced);
            let (mut r, mut c) = (String::new(), String::new());
            let bytes: Vec<char> = text.chars().collect();
            for piece in bytes.chunks(size) {
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

    #[test]
    fn thinking_goes_apart_from_the_answer() {
        let t = "<think>\nLet me see: 2 + 2.\n</think>\n\nIt is 4.";
        let r = split(t, Format::DeepSeek, false);
        assert_eq!(
            r,
            (Some("\nLet me see: 2 + 2.\n".into()), "It is 4.".into())
        );
        // A template that opened the block: the answer starts inside it.
        let r = split("Hmm.</think>Four.", Format::DeepSeek, true);
        assert_eq!(r, (Some("Hmm.".into()), "Four.".into()));
        // Kept whole in content too, or not split at all.
        let r = split(t, Format::DeepSeekLegacy, false);
        assert_eq!(r, (Some("\nLet me see: 2 + 2.\n".into()), t.into()));
        assert_eq!(split(t, Format::None, false), (None, t.into()));
    }

    #[test]
    fn answers_without_thinking_are_unchanged() {
        for t in ["It is 4.", "<thi", "a <think>b</think>", "  x", "é<"] {
            assert_eq!(split(t, Format::DeepSeek, false), (None, t.into()), "{t}");
        }
        // An unclosed block is all reasoning.
        assert_eq!(
            split("<think>still going </thi", Format::DeepSeek, false),
            (Some("still going </thi".into()), String::new())
        );
    }
}
