//! Chat templates by name, for `--chat-template NAME` as llama-server takes it: the markup
//! llama.cpp's built-in formats produce (`llm_chat_apply_template` in its `src/llama-chat.cpp`),
//! written as Jinja for pi2's template engine. Only the formats whose output is fixed markup
//! around each message are here; other names are refused with this list.

/// Names pi2 knows, each with its Jinja text.
const TEMPLATES: [(&str, &str); 4] = [
    // `<|im_start|>role\ncontent<|im_end|>\n` per message.
    (
        "chatml",
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
    ),
    // Llama 3: a header per message, `<|eot_id|>` after it; the BOS is the tokenizer's.
    (
        "llama3",
        "{%- for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
    ),
    // Gemma: `model` for the assistant; system text opens the next user turn.
    (
        "gemma",
        "{%- set ns = namespace(system='') %}{%- for m in messages %}\
         {%- if m['role'] == 'system' %}{%- set ns.system = ns.system + m['content'] | trim %}\
         {%- else %}{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}\
         {{ '<start_of_turn>' + role + '\\n' }}\
         {%- if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' %}{%- endif %}\
         {{ m['content'] | trim + '<end_of_turn>\\n' }}{%- endif %}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}",
    ),
    // Phi-3: `<|role|>\ncontent<|end|>\n` per message.
    (
        "phi3",
        "{%- for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}",
    ),
];

/// The Jinja text of the format `name`.
pub fn named(name: &str) -> Option<&'static str> {
    TEMPLATES.iter().find(|t| t.0 == name).map(|t| t.1)
}

/// The names [`named`] knows, comma-separated.
pub fn names() -> String {
    TEMPLATES.map(|t| t.0).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatTemplate, Message};

    fn render(name: &str, msgs: &[Message]) -> String {
        ChatTemplate::new(named(name).unwrap(), "<s>", "</s>")
            .unwrap()
            .render(msgs, true)
            .unwrap()
    }

    /// Each format's text for a system prompt, a turn and a reply, and the next turn's prompt,
    /// as llama.cpp's `llm_chat_apply_template` writes it (its `tests/test-chat-template.cpp`
    /// expectations for these formats, its conversation).
    #[test]
    fn named_formats_write_llama_cpps_markup() {
        let msgs = [
            Message::new("system", "You are a helpful assistant"),
            Message::new("user", "Hello"),
            Message::new("assistant", "Hi there"),
            Message::new("user", "Who are you"),
            Message::new("assistant", "   I am an assistant   "),
            Message::new("user", "Another question"),
        ];
        assert_eq!(
            render("chatml", &msgs),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render("gemma", &msgs),
            "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            render("llama3", &msgs),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            render("phi3", &msgs),
            "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"
        );
        assert!(named("vicuna").is_none());
        assert!(names().contains("chatml, llama3"));
    }
}
