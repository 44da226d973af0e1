//! Any text as a model's chat template: it compiles and renders, or fails with an error, within
//! bounded steps, output, memory and time. Rendering runs in a child process (see
//! `ChatTemplate::render`), so a panic there comes back as an error naming a bug: made a crash
//! here so that the fuzzer still finds it.
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
        if let Err(e) = t.render(&msgs, true) {
            assert!(!e.to_string().contains("a bug in pi2"), "{e}");
        }
    }
});
