//! Slots: each on its own thread, fed from one bounded queue. In memory each slot has its own
//! engine; under a memory budget the slots share one engine (one neuron cache, one budget, a KV
//! cache per slot) whose decode steps run as one batch ([`pi2_engine::SharedEngine`]). A slot
//! keeps its conversation's KV cache between requests (the next request reuses the common
//! prefix), and stops generating as soon as its client is gone.

use crate::api::{Finish, Summary};
use crate::metrics::Metrics;
use crate::sched::Scheduler;
use pi2_engine::{
    Decoder, Drafter, Engine, EngineError, ModelDraft, SamplerConfig, SharedEngine, SharedSequence,
    TokenLogprob,
};
use pi2_grammar::Grammar;
use pi2_model::TokenId;
use pi2_runtime::handle::{generate_pieces, Finish as RunFinish, TextRequest};
use pi2_runtime::Prepared;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What a slot sends back while it works on a job.
#[derive(Debug)]
pub enum Event {
    /// Generated text, whole characters, stop strings cut, with its tokens' log
    /// probabilities when the job asks for them.
    Text(String, Vec<TokenLogprob>),
    Done(Summary),
    /// The engine failed; the message says why.
    Failed(String),
    /// The memory budget cannot hold this request's KV cache beside the other slots': retry
    /// when they are done (503).
    Busy(String),
    /// An embedding job's vector.
    Embedding(Vec<f32>),
    /// A slot action's answer.
    Slot(serde_json::Value),
}

/// One generation request, ready for a slot.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<TokenId>,
    pub sampler: SamplerConfig,
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    pub ignore_eos: bool,
    /// Send text as it comes (else once, at the end: no wake-up of the HTTP side per token).
    pub stream: bool,
    /// Where drafts come from, and the longest one checked.
    pub drafts: crate::api::Drafts,
    pub draft_max: usize,
    /// The output follows this grammar.
    pub grammar: Option<Arc<Grammar>>,
    /// Report log probabilities with this many alternatives.
    pub logprobs: Option<usize>,
    /// Control tokens shown as text (the chat dialect's markers).
    pub shown_tokens: Vec<TokenId>,
    /// Not a generation: the prompt's embedding, pooled so.
    pub embed: Option<pi2_runtime::embed::Pooling>,
    /// Not a generation: the slot's KV cache saved, restored or erased.
    pub slot_action: Option<crate::slot_file::SlotAction>,
    pub events: mpsc::Sender<Event>,
}

impl Job {
    /// A slot action, answered on `events`.
    pub fn slot(action: crate::slot_file::SlotAction, events: mpsc::Sender<Event>) -> Self {
        Job {
            slot_action: Some(action),
            ..Job::not_generating(Vec::new(), events)
        }
    }

    /// The embedding of `prompt`, pooled so, answered on `events`.
    pub fn embedding(
        prompt: Vec<TokenId>,
        pooling: pi2_runtime::embed::Pooling,
        events: mpsc::Sender<Event>,
    ) -> Self {
        Job {
            embed: Some(pooling),
            ..Job::not_generating(prompt, events)
        }
    }

    /// A job that generates nothing (the base of the two above).
    fn not_generating(prompt: Vec<TokenId>, events: mpsc::Sender<Event>) -> Self {
        Job {
            prompt,
            sampler: SamplerConfig::default(),
            max_tokens: None,
            stops: Vec::new(),
            ignore_eos: false,
            stream: false,
            drafts: crate::api::Drafts::None,
            draft_max: 0,
            grammar: None,
            logprobs: None,
            shown_tokens: Vec::new(),
            embed: None,
            slot_action: None,
            events,
        }
    }
}

/// The queue in front of the slots.
#[derive(Clone)]
pub struct Queue {
    sched: Arc<Scheduler<Job>>,
}

/// Why a job was not queued.
#[derive(Debug)]
pub enum QueueError {
    Full(usize),
}

impl From<QueueError> for crate::error::ApiError {
    fn from(QueueError::Full(n): QueueError) -> Self {
        crate::error::ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("the server is busy ({n} requests queued); retry shortly"),
        )
    }
}

impl Queue {
    /// Hands `job` to a slot or the queue, or answers at once that the queue is full: a
    /// client never waits for a place in line.
    pub fn submit(&self, job: Job) -> Result<(), QueueError> {
        let prompt = job.prompt.clone();
        match self.sched.submit(job, &prompt) {
            Ok(_) => Ok(()),
            Err(_) => Err(QueueError::Full(self.sched.capacity())),
        }
    }

    /// Hands `job` to slot `id` itself, after what it is doing; refused when several jobs
    /// already wait for that slot.
    pub fn submit_to(&self, id: usize, job: Job) -> Result<(), QueueError> {
        self.sched
            .submit_to(id, job)
            .map_err(|_| QueueError::Full(crate::sched::OWN_JOBS))
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.sched.queued()
    }

    /// Each slot's state now.
    pub fn slots(&self) -> Vec<crate::sched::SlotView> {
        self.sched.slots()
    }
}

/// Starts `parallel` slots over `prepared` behind a queue of `queue` jobs: in memory each with
/// its own engine (made on the slot's thread; with `draft_model`, a draft engine beside it),
/// under a memory budget (more than one slot) all on one shared engine. Returns once every
/// engine is ready, or the first error making one; with the queue comes the engines' context
/// size.
pub fn start(
    prepared: &'static Prepared<'static>,
    draft_model: Option<&'static pi2_model::Model>,
    parallel: usize,
    queue: usize,
    n_batch: usize,
    metrics: Arc<Metrics>,
) -> Result<(Queue, usize), pi2_runtime::RuntimeError> {
    let sched = Arc::new(Scheduler::new(parallel, queue));
    let shared = match parallel > 1 && prepared.offloads() {
        true => {
            let (engine, n_batch) = prepared.engine_within_budget(n_batch)?;
            Some((SharedEngine::new(engine), n_batch))
        }
        false => None,
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    for id in 0..parallel {
        let sched = sched.clone();
        let ready = ready_tx.clone();
        let metrics = metrics.clone();
        let shared = shared.as_ref().map(|(e, b)| (e.sequence(), *b));
        std::thread::Builder::new()
            .name(format!("pi2-slot-{id}"))
            .spawn(move || {
                let made = match shared {
                    Some((seq, n_batch)) => Ok((SlotEngine::Shared(seq), None, n_batch)),
                    None => slot_engines(prepared, draft_model, n_batch)
                        .map(|(e, d, b)| (SlotEngine::Own(Box::new(e)), d, b)),
                };
                match made {
                    Ok((engine, draft, n_batch)) => {
                        let _ = ready.send(Ok(engine.decoder_ref().n_ctx()));
                        Slot {
                            id,
                            engine,
                            draft,
                            cached: Vec::new(),
                            n_batch,
                            metrics,
                        }
                        .serve(&sched)
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })
            .map_err(|e| {
                pi2_runtime::RuntimeError::Unsupported(format!("cannot start a slot thread: {e}"))
            })?;
    }
    drop(ready_tx);
    let mut n_ctx = 0;
    for _ in 0..parallel {
        match ready_rx.recv() {
            Ok(r) => n_ctx = r?,
            Err(_) => {
                return Err(pi2_runtime::RuntimeError::Unsupported(
                    "a slot thread ended while making its engine".into(),
                ))
            }
        }
    }
    Ok((Queue { sched }, n_ctx))
}

/// A slot's engine: its own, or its sequence of the engine the slots share.
enum SlotEngine {
    Own(Box<Engine<'static>>),
    Shared(SharedSequence<'static>),
}

impl SlotEngine {
    fn decoder(&mut self) -> &mut dyn Decoder<'static> {
        match self {
            SlotEngine::Own(e) => &mut **e,
            SlotEngine::Shared(s) => s,
        }
    }

    fn decoder_ref(&self) -> &dyn Decoder<'static> {
        match self {
            SlotEngine::Own(e) => &**e,
            SlotEngine::Shared(s) => s,
        }
    }

    /// Runs `f` on the engine with this slot's KV cache in it.
    fn with_engine<R>(&mut self, f: impl FnOnce(&mut Engine<'static>) -> R) -> R {
        match self {
            SlotEngine::Own(e) => f(e),
            SlotEngine::Shared(s) => s.run(f),
        }
    }

    /// Reports the offload's counters to `metrics` (a shared engine's are everyone's:
    /// reported once, as slot 0's) and a shared engine's batched steps.
    fn report(&self, id: usize, metrics: &Metrics) {
        match self {
            SlotEngine::Own(e) => {
                if let Some(o) = e.offload() {
                    metrics.set_offload(id, o.stats());
                }
            }
            SlotEngine::Shared(s) => {
                let st = s.shared().batch_stats();
                metrics.set_batches(st.steps, st.tokens);
                s.shared().with_engine(|e| {
                    if let Some(o) = e.offload() {
                        metrics.set_offload(0, o.stats());
                    }
                });
            }
        }
    }

    /// The generation ended: batched steps stop waiting for this slot.
    fn idle(&self) {
        if let SlotEngine::Shared(s) = self {
            s.idle();
        }
    }
}

/// A slot's engine, its draft model's (if any), and the prompt batch they hold.
fn slot_engines(
    prepared: &'static Prepared<'static>,
    draft_model: Option<&'static pi2_model::Model>,
    n_batch: usize,
) -> Result<(Engine<'static>, Option<ModelDraft<'static>>, usize), pi2_runtime::RuntimeError> {
    let (engine, n_batch) = prepared.engine_within_budget(n_batch)?;
    let draft = match draft_model {
        Some(dm) => {
            let base = prepared.engine_config()?;
            Some(pi2_runtime::draft::engine(
                dm,
                &base,
                &engine,
                prepared.offloads(),
            )?)
        }
        None => None,
    };
    Ok((engine, draft, n_batch))
}

struct Slot<'p> {
    id: usize,
    engine: SlotEngine,
    /// The draft model's engine (`--draft-model`).
    draft: Option<ModelDraft<'p>>,
    /// The tokens the engine's KV cache holds.
    cached: Vec<TokenId>,
    n_batch: usize,
    metrics: Arc<Metrics>,
}

impl Slot<'_> {
    fn serve(mut self, sched: &Scheduler<Job>) {
        loop {
            let job = sched.next(self.id, &self.cached);
            if job.events.is_closed() {
                // The client left while waiting.
                self.metrics.cancelled();
                continue;
            }
            self.metrics.processing(1);
            let last = self.run(&job);
            self.engine.idle();
            self.metrics.processing(-1);
            self.engine.report(self.id, &self.metrics);
            // Before the answer, so that a client listing `/slots` after it sees this cache.
            sched.job_done(self.id, &self.cached);
            // Last, so that a client reading `/metrics` after its answer sees it counted.
            if let Some(ev) = last {
                let _ = job.events.blocking_send(ev);
            }
        }
    }

    /// Generates for `job`, sending its text; returns the final event (none if the client
    /// left).
    fn run(&mut self, job: &Job) -> Option<Event> {
        if let Some(action) = &job.slot_action {
            let (id, cached) = (self.id, &mut self.cached);
            let done = self
                .engine
                .with_engine(|e| crate::slot_file::run(action, id, e, cached));
            return Some(match done {
                Ok(v) => Event::Slot(v),
                Err(m) => Event::Failed(m),
            });
        }
        if let Some(pooling) = job.embed {
            // The evaluation leaves the cache empty.
            self.cached.clear();
            let n_batch = self.n_batch;
            let done = self
                .engine
                .with_engine(|e| pi2_runtime::embed::embed(e, &job.prompt, n_batch, pooling));
            return Some(match done {
                Ok(v) => Event::Embedding(v),
                Err(e) => self.failure(e),
            });
        }
        let events = &job.events;
        let (mut held, mut held_scores) = (String::new(), Vec::new());
        let started = Instant::now();
        let req = TextRequest {
            sampler: job.sampler.clone(),
            max_tokens: job.max_tokens,
            stops: job.stops.clone(),
            ignore_eos: job.ignore_eos,
            draft_max: match job.drafts {
                crate::api::Drafts::None => 0,
                _ => job.draft_max,
            },
            grammar: job.grammar.clone(),
            logprobs: job.logprobs,
            shown_tokens: job.shown_tokens.clone(),
        };
        let mut self_draft = pi2_engine::SelfDraft;
        let result = generate_pieces(
            self.engine.decoder(),
            &mut self.cached,
            self.n_batch,
            &job.prompt,
            &req,
            match (job.drafts, &mut self.draft) {
                (crate::api::Drafts::Model, Some(d)) => Some(d as &mut dyn Drafter),
                (crate::api::Drafts::SelfDraft, _) => Some(&mut self_draft as &mut dyn Drafter),
                _ => None,
            },
            &mut |piece| {
                let sent = match job.stream {
                    true => events
                        .blocking_send(Event::Text(piece.text.into(), piece.logprobs.to_vec()))
                        .is_ok(),
                    false => {
                        held.push_str(piece.text);
                        held_scores.extend_from_slice(piece.logprobs);
                        true
                    }
                };
                sent && !events.is_closed()
            },
        );
        let out = match result {
            Ok(out) => out,
            Err(e) => return Some(self.failure(e)),
        };
        let finish = match out.finish {
            RunFinish::Cancelled => {
                self.metrics.cancelled();
                return None;
            }
            RunFinish::Length => Finish::Length,
            RunFinish::Stop => Finish::Stop,
        };
        if !held.is_empty() || !held_scores.is_empty() {
            let _ = events.blocking_send(Event::Text(held, held_scores));
        }
        let g = out.generation;
        let summary = Summary {
            finish,
            prompt_tokens: job.prompt.len(),
            cached_tokens: job.prompt.len() - g.prompt_n,
            completion_tokens: g.tokens.len(),
            prompt_ms: g.prompt_time.as_secs_f64() * 1e3,
            predicted_ms: g.predicted_time.as_secs_f64() * 1e3,
            draft_n: g.drafted,
            draft_n_accepted: g.accepted,
            stop_word: out.stop_word,
        };
        self.metrics.completed(&summary, started.elapsed());
        Some(Event::Done(summary))
    }

    /// What a failed job answers: a memory budget too full for its KV cache is "busy" (503),
    /// anything else a failure.
    fn failure(&self, e: pi2_runtime::RuntimeError) -> Event {
        if let pi2_runtime::RuntimeError::Engine(EngineError::MemoryFull(m)) = &e {
            self.metrics.rejected();
            return Event::Busy(format!(
                "the memory budget is full ({m}); retry when other requests are done"
            ));
        }
        self.metrics.failed();
        Event::Failed(e.to_string())
    }
}
