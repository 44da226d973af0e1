//! The engine's one error type: bad requests, sparse weights that do not fit, offloading,
//! CPU topology. Every variant names what failed and, where it can, what to change.

use pi2_kernels::QuantType;
use pi2_model::TokenId;
use std::path::PathBuf;

/// Everything the engine can refuse or fail at.
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
    #[error("a context of {n_ctx} tokens is outside 1..{max} (set -c/--ctx-size)")]
    ContextSize { n_ctx: usize, max: usize },
    #[error(
        "cannot resume at layer {layer} of {n_layer} with a stream of {len} values for {tokens} tokens ({tokens} x n_embd {n_embd} are needed)"
    )]
    Resume {
        layer: usize,
        n_layer: usize,
        len: usize,
        tokens: usize,
        n_embd: usize,
    },
    #[error(
        "cannot resume at layer {first}: layer {layer} reads the keys and values of layer {from}, which no pass over these positions wrote (run the dense pass over them first)"
    )]
    ResumeShared {
        first: usize,
        layer: usize,
        from: usize,
    },
    #[error("saved KV cache: {0}")]
    CacheFile(String),
    #[error("empty input")]
    Empty,
    #[error("sparse weights do not fit the model: {0}")]
    SparseMismatch(String),
    #[error("reading the model's neurons failed: {0}")]
    Io(#[from] pi2_io::IoError),
    #[error("offloaded FFN: {0}")]
    Offload(String),
    /// The KV caches outgrew what the memory budget can give them: nothing runs over it.
    #[error("memory budget full: {0}")]
    MemoryFull(String),
    /// A step shared by several sequences failed; each of them gets this copy of why.
    #[error("{0}")]
    Shared(String),
    #[error("output head: {0}")]
    Head(String),
    #[error("speculative decoding: {0}")]
    Drafts(String),
    #[error("constrained decoding: {0}")]
    Constraint(String),
    #[error(transparent)]
    Budget(#[from] pi2_cache::CacheError),
    #[error(transparent)]
    Model(#[from] pi2_model::ModelError),
    #[error("{0} thresholds given for a model of {1} layers")]
    ThresholdCount(usize, usize),
    #[error("threshold {0} of layer {1} is not a finite number >= 0")]
    BadThreshold(f32, usize),
    #[error(
        "cannot store the transposed down matrix as {ty}: rows of {cols} elements need {need}"
    )]
    DownType {
        ty: QuantType,
        cols: usize,
        need: &'static str,
    },
    #[error("sparse weights, layer {layer}: {msg}")]
    SparseLayer { layer: usize, msg: String },
    #[error("cannot read CPU topology at {path}: {msg}")]
    Sysfs { path: PathBuf, msg: String },
    #[error(
        "bad core selection `{spec}`: {msg} (use big, mid, little, all, or CPU numbers like 0-3,6)"
    )]
    CoreSpec { spec: String, msg: String },
    #[error("cannot pin a thread to CPU {cpu}: {msg}")]
    Pin { cpu: usize, msg: String },
}

impl EngineError {
    /// This error for another sequence of the same failed step: a full memory budget stays
    /// one (callers answer it as "busy"), anything else is its message.
    pub fn shared(&self) -> EngineError {
        match self {
            EngineError::MemoryFull(m) => EngineError::MemoryFull(m.clone()),
            e => EngineError::Shared(e.to_string()),
        }
    }
}
