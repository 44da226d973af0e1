//! Any text as a model's chat template: it compiles and renders, or fails with an error, within
//! bounded steps and output.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_model::{ChatTemplate, Message};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") {
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello."),
            Message::new("user", "And?"),
        ];
        let _ = t.render(&msgs, true);
    }
});
