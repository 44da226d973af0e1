//! A `pi2 serve` child on a free port and a small HTTP/1.1 client for the server tests.

use super::{m, root};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `pi2 serve` on a free port; killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(&m(), extra)
    }

    pub fn start_model(model: &str, extra: &[&str]) -> Server {
        let mut args = vec!["serve", "-m", model, "--port", "0", "-t", "1"];
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_pi2"))
            .args(&args)
            .current_dir(root())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pi2 serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let line = lines.next().expect("pi2 serve printed nothing").unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in `{line}`"))
            .to_string();
        // Keep reading stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, addr }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Reply {
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTP/1.1 request on a fresh connection (closed after the answer); a POST says its body
/// is JSON unless `headers` name a content type.
pub fn http(addr: &str, method: &str, path: &str, headers: &[&str], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    let typed = headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("content-type:"));
    if method == "POST" && !typed {
        head.push_str("Content-Type: application/json\r\n");
    }
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading the whole body and close: ignore that error.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_reply(&raw)
}

pub fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n").expect("no HTTP head");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Reply {
        status,
        head: head.to_string(),
        body,
    }
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

pub fn post(addr: &str, path: &str, body: &Value) -> Reply {
    http(addr, "POST", path, &[], body.to_string().as_bytes())
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// A chat stream's chunks (JSON, `[DONE]` left out) and the text of one `delta` field over
/// all of them (`content`, `reasoning_content`).
pub fn chat_stream(body: &str) -> (Vec<Value>, impl Fn(&str) -> String) {
    let chunks: Vec<Value> = sse_data(body)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let all = chunks.clone();
    let field = move |name: &str| -> String {
        (all.iter())
            .filter_map(|c| c["choices"][0]["delta"][name].as_str())
            .collect()
    };
    (chunks, field)
}

pub fn metric(addr: &str, name: &str) -> f64 {
    let r = http(addr, "GET", "/metrics", &[], b"");
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} missing from {}", r.body))
        .parse()
        .unwrap()
}
