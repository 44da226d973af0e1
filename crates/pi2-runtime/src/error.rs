//! The runtime's one error type.

use std::path::PathBuf;

/// Why a session could not be built or planned.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An option's value cannot work; the message says what to pass instead.
    #[error("{option}: {msg}")]
    Option { option: &'static str, msg: String },
    #[error(transparent)]
    Model(#[from] pi2_model::ModelError),
    #[error(transparent)]
    Catalog(#[from] pi2_catalog::CatalogError),
    #[error(transparent)]
    Engine(#[from] pi2_engine::EngineError),
    #[error(transparent)]
    Plan(#[from] pi2_planner::PlanError),
    #[error(transparent)]
    Sparse(#[from] pi2_sparse::SparseError),
    #[error(transparent)]
    Grammar(#[from] pi2_grammar::GrammarError),
    #[error("converting the model: {0}")]
    Convert(#[from] pi2_convert::ConvertError),
    #[error("{path}: {msg}")]
    Io { path: String, msg: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file or stream the user gave cannot be used; the message says which and why.
    #[error("{0}")]
    Input(String),
    /// A file's bytes no longer match the checksums it was written with.
    #[error("{} changed or is damaged: {why}", path.display())]
    Damaged { path: PathBuf, why: String },
    /// The request needs something the model or device lacks.
    #[error("{0}")]
    Unsupported(String),
}

impl RuntimeError {
    pub(crate) fn option(option: &'static str, msg: impl Into<String>) -> Self {
        RuntimeError::Option {
            option,
            msg: msg.into(),
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
