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
    #[error("model metadata lacks required key `{}`", shown(.0))]
    MissingKey(String),
    #[error("model metadata key `{}` has type {got}, expected {expected}", shown(.key))]
    WrongKeyType {
        key: String,
        expected: &'static str,
        got: &'static str,
    },
    #[error("model lacks tensor `{}`", shown(.0))]
    MissingTensor(String),
    #[error("tensor `{}` has shape {got:?}, expected {expected:?}", shown(.name))]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("tensor `{}` has type {ty}, which pi2 does not support (supported: {supported}); convert the model to one of those types, e.g. with llama.cpp's llama-quantize", shown(.name), supported = supported_types())]
    UnsupportedTensorType { name: String, ty: String },
    #[error("unsupported architecture `{}` (pi2 supports: {})", shown(.0), supported_archs())]
    UnsupportedArch(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// A name from a file as an error shows it: control characters (a hostile file's escape
/// sequences, newlines) escaped, so an error stays one readable line.
pub(crate) fn shown(name: &str) -> String {
    name.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// The architectures pi2 reads, comma-separated, for error messages.
fn supported_archs() -> String {
    crate::arch::FAMILIES
        .iter()
        .map(|f| f.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The tensor types pi2 loads, comma-separated, for error messages.
fn supported_types() -> String {
    pi2_kernels::QuantType::ALL
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_files_are_shown_on_one_line() {
        let e = ModelError::MissingKey("a\x1b[2J\nb".into()).to_string();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(e.contains("a\\u{1b}[2J\\nb"), "{e}");
        let e = ModelError::UnsupportedArch("mamba".into()).to_string();
        for f in crate::arch::FAMILIES {
            assert!(e.contains(f.name), "{e}");
        }
    }
}
