//! `pi2 serve` end to end on loopback: answers equal `pi2 run`, streaming, KV reuse between
//! turns, bad requests, API keys, a full queue under 32 clients, a client leaving mid-stream,
//! and (when CI provides them) the official `openai` Python client and the chat page in
//! headless Chromium.

mod common;

use common::server::{http, metric, post, sse_data, Server};
use common::{m, root};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn run_text(args: &[&str]) -> String {
    run_text_with(&m(), args)
}

fn run_text_with(model: &str, args: &[&str]) -> String {
    let mut a = vec!["run", "-m", model, "--temp", "0", "-t", "1", "--json"];
    a.extend_from_slice(args);
    let v: Value = serde_json::from_str(&common::ok(&a)).unwrap();
    v["text"].as_str().unwrap().to_string()
}

const QUESTION: &str = "What is the capital of France?";

#[test]
fn greedy_answers_equal_pi2_run_whole_and_streamed_and_turns_reuse_the_cache() {
    let s = Server::start(&[]);
    let want_chat = run_text(&["--chat", "-p", QUESTION, "-n", "24"]);
    let chat = json!({"messages": [{"role": "user", "content": QUESTION}],
                      "temperature": 0, "max_tokens": 24});
    let r = post(&s.addr, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], want_chat.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 24);
    assert!(v["timings"]["predicted_per_second"].as_f64().unwrap() > 0.0);

    // Streamed: the same text in chunks, a finish reason, then [DONE].
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let r = post(&s.addr, "/v1/chat/completions", &streamed);
    assert_eq!(r.status, 200);
    let data = sse_data(&r.body);
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    // As llama-server and OpenAI send it: no text yet (null), and the build that answers.
    assert!(
        chunks[0]["choices"][0]["delta"]["content"].is_null(),
        "{}",
        chunks[0]
    );
    assert!(chunks.iter().all(|c| c["system_fingerprint"].is_string()));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, want_chat);
    let end = chunks.last().unwrap();
    assert_eq!(end["choices"][0]["finish_reason"], "length");
    // The same conversation again: its prompt is all in the slot's cache but the last token.
    let prompt_tokens = end["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(end["timings"]["cache_n"], prompt_tokens - 1, "{end}");
    // With `stream_options.include_usage`, usage comes in a chunk of its own with no choices.
    let mut with_usage = chat.clone();
    with_usage["stream"] = json!(true);
    with_usage["stream_options"] = json!({"include_usage": true});
    let r = post(&s.addr, "/v1/chat/completions", &with_usage);
    let data = sse_data(&r.body);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let (last, before) = (&chunks[chunks.len() - 1], &chunks[chunks.len() - 2]);
    assert_eq!(last["choices"], json!([]), "{last}");
    assert!(
        last["usage"]["completion_tokens"].as_u64() > Some(0),
        "{last}"
    );
    assert_eq!(before["choices"][0]["finish_reason"], "length", "{before}");
    assert!(before.get("usage").is_none(), "{before}");

    // A second turn reuses the first turn's prefix.
    let turn2 = json!({"messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": want_chat},
        {"role": "user", "content": "And of Italy?"}], "temperature": 0, "max_tokens": 4});
    let v = post(&s.addr, "/v1/chat/completions", &turn2).json();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= prompt_tokens - 1, "{v}");

    // Completions: plain prompt, greedy, stop strings cut the text.
    let prompt = "The capital of France is";
    let want = run_text(&["-p", prompt, "-n", "12"]);
    let v = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": 12}),
    )
    .json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want.as_str());
    let cut_at = want.find('.').expect("a full stop in the greedy text");
    let v = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": 12, "stop": ["."]}),
    )
    .json();
    assert_eq!(v["choices"][0]["text"], &want[..cut_at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let models = http(&s.addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    let page = http(&s.addr, "GET", "/", &[], b"");
    assert!(page.status == 200 && page.body.contains("pi2 chat"));
    assert_eq!(metric(&s.addr, "pi2_requests_completed_total"), 6.0);
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_stays_up() {
    let mut s = Server::start(&["--api-key", "sesame", "--max-body", "64K", "-c", "256"]);
    let auth = "Authorization: Bearer sesame";
    let call = |path: &str, headers: &[&str], body: &[u8]| {
        let r = http(&s.addr, "POST", path, headers, body);
        (r.status, r.body)
    };
    let chat = "/v1/chat/completions";
    let hi = br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    // What, headers, body, the status expected, and a word its message must hold.
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("no key", vec![], hi.to_vec(), 401, "API key"),
        (
            "wrong key",
            vec!["Authorization: Bearer open"],
            hi.to_vec(),
            401,
            "wrong API key",
        ),
        (
            "malformed",
            vec![auth],
            b"{\"messages\": [".to_vec(),
            400,
            "not valid JSON",
        ),
        (
            "not an object",
            vec![auth],
            b"[1,2]".to_vec(),
            400,
            "JSON object",
        ),
        (
            "wrong type",
            vec![auth],
            br#"{"messages":"hi"}"#.to_vec(),
            400,
            "`messages`",
        ),
        (
            "wrong type",
            vec![auth],
            br#"{"messages":[],"max_tokens":"9"}"#.to_vec(),
            400,
            "max_tokens",
        ),
        (
            "empty",
            vec![auth],
            br#"{"messages":[]}"#.to_vec(),
            400,
            "empty",
        ),
        (
            "temperature",
            vec![auth],
            br#"{"messages":[{"role":"user","content":"x"}],"temperature":-2}"#.to_vec(),
            400,
            "temperature",
        ),
        ("oversize", vec![auth], vec![b' '; 100 << 10], 413, "larger"),
    ];
    for (what, headers, body, status, needle) in &cases {
        let (got, body) = call(chat, headers, body);
        assert_eq!(got, *status, "{what}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{what}: {body}"));
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{what}: {msg}");
    }
    // `max_tokens` past the context: the answer ends where the context does, with `length`.
    let (got, body) = call(
        chat,
        &[auth],
        br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100000,"ignore_eos":true}"#,
    );
    assert_eq!(got, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{body}");
    let used = v["usage"]["total_tokens"].as_u64().unwrap();
    assert!((250..=257).contains(&used), "{body}");
    // A prompt longer than the context.
    let long = json!({"prompt": "word ".repeat(400)}).to_string();
    let (got, body) = call("/v1/completions", &[auth], long.as_bytes());
    assert!(got == 400 && body.contains("context"), "{got} {body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["type"], "exceed_context_size_error", "{body}");
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(e["error"]["n_ctx"], 256, "{body}");
    assert!(
        e["error"]["n_prompt_tokens"].as_u64() >= Some(256),
        "{body}"
    );
    assert_eq!(http(&s.addr, "GET", "/health", &[], b"").status, 200);
    assert_eq!(http(&s.addr, "GET", "/metrics", &[], b"").status, 401);
    assert_eq!(call(chat, &[auth], hi).0, 200);
    // As llama-server with one model: any `model` name is answered (apps hard-code theirs);
    // the OpenAI SDK's `developer` role is the system prompt; llama-server's own fields pass.
    let named = br#"{"model":"gpt-4o","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"hi"}],"n_predict":2,"ignore_eos":true,"cache_prompt":true,"typical_p":1.0,"samplers":["penalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"]}"#;
    let (got, body) = call(chat, &[auth], named);
    assert_eq!(got, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2, "{body}");
    // A field that would change the answer and is not served is refused by name.
    let (got, body) = call(
        chat,
        &[auth],
        br#"{"messages":[{"role":"user","content":"hi"}],"typical_p":0.5}"#,
    );
    assert!(got == 400 && body.contains("typical_p"), "{got} {body}");
    // The key in `X-Api-Key`, as llama-server takes it too.
    assert_eq!(call(chat, &["X-Api-Key: sesame"], hi).0, 200);
    assert_eq!(call(chat, &["X-Api-Key: open"], hi).0, 401);
    // The scheme is case-insensitive; the key is not.
    assert_eq!(call(chat, &["Authorization: bearer sesame"], hi).0, 200);
    assert_eq!(call(chat, &["Authorization: bearer SESAME"], hi).0, 401);
    assert!(s.alive());
}

#[test]
fn thirty_two_clients_get_answers_or_503_and_metrics_count_them() {
    let s = Server::start(&["--parallel", "2", "--queue", "3"]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": true});
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let addr = s.addr.clone();
            let body = body.clone();
            std::thread::spawn(move || post(&addr, "/v1/completions", &body))
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    for c in clients {
        let r = c.join().unwrap();
        match r.status {
            200 => {
                assert_eq!(r.json()["usage"]["completion_tokens"], 24, "{}", r.body);
                ok += 1;
            }
            503 => {
                assert!(r.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("busy"));
                busy += 1;
            }
            other => panic!("status {other}: {}", r.body),
        }
    }
    assert_eq!(ok + busy, 32);
    // At least the queue's worth (when every request arrives before a slot takes one).
    assert!(ok >= 3, "a queue of three serves at least three: {ok}");
    assert!(busy > 0, "a queue of three cannot hold 32 at once");
    assert_eq!(metric(&s.addr, "pi2_requests_total"), 32.0);
    assert_eq!(metric(&s.addr, "pi2_requests_completed_total"), ok as f64);
    assert_eq!(metric(&s.addr, "pi2_requests_rejected_total"), busy as f64);
    assert_eq!(
        metric(&s.addr, "pi2_tokens_predicted_total"),
        24.0 * ok as f64
    );
    assert_eq!(metric(&s.addr, "pi2_requests_processing"), 0.0);
    assert_eq!(metric(&s.addr, "pi2_requests_deferred"), 0.0);
    // llama-server's names for dashboards made for it: its prompt count leaves cached tokens out.
    assert_eq!(
        metric(&s.addr, "llamacpp:tokens_predicted_total"),
        24.0 * ok as f64
    );
    let (evaluated, cached) = (
        metric(&s.addr, "llamacpp:prompt_tokens_total"),
        metric(&s.addr, "llamacpp:prompt_tokens_cached_total"),
    );
    assert_eq!(
        evaluated,
        metric(&s.addr, "pi2_prompt_tokens_evaluated_total")
    );
    assert_eq!(
        evaluated + cached,
        metric(&s.addr, "pi2_prompt_tokens_total")
    );
    assert!(metric(&s.addr, "llamacpp:predicted_tokens_seconds") > 0.0);
}

#[test]
fn two_conversations_keep_their_own_slots() {
    let s = Server::start(&["--parallel", "2"]);
    let system = json!({"role": "system", "content": "You are a helpful assistant."});
    let ask = |history: &[Value]| {
        let v = post(
            &s.addr,
            "/v1/chat/completions",
            &json!({"messages": history, "temperature": 0, "max_tokens": 8}),
        )
        .json();
        let reply = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        (v["usage"].clone(), reply)
    };
    let mut a = vec![
        system.clone(),
        json!({"role": "user", "content": "Name a fruit."}),
    ];
    let mut b = vec![system, json!({"role": "user", "content": "Name a colour."})];
    let (ua, ra) = ask(&a);
    let (ub, rb) = ask(&b);
    // Turns alternate between the conversations: each finds its own earlier turn cached.
    for (conv, reply, first) in [(&mut a, ra, ua), (&mut b, rb, ub)] {
        conv.push(json!({"role": "assistant", "content": reply}));
        conv.push(json!({"role": "user", "content": "Another one?"}));
        let (u, _) = ask(conv);
        let cached = u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached >= first["prompt_tokens"].as_u64().unwrap(),
            "turn 2 reused {cached} tokens: {u} after {first}"
        );
    }
}

#[test]
fn a_client_leaving_mid_answer_frees_its_slot() {
    let s = Server::start(&["--parallel", "1"]);
    for (i, stream) in [true, false].into_iter().enumerate() {
        // Thousands of tokens: a minute of work if nobody stopped it.
        let long = json!({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": true,
                          "stream": stream});
        let mut c = TcpStream::connect(&s.addr).unwrap();
        let body = long.to_string();
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            s.addr,
            body.len()
        )
        .unwrap();
        if stream {
            let mut first = [0u8; 512];
            let n = c.read(&mut first).unwrap();
            assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
        }
        std::thread::sleep(Duration::from_millis(300));
        drop(c);
        let t = Instant::now();
        let r = post(
            &s.addr,
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 1}),
        );
        assert_eq!(r.status, 200);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "stream {stream}: the next request waited {:?}",
            t.elapsed()
        );
        assert_eq!(
            metric(&s.addr, "pi2_requests_cancelled_total"),
            (i + 1) as f64
        );
    }
}

#[test]
fn serve_refuses_unusable_options_in_one_line() {
    common::fails_with(&["serve", "-m", &m(), "--parallel", "0"], "--parallel");
    common::fails_with(&["serve", "-m", &m(), "--queue", "0"], "--queue");
    common::fails_with(&["serve", "-m", &m(), "--api-key", " "], "--api-key");
    common::fails_with(&["serve", "-m", &m(), "--max-body", "lots"], "--max-body");
    common::fails_with(
        &["serve", "-m", &m(), "--max-connections", "0"],
        "--max-connections",
    );
    common::fails_with(
        &["serve", "-m", &m(), "--header-timeout", "0"],
        "--header-timeout",
    );
    common::fails_with(
        &["serve", "-m", &m(), "--cors-origin", "evil"],
        "--cors-origin",
    );
    let qwen = root().join("models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf");
    common::fails_with(
        &["serve", "-m", &m(), "--draft-model", qwen.to_str().unwrap()],
        "needs the same vocabulary",
    );
    // An address that is not this machine's is not blamed on another server.
    common::fails_with(
        &["serve", "-m", &m(), "--host", "999.1.1.1", "--port", "0"],
        "check --host",
    );
    // A port already taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    common::fails_with(
        &["serve", "-m", &m(), "--port", &port],
        "choose another --port",
    );
}

#[test]
fn under_a_memory_budget_the_server_answers_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let conv = common::small_conversion(dir.path());

    // The whole file's size: the budget also holds this process's own memory (about 40 MiB
    // here) and the server's 512-token batch buffers, so the FFN is still offloaded.
    let budget = ["--mem-budget", "100%", "-c", "256"];
    let prompt = "The capital of France is";
    let mut args = vec!["-p", prompt, "-n", "16"];
    args.extend_from_slice(&budget);
    let want = run_text_with(&conv, &args);
    let s = Server::start_model(&conv, &budget);
    let v = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": 16}),
    )
    .json();
    assert_eq!(v["choices"][0]["text"], want.as_str());
    let hit = metric(&s.addr, "pi2_neuron_cache_hit_ratio");
    assert!((0.0..=1.0).contains(&hit), "{hit}");
}

/// Runs a Python script from tests/serve/ against a running server, with the interpreter CI
/// set up (`PI2_TEST_PYTHON`: a Python with `openai` and `selenium`); says so when skipped.
fn python_script(script: &str, env: &[(&str, &str)]) {
    python_script_on(&m(), script, env)
}

/// [`python_script`] against a server of `model`.
fn python_script_on(model: &str, script: &str, env: &[(&str, &str)]) {
    let Ok(python) = std::env::var("PI2_TEST_PYTHON") else {
        eprintln!("SKIPPED {script}: set PI2_TEST_PYTHON to a Python with openai and selenium (.ci/run does)");
        return;
    };
    let s = Server::start_model(model, &[]);
    let path = root().join("crates/pi2-cli/tests/serve").join(script);
    let want = run_text(&["--chat", "-p", QUESTION, "-n", "24"]);
    let out = Command::new(python)
        .arg(&path)
        .env("PI2_URL", format!("http://{}", s.addr))
        .env("PI2_QUESTION", QUESTION)
        .env("PI2_EXPECTED", &want)
        .envs(env.iter().copied())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_openai_python_client_works() {
    let want_completion = run_text(&["-p", "The capital of France is", "-n", "12"]);
    python_script(
        "openai_client.py",
        &[("PI2_EXPECTED_COMPLETION", &want_completion)],
    );
}

/// json_schema on 20 prompts, json_object, GBNF, a weather-tool round trip (whole, streamed,
/// `tool` message back, a named function) and log probabilities, on Qwen2.5-Coder-0.5B (whose
/// template shows tools).
#[test]
fn structured_output_tool_calls_and_logprobs_through_the_openai_client() {
    let qwen = root().join("models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf");
    python_script_on(qwen.to_str().unwrap(), "structured.py", &[]);
}

#[test]
fn the_chat_page_streams_an_answer_in_headless_chromium() {
    python_script("chat_page.py", &[]);
}

#[test]
fn requests_may_decode_with_prompt_lookup_drafts() {
    let s = Server::start(&["-c", "1024"]);
    let items: Vec<String> = (1..=20)
        .map(|i| format!("item {i}: value {}", i * 7))
        .collect();
    let prompt = format!("{}\n{}\n", items.join("\n"), items.join("\n"));
    let ask = |draft: &str| {
        post(
            &s.addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "draft": draft}),
        )
    };
    let plain = ask("none").json();
    let drafted = ask("lookup").json();
    assert_eq!(plain["choices"][0]["text"], drafted["choices"][0]["text"]);
    assert_eq!(plain["timings"]["draft_n"], 0);
    assert!(
        drafted["timings"]["draft_n_accepted"].as_u64().unwrap() > 0,
        "{drafted}"
    );
    let bad = ask("wizard");
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["param"], "draft");
    // `model` needs a server with a draft model.
    let no_model = ask("model");
    assert_eq!(no_model.status, 400, "{}", no_model.body);
    assert!(no_model.body.contains("--draft-model"), "{}", no_model.body);
    // `self` drafts from what a memory budget keeps resident: not in memory.
    let no_budget = ask("self");
    assert_eq!(no_budget.status, 400, "{}", no_budget.body);
    assert!(
        no_budget.body.contains("--mem-budget"),
        "{}",
        no_budget.body
    );
}

/// `serve --draft-model`: requests draft with it by default (the model as its own draft keeps
/// every draft), give the same greedy text as without drafts, and may say `"draft": "none"`.
#[test]
fn a_server_with_a_draft_model_drafts_with_it() {
    let s = Server::start(&["-c", "512", "--draft-model", &m()]);
    let ask = |draft: Option<&str>| {
        // Past an end of generation the answer stops where the drafts run on, so those would
        // count as drafted and not accepted.
        let mut body = json!({"prompt": "The capital of France is", "max_tokens": 24,
                              "temperature": 0, "ignore_eos": true});
        if let Some(d) = draft {
            body["draft"] = d.into();
        }
        post(&s.addr, "/v1/completions", &body).json()
    };
    let drafted = ask(None);
    let plain = ask(Some("none"));
    assert_eq!(plain["choices"][0]["text"], drafted["choices"][0]["text"]);
    let t = &drafted["timings"];
    assert!(t["draft_n"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["draft_n"], t["draft_n_accepted"], "{t}");
    assert_eq!(plain["timings"]["draft_n"], 0);
    let props = http(&s.addr, "GET", "/props", &[], b"").json();
    assert_eq!(
        props["default_generation_settings"]["params"]["draft"], "model",
        "{props}"
    );
}

#[test]
fn token_routes_and_props_answer_as_llama_server_does() {
    let s = Server::start(&["--parallel", "2", "-c", "512"]);
    let text = "Hello, world <|im_start|>";
    let v = post(&s.addr, "/tokenize", &json!({ "content": text })).json();
    let ids: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    // The same tokens as `pi2 tokenize`-style encoding through the library.
    let model = pi2_model::Model::load(m()).unwrap();
    let want = model.tokenizer.encode(text, false, true);
    assert_eq!(ids, want.iter().map(|&t| t as u64).collect::<Vec<_>>());
    let v = post(
        &s.addr,
        "/tokenize",
        &json!({"content": "Hi", "add_special": true, "with_pieces": true}),
    )
    .json();
    let pieces: String = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["piece"].as_str())
        .collect();
    assert!(pieces.ends_with("Hi"), "{v}");
    let back = post(&s.addr, "/detokenize", &json!({ "tokens": ids })).json();
    assert_eq!(back["content"], "Hello, world ");
    // Bad input is named.
    let r = post(&s.addr, "/detokenize", &json!({"tokens": [1, -5]}));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("tokens[1]"), "{}", r.body);
    let r = post(
        &s.addr,
        "/tokenize",
        &json!({"content": "x", "lowercase": true}),
    );
    assert_eq!(r.status, 400);
    assert!(r.body.contains("lowercase"), "{}", r.body);
    let r = post(&s.addr, "/tokenize", &json!({"text": "x"}));
    assert_eq!(r.status, 400);
    let p = http(&s.addr, "GET", "/props", &[], b"").json();
    assert_eq!(p["total_slots"], 2);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 512);
    assert!(p["chat_template"].as_str().unwrap().contains("im_start"));
}

#[test]
fn echo_starts_a_completion_with_its_prompt() {
    let s = Server::start(&[]);
    let ask = |echo: bool, stream: bool| {
        let body = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                          "echo": echo, "stream": stream});
        let r = post(&s.addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        if !stream {
            return r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        }
        sse_data(&r.body)
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| {
                let v: Value = serde_json::from_str(d).unwrap();
                v["choices"][0]["text"].as_str().unwrap_or("").to_string()
            })
            .collect()
    };
    let plain = ask(false, false);
    assert_eq!(ask(true, false), format!("The capital of France is{plain}"));
    assert_eq!(ask(true, true), format!("The capital of France is{plain}"));
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "echo": true}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("`echo` is for /v1/completions"),
        "{}",
        r.body
    );
}

#[test]
fn context_shift_drops_the_oldest_messages_of_a_long_chat() {
    let mut history = vec![json!({"role": "system", "content": "You are brief."})];
    for i in 0..8 {
        history.push(json!({"role": "user", "content": format!("Tell me fact number {i} about the sea, in a long sentence.")}));
        history.push(json!({"role": "assistant", "content": "The sea is wide and deep and full of fish and salt and waves."}));
    }
    history.push(json!({"role": "user", "content": "Thanks!"}));
    let body = json!({"messages": history, "max_tokens": 4, "temperature": 0});
    let plain = Server::start(&["-c", "128"]);
    let r = post(&plain.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--context-shift"), "{}", r.body);
    let shifting = Server::start(&["-c", "128", "--context-shift"]);
    let r = post(&shifting.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt < 128, "{prompt}");
}

/// One request cannot kill or freeze the server: grammars and schemas past the limits get a
/// 400 naming the limit (a 3,000-rule chain and a 10,000-deep `$ref` chain overflowed the
/// stack and killed it); while many chat requests with grammars are checked, `/health` still
/// answers at once (they are checked off the server's async thread); a `Host` that only
/// starts like a loopback name is refused; embeddings count as completed requests.
#[test]
fn heavy_or_hostile_requests_neither_kill_nor_freeze_the_server() {
    let mut s = Server::start(&["--parallel", "1", "--queue", "64"]);
    let mut chain = String::from("root ::= r0\n");
    for i in 0..3000 {
        chain += &format!("r{i} ::= r{}\n", i + 1);
    }
    chain += "r3000 ::= \"x\"\n";
    let r = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 2, "grammar": chain}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("over the limit"), "{}", r.body);
    let mut defs = serde_json::Map::new();
    for i in 0..10_000 {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d10000".into(), json!({"type": "integer"}));
    let schema =
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs});
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("over the limit"), "{}", r.body);
    assert!(s.alive());

    // Fifty chat requests with a grammar of many alternatives, while /health is asked.
    let alternatives: Vec<String> = (0..1500).map(|i| format!("\"w{i}\"")).collect();
    let grammar = format!("root ::= {}", alternatives.join(" | "));
    let heavy: Vec<_> = (0..50)
        .map(|_| {
            let (addr, grammar) = (s.addr.clone(), grammar.clone());
            std::thread::spawn(move || {
                post(
                    &addr,
                    "/v1/chat/completions",
                    &json!({"messages": [{"role": "user", "content": "pick"}], "max_tokens": 1,
                            "grammar": grammar}),
                )
                .status
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let t0 = Instant::now();
        assert_eq!(http(&s.addr, "GET", "/health", &[], b"").status, 200);
        slowest = slowest.max(t0.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let statuses: Vec<u16> = heavy.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|&c| c == 200 || c == 503),
        "{statuses:?}"
    );
    // Generous for a loaded 2-core CI machine; before, /health waited 16-20 s.
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");

    let mut raw = TcpStream::connect(&s.addr).unwrap();
    raw.write_all(b"GET /health HTTP/1.1\r\nHost: [::1]evil.com\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    let r = common::server::parse_reply(&answer);
    assert_eq!(r.status, 403, "{}", r.body);

    let before = metric(&s.addr, "pi2_requests_completed_total");
    let r = post(&s.addr, "/v1/embeddings", &json!({"input": "hello"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let bad = metric(&s.addr, "pi2_requests_invalid_total");
    let r = post(&s.addr, "/v1/embeddings", &json!({"input": []}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        metric(&s.addr, "pi2_requests_completed_total"),
        before + 1.0
    );
    assert_eq!(metric(&s.addr, "pi2_requests_invalid_total"), bad + 1.0);
    assert!(s.alive());
}

/// llama-server's `/apply-template`: the messages in the model's template, nothing generated;
/// `--no-ui` serves the API without the chat page.
#[test]
fn apply_template_renders_and_no_ui_hides_the_page() {
    let s = Server::start(&["--no-ui"]);
    let r = post(
        &s.addr,
        "/apply-template",
        &json!({"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = r.json()["prompt"].as_str().unwrap().to_string();
    // SmolLM2's ChatML: the system turn, the user's, and the assistant's header to answer in.
    assert!(
        prompt.contains("Be brief.") && prompt.contains("Name a colour."),
        "{prompt}"
    );
    assert!(
        prompt.trim_end().ends_with("<|im_start|>assistant"),
        "{prompt}"
    );
    assert_eq!(metric(&s.addr, "pi2_tokens_predicted_total"), 0.0);
    assert_eq!(http(&s.addr, "GET", "/", &[], b"").status, 404);
    let r = post(&s.addr, "/apply-template", &json!({"messages": []}));
    assert_eq!(r.status, 400, "{}", r.body);
}
