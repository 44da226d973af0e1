//! One engine shared by several sequences, each driven from its own thread (a server's slots
//! under one memory budget: one neuron cache, one budget, a KV cache per sequence).
//!
//! Decode steps are batched as they come (continuous batching): a thread whose sequence needs
//! a one-token step leaves its token on the board; the first one to find the engine free
//! gathers every waiting token, waits a moment for the other sequences that are decoding (a
//! share of the last step's time, so a stalled one costs little), and runs them as one pass
//! ([`Engine::forward_sequences`]); every sequence gets its own logits row, bit for bit what
//! its own step computes. A sequence joins or leaves between steps. Anything else (a prompt, a
//! checked draft, an embedding) runs alone on the engine with the sequence's cache swapped in.

use crate::decoder::Decoder;
use crate::engine::{Engine, Logits, SequenceCache};
use crate::EngineError;
use pi2_model::{Model, TokenId};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An engine and the sequences sharing it.
pub struct SharedEngine<'m> {
    model: &'m Model,
    n_ctx: usize,
    batches_as_decode: bool,
    engine: Mutex<Engine<'m>>,
    board: Mutex<Board>,
    changed: Condvar,
}

struct Seat {
    /// `None` while a pass works on it.
    cache: Option<SequenceCache>,
    len: usize,
    bytes: usize,
    /// The token of the step it waits for.
    token: Option<TokenId>,
    result: Option<Result<Vec<f32>, EngineError>>,
    /// In a decode loop: a gathered step waits a moment for its next token.
    decoding: bool,
}

#[derive(Default)]
struct Board {
    /// By sequence id; `None` once closed.
    seats: Vec<Option<Seat>>,
    /// A thread is gathering or running a batched step.
    gathering: bool,
    last_step: Duration,
    stats: BatchStats,
}

/// How batched steps went: steps run and the tokens they carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    pub steps: u64,
    pub tokens: u64,
}

/// Longest wait for decoding sequences' tokens before a batched step runs without them.
const MAX_GATHER: Duration = Duration::from_millis(50);
/// Shortest such wait: about a thread's wake-up on a loaded machine, below which no other
/// sequence can arrive (a real model's step is longer: an eighth of it is the wait).
const MIN_GATHER: Duration = Duration::from_millis(1);

impl<'m> SharedEngine<'m> {
    /// Shares `engine` (its own sequence is left unused).
    pub fn new(engine: Engine<'m>) -> Arc<Self> {
        Arc::new(Self {
            model: engine.model(),
            n_ctx: engine.n_ctx(),
            batches_as_decode: engine.checks_batches_as_decode(),
            engine: Mutex::new(engine),
            board: Mutex::new(Board::default()),
            changed: Condvar::new(),
        })
    }

    /// A new, empty sequence on the engine.
    pub fn sequence(self: &Arc<Self>) -> SharedSequence<'m> {
        let cache = self.lock_engine().new_sequence();
        let mut b = self.lock_board();
        let seat = Seat {
            cache: Some(cache),
            len: 0,
            bytes: 0,
            token: None,
            result: None,
            decoding: false,
        };
        let id = match b.seats.iter().position(Option::is_none) {
            Some(i) => {
                b.seats[i] = Some(seat);
                i
            }
            None => {
                b.seats.push(Some(seat));
                b.seats.len() - 1
            }
        };
        SharedSequence {
            shared: self.clone(),
            id,
            logits: Vec::new(),
        }
    }

    /// Runs `f` on the engine between passes (its statistics, say).
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine<'m>) -> R) -> R {
        f(&mut self.lock_engine())
    }

    /// Batched steps so far.
    pub fn batch_stats(&self) -> BatchStats {
        self.lock_board().stats
    }

    fn lock_engine(&self) -> MutexGuard<'_, Engine<'m>> {
        // A pass that panicked leaves the engine as usable as an error does.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gathers the waiting tokens (after a short wait for decoding sequences) and runs them as
    /// one step; called with `b.gathering` set by the caller.
    fn run_batch<'b>(&'b self, mut b: MutexGuard<'b, Board>) -> MutexGuard<'b, Board> {
        let deadline = Instant::now() + (b.last_step / 8).clamp(MIN_GATHER, MAX_GATHER);
        loop {
            // A sequence whose last row is not yet taken comes back with its next token.
            let missing = (b.seats.iter().flatten())
                .any(|s| s.decoding && s.token.is_none() && s.cache.is_some());
            let now = Instant::now();
            if !missing || now >= deadline {
                break;
            }
            b = self
                .changed
                .wait_timeout(b, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mut ids = Vec::new();
        let mut caches = Vec::new();
        let mut tokens = Vec::new();
        let mut parked = (0, 0);
        for (i, seat) in b.seats.iter_mut().enumerate() {
            let Some(s) = seat else { continue };
            match (s.token.take(), s.cache.take()) {
                (Some(t), Some(c)) => {
                    ids.push(i);
                    tokens.push(t);
                    caches.push(c);
                }
                (t, c) => {
                    (s.token, s.cache) = (t, c);
                    parked = (parked.0 + s.bytes, parked.1 + s.len);
                }
            }
        }
        drop(b);
        let started = Instant::now();
        let mut refused = Vec::new();
        let out = {
            let mut engine = self.lock_engine();
            loop {
                engine.set_parked_kv(parked.0, parked.1);
                let mut refs: Vec<&mut SequenceCache> = caches.iter_mut().collect();
                match engine.forward_sequences(&mut refs, &tokens) {
                    // The budget is charged before anything is computed: the sequence holding
                    // the most memory gets the error, the others run without it.
                    Err(EngineError::MemoryFull(m)) if caches.len() > 1 => {
                        let k = (0..caches.len())
                            .max_by_key(|&k| caches[k].bytes())
                            .expect("a batch has sequences");
                        tokens.remove(k);
                        let cache = caches.remove(k);
                        parked = (parked.0 + cache.bytes(), parked.1 + cache.len());
                        refused.push((ids.remove(k), cache, m));
                    }
                    out => break out.map(<[f32]>::to_vec),
                }
            }
        };
        self.lock_engine().set_parked_kv(0, 0);
        let mut b = self.lock_board();
        b.last_step = started.elapsed();
        b.stats.steps += 1;
        b.stats.tokens += ids.len() as u64;
        let n_vocab = self.model.config.n_vocab;
        for (k, (id, cache)) in ids.into_iter().zip(caches).enumerate() {
            let Some(s) = b.seats[id].as_mut() else {
                continue;
            };
            (s.len, s.bytes) = (cache.len(), cache.bytes());
            s.cache = Some(cache);
            s.result = Some(match &out {
                Ok(rows) => Ok(rows[k * n_vocab..(k + 1) * n_vocab].to_vec()),
                Err(e) => Err(e.shared()),
            });
        }
        for (id, cache, m) in refused {
            if let Some(s) = b.seats[id].as_mut() {
                (s.len, s.bytes) = (cache.len(), cache.bytes());
                s.cache = Some(cache);
                s.result = Some(Err(EngineError::MemoryFull(m)));
            }
        }
        b.gathering = false;
        self.changed.notify_all();
        b
    }
}

/// One sequence of a [`SharedEngine`]: its own KV cache, driven from one thread at a time.
pub struct SharedSequence<'m> {
    shared: Arc<SharedEngine<'m>>,
    id: usize,
    logits: Vec<f32>,
}

impl<'m> SharedSequence<'m> {
    /// The engine it shares.
    pub fn shared(&self) -> &Arc<SharedEngine<'m>> {
        &self.shared
    }

    /// Runs `f` on the engine with this sequence's cache swapped in (a prompt, a checked
    /// draft, an embedding: anything but a batched step); other sequences' caches are charged
    /// to the memory budget beside it.
    pub fn run<R>(&mut self, f: impl FnOnce(&mut Engine<'m>) -> R) -> R {
        let sh = &*self.shared;
        let (mut cache, parked) = {
            let mut b = sh.lock_board();
            let parked = parked_bytes(&b, self.id);
            let s = seat(&mut b, self.id);
            s.decoding = false;
            let cache = s
                .cache
                .take()
                .expect("a sequence's own thread holds its cache");
            sh.changed.notify_all();
            (cache, parked)
        };
        let r = {
            let mut engine = sh.lock_engine();
            engine.set_parked_kv(parked.0, parked.1);
            engine.swap_sequence(&mut cache);
            let r = f(&mut engine);
            engine.swap_sequence(&mut cache);
            engine.set_parked_kv(0, 0);
            r
        };
        let mut b = sh.lock_board();
        let s = seat(&mut b, self.id);
        (s.len, s.bytes) = (cache.len(), cache.bytes());
        s.cache = Some(cache);
        r
    }

    /// Says this sequence stopped decoding (its generation ended): batched steps no longer
    /// wait for its next token.
    pub fn idle(&self) {
        let mut b = self.shared.lock_board();
        seat(&mut b, self.id).decoding = false;
        self.shared.changed.notify_all();
    }

    /// One decode step of `token`, batched with the other sequences' steps.
    fn step(&mut self, token: TokenId) -> Result<&[f32], EngineError> {
        let sh = &*self.shared;
        let mut b = sh.lock_board();
        let s = seat(&mut b, self.id);
        (s.token, s.result, s.decoding) = (Some(token), None, true);
        sh.changed.notify_all();
        loop {
            if let Some(r) = seat(&mut b, self.id).result.take() {
                drop(b);
                self.logits = r?;
                return Ok(&self.logits);
            }
            if !b.gathering {
                b.gathering = true;
                b = sh.run_batch(b);
                continue;
            }
            b = sh.changed.wait(b).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn copy_out(
        &mut self,
        f: impl FnOnce(&mut Engine<'m>) -> Result<Vec<f32>, EngineError>,
    ) -> Result<&[f32], EngineError> {
        self.logits = self.run(f)?;
        Ok(&self.logits)
    }
}

impl Drop for SharedSequence<'_> {
    fn drop(&mut self) {
        let mut b = self.shared.lock_board();
        if let Some(seat) = b.seats.get_mut(self.id) {
            *seat = None;
        }
        self.shared.changed.notify_all();
    }
}

fn seat(b: &mut Board, id: usize) -> &mut Seat {
    b.seats[id].as_mut().expect("an open sequence has its seat")
}

/// KV bytes and positions of every sequence but `id`.
fn parked_bytes(b: &Board, id: usize) -> (usize, usize) {
    (b.seats.iter().enumerate())
        .filter(|&(i, _)| i != id)
        .filter_map(|(_, s)| s.as_ref())
        .fold((0, 0), |(b, p), s| (b + s.bytes, p + s.len))
}

impl<'m> Decoder<'m> for SharedSequence<'m> {
    fn model(&self) -> &'m Model {
        self.shared.model
    }

    fn n_ctx(&self) -> usize {
        self.shared.n_ctx
    }

    fn n_past(&self) -> usize {
        seat(&mut self.shared.lock_board(), self.id).len
    }

    fn truncate(&mut self, n: usize) -> usize {
        self.run(|e| e.truncate(n))
    }

    fn release(&mut self) {
        self.run(|e| e.release())
    }

    fn prepare(&mut self) {
        self.shared.lock_engine().prepare()
    }

    fn reset_stats(&mut self) {
        // The engine's counts are of every sequence: one generation does not reset them.
    }

    fn checks_batches_as_decode(&self) -> bool {
        self.shared.batches_as_decode
    }

    fn forward(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError> {
        if let ([t], Logits::Last) = (tokens, want) {
            if self.shared.batches_as_decode {
                return self.step(*t);
            }
        }
        self.copy_out(|e| e.forward(tokens, want).map(<[f32]>::to_vec))
    }

    fn forward_prompt(&mut self, tokens: &[TokenId]) -> Result<&[f32], EngineError> {
        self.copy_out(|e| e.forward_prompt(tokens).map(<[f32]>::to_vec))
    }

    fn forward_decode(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError> {
        self.copy_out(|e| e.forward_decode(tokens, want).map(<[f32]>::to_vec))
    }

    fn forward_resident(&mut self, token: TokenId) -> Result<&[f32], EngineError> {
        self.copy_out(|e| e.forward_resident(token).map(<[f32]>::to_vec))
    }
}
