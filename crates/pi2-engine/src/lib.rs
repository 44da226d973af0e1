//! pi2-engine: the inference engine.
//!
//! [`Engine`] runs llama-family transformers from a [`pi2_model::Model`]: batched dense prefill,
//! token-by-token decode, a growable KV cache (a ring for sliding-window layers), all matrix work
//! on a persistent worker pool.
//! [`Sampler`] turns logits into tokens (greedy, temperature, top-k, top-p, repetition penalty).

mod attention;
mod decoder;
mod delta;
mod draft;
mod draft_model;
mod engine;
mod error;
mod ffn;
mod generate;
mod guide;
mod head;
mod kv;
mod mixer;
mod moe;
mod neurons;
pub mod offload;
mod packed;
mod per_layer;
pub mod perplexity;
mod pipeline;
mod residency;
mod sampler;
mod scratch;
mod shared;
mod sparse;
mod states;
pub mod topology;
mod weights;

pub use decoder::Decoder;
pub use draft::{DraftConfig, Drafter, Lookup, SelfDraft, MAX_DRAFT};
pub use draft_model::{vocabulary_mismatch, ModelDraft};
pub use engine::{
    kv_bytes_full, kv_bytes_start, scratch_bytes, Engine, EngineConfig, EngineParts, Logits,
    NeuronStep, SequenceCache, MAX_CTX,
};
pub use error::EngineError;
pub use generate::{
    generate, generate_drafted, generate_scored, GenerateConfig, Generation, StopReason,
};
pub use guide::{TokenConstraint, TokenLogprob};
pub use head::{ClusteredHead, HeadStats};
pub use kv::kv_bytes;
pub use moe::RoutingStats;
pub use neurons::fires;
pub use offload::{
    expert_budget, min_budget, planned_min_budget, regions, ExpertBudget, ExpertCache, ExpertStats,
    ExpertStream, Offload, OffloadConfig, OffloadStats, PlannedConversion, Regions,
};
pub use perplexity::{nll, perplexity, PerplexityConfig, PerplexityStep};
pub use sampler::{argmax, Sampler, SamplerConfig};
pub use shared::{BatchStats, SharedEngine, SharedSequence};
pub use sparse::{
    check_thresholds, load_sparse, profile_activation, transposed, unit_frequencies,
    verify_checksums, Blob, PredictorWeights, SparseFfn, SparseLayer, SparseStats, Weight,
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
