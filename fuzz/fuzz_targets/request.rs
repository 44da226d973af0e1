//! Any bytes as a server request body: parsed and checked (sampling, grammar, log
//! probabilities, tools), or refused with an error; never a panic. Any text through the
//! stop-string matcher in pieces: what it releases is always a prefix of the text (all of it
//! when no stop string was found).
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_runtime::text::StopStrings;
use pi2_server::api::CompletionRequest;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = CompletionRequest::parse(data) {
        let _ = r.chat_messages();
        let _ = r.prompt_text();
        let _ = r.sampler(32_000, 4096);
        let _ = r.max_tokens(4096);
        let _ = r.stops();
        let _ = r.grammar_spec();
        let _ = r.top_logprobs(pi2_server::api::Kind::Chat);
        let _ = r.top_logprobs(pi2_server::api::Kind::Completion);
        let _ = r.top_logprobs(pi2_server::api::Kind::Native);
        let _ = r.tool_plan();
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (stop, body) = text.split_once('\n').unwrap_or(("", text));
    let mut s = StopStrings::new([stop.to_string()]);
    let mut out = String::new();
    let mut rest = body;
    let mut step = 1;
    while !rest.is_empty() {
        let mut cut = step.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        out.push_str(&s.push(&rest[..cut]));
        rest = &rest[cut..];
        step = step % 5 + 1;
    }
    out.push_str(&s.finish());
    assert!(body.starts_with(&out), "released text is not a prefix");
    if !s.stopped() {
        assert_eq!(out, body);
    } else {
        assert!(body[out.len()..].starts_with(stop));
    }
});
