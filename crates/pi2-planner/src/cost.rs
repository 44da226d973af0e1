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
//! - offloaded: the same compute `c`, and the reads the replay says miss, shaped into device
//!   reads exactly as the reader shapes them (gate rows in one batch, then up/down rows per
//!   cluster), each costing `latency + bytes / bandwidth` at the engine's concurrency: `io`.
//!   Reads and compute overlap by clusters, but a layer cannot start before the previous one
//!   ends, so the step costs `max(c, io + c / clusters)` (the last cluster computes after its
//!   reads land).
//!
//! Prefill of a batch: every matrix as a batched product; offloaded, each layer's FFN is read
//! whole in `max_read` pieces while the previous layer computes: `max(compute, read)` per layer.

use crate::hw::{HardwareProfile, KernelOp, ThreadRates};
use crate::model::{replay, ModelProfile, Replay, Residency, StepMisses};
use pi2_io::ReaderConfig;
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

/// Device-read cost of a replay under one I/O shaping: per step, seconds.
struct IoCost {
    step_secs: Vec<f64>,
    bytes: u64,
    reads: u64,
}

type ReplayKey = (u64, u64);
type IoKey = (u64, u64, usize, usize, usize);

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
    replays: Mutex<HashMap<ReplayKey, Arc<Result<Replay, String>>>>,
    io: Mutex<HashMap<IoKey, Arc<IoCost>>>,
}

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
            replays: Mutex::default(),
            io: Mutex::default(),
        }
    }

    fn rates(&self, k: &Knobs) -> Result<&ThreadRates, String> {
        self.hw.rates(k.class, k.threads).ok_or_else(|| {
            format!(
                "the hardware profile has no figures for {} thread(s) on core class {}",
                k.threads, k.class
            )
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
        let r = Arc::new(r);
        self.replays.lock().unwrap().insert(key, r.clone());
        r
    }

    fn io_cost(&self, k: &Knobs, rep: &Replay) -> Arc<IoCost> {
        let key = (
            k.budget,
            k.hot_share.to_bits(),
            k.cluster,
            k.merge_gap,
            k.max_read,
        );
        if let Some(c) = self.io.lock().unwrap().get(&key) {
            return c.clone();
        }
        let f = &self.hw.flash;
        let cfg = ReaderConfig {
            max_request: k.max_read,
            depth: k.io_depth,
            merge_gap: k.merge_gap,
        };
        let conc = k.io_depth.min(f.engine_concurrency).max(1) as f64;
        let (mut bytes, mut reads) = (0u64, 0u64);
        let mut step_secs = Vec::with_capacity(rep.steps.len());
        let mut batch = Vec::new();
        for (s, miss) in self.model.steps.iter().zip(&rep.steps) {
            let l = &self.model.ffn[s.layer as usize];
            let mut secs = 0.0;
            let mut cost = |batch: &[(u64, usize)]| {
                for (_, len) in pi2_io::device_reads(batch, f.alignment, &cfg) {
                    secs += f.read_secs(len);
                    bytes += len as u64;
                    reads += 1;
                }
            };
            batch.clear();
            batch.extend(miss.gate.iter().map(|&i| {
                (
                    l.gate.offset + i as u64 * l.gate.row_bytes as u64,
                    l.gate.row_bytes,
                )
            }));
            cost(&batch);
            // Up/down reads go out per cluster, as each cluster's gate phase confirms them.
            for chunk in miss
                .updown
                .chunk_by(|a, b| a.0 as usize / k.cluster == b.0 as usize / k.cluster)
            {
                batch.clear();
                for &(_, i) in chunk {
                    batch.push((
                        l.up.offset + i as u64 * l.up.row_bytes as u64,
                        l.up.row_bytes,
                    ));
                    batch.push((
                        l.down.offset + i as u64 * l.down.row_bytes as u64,
                        l.down.row_bytes,
                    ));
                }
                cost(&batch);
            }
            step_secs.push(secs / conc);
        }
        let c = Arc::new(IoCost {
            step_secs,
            bytes,
            reads,
        });
        self.io.lock().unwrap().insert(key, c.clone());
        c
    }

    /// Per-token costs outside the FFN: attention, predictor, output, their parallel steps.
    fn fixed_parts(&self, r: &ThreadRates, mode: Mode) -> (f64, f64, f64, f64) {
        let m = self.model;
        let mv = |s: &crate::model::MatShape| r.secs(KernelOp::Matvec, &s.ty, s.rows, s.row_bytes);
        let kv = self.position as f64 * m.kv_bytes_per_pos as f64 / r.mem_bytes_per_sec;
        let attention: f64 = m.attention.iter().flatten().map(mv).sum::<f64>() + kv;
        let predictor: f64 = if mode == Mode::Dense {
            0.0
        } else {
            m.predictor.iter().flatten().map(mv).sum()
        };
        let output = mv(&m.output);
        // Per layer: q/k/v, attention heads, o; the predictor's two products; the FFN's two
        // (dense: gate+up, down; sparse: one cluster pipeline). Plus the output head.
        let pred_steps = if mode == Mode::Dense { 0 } else { 2 };
        let ffn_steps = if mode == Mode::Dense { 2 } else { 1 };
        let steps = (m.n_layer * (3 + pred_steps + ffn_steps) + 1) as f64 * r.step_ns * 1e-9;
        (attention, predictor, output, steps)
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

    /// Seconds per decoded token that no completion of a partial plan can beat: compute with
    /// no reads; once the memory split is known, reads at pure transfer speed.
    pub fn decode_lower_bound(&self, k: &Knobs, split_known: bool) -> Result<f64, String> {
        let r = self.rates(k)?;
        let m = self.model;
        let tokens = m.tokens() as f64;
        let (a, p, o, st) = self.fixed_parts(r, k.mode);
        let mut ffn = 0.0;
        let io = if split_known && k.mode == Mode::Offload {
            let rep = self.replay(k.budget, k.hot_share);
            let rep = rep.as_ref().as_ref().map_err(|e| e.clone())?;
            let f = &self.hw.flash;
            let conc = f.engine_concurrency.max(1) as f64;
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
        for (j, s) in m.steps.iter().enumerate() {
            let (nc, nf) = (s.candidates.len(), s.confirmed.len());
            let c = if k.mode == Mode::Dense {
                self.ffn_compute(r, Mode::Dense, s.layer as usize, 0, 0)
            } else {
                self.ffn_compute(r, Mode::Sparse, s.layer as usize, nc, nf)
            };
            ffn += io.as_ref().map_or(c, |io| c.max(io[j]));
        }
        Ok(a + p + o + st + ffn / tokens)
    }

    /// The prediction for one plan, or why it cannot run.
    pub fn evaluate(&self, k: &Knobs) -> Result<Prediction, String> {
        let r = self.rates(k)?;
        let m = self.model;
        if k.cluster == 0 || k.cluster % 4 != 0 {
            return Err(format!(
                "cluster size {} must be a positive multiple of 4",
                k.cluster
            ));
        }
        let tokens = m.tokens().max(1) as f64;
        let (attention, predictor, output, steps) = self.fixed_parts(r, k.mode);
        let mut b = Breakdown {
            attention,
            predictor,
            output,
            steps,
            ..Default::default()
        };
        let (mut hit_rate, mut read_bytes, mut reads) = (None, 0.0, 0.0);
        let memory = match k.mode {
            Mode::Dense | Mode::Sparse => self.residency.in_memory_bytes(),
            Mode::Offload => k.budget,
        };
        match k.mode {
            Mode::Dense => {
                let per: f64 = (0..m.n_layer)
                    .map(|l| self.ffn_compute(r, Mode::Dense, l, 0, 0))
                    .sum();
                b.ffn_compute = per;
            }
            Mode::Sparse => {
                let total: f64 = m
                    .steps
                    .iter()
                    .map(|s| {
                        self.ffn_compute(
                            r,
                            Mode::Sparse,
                            s.layer as usize,
                            s.candidates.len(),
                            s.confirmed.len(),
                        )
                    })
                    .sum();
                b.ffn_compute = total / tokens;
            }
            Mode::Offload => {
                let rep = self.replay(k.budget, k.hot_share);
                let rep = rep.as_ref().as_ref().map_err(|e| e.clone())?;
                let io = self.io_cost(k, rep);
                let (mut comp, mut exposed, mut total_io) = (0.0, 0.0, 0.0);
                for (j, s) in m.steps.iter().enumerate() {
                    let nc = s.candidates.len();
                    let c =
                        self.ffn_compute(r, Mode::Offload, s.layer as usize, nc, s.confirmed.len());
                    let clusters = nc.div_ceil(k.cluster).max(1) as f64;
                    let t = c.max(io.step_secs[j] + c / clusters);
                    comp += c;
                    exposed += t - c;
                    total_io += io.step_secs[j];
                }
                b.ffn_compute = comp / tokens;
                b.io_exposed = exposed / tokens;
                b.io_total = total_io / tokens;
                hit_rate = Some(rep.hit_rate());
                read_bytes = io.bytes as f64 / tokens;
                reads = io.reads as f64 / tokens;
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
        let f = &self.hw.flash;
        let mut total = 0.0;
        let mut prev_compute = 0.0;
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
                let read = bytes.div_ceil(max_read) as f64 * f.read_secs(max_read.min(bytes));
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
        n as f64 / total
    }
}

fn miss_bytes(l: &crate::model::FfnLayer, miss: &StepMisses) -> u64 {
    (miss.gate.len() * l.gate.row_bytes + miss.updown.len() * (l.up.row_bytes + l.down.row_bytes))
        as u64
}
