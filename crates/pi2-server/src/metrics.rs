//! Counters for `/metrics`, in Prometheus' text format.

use crate::api::Summary;
use parking_lot::Mutex;
use pi2_engine::OffloadStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What the server has done since it started.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    completed: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    bad: AtomicU64,
    prompt_tokens: AtomicU64,
    prompt_evaluated: AtomicU64,
    predicted_tokens: AtomicU64,
    prompt_us: AtomicU64,
    predicted_us: AtomicU64,
    busy_us: AtomicU64,
    processing: AtomicI64,
    /// Batched decode steps of slots sharing one engine, and the tokens they carried.
    batch_steps: AtomicU64,
    batch_tokens: AtomicU64,
    /// Per slot: its engine's offload counters after its last request.
    offload: Mutex<Vec<Option<OffloadStats>>>,
    slots: usize,
}

impl Metrics {
    pub fn new(slots: usize) -> Self {
        Self {
            offload: Mutex::new(vec![None; slots]),
            slots,
            ..Self::default()
        }
    }

    pub fn request(&self) {
        self.requests.fetch_add(1, Relaxed);
    }
    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Relaxed);
    }
    pub fn bad_request(&self) {
        self.bad.fetch_add(1, Relaxed);
    }
    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Relaxed);
    }
    pub fn failed(&self) {
        self.failed.fetch_add(1, Relaxed);
    }
    /// A request answered with the error `status`: 503 rejected, other 4xx bad, 5xx failed.
    pub fn refused(&self, status: axum::http::StatusCode) {
        match status {
            axum::http::StatusCode::SERVICE_UNAVAILABLE => self.rejected(),
            st if st.is_client_error() => self.bad_request(),
            st if st.is_server_error() => self.failed(),
            _ => {}
        }
    }
    /// A request answered in full that generated nothing (embeddings).
    pub fn completed_request(&self) {
        self.completed.fetch_add(1, Relaxed);
    }
    pub fn processing(&self, d: i64) {
        self.processing.fetch_add(d, Relaxed);
    }

    pub fn completed(&self, s: &Summary, busy: Duration) {
        self.completed.fetch_add(1, Relaxed);
        self.prompt_tokens
            .fetch_add(s.prompt_tokens as u64, Relaxed);
        self.prompt_evaluated
            .fetch_add((s.prompt_tokens - s.cached_tokens) as u64, Relaxed);
        self.predicted_tokens
            .fetch_add(s.completion_tokens as u64, Relaxed);
        self.prompt_us
            .fetch_add((s.prompt_ms * 1e3) as u64, Relaxed);
        self.predicted_us
            .fetch_add((s.predicted_ms * 1e3) as u64, Relaxed);
        self.busy_us.fetch_add(busy.as_micros() as u64, Relaxed);
    }

    /// The shared engine's batched steps so far.
    pub fn set_batches(&self, steps: u64, tokens: u64) {
        self.batch_steps.fetch_max(steps, Relaxed);
        self.batch_tokens.fetch_max(tokens, Relaxed);
    }

    pub fn set_offload(&self, slot: usize, stats: &OffloadStats) {
        if let Some(s) = self.offload.lock().get_mut(slot) {
            *s = Some(stats.clone());
        }
    }

    /// The Prometheus text exposition; `queued` is how many requests wait for a slot now.
    pub fn render(&self, queued: usize) -> String {
        let get = |a: &AtomicU64| a.load(Relaxed) as f64;
        let gauge = |a: &AtomicI64| a.load(Relaxed).max(0) as f64;
        let predicted_s = get(&self.predicted_us) / 1e6;
        let rate = match predicted_s > 0.0 {
            true => get(&self.predicted_tokens) / predicted_s,
            false => 0.0,
        };
        const C: &str = "counter";
        const G: &str = "gauge";
        let mut rows = vec![
            (
                "requests_total",
                C,
                "Generation requests received.",
                get(&self.requests),
            ),
            (
                "requests_completed_total",
                C,
                "Requests answered in full.",
                get(&self.completed),
            ),
            (
                "requests_rejected_total",
                C,
                "Requests refused with 503: the queue full, or the memory budget too full for their KV cache.",
                get(&self.rejected),
            ),
            (
                "requests_cancelled_total",
                C,
                "Requests whose client left before the answer ended.",
                get(&self.cancelled),
            ),
            (
                "requests_failed_total",
                C,
                "Requests the engine failed on (500).",
                get(&self.failed),
            ),
            (
                "requests_invalid_total",
                C,
                "Requests refused as invalid (4xx).",
                get(&self.bad),
            ),
            (
                "prompt_tokens_total",
                C,
                "Prompt tokens of completed requests.",
                get(&self.prompt_tokens),
            ),
            (
                "prompt_tokens_evaluated_total",
                C,
                "Prompt tokens evaluated (not reused from a slot's KV cache).",
                get(&self.prompt_evaluated),
            ),
            (
                "tokens_predicted_total",
                C,
                "Tokens generated.",
                get(&self.predicted_tokens),
            ),
            (
                "prompt_seconds_total",
                C,
                "Time spent evaluating prompts.",
                get(&self.prompt_us) / 1e6,
            ),
            (
                "tokens_predicted_seconds_total",
                C,
                "Time spent generating.",
                predicted_s,
            ),
            (
                "busy_seconds_total",
                C,
                "Time slots spent on requests.",
                get(&self.busy_us) / 1e6,
            ),
            (
                "predicted_tokens_seconds",
                G,
                "Mean generation speed, tokens per second.",
                rate,
            ),
            (
                "requests_deferred",
                G,
                "Requests waiting in the queue.",
                queued as f64,
            ),
            (
                "requests_processing",
                G,
                "Requests being generated.",
                gauge(&self.processing),
            ),
            (
                "slots",
                G,
                "Slots (engines generating in parallel).",
                self.slots as f64,
            ),
        ];
        rows.extend(self.engine_rows());
        let mut out = String::new();
        for (name, kind, help, v) in rows {
            let _ = writeln!(
                out,
                "# HELP pi2_{name} {help}\n# TYPE pi2_{name} {kind}\npi2_{name} {v}"
            );
        }
        for (name, kind, help, v) in self.llama_server_rows(queued) {
            let _ = writeln!(
                out,
                "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {v}"
            );
        }
        out
    }

    /// The same counts under llama-server's names (`llamacpp:`), for dashboards made for it:
    /// its `prompt_tokens_total` counts the tokens evaluated (a slot's cached ones apart).
    fn llama_server_rows(&self, queued: usize) -> Vec<Row> {
        let get = |a: &AtomicU64| a.load(Relaxed) as f64;
        let (evaluated, prompt) = (get(&self.prompt_evaluated), get(&self.prompt_tokens));
        let (prompt_s, predicted_s) = (get(&self.prompt_us) / 1e6, get(&self.predicted_us) / 1e6);
        let per_second = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
        let predicted = get(&self.predicted_tokens);
        const C: &str = "counter";
        const G: &str = "gauge";
        vec![
            (
                "prompt_tokens_total",
                C,
                "Number of prompt tokens processed, excluding cached tokens",
                evaluated,
            ),
            (
                "prompt_tokens_cached_total",
                C,
                "Number of prompt tokens reused from the cache",
                (prompt - evaluated).max(0.0),
            ),
            (
                "prompt_seconds_total",
                C,
                "Total time spent processing prompts",
                prompt_s,
            ),
            (
                "tokens_predicted_total",
                C,
                "Number of generation tokens processed",
                predicted,
            ),
            (
                "tokens_predicted_seconds_total",
                C,
                "Total time spent generating tokens",
                predicted_s,
            ),
            (
                "prompt_tokens_seconds",
                G,
                "Average prompt throughput in tokens/s",
                per_second(evaluated, prompt_s),
            ),
            (
                "predicted_tokens_seconds",
                G,
                "Average generation throughput in tokens/s",
                per_second(predicted, predicted_s),
            ),
            (
                "requests_processing",
                G,
                "Number of requests processing",
                self.processing.load(Relaxed).max(0) as f64,
            ),
            (
                "requests_deferred",
                G,
                "Number of requests deferred",
                queued as f64,
            ),
        ]
    }

    /// Rows of what the engines did: batched steps of shared slots, and the offload's reads.
    fn engine_rows(&self) -> Vec<Row> {
        let get = |a: &AtomicU64| a.load(Relaxed) as f64;
        const C: &str = "counter";
        const G: &str = "gauge";
        let mut rows = Vec::new();
        if get(&self.batch_steps) > 0.0 {
            rows.push((
                "decode_batches_total",
                C,
                "Decode steps the slots sharing one engine ran as one batch.",
                get(&self.batch_steps),
            ));
            rows.push((
                "decode_batch_tokens_total",
                C,
                "Tokens those batched steps carried (over the batches: the mean batch).",
                get(&self.batch_tokens),
            ));
        }
        let offload = self.offload.lock();
        if offload.iter().any(Option::is_some) {
            // The slots' neuron counters summed, read as one cache.
            let mut sum = OffloadStats::default();
            for s in offload.iter().flatten() {
                sum.gate_hot += s.gate_hot;
                sum.gate_hits += s.gate_hits;
                sum.gate_reads += s.gate_reads;
                sum.updown_hot += s.updown_hot;
                sum.updown_hits += s.updown_hits;
                sum.updown_reads += s.updown_reads;
                sum.decode_bytes += s.decode_bytes;
                sum.stage_bytes += s.stage_bytes;
                sum.attn_bytes += s.attn_bytes;
                sum.out_bytes += s.out_bytes;
            }
            rows.push((
                "neuron_cache_hit_ratio",
                G,
                "Neuron rows decode found in memory (pinned or cached) among all it needed.",
                sum.hit_rate(),
            ));
            rows.push((
                "neuron_read_bytes_total",
                C,
                "Bytes of neuron rows decode read from flash.",
                sum.decode_bytes as f64,
            ));
            rows.push((
                "flash_read_bytes_total",
                C,
                "Bytes read from flash: neuron rows, layers read whole (prompts, batches), attention and output rows.",
                (sum.decode_bytes + sum.stage_bytes + sum.attn_bytes + sum.out_bytes) as f64,
            ));
        }
        rows
    }
}

/// A metric: name, kind, help and value.
type Row = (&'static str, &'static str, &'static str, f64);
