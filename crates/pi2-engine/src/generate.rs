//! The generation loop shared by every front end: prefill the prompt, then sample and decode
//! one token at a time until a limit or an end-of-generation token.

use crate::engine::{Engine, Logits};
use crate::sampler::Sampler;
use crate::EngineError;
use pi2_model::TokenId;
use std::time::{Duration, Instant};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token (not included in the output).
    EndOfGeneration,
    /// `max_tokens` reached.
    Limit,
    /// The context is full.
    ContextFull,
    /// The callback asked to stop.
    Callback,
}

/// Result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<TokenId>,
    pub stop: StopReason,
    /// Tokens evaluated in the prompt phase (those not already in the cache).
    pub prompt_n: usize,
    pub prompt_time: Duration,
    /// Time for every sampled token after the first: decode forward passes plus sampling.
    pub predicted_time: Duration,
}

/// Settings for [`generate`].
#[derive(Clone, Debug)]
pub struct GenerateConfig {
    /// Stop after this many tokens (None = until end of generation or a full context).
    pub max_tokens: Option<usize>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// The prompt is evaluated in batches of at most this many tokens (llama.cpp's
    /// `n_batch`): what the engine's batch buffers, and an offload budget, were sized for.
    pub n_batch: usize,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_tokens: None,
            ignore_eos: false,
            n_batch: 512,
        }
    }
}

/// Generate after `prompt`. Tokens already in the engine's cache that equal the prompt's prefix
/// are reused (chat turns); the rest is evaluated in batches of `cfg.n_batch`. `on_token` sees
/// each new token and returns false to stop.
pub fn generate(
    engine: &mut Engine<'_>,
    sampler: &mut Sampler,
    cached: &mut Vec<TokenId>,
    prompt: &[TokenId],
    cfg: &GenerateConfig,
    mut on_token: impl FnMut(TokenId) -> bool,
) -> Result<Generation, EngineError> {
    let common = cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1));
    let common = engine.truncate(common);
    cached.truncate(common);
    for &t in prompt {
        sampler.accept(t);
    }
    // Start-up work (weight repacking) belongs to loading, not to the prompt's time.
    engine.prepare();
    let t0 = Instant::now();
    let rest = &prompt[common..];
    let mut logits = Vec::new();
    for part in rest.chunks(cfg.n_batch.max(1)) {
        logits.clear();
        logits.extend_from_slice(engine.forward(part, Logits::Last)?);
        cached.extend_from_slice(part);
    }
    let prompt_time = t0.elapsed();

    let t1 = Instant::now();
    let tok = engine.model().tokenizer.eog.clone();
    let mut out = Vec::new();
    let stop = loop {
        if cfg.max_tokens.is_some_and(|m| out.len() >= m) {
            break StopReason::Limit;
        }
        let next = sampler.sample(&mut logits);
        if !cfg.ignore_eos && tok.contains(&next) {
            break StopReason::EndOfGeneration;
        }
        sampler.accept(next);
        out.push(next);
        if !on_token(next) {
            break StopReason::Callback;
        }
        if cfg.max_tokens.is_some_and(|m| out.len() >= m) {
            break StopReason::Limit;
        }
        if engine.n_past() >= engine.n_ctx() {
            break StopReason::ContextFull;
        }
        logits.copy_from_slice(engine.forward(&[next], Logits::Last)?);
        cached.push(next);
    };
    Ok(Generation {
        tokens: out,
        stop,
        prompt_n: rest.len(),
        prompt_time,
        predicted_time: t1.elapsed(),
    })
}
