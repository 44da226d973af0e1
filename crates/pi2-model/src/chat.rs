//! Chat templates: the model's `tokenizer.chat_template` (Jinja) rendered with minijinja.

use crate::error::{ModelError, Result};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

/// One chat message.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// ChatML, used when a model carries no template (llama.cpp does the same).
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

impl ChatTemplate {
    /// Compile `source`; `bos`/`eos` are the texts templates see as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        // HF templates call Python string methods (`.strip()`, `.startswith()`, ...).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ModelError::Template(format!("cannot compile: {e}")))?;
        Ok(Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// Render `messages`, ending with the assistant prompt when `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ModelError::Template(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        })
        .map_err(|e| ModelError::Template(format!("cannot render: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
