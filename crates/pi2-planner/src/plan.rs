//! Constraints in, plan out: the search space, the solver call, the versioned plan file.

use crate::cost::{CostModel, Knobs, Mode, Prediction};
use crate::solve::branch_and_bound;
use crate::PlanError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bumped whenever a plan's meaning changes; plans of other versions are refused.
pub const PLAN_VERSION: u32 = 1;

/// What the user wants most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Fastest decode within the memory limit.
    Fastest,
    /// Least memory that still decodes at `min_decode_tps`.
    LeastMemory,
}

/// The user's constraints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// Resident bytes the engine may use.
    pub mem_limit: u64,
    /// Core classes allowed (indices into the hardware profile); empty: all.
    pub classes: Vec<usize>,
    /// At most this many threads (0: as many as the class has cores).
    pub max_threads: usize,
    /// Decode at least this fast (tokens/s; 0: no minimum).
    pub min_decode_tps: f64,
    pub objective: Objective,
}

/// The discrete choices the solver searches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Space {
    /// Thread counts tried (empty: every count the profile has, up to the constraints).
    pub threads: Vec<usize>,
    pub modes: Vec<Mode>,
    /// Offloading budgets tried: this many points from the limit down to the minimum.
    pub memory_points: usize,
    pub hot_shares: Vec<f64>,
    pub clusters: Vec<usize>,
    pub merge_gaps: Vec<usize>,
    pub max_reads: Vec<usize>,
    pub io_depths: Vec<usize>,
}

impl Default for Space {
    fn default() -> Self {
        Self {
            threads: vec![],
            modes: vec![Mode::Sparse, Mode::Dense, Mode::Offload],
            memory_points: 6,
            hot_shares: vec![1.0, 0.5, 0.0],
            clusters: vec![32, 64, 128],
            merge_gaps: vec![0, 4 << 10, 16 << 10, 64 << 10],
            max_reads: vec![128 << 10, 512 << 10],
            // As deep as the reader's own choice goes (`pi2_io::choice`): flash that needs 32
            // reads in flight is common (a virtual disk here: 1.9x from 1 to 32).
            io_depths: vec![1, 2, 4, 8, 16, 32],
        }
    }
}

/// The solver's answer.
#[derive(Clone, Debug)]
pub struct Solution {
    pub knobs: Knobs,
    pub predicted: Prediction,
    /// Plans the solver evaluated fully, of `space_size`.
    pub evaluated: u64,
    pub space_size: u64,
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Solves for the best plan under `c`.
pub fn plan(cm: &CostModel<'_>, c: &Constraints, space: &Space) -> Result<Solution, PlanError> {
    let res = cm.residency;
    let in_memory = res.in_memory_bytes();
    let min_budget = res.min_budget();
    let need = in_memory.min(min_budget);
    if c.mem_limit < need {
        return Err(PlanError::Infeasible(format!(
            "needs at least {} (the fixed region, one layer of neuron cache and prefill staging); the limit is {}",
            mib(need),
            mib(c.mem_limit)
        )));
    }
    let threads = thread_choices(cm, c, space)?;
    let modes = mode_choices(c, space, in_memory, min_budget);
    // An engine that keeps one read in flight gains nothing from depth (and the reader reports
    // completions per group of `depth` reads, so 1 overlaps best): only the smallest is tried.
    let mut space = space.clone();
    if cm.hw.flash.engine_concurrency <= 1 {
        if let Some(&d) = space.io_depths.iter().min() {
            space.io_depths = vec![d];
        }
    }
    let space = &space;
    let axes = [
        threads.len(),
        modes.len(),
        space.hot_shares.len(),
        space.clusters.len(),
        space.merge_gaps.len(),
        space.max_reads.len(),
        space.io_depths.len(),
    ];
    let knobs = |at: &[usize]| {
        let g = |axis: usize| at.get(axis).copied().unwrap_or(0);
        let (class, th) = threads[g(0)];
        let (mode, budget) = modes[g(1)];
        Knobs {
            class,
            threads: th,
            mode,
            budget,
            hot_share: space.hot_shares[g(2)],
            cluster: space.clusters[g(3)],
            merge_gap: space.merge_gaps[g(4)],
            max_read: space.max_reads[g(5)],
            io_depth: space.io_depths[g(6)],
        }
    };
    // Axes a mode ignores stay at their first value (no duplicate plans); `at` may be partial.
    let ignored = |at: &[usize]| {
        at.len() > 1
            && match modes[at[1]].0 {
                Mode::Offload => false,
                Mode::Sparse => at
                    .iter()
                    .enumerate()
                    .any(|(a, &v)| (a == 2 || a >= 4) && v != 0),
                Mode::Dense => at.iter().skip(2).any(|&v| v != 0),
            }
    };
    let mut evaluated = 0u64;
    let min_tps = c.min_decode_tps;
    let mut cost = |at: &[usize]| -> Option<f64> {
        if ignored(at) {
            return None;
        }
        evaluated += 1;
        let p = cm.evaluate(&knobs(at)).ok()?;
        if p.memory > c.mem_limit || p.decode_tps < min_tps {
            return None;
        }
        Some(match c.objective {
            Objective::Fastest => 1.0 / p.decode_tps,
            // Memory first; among equal memory, the faster plan.
            Objective::LeastMemory => p.memory as f64 + 1e-3 / p.decode_tps,
        })
    };
    let mut bound = |at: &[usize]| -> f64 {
        if ignored(at) {
            return f64::INFINITY;
        }
        match c.objective {
            Objective::Fastest if at.len() < 2 => {
                let k = knobs(at);
                [Mode::Dense, Mode::Sparse]
                    .into_iter()
                    .filter_map(|mode| {
                        cm.decode_lower_bound(&Knobs { mode, ..k.clone() }, false)
                            .ok()
                    })
                    .fold(f64::INFINITY, f64::min)
            }
            Objective::Fastest => cm
                .decode_lower_bound(&knobs(at), at.len() >= 3)
                .unwrap_or(f64::INFINITY),
            Objective::LeastMemory if at.len() < 2 => need as f64,
            Objective::LeastMemory => modes[at[1]].1 as f64,
        }
    };
    let found = branch_and_bound(&axes, &mut cost, &mut bound);
    let space_size = axes.iter().map(|&n| n as u64).product();
    match found {
        Some((at, _)) => {
            let predicted = cm.evaluate(&knobs(&at))?;
            Ok(Solution {
                knobs: knobs(&at),
                predicted,
                evaluated,
                space_size,
            })
        }
        None => Err(speed_infeasible(cm, c, space)),
    }
}

/// Every allowed (class, thread count) pair of the profile.
fn thread_choices(
    cm: &CostModel<'_>,
    c: &Constraints,
    space: &Space,
) -> Result<Vec<(usize, usize)>, PlanError> {
    let mut threads = Vec::new();
    for (ci, class) in cm.hw.classes.iter().enumerate() {
        if !c.classes.is_empty() && !c.classes.contains(&ci) {
            continue;
        }
        for r in &class.rates {
            if (c.max_threads == 0 || r.threads <= c.max_threads)
                && (space.threads.is_empty() || space.threads.contains(&r.threads))
            {
                threads.push((ci, r.threads));
            }
        }
    }
    if threads.is_empty() {
        return Err(PlanError::Infeasible(
            "no allowed cores: the core selection matches no class of the hardware profile".into(),
        ));
    }
    Ok(threads)
}

/// Modes with their memory: whole model, or offloading budgets (largest first, so fast plans
/// are found early and bound the rest; smallest first when memory is the objective).
fn mode_choices(
    c: &Constraints,
    space: &Space,
    in_memory: u64,
    min_budget: u64,
) -> Vec<(Mode, u64)> {
    let mut modes: Vec<(Mode, u64)> = Vec::new();
    for &m in &space.modes {
        match m {
            Mode::Dense | Mode::Sparse if in_memory <= c.mem_limit => modes.push((m, in_memory)),
            Mode::Offload if min_budget <= c.mem_limit => {
                let top = c.mem_limit.min(in_memory.max(min_budget));
                let n = space.memory_points.max(1);
                for k in 0..n {
                    let b = if n == 1 {
                        top
                    } else {
                        top - (top - min_budget) * k as u64 / (n - 1) as u64
                    };
                    if !modes.contains(&(Mode::Offload, b)) {
                        modes.push((Mode::Offload, b));
                    }
                }
            }
            _ => {}
        }
    }
    if c.objective == Objective::LeastMemory {
        modes.sort_by_key(|&(_, b)| b);
    }
    modes
}

/// The memory limit admits plans but none is fast enough: say how fast the fastest one is.
fn speed_infeasible(cm: &CostModel<'_>, c: &Constraints, space: &Space) -> PlanError {
    let fastest = plan(
        cm,
        &Constraints {
            min_decode_tps: 0.0,
            objective: Objective::Fastest,
            ..c.clone()
        },
        space,
    );
    PlanError::Infeasible(match fastest {
        Ok(s) => format!(
            "no plan decodes at {:.2} tok/s within {}: the fastest predicted is {:.2} tok/s",
            c.min_decode_tps,
            mib(c.mem_limit),
            s.predicted.decode_tps
        ),
        Err(e) => e.to_string(),
    })
}

/// Identity of the model a plan is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanModel {
    pub name: String,
    pub digest: String,
    pub file_bytes: u64,
}

/// Identity of the device a plan is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanDevice {
    pub fingerprint: String,
    pub cpu: String,
    /// The emulated flash device the plan is for (`LATENCYus,BANDWIDTHMB/s`), if any.
    #[serde(default)]
    pub emulated: Option<String>,
    /// The read engine the hardware profile measured (`pread-direct`, `uring-direct`, ...):
    /// the one to run the plan with.
    #[serde(default)]
    pub engine: String,
}

/// A plan on disk: every knob, what it is predicted to do, and what it is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanFile {
    pub version: u32,
    pub model: PlanModel,
    pub device: PlanDevice,
    pub constraints: Constraints,
    pub knobs: Knobs,
    /// Per layer, whether it runs dense when all its rows are pinned (where the device computes
    /// it faster so); empty in plans that predate the choice.
    #[serde(default)]
    pub dense_layers: Vec<bool>,
    /// CPUs the threads are pinned to (thread `i` on `cpus[i]`).
    pub cpus: Vec<usize>,
    /// Context length and prefill batch the memory was accounted for.
    pub n_ctx: usize,
    pub n_batch: usize,
    pub predicted: Prediction,
    pub evaluated: u64,
    pub space_size: u64,
}

impl PlanFile {
    /// Reads a plan, refusing other versions.
    pub fn load(path: &Path) -> Result<PlanFile, PlanError> {
        let file_err = |msg: String| PlanError::File {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses a plan's text, refusing other versions; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<PlanFile, PlanError> {
        let file_err = |msg: String| PlanError::File {
            path: origin.to_string(),
            msg,
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| file_err(format!("not JSON: {e}")))?;
        match v.get("version").and_then(|v| v.as_u64()) {
            Some(n) if n == PLAN_VERSION as u64 => {}
            other => {
                return Err(file_err(format!(
                    "plan version {}, this pi2 reads version {PLAN_VERSION}: plan again with `pi2 plan`",
                    other.map_or("missing".to_string(), |n| n.to_string())
                )))
            }
        }
        serde_json::from_value(v).map_err(|e| file_err(e.to_string()))
    }

    /// Writes the plan; never replaces an existing file unless `overwrite`.
    pub fn save(&self, path: &Path, overwrite: bool) -> Result<(), PlanError> {
        let file_err = |msg: String| PlanError::File {
            path: path.display().to_string(),
            msg,
        };
        if path.exists() && !overwrite {
            return Err(file_err("exists; pass --force to replace it".into()));
        }
        let text = serde_json::to_string_pretty(self).expect("serialisable");
        std::fs::write(path, text + "\n").map_err(|e| file_err(e.to_string()))
    }

    /// Refuses a plan made for another model or another device.
    pub fn check(&self, model_digest: &str, device_fingerprint: &str) -> Result<(), PlanError> {
        if self.model.digest != model_digest {
            return Err(PlanError::Foreign {
                what: "model",
                planned: format!("{} ({})", self.model.name, self.model.digest),
                actual: model_digest.to_string(),
            });
        }
        if self.device.fingerprint != device_fingerprint {
            return Err(PlanError::Foreign {
                what: "device",
                planned: format!("{} ({})", self.device.cpu, self.device.fingerprint),
                actual: device_fingerprint.to_string(),
            });
        }
        Ok(())
    }
}

/// Predicted decode speed of the fastest plan at each memory limit (the `--explain` picture).
pub fn speed_curve(
    cm: &CostModel<'_>,
    c: &Constraints,
    space: &Space,
    limits: &[u64],
) -> Vec<(u64, Option<f64>)> {
    limits
        .iter()
        .map(|&l| {
            let cc = Constraints {
                mem_limit: l,
                objective: Objective::Fastest,
                min_decode_tps: 0.0,
                ..c.clone()
            };
            (l, plan(cm, &cc, space).ok().map(|s| s.predicted.decode_tps))
        })
        .collect()
}
