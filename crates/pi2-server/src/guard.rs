//! What a request must satisfy before a handler sees it: a `Host` this server answers to (on
//! loopback binds), a JSON content type on POST, a declared length within the body cap, and,
//! for browsers, a CORS policy that admits only the origin the user named.
//!
//! Why: a web page the user visits can post to `127.0.0.1` without asking (a `text/plain` body
//! needs no CORS preflight), and a page on a domain that re-resolves to `127.0.0.1` (DNS
//! rebinding) can also read the answers, naming its own domain in `Host`. Requiring
//! `application/json` forces a preflight, which fails without CORS headers; checking `Host`
//! stops the rebinding page.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The request rules of one server.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Host names accepted in `Host` (empty: any; the server is bound beyond loopback).
    pub hosts: Vec<String>,
    pub max_body: usize,
}

impl Rules {
    /// Rules for a server bound to `bind` (the `--host` value).
    pub fn new(bind: &str, max_body: usize) -> Self {
        let loopback = bind == "localhost"
            || bind
                .trim_matches(['[', ']'])
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        let hosts = if loopback {
            let mut h = vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()];
            if !h.iter().any(|x| x == bind) {
                h.push(bind.to_string());
            }
            h
        } else {
            vec![]
        };
        Self { hosts, max_body }
    }

    fn check(&self, req: &Request) -> Result<(), ApiError> {
        if !self.hosts.is_empty() {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !self
                .hosts
                .iter()
                .any(|h| host_name(host) == Some(h.as_str()))
            {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "Host `{host}` is not this server: a loopback server answers only to {} (bind with --host to serve other names)",
                        self.hosts.join(", ")
                    ),
                ));
            }
        }
        if req.method() == Method::POST {
            let json = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
            if !json {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "send the body as JSON with `Content-Type: application/json`",
                ));
            }
        }
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().parse::<u64>());
        match declared {
            Some(Ok(n)) if n > self.max_body as u64 => Err(too_large()),
            Some(Err(_)) => Err(ApiError::bad("`Content-Length` is not a number")),
            _ => Ok(()),
        }
    }
}

/// The 413 of a body over the cap, declared or read.
pub fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "the request body is larger than this server accepts (see `pi2 serve --max-body`)",
    )
}

/// `Host`'s name without its port (`[::1]:8080` -> `[::1]`); `None` when what follows the
/// name is not a port (`[::1]evil.com`, `localhost:x`), so such a `Host` matches no name.
fn host_name(host: &str) -> Option<&str> {
    let (name, rest) = match host.starts_with('[') {
        true => host.split_at(host.find(']')? + 1),
        false => host.split_at(host.rfind(':').unwrap_or(host.len())),
    };
    let port_ok = match rest.strip_prefix(':') {
        Some(port) => !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()),
        None => rest.is_empty(),
    };
    port_ok.then_some(name)
}

/// The middleware applying `rules`.
pub async fn check(State(rules): State<Arc<Rules>>, req: Request, next: Next) -> Response {
    match rules.check(&req) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// No CORS headers at all unless `origin` names one (or `*`): then that origin may call the
/// API from a browser, with a key in `Authorization` where the server has one.
pub fn cors(origin: Option<&str>) -> Option<CorsLayer> {
    let origin = origin?;
    let allow = if origin == "*" {
        AllowOrigin::any()
    } else {
        AllowOrigin::exact(HeaderValue::from_str(origin).ok()?)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_ports() {
        assert_eq!(host_name("127.0.0.1:8080"), Some("127.0.0.1"));
        assert_eq!(host_name("[::1]:8080"), Some("[::1]"));
        assert_eq!(host_name("[::1]"), Some("[::1]"));
        assert_eq!(host_name("localhost"), Some("localhost"));
        for bad in [
            "[::1]evil.com",
            "[::1]:80evil",
            "localhost:",
            "localhost:x",
            "[::1",
        ] {
            assert_eq!(host_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn loopback_binds_check_hosts_and_others_do_not() {
        assert!(Rules::new("127.0.0.1", 1024)
            .hosts
            .contains(&"localhost".into()));
        assert!(Rules::new("::1", 1024).hosts.contains(&"[::1]".into()));
        assert!(Rules::new("0.0.0.0", 1024).hosts.is_empty());
        assert!(Rules::new("192.168.1.5", 1024).hosts.is_empty());
    }
}
