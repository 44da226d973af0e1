//! The generation loop shared by every front end: prefill the prompt, then sample and decode
//! until a limit or an end-of-generation token: one token a step, or with a [`Drafter`] a
//! checked draft of several (speculative decoding).

use crate::draft::{DraftConfig, DraftLength, Drafter};
use crate::engine::Logits;
use crate::guide::TokenLogprob;
use crate::sampler::Sampler;
use crate::Decoder;
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
    /// Speculative decoding: tokens drafted and checked, and of those kept.
    pub drafted: usize,
    pub accepted: usize,
    /// Forward passes of the generation phase (one per token without drafts).
    pub decode_passes: usize,
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
    /// Draft lengths, when a drafter is given to [`generate_drafted`].
    pub draft: DraftConfig,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_tokens: None,
            ignore_eos: false,
            n_batch: 512,
            draft: DraftConfig::default(),
        }
    }
}

/// Generate after `prompt`. Tokens already in the engine's cache that equal the prompt's prefix
/// are reused (chat turns); the rest is evaluated in batches of `cfg.n_batch`. `on_token` sees
/// each new token and returns false to stop.
pub fn generate(
    engine: &mut dyn Decoder<'_>,
    sampler: &mut Sampler,
    cached: &mut Vec<TokenId>,
    prompt: &[TokenId],
    cfg: &GenerateConfig,
    on_token: impl FnMut(TokenId) -> bool,
) -> Result<Generation, EngineError> {
    generate_drafted(engine, sampler, cached, prompt, cfg, None, on_token)
}

/// [`generate`] with speculative decoding when `drafter` is given: each step runs the sampled
/// token and a draft of up to `cfg.draft.max` guessed tokens in one forward pass (the engine's
/// batch buffers must hold `cfg.draft.max + 1` tokens), samples the target's distribution at
/// each drafted position in turn, keeps the guesses while the sample equals them, and takes the
/// first sample that differs (or the one after a draft kept whole) as the next token; the
/// cache is cut back to what was kept. The tokens come out distributed as plain decode's
/// (greedy: the same tokens, up to the batch's rounding against one-token steps).
pub fn generate_drafted(
    engine: &mut dyn Decoder<'_>,
    sampler: &mut Sampler,
    cached: &mut Vec<TokenId>,
    prompt: &[TokenId],
    cfg: &GenerateConfig,
    drafter: Option<&mut dyn Drafter>,
    mut on_token: impl FnMut(TokenId) -> bool,
) -> Result<Generation, EngineError> {
    generate_scored(engine, sampler, cached, prompt, cfg, drafter, |t, _| {
        on_token(t)
    })
}

/// [`generate_drafted`] whose `on_token` also sees each token's log probability (when the
/// sampler records them: [`Sampler::with_logprobs`]). A sampler's constraint ends the
/// generation when it is complete ([`StopReason::EndOfGeneration`]) and fails it with
/// [`EngineError::Constraint`] when it breaks.
pub fn generate_scored(
    engine: &mut dyn Decoder<'_>,
    sampler: &mut Sampler,
    cached: &mut Vec<TokenId>,
    prompt: &[TokenId],
    cfg: &GenerateConfig,
    mut drafter: Option<&mut dyn Drafter>,
    mut on_token: impl FnMut(TokenId, Option<&TokenLogprob>) -> bool,
) -> Result<Generation, EngineError> {
    if drafter.is_some() && !engine.checks_batches_as_decode() {
        return Err(EngineError::Drafts(
            "a sparse mixture-of-experts model routes a checked draft's experts densely, unlike its one-token steps; decode without drafts".into(),
        ));
    }
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
        logits.extend_from_slice(engine.forward_prompt(part)?);
        cached.extend_from_slice(part);
    }
    let prompt_time = t0.elapsed();
    // The engine's counts (bytes read, neurons, head rows) are of the generation from here.
    engine.reset_stats();

    let t1 = Instant::now();
    let mut run = Run {
        eog: engine.model().tokenizer.eog.clone(),
        cfg,
        out: Vec::new(),
        drafted: 0,
        accepted: 0,
        passes: 0,
        failed: None,
    };
    let mut length = DraftLength::new(cfg.draft);
    let n_vocab = engine.model().config.n_vocab;
    // A token sampled from a checked draft's pass, not yet run.
    let mut pending: Option<TokenId> = None;
    let stop = loop {
        let next = match pending.take() {
            Some(t) => t,
            None => draw(sampler, &mut logits)?,
        };
        if let Some(stop) = run.take(
            next,
            sampler,
            engine.n_past(),
            engine.n_ctx(),
            &mut on_token,
        ) {
            break stop;
        }
        let room = engine.n_ctx() - engine.n_past() - 1;
        let want = length.get().min(room).min(run.left());
        let draft = match drafter.as_deref_mut() {
            Some(d) if want >= cfg.draft.min.max(1) => {
                let mut history = cached.clone();
                history.push(next);
                let mut d = d.propose_on(engine, &history, want)?;
                d.truncate(want);
                d
            }
            _ => Vec::new(),
        };
        run.passes += 1;
        if draft.len() < cfg.draft.min.max(1) {
            logits.copy_from_slice(engine.forward(&[next], Logits::Last)?);
            cached.push(next);
            continue;
        }
        let base = engine.n_past();
        let mut batch = Vec::with_capacity(draft.len() + 1);
        batch.push(next);
        batch.extend_from_slice(&draft);
        let (n_ctx, checked) = (
            engine.n_ctx(),
            engine.forward_decode(&batch, Logits::From(0))?,
        );
        cached.push(next);
        run.drafted += draft.len();
        let mut kept = 0;
        let mut stopped = None;
        for (i, &guess) in draft.iter().enumerate() {
            logits.copy_from_slice(&checked[i * n_vocab..(i + 1) * n_vocab]);
            let t = draw(sampler, &mut logits)?;
            if t != guess {
                pending = Some(t);
                break;
            }
            kept += 1;
            run.accepted += 1;
            cached.push(t);
            // In plain decode `t` would follow `next` and the kept guesses.
            let past = base + 1 + i;
            if let Some(stop) = run.take(t, sampler, past, n_ctx, &mut on_token) {
                stopped = Some(stop);
                break;
            }
        }
        if stopped.is_none() && pending.is_none() {
            // The whole draft was kept: its last row gives the next token.
            let last = draft.len();
            logits.copy_from_slice(&checked[last * n_vocab..(last + 1) * n_vocab]);
        }
        length.update(draft.len(), kept);
        // The cache takes back the rejected tokens (it keeps what a checked draft needs; a
        // cache that could not would be a wrong answer, so it is an error).
        let want = base + 1 + kept;
        if engine.truncate(want) != want {
            return Err(EngineError::Drafts(format!(
                "the cache could not take back rejected draft tokens to position {want}"
            )));
        }
        cached.truncate(want);
        if let Some(stop) = stopped {
            break stop;
        }
    };
    if let Some(e) = run.failed {
        return Err(EngineError::Constraint(e));
    }
    Ok(Generation {
        tokens: run.out,
        stop,
        prompt_n: rest.len(),
        prompt_time,
        predicted_time: t1.elapsed(),
        drafted: run.drafted,
        accepted: run.accepted,
        decode_passes: run.passes,
    })
}

/// The sampler's draw from `logits`, or why its constraint failed.
fn draw(sampler: &mut Sampler, logits: &mut [f32]) -> Result<TokenId, EngineError> {
    let t = sampler.sample(logits);
    match sampler.take_failure() {
        Some(e) => Err(EngineError::Constraint(e)),
        None => Ok(t),
    }
}

/// The generated tokens and the rules every new one passes.
struct Run<'c> {
    eog: Vec<TokenId>,
    cfg: &'c GenerateConfig,
    out: Vec<TokenId>,
    drafted: usize,
    accepted: usize,
    passes: usize,
    /// The constraint refused a taken token.
    failed: Option<String>,
}

impl Run<'_> {
    /// Tokens still allowed (`usize::MAX` without a limit).
    fn left(&self) -> usize {
        self.cfg
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.out.len()))
    }

    /// Takes `t` as the next output token, or says why generation stops before or after it
    /// (`past`: positions run before `t`).
    fn take(
        &mut self,
        t: TokenId,
        sampler: &mut Sampler,
        past: usize,
        n_ctx: usize,
        on_token: &mut impl FnMut(TokenId, Option<&TokenLogprob>) -> bool,
    ) -> Option<StopReason> {
        if self.left() == 0 {
            return Some(StopReason::Limit);
        }
        if !self.cfg.ignore_eos && self.eog.contains(&t) {
            return Some(StopReason::EndOfGeneration);
        }
        sampler.commit(t);
        if let Some(e) = sampler.take_failure() {
            self.failed = Some(e);
            return Some(StopReason::Callback);
        }
        self.out.push(t);
        if !on_token(t, sampler.last_logprob()) {
            return Some(StopReason::Callback);
        }
        if sampler.finished() {
            return Some(StopReason::EndOfGeneration);
        }
        if self.left() == 0 {
            return Some(StopReason::Limit);
        }
        if past >= n_ctx {
            return Some(StopReason::ContextFull);
        }
        None
    }
}
