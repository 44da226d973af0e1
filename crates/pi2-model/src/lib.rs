//! pi2-model: everything about a model file that is not computation.
//!
//! - [`gguf`]: zero-copy GGUF reader with caps against hostile files; [`writer`] writes GGUF.
//! - [`arch`]: llama-family hyper-parameters and the checked tensor directory.
//! - [`tokenizer`]: GGUF vocabularies (byte-level BPE, SentencePiece-style).
//! - [`chat`]: chat templates from `tokenizer.chat_template`.
//! - [`synth`]: small generated models for tests; [`stand_in`]: full-size stand-ins with
//!   planted activation statistics.
//!
//! [`Model::load`] ties them together.

pub mod answer;
pub mod arch;
pub mod bundle;
pub mod chat;
pub mod chat_builtin;
pub mod checksum;
pub mod error;
pub mod fim;
pub mod gguf;
#[cfg(any(target_os = "linux", target_os = "android"))]
mod isolate;
mod pyjson;
/// Random-weight model files from recipes shared with llama.cpp (feature `synth`).
#[cfg(feature = "synth")]
pub mod recipe;
mod rng;
mod specials;
pub mod stand_in;
mod strftime;
/// Small generated models for tests (feature `synth`): not part of the stable API.
#[cfg(feature = "synth")]
pub mod synth;
pub mod tokenizer;
mod vocab;
pub mod writer;

pub use arch::{
    Arch, DeltaNet, EveryNth, ExpertNorms, FfnAct, GateFunc, Gating, Heads, LayerWeights, Mixer,
    ModelConfig, PerLayerGate, PerLayerInput, RopeKind, SlidingWindow, TensorView, Weights,
    KEY_FFN_ACTIVATION,
};
pub use chat::{ChatTemplate, FunctionCall, Message, ToolCall};
pub use error::{ModelError, Result};
pub use gguf::{GgufFile, Strings, TensorInfo, Value};
pub use tokenizer::{TokenId, Tokenizer};

use std::path::Path;

/// A loaded model: the mapped file, its configuration, checked weight views and tokenizer.
#[derive(Debug)]
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, if the file has one.
    pub chat_template: Option<String>,
    /// `general.name`, if set.
    pub name: Option<String>,
}

impl Model {
    /// Open, parse and check a GGUF model.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(GgufFile::open(path)?)
    }

    /// Check an already parsed file.
    pub fn from_file(file: GgufFile) -> Result<Self> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = Weights::from_gguf(&file, &config)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        if tokenizer.vocab_size() != config.n_vocab {
            return Err(ModelError::Corrupt(format!(
                "tokenizer has {} tokens but the embedding has {} rows",
                tokenizer.vocab_size(),
                config.n_vocab
            )));
        }
        let chat_template = file
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        let name = file
            .get("general.name")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Self {
            file,
            config,
            weights,
            tokenizer,
            chat_template,
            name,
        })
    }

    /// The template used when the file has none: Gemma's turns for a vocabulary that has
    /// them, else ChatML.
    pub fn default_chat_template(&self) -> &'static str {
        let t = &self.tokenizer;
        match (t.token_id("<start_of_turn>"), t.token_id("<end_of_turn>")) {
            (Some(_), Some(_)) => chat::GEMMA,
            _ => chat::CHATML,
        }
    }

    /// The chat template (the model's own, or [`Model::default_chat_template`]), rendering
    /// without a leading BOS when the tokenizer adds one.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let text = |id: Option<TokenId>| {
            id.and_then(|i| self.tokenizer.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        ChatTemplate::new(
            self.chat_template
                .as_deref()
                .unwrap_or(self.default_chat_template()),
            &text(self.tokenizer.bos),
            &text(self.tokenizer.eos),
        )
        .map(|t| t.strip_leading_bos(self.tokenizer.add_bos))
    }

    /// Parameter count (elements of all tensors).
    pub fn n_params(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.n_elements()).sum()
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
