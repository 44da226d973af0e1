//! Reasoning between two markers, before the answer: `<think>` .. `</think>` (Qwen3, Qwen3.5,
//! DeepSeek-R1) or Gemma 4's `<|channel>thought` .. `<channel|>`. A template that opens the
//! block itself (the prompt ends in the opening marker) starts the answer inside it. Streamed
//! text is split as it arrives; a piece that may be the start of a marker waits for the next.

use super::{partial_tag, Parts};

/// The markers around the reasoning.
#[derive(Clone, Copy, Debug)]
pub struct Tags {
    pub open: &'static str,
    pub close: &'static str,
    /// The blank space right after `open` is markup, not reasoning (Gemma 4's).
    pub space_after_open: bool,
}

pub const THINK: Tags = Tags {
    open: "<think>",
    close: "</think>",
    space_after_open: false,
};

pub const GEMMA4: Tags = Tags {
    open: "<|channel>thought",
    close: "<channel|>",
    space_after_open: true,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// At the start: a think block may open.
    Start,
    /// Just after the opening marker.
    Opened,
    Thinking,
    /// Just after the block: the blank lines before the answer are dropped.
    Closed,
    Answer,
}

/// Splits an answer's text, piece by piece, into reasoning and content.
#[derive(Clone, Debug)]
pub struct TagSplit {
    tags: Tags,
    state: State,
    /// Text held back: it may be the start of a tag.
    pending: String,
}

impl TagSplit {
    pub fn new(tags: Tags, forced_open: bool) -> Self {
        let state = match forced_open {
            true => State::Opened,
            false => State::Start,
        };
        TagSplit {
            tags,
            state,
            pending: String::new(),
        }
    }

    /// The reasoning and the content `text` adds (either may be empty).
    pub fn feed(&mut self, text: &str) -> Parts {
        let Tags {
            open,
            close,
            space_after_open,
        } = self.tags;
        self.pending.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(open) {
                        self.pending = rest.to_string();
                        self.state = State::Opened;
                    } else if open.starts_with(t) {
                        break; // Maybe a marker: wait.
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Opened if space_after_open => {
                    let t = self.pending.trim_start();
                    if t.is_empty() {
                        self.pending.clear();
                        break;
                    }
                    self.pending = t.to_string();
                    self.state = State::Thinking;
                }
                State::Opened => self.state = State::Thinking,
                State::Thinking => match self.pending.find(close) {
                    Some(at) => {
                        reasoning.push_str(&self.pending[..at]);
                        self.pending.drain(..at + close.len());
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, close);
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
        (reasoning, content)
    }

    /// What is held back at the end: a marker never finished is text (of the reasoning,
    /// inside an unclosed block).
    pub fn finish(&mut self) -> Parts {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Opened | State::Thinking => (rest, String::new()),
            _ => (String::new(), rest),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::answer::test_util::split;
    use crate::answer::{Dialect, ReasoningFormat};

    const THINK: Dialect = Dialect::ThinkTags;

    #[test]
    fn thinking_goes_apart_from_the_answer() {
        let t = "<think>\nLet me see: 2 + 2.\n</think>\n\nIt is 4.";
        let r = split(t, THINK, ReasoningFormat::Apart, false);
        assert_eq!(
            r,
            (Some("\nLet me see: 2 + 2.\n".into()), "It is 4.".into())
        );
        // A template that opened the block: the answer starts inside it.
        let r = split("Hmm.</think>Four.", THINK, ReasoningFormat::Apart, true);
        assert_eq!(r, (Some("Hmm.".into()), "Four.".into()));
        // Kept whole in content too, or not split at all.
        let r = split(t, THINK, ReasoningFormat::ApartAndInContent, false);
        assert_eq!(r, (Some("\nLet me see: 2 + 2.\n".into()), t.into()));
        assert_eq!(
            split(t, THINK, ReasoningFormat::None, false),
            (None, t.into())
        );
    }

    #[test]
    fn answers_without_thinking_are_unchanged() {
        for t in ["It is 4.", "<thi", "a <think>b</think>", "  x", "é<"] {
            let r = split(t, THINK, ReasoningFormat::Apart, false);
            assert_eq!(r, (None, t.into()), "{t}");
        }
        // An unclosed block is all reasoning.
        assert_eq!(
            split(
                "<think>still going </thi",
                THINK,
                ReasoningFormat::Apart,
                false
            ),
            (Some("still going </thi".into()), String::new())
        );
    }

    #[test]
    fn gemma4_thoughts_are_a_channel() {
        let t = "<|channel>thought\nCold, so a coat.<channel|>Take a coat.";
        assert_eq!(
            split(t, Dialect::Gemma4, ReasoningFormat::Apart, false),
            (Some("Cold, so a coat.".into()), "Take a coat.".into())
        );
    }
}
