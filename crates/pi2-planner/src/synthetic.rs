//! Small synthetic inputs (a model recording, a device, a memory accounting) for tests and
//! benches of planners, here and in other engines.

use crate::cost::Mode;
use crate::hw::{
    CoreClass, FlashPoint, FlashProfile, HardwareProfile, KernelOp, KernelRate, ThreadRates,
};
use crate::model::{FfnLayer, MatShape, ModelProfile, Residency, ResidencySplit, RowPart, Step};
use crate::PlanError;

/// `n_layer` layers of `n_ff` neurons (136-byte Q8_0 rows of 128 columns), `tokens` recorded
/// tokens where neuron `i` of layer `l` is a candidate at token `t` when
/// `(7i + 3t + l) % 5 < 3`, and confirmed when also even.
pub fn toy_model(n_layer: usize, n_ff: usize, tokens: usize) -> ModelProfile {
    let part = |base: u64, rb: usize| RowPart {
        ty: "Q8_0".into(),
        offset: base,
        row_bytes: rb,
    };
    let mut steps = Vec::new();
    for t in 0..tokens {
        for l in 0..n_layer {
            let candidates: Vec<u32> = (0..n_ff as u32)
                .filter(|&i| (i as usize * 7 + t * 3 + l) % 5 < 3)
                .collect();
            let confirmed = candidates.iter().copied().filter(|i| i % 2 == 0).collect();
            steps.push(Step {
                layer: l as u32,
                candidates,
                confirmed,
            });
        }
    }
    let mat = |rows: usize| MatShape {
        ty: "Q8_0".into(),
        rows,
        row_bytes: 136,
    };
    ModelProfile {
        name: "toy".into(),
        digest: "toy-digest".into(),
        file_bytes: 4096 + (n_layer * n_ff * 3 * 136) as u64,
        n_layer,
        n_ff,
        n_embd: 128,
        kv_bytes_per_pos: 1024,
        attention: (0..n_layer).map(|_| vec![mat(128); 4]).collect(),
        predictor: (0..n_layer).map(|_| vec![mat(16)]).collect(),
        output: mat(1000),
        head: None,
        ffn: (0..n_layer)
            .map(|l| {
                let base = 4096 + (l * n_ff * 3 * 136) as u64;
                FfnLayer {
                    gate: part(base, 136),
                    up: part(base + (n_ff * 136) as u64, 136),
                    down: part(base + (2 * n_ff * 136) as u64, 136),
                }
            })
            .collect(),
        steps,
    }
}

/// A device with one class of `cores` cores: every kernel streams `gbps` GB/s per thread
/// (no per-row cost), parallel steps cost 2 us, serial work is free, and flash reads cost `lat_us + s / 1 GB/s`.
pub fn toy_hardware(cores: usize, gbps: f64, lat_us: f64) -> HardwareProfile {
    let rates = (1..=cores)
        .map(|t| ThreadRates {
            threads: t,
            kernels: [
                KernelOp::Matvec,
                KernelOp::Gather,
                KernelOp::Axpy,
                KernelOp::Matmul,
            ]
            .into_iter()
            .map(|op| KernelRate {
                op,
                ty: "Q8_0".into(),
                row_ns: 0.0,
                bytes_per_sec: gbps * 1e9 * t as f64,
            })
            .collect(),
            step_ns: 2000.0,
            mem_bytes_per_sec: 10e9,
            serial_ns_per_elem: 0.0,
        })
        .collect();
    HardwareProfile {
        version: crate::hw::HW_VERSION,
        fingerprint: "toy-device".into(),
        cpu: "toy".into(),
        tier: "scalar".into(),
        classes: vec![CoreClass {
            name: "big".into(),
            max_freq_khz: None,
            cpus: (0..cores).collect(),
            rates,
        }],
        flash: FlashProfile {
            engine: "pread-direct".into(),
            engine_concurrency: 1,
            alignment: 4096,
            points: vec![FlashPoint {
                read_size: 4096,
                depth: 1,
                bytes_per_sec: 4096.0 / (lat_us * 1e-6 + 4096e-9),
                lat_p50_us: lat_us,
                lat_p99_us: lat_us,
            }],
            latency_us: lat_us,
            bytes_per_sec: 1e9,
            handling_bytes_per_sec: f64::INFINITY,
            handling_ns_per_request: 0.0,
            engine_cpu_bytes_per_sec: None,
            loaded: vec![],
        },
    }
}

/// Memory accounting for [`toy_model`]: `fixed` bytes always resident, then neurons of
/// `neuron_bytes` each, pinned by share (same count per layer) or cached (at least one layer).
pub struct ToyResidency {
    pub n_layer: usize,
    pub n_ff: usize,
    pub fixed: u64,
    pub neuron_bytes: u64,
    pub file_bytes: u64,
}

impl ToyResidency {
    pub fn for_model(m: &ModelProfile, fixed: u64) -> Self {
        Self {
            n_layer: m.n_layer,
            n_ff: m.n_ff,
            fixed,
            neuron_bytes: m.ffn[0].neuron_bytes() as u64,
            file_bytes: m.file_bytes,
        }
    }
}

impl Residency for ToyResidency {
    fn split(&self, budget: u64, hot_share: f64) -> Result<ResidencySplit, PlanError> {
        if budget < self.min_budget() {
            return Err(PlanError::Infeasible(format!(
                "needs at least {} bytes",
                self.min_budget()
            )));
        }
        let neurons = ((budget - self.fixed) / self.neuron_bytes) as usize;
        let spare = neurons - self.n_ff;
        let hot = ((spare as f64 * hot_share) as usize / self.n_layer).min(self.n_ff);
        let cold =
            (neurons - hot * self.n_layer).min(self.n_layer * self.n_ff - hot * self.n_layer);
        Ok(ResidencySplit {
            hot_counts: vec![hot; self.n_layer],
            hot_gate_counts: Vec::new(),
            cold_slots: cold
                .max(self.n_ff.min(self.n_layer * self.n_ff - hot * self.n_layer))
                .max(1),
            streamed: Default::default(),
        })
    }
    fn min_budget(&self) -> u64 {
        self.fixed + self.n_ff as u64 * self.neuron_bytes
    }
    fn in_memory_bytes(&self) -> u64 {
        self.file_bytes + self.fixed
    }
}

/// Every mode, for tests that want the full space.
pub const ALL_MODES: [Mode; 3] = [Mode::Dense, Mode::Sparse, Mode::Offload];
