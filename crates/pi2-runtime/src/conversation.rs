//! A chat kept between turns: the system prompt and the turns, saved and loaded as
//! `{"messages": [...]}` JSON (the shape of an OpenAI request's messages), and fitted to a
//! context by dropping the oldest exchanges as llama.cpp's context shift does.

use crate::error::{Result, RuntimeError};
use pi2_model::chat::ChatTemplate;
use pi2_model::{Message, TokenId, Tokenizer};
use std::io::Write;
use std::path::Path;

/// The system prompt and the turns (user and assistant messages, oldest first).
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub system: Option<String>,
    pub turns: Vec<Message>,
}

/// Largest conversation file read.
const MAX_FILE_BYTES: u64 = 64 << 20;

impl Conversation {
    pub fn new(system: Option<String>) -> Self {
        Self {
            system,
            turns: Vec::new(),
        }
    }

    /// The messages a template renders: the system prompt first, then the turns.
    pub fn messages(&self) -> Vec<Message> {
        let system = self.system.iter().map(|s| Message::new("system", s));
        system.chain(self.turns.iter().cloned()).collect()
    }

    /// Writes the conversation to `path`, a new file: an existing one is never replaced.
    pub fn save(&self, path: &Path) -> Result<()> {
        let msgs: Vec<serde_json::Value> = self
            .messages()
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({ "messages": msgs }))
            .expect("JSON of strings");
        let io = |e: std::io::Error| file_error(path, format!("cannot write it: {e}"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                file_error(
                    path,
                    format!("cannot create it (an existing file is never replaced): {e}"),
                )
            })?;
        f.write_all(text.as_bytes()).map_err(io)
    }

    /// Reads a conversation [`Conversation::save`] wrote: a system message may come first,
    /// then user and assistant messages.
    pub fn load(path: &Path) -> Result<Self> {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        if size > MAX_FILE_BYTES {
            return Err(file_error(
                path,
                format!("over {} MiB", MAX_FILE_BYTES >> 20),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|source| RuntimeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| file_error(path, format!("not JSON ({e})")))?;
        let list = v["messages"].as_array().ok_or_else(|| {
            file_error(path, "no \"messages\" list (a saved conversation has one)")
        })?;
        let mut c = Conversation::default();
        for (i, m) in list.iter().enumerate() {
            let (Some(role), Some(content)) = (m["role"].as_str(), m["content"].as_str()) else {
                return Err(file_error(
                    path,
                    format!("messages[{i}] needs a role and a content string"),
                ));
            };
            match role {
                "system" if i == 0 => c.system = Some(content.to_string()),
                "user" | "assistant" => c.turns.push(Message::new(role, content)),
                other => {
                    return Err(file_error(
                        path,
                        format!("messages[{i}] has the role `{other}` (system first, then user and assistant)"),
                    ))
                }
            }
        }
        Ok(c)
    }

    /// The conversation in `template`'s markup, ready for a reply. When it is longer than
    /// `room` tokens and `shift` is set, the oldest exchanges (a user turn and the reply after
    /// it) are dropped until it fits or one turn is left; the system prompt stays. Returns the
    /// prompt and the number of turns dropped (the caller checks that the prompt fits).
    pub fn encode_within(
        &mut self,
        template: &ChatTemplate,
        tok: &Tokenizer,
        room: usize,
        shift: bool,
    ) -> Result<(Vec<TokenId>, usize)> {
        let mut prompt = template.encode(tok, &self.messages(), true)?;
        let mut dropped = 0;
        while shift && prompt.len() > room && self.turns.len() > 1 {
            let n = if self.turns.len() > 2 { 2 } else { 1 };
            self.turns.drain(..n);
            dropped += n;
            prompt = template.encode(tok, &self.messages(), true)?;
        }
        Ok((prompt, dropped))
    }
}

fn file_error(path: &Path, msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Io {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_conversations_load_back_and_files_are_never_replaced() {
        let dir = std::env::temp_dir().join(format!("pi2-conv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        let _ = std::fs::remove_file(&path);
        let mut c = Conversation::new(Some("be brief".into()));
        c.turns.push(Message::new("user", "hi \"there\""));
        c.turns.push(Message::new("assistant", "hello\n"));
        c.save(&path).unwrap();
        let back = Conversation::load(&path).unwrap();
        assert_eq!(back.system.as_deref(), Some("be brief"));
        assert_eq!(back.turns.len(), 2);
        assert_eq!(back.turns[0].content, "hi \"there\"");
        let before = std::fs::read(&path).unwrap();
        assert!(Conversation::default().save(&path).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
        for (bad, says) in [
            ("{", "not JSON"),
            ("{\"m\": 1}", "no \"messages\""),
            ("{\"messages\": [{\"role\": \"user\"}]}", "messages[0]"),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"system\", \"content\": \"b\"}]}",
                "role `system`",
            ),
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = Conversation::load(&path).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
