//! The server's one error: an OpenAI-style body with its HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error as OpenAI sends it: a status and `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    /// A prompt over the context: its tokens and the context's, for clients that shorten it.
    pub overflow: Option<(usize, usize)>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            overflow: None,
        }
    }

    /// A prompt of `n_prompt` tokens that the context of `n_ctx` cannot hold: typed as
    /// llama-server types it (`exceed_context_size_error`, with both counts) and coded as
    /// OpenAI codes it (`context_length_exceeded`), so either kind of client can act on it.
    pub fn over_context(message: impl Into<String>, n_prompt: usize, n_ctx: usize) -> Self {
        Self {
            overflow: Some((n_prompt, n_ctx)),
            ..Self::bad(message)
        }
    }

    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn param(mut self, p: impl Into<String>) -> Self {
        self.param = Some(p.into());
        self
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    pub fn body(&self) -> Value {
        if let Some((n_prompt, n_ctx)) = self.overflow {
            return json!({"error": {
                "message": self.message,
                "type": "exceed_context_size_error",
                "param": self.param,
                "code": "context_length_exceeded",
                "n_prompt_tokens": n_prompt,
                "n_ctx": n_ctx,
            }});
        }
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}
