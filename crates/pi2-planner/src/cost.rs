//! The cost model: predicted seconds per decoded token and per prefilled token for a plan.
//!
//! Decode, per token: for every layer, attention (the q/k/v/o matrix-vector products plus
//! reading the KV cache) + predictor + FFN, then the output head. Each matrix costs
//! `rows x (row_ns + row_bytes / rate)` at the plan's thread count, from the hardware profile,
//! plus a fixed cost per parallel step. The FFN of a recorded step:
//!
//! - dense: every gate/up row (matrix-vector) and every down row (axpy);
//! - sparse, in memory: candidates' gate rows (gather), confirmed neurons' up rows (gather) and
//!   down rows (axpy);
//! - offloaded: the same compute, and the reads the replay says miss, each device read costing
//!   `latency + bytes / bandwidth` at the engine's concurrency. The step is simulated
//!   ([`crate::pipeline`]): the I/O thread shapes whatever is pending into device reads as the
//!   reader does, clusters compute on the first free worker once their rows land, and a layer
//!   cannot start before the previous one ends.
//!
//! Prefill of a batch: every matrix as a batched product; offloaded, each layer's FFN is read
//! whole in `max_read` pieces while the previous layer computes: `max(compute, read)` per layer.
//!
//! When the split streams the last layers' attention from flash, every token (and every prefill
//! batch) reads those layers whole in `max_read` pieces. The reader has one queue, shared with
//! the neuron reads, so decode counts that time as exposed (an upper bound when the device is
//! idle part of the step; with the budgets that stream, it rarely is).
//!
//! When the plan's compute threads take every core, the I/O thread's handling runs on a core a
//! worker was computing on and delays it (see [`crate::pipeline`]).

use crate::hw::{HardwareProfile, KernelOp, ThreadRates};
use crate::model::{replay, ModelProfile, Replay, Residency, StepMisses, StreamedWeights};
use crate::pipeline::{self, RowRequest, StepCost};
use crate::PlanError;
use pi2_io::ReaderConfig;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How the FFN runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Whole model in memory, every neuron computed.
    Dense,
    /// Whole model in memory, predicted neurons computed.
    Sparse,
    /// Neuron bundles on flash, a budget of memory for everything resident.
    Offload,
}

/// Every setting a plan fixes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    /// Core class (index into the hardware profile, fastest first) and threads on it.
    pub class: usize,
    pub threads: usize,
    pub mode: Mode,
    /// Resident bytes the engine may use (offloading); the whole model for the other modes.
    pub budget: u64,
    /// Share of the neuron memory pinned to the hottest neurons (rest: LRU cache).
    pub hot_share: f64,
    /// Neurons per cluster in sparse decode.
    pub cluster: usize,
    pub io_depth: usize,
    pub max_read: usize,
    pub merge_gap: usize,
}

/// Predicted seconds per decoded token, by component.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    pub attention: f64,
    pub predictor: f64,
    /// FFN compute (resident and read neurons alike).
    pub ffn_compute: f64,
    /// Time reads add beyond what the pipeline hides.
    pub io_exposed: f64,
    pub output: f64,
    /// Fixed costs of parallel steps.
    pub steps: f64,
    /// Serial vector work between the steps (norms, activation quantization, SiLU, sums).
    pub serial: f64,
    /// Total device read time (hidden or not).
    pub io_total: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.attention
            + self.predictor
            + self.ffn_compute
            + self.io_exposed
            + self.output
            + self.steps
            + self.serial
    }
}

/// What a plan is predicted to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub decode_tps: f64,
    pub prefill_tps: f64,
    /// Resident bytes the engine accounts (the budget, or the whole model and its buffers).
    pub memory: u64,
    pub breakdown: Breakdown,
    /// Share of needed rows served from memory (offloading).
    pub hit_rate: Option<f64>,
    pub read_bytes_per_token: f64,
    pub device_reads_per_token: f64,
}

/// A replay under one I/O shaping and thread count: per simulated step (every `io_stride`-th),
/// the FFN time and the device's busy time; bytes and reads over the simulated steps.
struct IoCost {
    step_secs: Vec<f64>,
    step_io: Vec<f64>,
    bytes: u64,
    reads: u64,
}

type ReplayKey = (u64, u64);
type ComputeKey = (usize, usize, Mode);
type IoKey = (u64, u64, usize, usize, usize, usize, usize);

/// Evaluates plans for one model on one device. Replays and read costs are memoized, so a
/// solver can call it for many plans.
pub struct CostModel<'a> {
    pub hw: &'a HardwareProfile,
    pub model: &'a ModelProfile,
    pub residency: &'a dyn Residency,
    /// KV positions decode attends over on average.
    pub position: usize,
    /// Tokens per prefill batch.
    pub n_batch: usize,
    /// Simulate the reads of every `io_stride`-th recorded step only (the others take their
    /// average): planning time falls by the stride; 1 simulates every step.
    pub io_stride: usize,
    /// Replays by split; a failed one keeps its message (errors are not `Clone`).
    replays: Mutex<HashMap<ReplayKey, Arc<Result<Replay, String>>>>,
    io: Mutex<HashMap<IoKey, Arc<IoCost>>>,
    /// FFN compute seconds of every recorded step, per (class, threads, mode).
    compute: Mutex<HashMap<ComputeKey, Arc<Vec<f64>>>>,
}

/// Replays memoized at once (the search visits one budget's hot shares before the next).
const REPLAYS_KEPT: usize = 8;

impl<'a> CostModel<'a> {
    pub fn new(
        hw: &'a HardwareProfile,
        model: &'a ModelProfile,
        residency: &'a dyn Residency,
        position: usize,
        n_batch: usize,
    ) -> Self {
        Self {
            hw,
            model,
            residency,
            position,
            n_batch: n_batch.max(1),
            io_stride: 1,
            replays: Mutex::default(),
            io: Mutex::default(),
            compute: Mutex::default(),
        }
    }

    fn rates(&self, k: &Knobs) -> Result<&ThreadRates, PlanError> {
        self.hw.rates(k.class, k.threads).ok_or_else(|| {
            PlanError::Hardware(format!(
                "no figures for {} thread(s) on core class {} (profile this device again with `pi2 profile-hw`)",
                k.threads, k.class
            ))
        })
    }

    /// The replay of the recording under `(budget, hot_share)` (memoized).
    pub fn replay(&self, budget: u64, hot_share: f64) -> Arc<Result<Replay, String>> {
        let key = (budget, hot_share.to_bits());
        if let Some(r) = self.replays.lock().unwrap().get(&key) {
            return r.clone();
        }
        let r = self
            .residency
            .split(budget, hot_share)
            .and_then(|split| replay(self.model, &split));
        let r = Arc::new(r.map_err(|e| e.to_string()));
        let mut kept = self.replays.lock().unwrap();
        // A replay holds every recorded step's misses (tens of MB on a real model): keep the
        // few the search is working through, not every budget's.
        if kept.len() >= REPLAYS_KEPT {
            kept.clear();
        }
        kept.insert(key, r.clone());
        r
    }

    /// The simulated FFN of every step under the plan's reads (memoized).
    fn io_cost(&self, k: &Knobs, r: &ThreadRates, rep: &Replay) -> Arc<IoCost> {
        let key = (
            k.budget,
            k.hot_share.to_bits(),
            k.cluster,
            k.merge_gap,
            k.max_read,
            k.class,
            k.threads,
        );
        if let Some(c) = self.io.lock().unwrap().get(&key) {
            return c.clone();
        }
        // Reads while this plan's compute threads keep the cores busy.
        let f = &self.hw.flash.with_load(k.threads);
        let cores: usize = self.hw.classes.iter().map(|c| c.cpus.len()).sum();
        let cores_shared = k.threads >= cores;
        let cfg = ReaderConfig {
            max_request: k.max_read,
            depth: k.io_depth,
            merge_gap: k.merge_gap,
        };
        let m = self.model;
        let cl = k.cluster;
        // Per-row seconds on one worker (the profile's rate is all threads together).
        let per_row: Vec<[f64; 3]> = m
            .ffn
            .iter()
            .map(|l| {
                let t = k.threads as f64;
                [
                    r.secs(KernelOp::Gather, &l.gate.ty, 1, l.gate.row_bytes) * t,
                    r.secs(KernelOp::Gather, &l.up.ty, 1, l.up.row_bytes) * t,
                    r.secs(KernelOp::Axpy, &l.down.ty, 1, l.down.row_bytes) * t,
                ]
            })
            .collect();
        // Steps are independent: simulated in parallel, each with its own buffers.
        let stride = self.io_stride.max(1);
        let per_step: Vec<StepCost> = (0..m.steps.len())
            .into_par_iter()
            .step_by(stride)
            .map(|j| (&m.steps[j], &rep.steps[j]))
            .map_init(
                || {
                    (
                        pipeline::Scratch::default(),
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                    )
                },
                |(sc, gsecs, usecs, gate, updown), (s, miss)| {
                    let l = &m.ffn[s.layer as usize];
                    let [g, u, d] = per_row[s.layer as usize];
                    let nc = s.candidates.len();
                    let n = nc.div_ceil(cl);
                    gsecs.clear();
                    gsecs.extend((0..n).map(|c| (cl.min(nc - c * cl)) as f64 * g));
                    usecs.clear();
                    usecs.resize(n, 0.0);
                    let mut conf = s.confirmed.iter().peekable();
                    for (pos, &i) in s.candidates.iter().enumerate() {
                        if conf.next_if(|&&x| x == i).is_some() {
                            usecs[pos / cl] += u + d;
                        }
                    }
                    gate.clear();
                    gate.extend(miss.gate.iter().map(|&(pos, i)| RowRequest {
                        cluster: pos / cl as u32,
                        updown: false,
                        offset: l.gate.offset + i as u64 * l.gate.row_bytes as u64,
                        len: l.gate.row_bytes,
                    }));
                    updown.clear();
                    for &(pos, i) in &miss.updown {
                        let cluster = pos / cl as u32;
                        for p in [&l.up, &l.down] {
                            updown.push(RowRequest {
                                cluster,
                                updown: true,
                                offset: p.offset + i as u64 * p.row_bytes as u64,
                                len: p.row_bytes,
                            });
                        }
                    }
                    pipeline::simulate(
                        gsecs,
                        usecs,
                        gate,
                        updown,
                        k.threads,
                        cores_shared,
                        f,
                        &cfg,
                        sc,
                    )
                },
            )
            .collect();
        let step_secs = per_step.iter().map(|p| p.secs).collect();
        let step_io = per_step.iter().map(|p| p.io_secs).collect();
        let bytes = per_step.iter().map(|p| p.bytes).sum();
        let reads = per_step.iter().map(|p| p.reads).sum();
        let c = Arc::new(IoCost {
            step_secs,
            step_io,
            bytes,
            reads,
        });
        self.io.lock().unwrap().insert(key, c.clone());
        c
    }

    /// Per-token costs outside the FFN: attention, predictor, output, their parallel steps.
    fn fixed_parts(&self, r: &ThreadRates, mode: Mode) -> (f64, f64, f64, f64, f64) {
        let m = self.model;
        let mv = |s: &crate::model::MatShape| r.secs(KernelOp::Matvec, &s.ty, s.rows, s.row_bytes);
        let kv = self.position as f64 * m.kv_bytes_per_pos as f64 / r.mem_bytes_per_sec;
        let attention: f64 = m.attention.iter().flatten().map(mv).sum::<f64>() + kv;
        let predictor: f64 = if mode == Mode::Dense {
            0.0
        } else {
            // `+ 0.0`: an empty sum is -0.0, which reports print as "-0.000 ms".
            m.predictor.iter().flatten().map(mv).sum::<f64>() + 0.0
        };
        // A clustered head scores its probes and computes its share of the rows.
        let output = match &m.head {
            Some(h) => h.probes.iter().map(mv).sum::<f64>() + h.share * mv(&m.output),
            None => mv(&m.output),
        };
        // Per layer: q/k/v, attention heads, o; the predictor's two products; the FFN's two
        // (dense: gate+up, down; sparse: one cluster pipeline). Plus the output head.
        let pred_steps = if mode == Mode::Dense { 0 } else { 2 };
        let ffn_steps = if mode == Mode::Dense { 2 } else { 1 };
        let steps = (m.n_layer * (3 + pred_steps + ffn_steps) + 1) as f64 * r.step_ns * 1e-9;
        // Serial elements per layer: attention's two norms, input and output quantization,
        // RoPE and two residual adds (about 7 x n_embd); dense FFN: its input quantization and
        // SiLU over every neuron; sparse: predictor input, gate and up inputs quantized and the
        // scan of every neuron's score (per-candidate work is added per step). The head:
        // norm, quantization, and the scan of the logits.
        let (d, ff) = (m.n_embd as f64, m.n_ff as f64);
        let ffn_serial = if mode == Mode::Dense {
            d + ff
        } else {
            3.0 * d + ff
        };
        let serial = (m.n_layer as f64 * (7.0 * d + ffn_serial) + 2.0 * d + m.output.rows as f64)
            * r.serial_ns_per_elem
            * 1e-9;
        (attention, predictor, output, steps, serial)
    }

    /// FFN compute of one recorded step (sparse) or one layer (dense).
    fn ffn_compute(
        &self,
        r: &ThreadRates,
        mode: Mode,
        layer: usize,
        n_cand: usize,
        n_conf: usize,
    ) -> f64 {
        let l = &self.model.ffn[layer];
        let n_ff = self.model.n_ff;
        match mode {
            Mode::Dense => {
                r.secs(KernelOp::Matvec, &l.gate.ty, n_ff, l.gate.row_bytes)
                    + r.secs(KernelOp::Matvec, &l.up.ty, n_ff, l.up.row_bytes)
                    + r.secs(KernelOp::Axpy, &l.down.ty, n_ff, l.down.row_bytes)
            }
            Mode::Sparse | Mode::Offload => {
                r.secs(KernelOp::Gather, &l.gate.ty, n_cand, l.gate.row_bytes)
                    + r.secs(KernelOp::Gather, &l.up.ty, n_conf, l.up.row_bytes)
                    + r.secs(KernelOp::Axpy, &l.down.ty, n_conf, l.down.row_bytes)
            }
        }
    }

    /// FFN compute of every recorded step (memoized).
    fn step_compute(&self, r: &ThreadRates, k: &Knobs) -> Arc<Vec<f64>> {
        let key = (k.class, k.threads, k.mode);
        if let Some(v) = self.compute.lock().unwrap().get(&key) {
            return v.clone();
        }
        let v: Vec<f64> = self
            .model
            .steps
            .iter()
            .map(|s| {
                self.ffn_compute(
                    r,
                    k.mode,
                    s.layer as usize,
                    s.candidates.len(),
                    s.confirmed.len(),
                )
            })
            .collect();
        let v = Arc::new(v);
        self.compute.lock().unwrap().insert(key, v.clone());
        v
    }

    /// FFN compute of every recorded step's layer run dense (memoized).
    fn dense_compute(&self, r: &ThreadRates, k: &Knobs) -> Arc<Vec<f64>> {
        let dense = Knobs {
            mode: Mode::Dense,
            ..k.clone()
        };
        self.step_compute(r, &dense)
    }

    /// Whether layer `li` may run dense when all its rows are pinned: offloading a layer
    /// without a predictor (whose sparse step computes every gate row anyway).
    fn may_run_dense(&self, k: &Knobs, li: usize) -> bool {
        k.mode == Mode::Offload && self.model.predictor[li].is_empty()
    }

    /// Per layer, whether it runs dense when all its rows are pinned: it may, and its dense FFN
    /// computes faster on this device than its recorded sparse steps do on average.
    pub fn dense_layers(&self, k: &Knobs) -> Result<Vec<bool>, PlanError> {
        let r = self.rates(k)?;
        let m = self.model;
        let (sparse, dense) = (self.step_compute(r, k), self.dense_compute(r, k));
        let mut sums = vec![(0.0, 0.0); m.n_layer];
        for ((s, &sp), &de) in m.steps.iter().zip(sparse.iter()).zip(dense.iter()) {
            let sum = &mut sums[s.layer as usize];
            (sum.0, sum.1) = (sum.0 + sp, sum.1 + de);
        }
        Ok((0..m.n_layer)
            .map(|li| self.may_run_dense(k, li) && sums[li].1 < sums[li].0)
            .collect())
    }

    /// Seconds per decoded token that no completion of a partial plan can beat: compute with
    /// no reads; once the memory split is known, reads at pure transfer speed.
    pub fn decode_lower_bound(&self, k: &Knobs, split_known: bool) -> Result<f64, PlanError> {
        let r = self.rates(k)?;
        let m = self.model;
        let tokens = m.tokens() as f64;
        let (a, p, o, st, se) = self.fixed_parts(r, k.mode);
        let mut ffn = 0.0;
        let io = if split_known && k.mode == Mode::Offload {
            let rep = self.replay(k.budget, k.hot_share);
            let rep = rep
                .as_ref()
                .as_ref()
                .map_err(|e| PlanError::Unrunnable(e.clone()))?;
            let f = &self.hw.flash.with_load(k.threads);
            let conc = f.speedup(k.io_depth, None);
            Some(
                m.steps
                    .iter()
                    .zip(&rep.steps)
                    .map(|(s, miss)| {
                        miss_bytes(&m.ffn[s.layer as usize], miss) as f64 / f.bytes_per_sec / conc
                    })
                    .collect::<Vec<_>>(),
            )
        } else {
            None
        };
        // Whichever way a layer runs: a wholly pinned layer without a predictor runs dense.
        let compute: Vec<f64> = (self.step_compute(r, k).iter())
            .zip(self.dense_compute(r, k).iter())
            .zip(&m.steps)
            .map(
                |((&sparse, &dense), s)| match self.may_run_dense(k, s.layer as usize) {
                    true => sparse.min(dense),
                    false => sparse,
                },
            )
            .collect();
        ffn += compute.iter().sum::<f64>();
        if let Some(io) = io {
            // The same sampling as `evaluate`: a simulated step is at least its compute and at
            // least its transfer time.
            let stride = self.io_stride.max(1);
            let sampled: Vec<usize> = (0..m.steps.len()).step_by(stride).collect();
            let extra: f64 = sampled.iter().map(|&j| (io[j] - compute[j]).max(0.0)).sum();
            ffn += extra * m.steps.len() as f64 / sampled.len().max(1) as f64;
            let rep = self.replay(k.budget, k.hot_share);
            if let Ok(rep) = rep.as_ref() {
                let f = &self.hw.flash.with_load(k.threads);
                let bytes = self.streamed(&rep.streamed, k).1;
                ffn += bytes as f64 / f.bytes_per_sec * tokens;
            }
        }
        Ok(a + p + o + st + se + ffn / tokens)
    }

    /// Seconds, bytes and device reads of one token's streamed weights `s`: attention
    /// layers, output row chunks and the embedding row, each read cut at `max_read`.
    fn streamed(&self, s: &StreamedWeights, knobs: &Knobs) -> (f64, u64, u64) {
        let m = self.model;
        let n = m.attention.len();
        let attention = m.attention[n.saturating_sub(s.attn_layers)..n]
            .iter()
            .flatten()
            .map(|mat| mat.bytes() as usize);
        let embedding = Some(s.embedding_row_bytes).filter(|&b| b > 0);
        let Some(h) = &m.head else {
            let chunk = s.output_chunk_rows.max(1);
            let output = (0..s.output_rows)
                .step_by(chunk)
                .map(|first| chunk.min(s.output_rows - first) * m.output.row_bytes);
            return self.read_cost(attention.chain(output).chain(embedding), knobs);
        };
        // A clustered head reads only the chosen clusters that are not resident: one read of
        // a cluster's rows per choice, as often as calibration chose each.
        let (secs, bytes, reads) = self.read_cost(attention.chain(embedding), knobs);
        let chosen = h.chosen_among_last(s.output_rows);
        let (one, one_bytes, one_reads) =
            self.read_cost(std::iter::once(h.cluster * m.output.row_bytes), knobs);
        (
            secs + chosen * one,
            bytes + (chosen * one_bytes as f64).round() as u64,
            reads + (chosen * one_reads as f64).round() as u64,
        )
    }

    /// Seconds, bytes and device reads of whole reads of these sizes, cut at `max_read`.
    fn read_cost(&self, sizes: impl Iterator<Item = usize>, knobs: &Knobs) -> (f64, u64, u64) {
        let f = &self.hw.flash.with_load(knobs.threads);
        let max_read = knobs.max_read.max(f.alignment).max(1);
        let (mut secs, mut bytes, mut reads) = (0.0, 0, 0);
        for b in sizes {
            let n = b.div_ceil(max_read);
            secs += n as f64 * f.read_secs(max_read.min(b));
            bytes += b as u64;
            reads += n as u64;
        }
        (secs, bytes, reads)
    }

    /// The prediction for one plan, or why it cannot run.
    pub fn evaluate(&self, k: &Knobs) -> Result<Prediction, PlanError> {
        let r = self.rates(k)?;
        let m = self.model;
        if k.cluster == 0 || !k.cluster.is_multiple_of(4) {
            return Err(PlanError::Unrunnable(format!(
                "cluster size {} must be a positive multiple of 4",
                k.cluster
            )));
        }
        let tokens = m.tokens().max(1) as f64;
        let (attention, predictor, output, steps, serial) = self.fixed_parts(r, k.mode);
        let mut b = Breakdown {
            attention,
            predictor,
            output,
            steps,
            serial,
            ..Default::default()
        };
        if k.mode != Mode::Dense {
            // Per candidate: its SiLU and its row addresses; per cluster: adding its partial.
            let per_step: f64 = m
                .steps
                .iter()
                .map(|s| {
                    let nc = s.candidates.len();
                    (2 * nc + nc.div_ceil(k.cluster) * m.n_embd) as f64
                })
                .sum();
            b.serial += per_step / tokens * r.serial_ns_per_elem * 1e-9;
        }
        let (mut hit_rate, mut read_bytes, mut reads) = (None, 0.0, 0.0);
        let memory = match k.mode {
            Mode::Dense | Mode::Sparse => self.residency.in_memory_bytes(),
            Mode::Offload => k.budget,
        };
        match k.mode {
            Mode::Dense | Mode::Sparse => {
                b.ffn_compute = self.step_compute(r, k).iter().sum::<f64>() / tokens;
            }
            Mode::Offload => {
                let rep = self.replay(k.budget, k.hot_share);
                let rep = rep
                    .as_ref()
                    .as_ref()
                    .map_err(|e| PlanError::Unrunnable(e.clone()))?;
                let io = self.io_cost(k, r, rep);
                let compute = self.step_compute(r, k);
                let (mut exposed, mut total_io) = (0.0, 0.0);
                // A simulated step (compute and reads interleaved) beyond its compute is the
                // reads' share; unsimulated steps take the simulated ones' average.
                let stride = self.io_stride.max(1);
                for (n, j) in (0..m.steps.len()).step_by(stride).enumerate() {
                    exposed += (io.step_secs[n] - compute[j]).max(0.0);
                    total_io += io.step_io[n];
                }
                let scale = m.steps.len() as f64 / io.step_secs.len().max(1) as f64 / tokens;
                let (stream_secs, stream_bytes, stream_reads) = self.streamed(&rep.streamed, k);
                // A wholly pinned layer runs dense where that is faster.
                let dense = self.dense_compute(r, k);
                let faster = self.dense_layers(k)?;
                b.ffn_compute = (compute.iter().zip(dense.iter()).zip(&m.steps))
                    .map(|((&sparse, &dense), s)| {
                        let li = s.layer as usize;
                        match faster[li] && rep.whole_layers[li] {
                            true => dense,
                            false => sparse,
                        }
                    })
                    .sum::<f64>()
                    / tokens;
                b.io_exposed = exposed * scale + stream_secs;
                b.io_total = total_io * scale + stream_secs;
                hit_rate = Some(rep.hit_rate());
                read_bytes = io.bytes as f64 * scale + stream_bytes as f64;
                reads = io.reads as f64 * scale + stream_reads as f64;
            }
        }
        Ok(Prediction {
            decode_tps: 1.0 / b.total(),
            prefill_tps: self.prefill_tps(r, k),
            memory,
            breakdown: b,
            hit_rate,
            read_bytes_per_token: read_bytes,
            device_reads_per_token: reads,
        })
    }

    /// Prefill of one `n_batch` batch, densely; offloaded layers stream in while the previous
    /// layer computes.
    fn prefill_tps(&self, r: &ThreadRates, k: &Knobs) -> f64 {
        let m = self.model;
        let n = self.n_batch;
        let mm =
            |ty: &str, rows: usize, rb: usize| r.secs(KernelOp::Matmul, ty, rows, rb) * n as f64;
        let f = &self.hw.flash.with_load(k.threads);
        let mut total = 0.0;
        let mut prev_compute = 0.0;
        let streamed = match k.mode {
            Mode::Offload => match self.replay(k.budget, k.hot_share).as_ref() {
                Ok(rep) => rep.streamed,
                Err(_) => StreamedWeights::default(),
            },
            _ => StreamedWeights::default(),
        };
        let first_streamed = m.ffn.len().saturating_sub(streamed.attn_layers);
        for (li, l) in m.ffn.iter().enumerate() {
            let attn: f64 = m.attention[li]
                .iter()
                .map(|s| mm(&s.ty, s.rows, s.row_bytes))
                .sum();
            let ffn = mm(&l.gate.ty, m.n_ff, l.gate.row_bytes)
                + mm(&l.up.ty, m.n_ff, l.up.row_bytes)
                + n as f64 * r.secs(KernelOp::Axpy, &l.down.ty, m.n_ff, l.down.row_bytes);
            let compute = attn + ffn + 5.0 * r.step_ns * 1e-9;
            if k.mode == Mode::Offload {
                let bytes = m.n_ff * l.neuron_bytes();
                let max_read = k.max_read.max(f.alignment).max(1);
                let mut read = bytes.div_ceil(max_read) as f64 * f.read_secs(max_read.min(bytes));
                if li >= first_streamed {
                    // This layer's attention shares the queue with the FFN reads.
                    let mats = m.attention[li].iter().map(|mat| mat.bytes() as usize);
                    read += self.read_cost(mats, k).0;
                }
                // The first layer's read is exposed; later ones overlap the previous layer.
                let waited = if li == 0 {
                    read
                } else {
                    (read - prev_compute).max(0.0)
                };
                total += waited + compute;
            } else {
                total += compute;
            }
            prev_compute = compute;
        }
        total += r.secs(
            KernelOp::Matvec,
            &m.output.ty,
            m.output.rows,
            m.output.row_bytes,
        );
        // The batch's embedding rows and its one pass over the streamed output rows.
        let vocab = StreamedWeights {
            attn_layers: 0,
            ..streamed
        };
        let (mut vocab_secs, ..) = self.streamed(&vocab, k);
        if streamed.embedding_row_bytes > 0 {
            let f = &self.hw.flash.with_load(k.threads);
            vocab_secs += (n - 1) as f64 * f.read_secs(streamed.embedding_row_bytes);
        }
        total += vocab_secs;
        n as f64 / total
    }
}

fn miss_bytes(l: &crate::model::FfnLayer, miss: &StepMisses) -> u64 {
    (miss.gate.len() * l.gate.row_bytes + miss.updown.len() * (l.up.row_bytes + l.down.row_bytes))
        as u64
}
