//! The engine's errors.

use pi2_model::TokenId;

/// Engine errors: bad requests rather than bad files (the model was checked at load).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "context full: {needed} tokens needed but the context holds {n_ctx} (raise -c/--ctx-size)"
    )]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("token id {0} is outside the vocabulary ({1} tokens)")]
    BadToken(TokenId, usize),
    #[error("kernel tier `{0}` is not supported by this CPU")]
    TierUnsupported(&'static str),
    #[error("cannot start {threads} worker threads: {msg}")]
    ThreadPool { threads: usize, msg: String },
    #[error("CPU {cpu} is not available to this process (allowed: {allowed})")]
    CpuNotAllowed { cpu: usize, allowed: String },
    #[error("empty input")]
    Empty,
    #[error("sparse weights do not fit the model: {0}")]
    SparseMismatch(String),
    #[error("reading the model's neurons failed: {0}")]
    Io(#[from] pi2_io::IoError),
    #[error("offloaded FFN: {0}")]
    Offload(String),
}
