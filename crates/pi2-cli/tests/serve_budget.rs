//! `pi2 serve --parallel N --mem-budget B`: the slots share one engine and its budget, their
//! decode steps batched; each answer equals `pi2 run`'s under the same budget, the process
//! stays within the budget, a client leaving frees its slot without stalling the others, and
//! a budget too full for another KV cache answers 503.

mod common;

use common::server::{metric, post, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
];

/// `pi2 run`'s greedy text for `prompt` under `budget`.
fn run_text(model: &str, prompt: &str, n: usize, budget: &[&str]) -> String {
    let n = n.to_string();
    let mut a = vec![
        "run", "-m", model, "--temp", "0", "-t", "1", "--json", "-p", prompt, "-n", &n,
    ];
    a.extend_from_slice(budget);
    let v: Value = serde_json::from_str(&common::ok(&a)).unwrap();
    v["text"].as_str().unwrap().to_string()
}

fn complete(addr: &str, prompt: &str, n: usize) -> String {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": n, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Peak resident memory of process `pid`, bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn slots_under_a_budget_share_one_engine_and_keep_runs_answers() {
    let dir = tempfile::tempdir().unwrap();
    let conv = common::small_conversion(dir.path());
    // The whole file: the budget also holds the process, so the FFN is still offloaded.
    let budget = ["--mem-budget", "100%", "-c", "256"];
    let n = 24;
    let want: Vec<String> = PROMPTS
        .iter()
        .map(|p| run_text(&conv, p, n, &budget))
        .collect();
    let mut args = budget.to_vec();
    args.extend_from_slice(&["--parallel", "3"]);
    let s = Server::start_model(&conv, &args);
    let got: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| scope.spawn(|| complete(&s.addr, p, n)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    let (steps, tokens) = (
        metric(&s.addr, "pi2_decode_batches_total"),
        metric(&s.addr, "pi2_decode_batch_tokens_total"),
    );
    assert!(
        tokens > steps,
        "no step carried two slots: {steps} steps, {tokens} tokens"
    );
    let file = std::fs::metadata(&conv).unwrap().len();
    let peak = peak_rss(s.child.id());
    assert!(peak <= file, "peak {peak} over the budget {file}");
}

#[test]
fn a_batched_slot_cancelled_mid_answer_leaves_the_others_running() {
    let dir = tempfile::tempdir().unwrap();
    let conv = common::small_conversion(dir.path());
    let budget = ["--mem-budget", "100%", "-c", "512"];
    let want = run_text(&conv, PROMPTS[0], 32, &budget);
    let mut args = budget.to_vec();
    args.extend_from_slice(&["--parallel", "2"]);
    let s = Server::start_model(&conv, &args);
    // A long streamed answer, left after its first chunks.
    let long = json!({"prompt": PROMPTS[1], "max_tokens": 400, "ignore_eos": true, "stream": true})
        .to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}",
        s.addr,
        long.len()
    )
    .unwrap();
    let mut first = [0u8; 512];
    let got = c.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..got]).contains("200 OK"));
    let other = std::thread::scope(|scope| {
        let h = scope.spawn(|| complete(&s.addr, PROMPTS[0], 32));
        std::thread::sleep(Duration::from_millis(300));
        drop(c);
        h.join().unwrap()
    });
    assert_eq!(other, want);
    // The cancelled slot is free again, and no step waits for it.
    let t = Instant::now();
    assert_eq!(complete(&s.addr, PROMPTS[0], 32), want);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(metric(&s.addr, "pi2_requests_cancelled_total"), 1.0);
}

#[test]
fn a_budget_too_full_for_another_cache_answers_503() {
    let dir = tempfile::tempdir().unwrap();
    let conv = common::small_conversion(dir.path());
    // The least budget three slots with 16-token batches start in: the KV caches cannot grow
    // far past their first batches.
    let slots = ["-c", "2048", "--parallel", "3", "-b", "16", "--port", "0"];
    let mut args = vec!["serve", "-m", &conv, "--mem-budget", "1"];
    args.extend_from_slice(&slots);
    let out = common::pi2(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    let least = err
        .split("pass --mem-budget ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no least budget in {err}"))
        .to_string();
    let mut args = vec!["--mem-budget", least.as_str()];
    args.extend_from_slice(&slots[..6]);
    let s = Server::start_model(&conv, &args);
    let long = "word ".repeat(300);
    let statuses: Vec<(u16, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let r = post(
                        &s.addr,
                        "/v1/completions",
                        &json!({"prompt": long, "max_tokens": 200, "ignore_eos": true}),
                    );
                    (r.status, r.body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy: Vec<_> = statuses.iter().filter(|(st, _)| *st == 503).collect();
    assert!(!busy.is_empty(), "{statuses:?}");
    for (st, body) in &statuses {
        assert!(*st == 200 || *st == 503, "{st} {body}");
        if *st == 503 {
            assert!(body.contains("memory budget is full"), "{body}");
        }
    }
    // The server is still up and answers what fits.
    assert!(!complete(&s.addr, "Hello", 2).is_empty());
}
