//! What serving adds around the engine: parsing a chat request, the per-token work of a slot
//! (stop strings over the streamed text, one SSE chunk serialized), and a whole HTTP round trip
//! on loopback (request, queue, slot, one generated token of a tiny synthetic model, answer).

use criterion::{criterion_group, criterion_main, Criterion};
use pi2_server::api::{CompletionRequest, Envelope, Kind};
use pi2_server::{serve, ServerConfig};
use std::io::{Read, Write};
use std::time::Duration;

fn chat_body(messages: usize) -> Vec<u8> {
    let msgs: Vec<_> = (0..messages)
        .map(|i| {
            serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" },
                               "content": "A message of a few dozen words, as chats have. ".repeat(4)})
        })
        .collect();
    serde_json::json!({"model": "m", "messages": msgs, "temperature": 0.7, "max_tokens": 256,
                       "stop": ["\n\n"], "stream": true})
    .to_string()
    .into_bytes()
}

fn per_request_and_token(c: &mut Criterion) {
    let body = chat_body(10);
    c.bench_function("parse a 10-message chat request", |b| {
        b.iter(|| {
            let r = CompletionRequest::parse(&body).unwrap();
            r.chat_messages().unwrap().len() + r.stops().unwrap().len()
        })
    });
    let env = Envelope {
        id: "chatcmpl-1".into(),
        created: 1,
        model: "model".into(),
        kind: Kind::Chat,
        usage_chunk: false,
        prompt: String::new(),
        settings: serde_json::Value::Null,
    };
    let pieces = ["Once", " upon", " a", " time", ",", " there", " was", "\n"];
    c.bench_function("per token: stop strings + one SSE chunk", |b| {
        let mut stops = pi2_runtime::text::StopStrings::new(["\n\n".to_string(), "END".into()]);
        let mut i = 0;
        b.iter(|| {
            i += 1;
            let text = stops.push(pieces[i % pieces.len()]);
            env.chunk(Some(&text), false, None, None).to_string().len()
        })
    });
}

fn round_trip(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    std::fs::write(
        &path,
        pi2_model::synth::build(&Default::default()).to_bytes(),
    )
    .unwrap();
    let model: &'static _ = Box::leak(Box::new(pi2_runtime::load_model(&path).unwrap()));
    let mut opts = pi2_runtime::SessionOptions::default();
    opts.engine.threads = Some(1);
    opts.engine.n_ctx = 256;
    let prepared: &'static _ =
        Box::leak(Box::new(pi2_runtime::prepare(model, &path, &opts).unwrap()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let cfg = ServerConfig {
            port: 0,
            ..ServerConfig::default()
        };
        serve(prepared, &cfg, |addr| tx.send(addr).unwrap()).unwrap();
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let body = br#"{"prompt":"hello","max_tokens":1,"temperature":0}"#;
    c.bench_function("HTTP round trip: one-token completion, tiny model", |b| {
        b.iter(|| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(
                s,
                "POST /v1/completions HTTP/1.1\r\nHost: b\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .unwrap();
            s.write_all(body).unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            assert!(out.starts_with(b"HTTP/1.1 200"));
            out.len()
        })
    });
}

criterion_group!(benches, per_request_and_token, round_trip);
criterion_main!(benches);
