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
    /// Rules for a server listening on `binds`: when every one is a loopback address, requests
    /// must name a local host (a page elsewhere cannot reach it through DNS rebinding).
    pub fn new(binds: &[String], max_body: usize) -> Self {
        let loopback = |bind: &str| {
            bind == "localhost"
                || (bind.trim_matches(['[', ']']).parse::<IpAddr>())
                    .is_ok_and(|ip| ip.is_loopback())
        };
        let hosts = if !binds.is_empty() && binds.iter().all(|b| loopback(b)) {
            let mut h: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()];
            for bind in binds {
                if !h.iter().any(|x| x == bind) {
                    h.push(bind.to_string());
                }
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

/// No CORS headers at all unless `origins` names some: then those origins may call the API from
/// a browser, with a key in `Authorization` where the server has one. As llama-server's
/// `--cors-origins`: a comma-separated list, `*` for any, or `localhost` for pages served from
/// this machine (`localhost`, `127.0.0.1` or `[::1]`, any port).
pub fn cors(origins: Option<&str>) -> Option<CorsLayer> {
    let origins = origins?;
    let allow = match origins.trim() {
        "*" => AllowOrigin::any(),
        "localhost" => AllowOrigin::predicate(|o: &HeaderValue, _| {
            o.to_str().ok().is_some_and(is_local_origin)
        }),
        list => AllowOrigin::list(
            (list.split(','))
                .map(|o| HeaderValue::from_str(o.trim()).ok())
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION]),
    )
}

/// The first of `origins` that is not an origin (`scheme://host[:port]`), `*` or `localhost`.
pub fn cors_origin_problem(origins: &str) -> Option<&str> {
    if matches!(origins.trim(), "*" | "localhost") {
        return None;
    }
    (origins.split(',').map(str::trim))
        .find(|o| !o.contains("://") || o.ends_with('/') || HeaderValue::from_str(o).is_err())
}

/// Whether `origin` is a page of this machine: `http(s)://localhost`, `127.0.0.1` or `[::1]`.
fn is_local_origin(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else {
        return false;
    };
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map(|h| format!("[{h}]")),
        None => rest.split(':').next().map(str::to_string),
    };
    host.is_some_and(|h| matches!(h.as_str(), "localhost" | "127.0.0.1" | "[::1]"))
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
        let rules = |binds: &[&str]| {
            let binds: Vec<String> = binds.iter().map(|b| b.to_string()).collect();
            Rules::new(&binds, 1024).hosts
        };
        assert!(rules(&["127.0.0.1"]).contains(&"localhost".into()));
        assert!(rules(&["::1"]).contains(&"[::1]".into()));
        assert!(rules(&["127.0.0.1", "127.0.0.2"]).contains(&"127.0.0.2".into()));
        assert!(rules(&["0.0.0.0"]).is_empty());
        assert!(rules(&["192.168.1.5"]).is_empty());
        // One address open to the network: the others' host check would not protect it.
        assert!(rules(&["127.0.0.1", "0.0.0.0"]).is_empty());
    }

    #[test]
    fn cors_origins_are_origins_a_list_localhost_or_any() {
        for ok in [
            "*",
            "localhost",
            "https://a.example",
            "https://a.example, http://b.example:8080",
        ] {
            assert_eq!(cors_origin_problem(ok), None, "{ok}");
        }
        assert_eq!(cors_origin_problem("https://a.example,evil"), Some("evil"));
        assert_eq!(
            cors_origin_problem("https://a.example/"),
            Some("https://a.example/")
        );
        for local in [
            "http://localhost:5173",
            "https://127.0.0.1",
            "http://[::1]:80",
        ] {
            assert!(is_local_origin(local), "{local}");
        }
        for other in [
            "http://localhost.evil.example",
            "http://evil.example",
            "localhost",
            "http://[::2]",
        ] {
            assert!(!is_local_origin(other), "{other}");
        }
    }
}
