//! What every handler shares: the model, the queue, the server's settings, the grammar
//! vocabulary built on first use; and reading a request's body within its limits.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::slots::Queue;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use pi2_grammar::{Grammar, GrammarError, GrammarSpec, Vocabulary};
use pi2_model::{ChatTemplate, Model};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

/// What every handler shares.
pub struct AppState {
    pub model: &'static Model,
    /// The model's chat template, or why it has none.
    pub template: Result<ChatTemplate, String>,
    /// Names clients may ask for; the first is the id `/v1/models` lists.
    pub names: Vec<String>,
    pub n_ctx: usize,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// How requests draft unless they say, whether a draft model is loaded, and the longest
    /// draft.
    pub draft: crate::api::Drafts,
    pub draft_model: bool,
    pub draft_max: usize,
    /// Engines read from flash (a memory budget): self-drafts are possible.
    pub offloads: bool,
    /// The largest body read, and how long it may take to arrive.
    pub max_body: usize,
    pub body_timeout: std::time::Duration,
    pub created: u64,
    /// Slots serving requests (`--parallel`).
    pub slots: usize,
    /// A chat longer than the context drops its oldest messages (`--context-shift`).
    pub context_shift: bool,
    /// How `/v1/embeddings` pools token states (`--pooling`).
    pub pooling: pi2_runtime::embed::Pooling,
    /// Where slot actions save and restore KV caches (`--slot-save-path`).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// The model's path, aliases and tags, as `/v1/models` and `/props` give them.
    pub labels: crate::Labels,
    /// Most tokens an answer gets, and the default (`--n-predict`).
    pub n_predict: Option<usize>,
    /// `reasoning_format` unless the request says (`--reasoning-format`).
    pub reasoning_format: Option<String>,
    /// The vocabulary grammars compile against, built by the first request with one.
    vocabulary: OnceLock<Arc<Vocabulary>>,
    pub(crate) next_id: AtomicU64,
}

impl AppState {
    pub fn new(
        model: &'static Model,
        names: Vec<String>,
        n_ctx: usize,
        queue: Queue,
        metrics: Arc<Metrics>,
        api_key: Option<String>,
    ) -> Self {
        Self {
            model,
            template: model.chat_template().map_err(|e| e.to_string()),
            names,
            n_ctx,
            queue,
            metrics,
            api_key,
            draft: crate::api::Drafts::None,
            draft_model: false,
            offloads: false,
            draft_max: 16,
            max_body: 2 << 20,
            body_timeout: std::time::Duration::from_secs(30),
            created: unix_now(),
            slots: 1,
            context_shift: false,
            pooling: Default::default(),
            slot_save_path: None,
            n_predict: None,
            reasoning_format: None,
            labels: Default::default(),
            vocabulary: OnceLock::new(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Refuses a `model` this server does not serve (empty or absent: this one).
    /// Compiles a request's grammar; a bad one is the client's error.
    pub(crate) fn grammar(
        &self,
        spec: &GrammarSpec,
        field: &str,
    ) -> Result<Arc<Grammar>, ApiError> {
        let server =
            |e: GrammarError| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        let vocab = match self.vocabulary.get() {
            Some(v) => v,
            None => {
                let v = Vocabulary::new(&self.model.tokenizer).map_err(server)?;
                self.vocabulary.get_or_init(|| v)
            }
        };
        match vocab.compile(spec) {
            Ok(g) => Ok(Arc::new(g)),
            Err(e @ GrammarError::Busy(_)) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("`{field}`: {e}"),
            )),
            Err(e) => Err(ApiError::bad(format!("`{field}`: {e}")).param(field)),
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The whole body, within the size cap and the body timeout (a client that sends half a body
/// and waits gets 408, not a connection held open for ever).
pub(crate) async fn read_body(s: &AppState, body: Body) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, s.max_body)).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                s.body_timeout.as_secs_f32()
            ),
        )),
        Ok(Err(e)) if is_length_limit(&e) => Err(crate::guard::too_large()),
        Ok(Err(e)) => Err(ApiError::bad(format!("cannot read the request body: {e}"))),
        Ok(Ok(b)) => Ok(b),
    }
}

/// Whether reading a body failed on the size cap.
fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = src {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        src = err.source();
    }
    false
}
