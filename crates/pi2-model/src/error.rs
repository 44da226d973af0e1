//! The one error type of pi2-model: each variant names what was being read and why it failed.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic bytes {0:02x?}, expected \"GGUF\")")]
    NotGguf([u8; 4]),
    #[error("unsupported GGUF version {0} (pi2 reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("GGUF file is truncated: {what} at byte {offset} runs past the end of the file ({len} bytes)")]
    Truncated { what: String, offset: u64, len: u64 },
    #[error("GGUF file is corrupt: {0}")]
    Corrupt(String),
    #[error("GGUF file exceeds a safety limit: {what} is {value}, the limit is {limit}")]
    LimitExceeded {
        what: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("model metadata lacks required key `{0}`")]
    MissingKey(String),
    #[error("model metadata key `{key}` has type {got}, expected {expected}")]
    WrongKeyType {
        key: String,
        expected: &'static str,
        got: &'static str,
    },
    #[error("model lacks tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("tensor `{name}` has type {ty}, which pi2 does not support (supported: {supported}); convert the model to one of those types, e.g. with llama.cpp's llama-quantize", supported = supported_types())]
    UnsupportedTensorType { name: String, ty: String },
    #[error("unsupported architecture `{0}` (pi2 supports: llama, qwen2)")]
    UnsupportedArch(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// The tensor types pi2 loads, comma-separated, for error messages.
fn supported_types() -> String {
    pi2_kernels::QuantType::ALL
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
