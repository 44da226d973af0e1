//! Owned handles for programs that embed pi2 (the C API, the Python package): a [`LoadedModel`]
//! owns its model file and prepared weights, and a [`Session`] owns an engine with its own KV
//! cache, keeping its model alive. [`generate_text`] turns a prompt into streamed text (whole
//! UTF-8 characters, stop strings cut) for them and for the server's slots.

use crate::error::{Result, RuntimeError};
use crate::text::{StopStrings, Utf8Stream};
use crate::{Prepared, SessionOptions};
use pi2_engine::{
    generate_scored, Decoder, DraftConfig, Engine, GenerateConfig, Generation, Lookup, Sampler,
    SamplerConfig, StopReason, TokenLogprob,
};
use pi2_grammar::{Grammar, GrammarSpec, Vocabulary};
use pi2_model::{Model, TokenId};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

self_cell::self_cell!(
    struct ModelCell {
        owner: Model,
        #[covariant]
        dependent: Prepared,
    }
);

/// A model opened for sessions: the file (a path or a catalogue name), under a memory budget its
/// conversion, and its prepared weights. Shared by its sessions (`Arc`); safe to use from
/// several threads.
pub struct LoadedModel {
    cell: ModelCell,
    sessions: AtomicUsize,
    /// The vocabulary grammars compile against, built on first use.
    vocabulary: OnceLock<Arc<Vocabulary>>,
}

impl LoadedModel {
    /// Opens `spec` (a path, a catalogue name, or the default model for `None`) with `opts`
    /// ([`crate::open::model_file`]: a budget on a plain GGUF runs its cached conversion);
    /// `notice` hears about fetches and conversions.
    pub fn open(
        spec: Option<&Path>,
        opts: &SessionOptions,
        notice: &mut dyn FnMut(crate::open::Notice),
    ) -> Result<Arc<Self>> {
        // Options are checked before anything is fetched or converted.
        opts.engine.config()?;
        let path = crate::open::resolve(spec, notice)?;
        let (path, opts) = crate::open::model_file(&path, opts, notice)?;
        let model = crate::load_model(&path)?;
        let cell = ModelCell::try_new(model, |m| crate::prepare(m, &path, &opts))?;
        Ok(Arc::new(Self {
            cell,
            sessions: AtomicUsize::new(0),
            vocabulary: OnceLock::new(),
        }))
    }

    /// Compiles `spec` against this model's vocabulary (built once, on first use).
    pub fn grammar(&self, spec: &GrammarSpec) -> Result<Arc<Grammar>> {
        let vocab = match self.vocabulary.get() {
            Some(v) => v,
            None => {
                let v = Vocabulary::new(&self.model().tokenizer)?;
                self.vocabulary.get_or_init(|| v)
            }
        };
        Ok(Arc::new(vocab.compile(spec)?))
    }

    pub fn model(&self) -> &Model {
        self.cell.borrow_owner()
    }

    pub fn prepared(&self) -> &Prepared<'_> {
        self.cell.borrow_dependent()
    }

    /// Sessions open on this model now.
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Acquire)
    }
}

/// A session's engine and the tokens its KV cache holds.
pub struct SessionState<'p> {
    pub engine: Engine<'p>,
    pub cached: Vec<TokenId>,
    /// The prompt batch the engine's buffers hold.
    pub n_batch: usize,
    /// The last generation's counts.
    pub last: Option<Stats>,
}

self_cell::self_cell!(
    struct SessionCell {
        owner: Arc<LoadedModel>,
        #[not_covariant]
        dependent: SessionState,
    }
);

/// A conversation: an engine with its own KV cache on a [`LoadedModel`]. The next generation
/// reuses the cache's common prefix with its prompt. Used from one thread at a time.
pub struct Session {
    cell: SessionCell,
}

/// Prompt batch of sessions in memory.
pub const SESSION_BATCH: usize = 512;
/// Prompt batch of sessions under a memory budget: buffers for 512-token batches would take
/// the neuron cache's room on every decode step (see docs/measurements/embedding-apis-*).
pub const SESSION_BATCH_BUDGET: usize = 64;

impl Session {
    /// A new session on `model` with the default prompt batch ([`SESSION_BATCH`], or
    /// [`SESSION_BATCH_BUDGET`] under a memory budget).
    pub fn new(model: Arc<LoadedModel>) -> Result<Self> {
        let n_batch = match model.prepared().offloads() {
            true => SESSION_BATCH_BUDGET,
            false => SESSION_BATCH,
        };
        Self::with_batch(model, n_batch)
    }

    /// A new session on `model` whose prompt is evaluated in batches of up to `n_batch` tokens
    /// (fewer where a budget cannot hold their buffers). Under a memory budget a model holds
    /// one session (a second engine would need its own neuron cache inside the same budget).
    pub fn with_batch(model: Arc<LoadedModel>, n_batch: usize) -> Result<Self> {
        if !(1..=pi2_engine::MAX_CTX).contains(&n_batch) {
            return Err(RuntimeError::option(
                "--batch-size",
                format!("{n_batch} is outside 1..{}", pi2_engine::MAX_CTX),
            ));
        }
        let offloads = model.prepared().offloads();
        let before = model.sessions.fetch_add(1, Ordering::AcqRel);
        if offloads && before > 0 {
            model.sessions.fetch_sub(1, Ordering::AcqRel);
            return Err(RuntimeError::option(
                "mem_budget",
                "a model under a memory budget holds one session (each would need its own neuron cache inside the budget); close the other session first",
            ));
        }
        let cell = SessionCell::try_new(model.clone(), |m| {
            let (engine, n_batch) = m.prepared().engine_within_budget(n_batch)?;
            Ok::<_, RuntimeError>(SessionState {
                engine,
                cached: Vec::new(),
                n_batch,
                last: None,
            })
        });
        match cell {
            Ok(cell) => Ok(Self { cell }),
            Err(e) => {
                model.sessions.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        self.cell.borrow_owner()
    }

    /// The engine's context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.cell.with_dependent(|_, s| s.engine.n_ctx())
    }

    /// Generates from `prompt` (see [`generate_text`]); the counts are kept for [`Session::stats`].
    pub fn generate(
        &mut self,
        prompt: &[TokenId],
        req: &TextRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<TextOutcome> {
        self.generate_pieces(prompt, req, &mut |p| p.text.is_empty() || on_text(p.text))
    }

    /// [`Session::generate`] passing [`Piece`]s: the text with its tokens' log probabilities
    /// (when [`TextRequest::logprobs`] asks for them).
    pub fn generate_pieces(
        &mut self,
        prompt: &[TokenId],
        req: &TextRequest,
        on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
    ) -> Result<TextOutcome> {
        self.cell.with_dependent_mut(|_, s| {
            let out = generate_pieces(
                &mut s.engine,
                &mut s.cached,
                s.n_batch,
                prompt,
                req,
                None,
                on_piece,
            )?;
            s.last = Some(Stats::of(&s.engine, &out.generation));
            Ok(out)
        })
    }

    /// The embedding of `tokens` (see [`crate::embed::embed`]); the conversation is forgotten
    /// (the evaluation takes the KV cache).
    pub fn embed(
        &mut self,
        tokens: &[TokenId],
        pooling: crate::embed::Pooling,
    ) -> Result<Vec<f32>> {
        self.cell.with_dependent_mut(|_, s| {
            s.cached.clear();
            crate::embed::embed(&mut s.engine, tokens, s.n_batch, pooling)
        })
    }

    /// The last generation's counts (`None` before the first).
    pub fn stats(&self) -> Option<Stats> {
        self.cell.with_dependent(|_, s| s.last.clone())
    }

    /// Forgets the conversation: the next generation evaluates its whole prompt.
    pub fn reset(&mut self) {
        self.cell.with_dependent_mut(|_, s| {
            s.engine.truncate(0);
            s.cached.clear();
        });
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.model().sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a generation asks for.
#[derive(Clone, Debug)]
pub struct TextRequest {
    pub sampler: SamplerConfig,
    /// Tokens to generate at most (`None`: until end of generation or a full context).
    pub max_tokens: Option<usize>,
    /// Text that ends the generation (not included in it).
    pub stops: Vec<String>,
    pub ignore_eos: bool,
    /// Prompt-lookup drafts of up to this many tokens (0: plain decode).
    pub draft_max: usize,
    /// The output follows this grammar (see [`LoadedModel::grammar`]).
    pub grammar: Option<Arc<Grammar>>,
    /// Report each token's log probability with this many alternatives ([`Piece::logprobs`]).
    pub logprobs: Option<usize>,
    /// Control tokens whose text the answer shows: a chat dialect's markers, which the answer
    /// is read back by ([`pi2_model::answer::Dialect::shown_ids`]). Others show as nothing.
    pub shown_tokens: Vec<TokenId>,
}

impl Default for TextRequest {
    fn default() -> Self {
        Self {
            sampler: SamplerConfig::default(),
            max_tokens: Some(256),
            stops: Vec::new(),
            ignore_eos: false,
            draft_max: 0,
            grammar: None,
            logprobs: None,
            shown_tokens: Vec::new(),
        }
    }
}

/// What [`generate_pieces`] passes on: released text, and the log probabilities of the tokens
/// generated since the last piece (when asked for: [`TextRequest::logprobs`]). A token whose
/// text is not released yet (half a character, a possible stop string) comes with a later
/// piece; the last piece carries what is left, even with no text.
#[derive(Debug)]
pub struct Piece<'a> {
    pub text: &'a str,
    pub logprobs: &'a [TokenLogprob],
}

/// How a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens`, or a full context.
    Length,
    /// The text callback asked to stop.
    Cancelled,
}

/// What [`generate_text`] did.
#[derive(Debug)]
pub struct TextOutcome {
    pub generation: Generation,
    pub finish: Finish,
    /// The stop string that ended the text, if one did.
    pub stop_word: Option<String>,
}

/// Generates from `prompt` on `engine` (whose cache holds `cached`, reused where it agrees with
/// the prompt), passing text to `on_text` in whole UTF-8 characters with stop strings cut; the
/// callback returns `false` to stop. The engine's batch buffers hold `n_batch` tokens.
pub fn generate_text(
    engine: &mut dyn Decoder<'_>,
    cached: &mut Vec<TokenId>,
    n_batch: usize,
    prompt: &[TokenId],
    req: &TextRequest,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<TextOutcome> {
    generate_pieces(engine, cached, n_batch, prompt, req, None, &mut |p| {
        p.text.is_empty() || on_text(p.text)
    })
}

/// [`generate_text`] passing [`Piece`]s: the text with the log probabilities of its tokens.
/// With `req.draft_max` > 0 drafts come from `drafter` (a draft model's, say), or without one
/// from prompt lookup.
pub fn generate_pieces(
    engine: &mut dyn Decoder<'_>,
    cached: &mut Vec<TokenId>,
    n_batch: usize,
    prompt: &[TokenId],
    req: &TextRequest,
    drafter: Option<&mut dyn pi2_engine::Drafter>,
    on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
) -> Result<TextOutcome> {
    if prompt.is_empty() {
        return Err(RuntimeError::option(
            "prompt",
            "has no tokens: give some text",
        ));
    }
    if prompt.len() >= engine.n_ctx() {
        return Err(RuntimeError::option(
            "prompt",
            format!(
                "is {} tokens, longer than the context of {} (raise the context size)",
                prompt.len(),
                engine.n_ctx()
            ),
        ));
    }
    let vocab = engine.model().config.n_vocab;
    if let Some((i, t)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(RuntimeError::option(
            "prompt",
            format!("token {t} at position {i} is outside the vocabulary of {vocab}"),
        ));
    }
    if let Some((t, _)) = req
        .sampler
        .logit_bias
        .iter()
        .find(|b| b.0 as usize >= vocab)
    {
        return Err(RuntimeError::option(
            "logit_bias",
            format!("token {t} is outside the vocabulary of {vocab}"),
        ));
    }
    if let Some((name, v, want)) = crate::options::sampling_problem(&req.sampler) {
        return Err(RuntimeError::Option {
            option: name,
            msg: format!("{v} must be {want}"),
        });
    }
    let model = engine.model();
    let tok = &model.tokenizer;
    let mut sampler = Sampler::new(req.sampler.clone());
    if let Some(g) = &req.grammar {
        sampler = sampler.with_constraint(Box::new(g.start()));
    }
    if let Some(n) = req.logprobs {
        sampler = sampler.with_logprobs(n);
    }
    // Log probabilities of tokens whose text is not released yet.
    let mut scored: Vec<TokenLogprob> = Vec::new();
    let mut utf8 = Utf8Stream::default();
    let mut stops = StopStrings::new(req.stops.iter().cloned());
    // A checked draft and its token fit the engine's batch buffers.
    let draft_max = req.draft_max.min(n_batch.saturating_sub(1));
    let cfg = GenerateConfig {
        max_tokens: req.max_tokens,
        ignore_eos: req.ignore_eos,
        n_batch,
        draft: DraftConfig {
            max: draft_max.max(1),
            min: 1,
        },
    };
    let mut lookup = Lookup::default();
    let drafter: Option<&mut dyn pi2_engine::Drafter> = match (draft_max > 0, drafter) {
        (false, _) => None,
        (true, Some(d)) => Some(d),
        (true, None) => Some(&mut lookup),
    };
    let mut cancelled = false;
    let generation = generate_scored(
        engine,
        &mut sampler,
        cached,
        prompt,
        &cfg,
        drafter,
        |id, lp| {
            scored.extend(lp.cloned());
            let shown = req.shown_tokens.contains(&id);
            let text = stops.push(&utf8.push(&tok.token_bytes(id, shown)));
            if !text.is_empty() {
                let go = on_piece(Piece {
                    text: &text,
                    logprobs: &scored,
                });
                scored.clear();
                if !go {
                    cancelled = true;
                    return false;
                }
            }
            !stops.stopped()
        },
    );
    let generation = match generation {
        Ok(g) => g,
        Err(e) => {
            // The cache may hold half a batch: the next generation starts afresh (and a budget
            // too full for it gets its memory back).
            engine.release();
            cached.clear();
            return Err(e.into());
        }
    };
    let tail = stops.push(&utf8.finish()) + &stops.finish();
    let piece = Piece {
        text: &tail,
        logprobs: &scored,
    };
    let nothing_left = tail.is_empty() && scored.is_empty();
    if !(cancelled || nothing_left || on_piece(piece)) {
        cancelled = true;
    }
    let finish = match generation.stop {
        _ if cancelled => Finish::Cancelled,
        StopReason::Limit | StopReason::ContextFull => Finish::Length,
        StopReason::EndOfGeneration | StopReason::Callback => Finish::Stop,
    };
    Ok(TextOutcome {
        generation,
        finish,
        stop_word: stops.matched().map(str::to_string),
    })
}

/// A generation's counts, as `pi2 run --json` reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    pub generated_tokens: usize,
    pub generated_ms: f64,
    /// Generated tokens per second (after the first, as llama.cpp counts).
    pub tokens_per_second: f64,
    /// Bytes read from flash per generated token (0 in memory).
    pub bytes_read_per_token: f64,
    /// This process's peak resident memory (`None` where the OS does not say).
    pub peak_rss_bytes: Option<u64>,
    pub drafted: usize,
    pub accepted: usize,
}

impl Stats {
    pub fn of(engine: &Engine<'_>, g: &Generation) -> Self {
        let prompt_ms = g.prompt_time.as_secs_f64() * 1e3;
        let generated_ms = g.predicted_time.as_secs_f64() * 1e3;
        let bytes = crate::report::bytes_read_json(engine, g.tokens.len())["total"]
            .as_f64()
            .unwrap_or(0.0);
        Self {
            prompt_tokens: g.prompt_n,
            prompt_ms,
            generated_tokens: g.tokens.len(),
            generated_ms,
            tokens_per_second: if generated_ms > 0.0 {
                g.tokens.len() as f64 * 1e3 / generated_ms
            } else {
                0.0
            },
            bytes_read_per_token: bytes,
            peak_rss_bytes: crate::report::peak_rss_bytes(),
            drafted: g.drafted,
            accepted: g.accepted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<LoadedModel>();
        send::<Session>();
    }
}
