//! The engine as the planner sees it: its memory accounting ([`EngineResidency`]), a model
//! profile (shapes, where neurons lie, a recording of real sparse decode steps), solving for a
//! plan, and applying a plan (a file checked against this model and device, or planned now).

use crate::device::{fingerprint, load_hw, model_digest};
use crate::error::{Result, RuntimeError};
use crate::options::{parse_emulate, parse_size, EngineOptions};
use pi2_engine::topology::Topology;
use pi2_engine::{Engine, EngineConfig, EngineParts, Logits, SparseFfn};
use pi2_model::Model;
use pi2_planner::cost::Mode;
use pi2_planner::hw::HardwareProfile;
use pi2_planner::model::{
    FfnLayer, MatShape, ModelProfile, Residency, ResidencySplit, RowPart, Step,
};
use pi2_planner::plan::{PlanDevice, PlanModel, PLAN_VERSION};
use pi2_planner::{Constraints, CostModel, Knobs, Objective, PlanError, PlanFile, Space};
use std::path::Path;

/// The engine's memory accounting, for the planner.
pub struct EngineResidency<'a> {
    model: &'a Model,
    sparse: &'a SparseFfn<'a>,
    kv: u64,
    scratch: u64,
    freq: Option<Vec<Vec<f32>>>,
    /// What the process holds outside the engine's regions ([`crate::offload::process_bytes`]).
    process: u64,
}

impl<'a> EngineResidency<'a> {
    /// The accounting of an engine of context `n_ctx` and batches of `n_batch`, in a process
    /// holding `process` bytes outside the regions (`None`: measured now, which a process that
    /// already holds an offload's regions must not do: they would count twice).
    pub fn new(
        model: &'a Model,
        sparse: &'a SparseFfn<'a>,
        n_ctx: usize,
        n_batch: usize,
        process: Option<u64>,
    ) -> Result<Self> {
        let sizing = EngineConfig {
            threads: 1,
            n_ctx,
            ..EngineConfig::default()
        };
        Ok(Self {
            model,
            sparse,
            kv: pi2_engine::kv_bytes_full(model, &sizing, n_batch) as u64,
            scratch: pi2_engine::scratch_bytes(model, &sizing, n_batch) as u64,
            freq: pi2_engine::unit_frequencies(model)?,
            process: process.unwrap_or_else(|| crate::offload::process_bytes(model)),
        })
    }
}

impl Residency for EngineResidency<'_> {
    fn split(&self, budget: u64, hot_share: f64) -> Result<ResidencySplit, PlanError> {
        let r = pi2_engine::regions(
            self.model,
            self.sparse,
            self.kv,
            0,
            self.scratch,
            self.freq.as_deref(),
            budget,
            hot_share,
            self.process,
        )
        .map_err(|e| PlanError::Infeasible(e.to_string()))?;
        Ok(ResidencySplit {
            hot_counts: r.hot_counts.clone(),
            hot_gate_counts: r.hot_gate_counts.clone(),
            cold_slots: r.cold_slots,
            streamed: pi2_planner::StreamedWeights {
                attn_layers: r.streamed_layers,
                output_rows: r.streamed_output_rows,
                output_chunk_rows: r.output_chunk_rows(),
                embedding_row_bytes: r.embedding_row_bytes(),
            },
        })
    }
    fn min_budget(&self) -> u64 {
        pi2_engine::min_budget(self.model, self.sparse, self.kv, self.scratch)
            .map_or(u64::MAX, |m| m + self.process)
    }
    fn in_memory_bytes(&self) -> u64 {
        self.model.file.file_size() + self.kv + self.scratch + self.process
    }
}

fn mat_shape(m: pi2_kernels::MatRef<'_>) -> MatShape {
    MatShape {
        ty: m.ty.to_string(),
        rows: m.rows,
        row_bytes: m.row_bytes(),
    }
}

/// Deterministic pseudo-random tokens (what `pi2 bench` decodes; llama-bench uses random
/// tokens too).
pub fn bench_tokens(model: &Model, n: usize) -> Vec<u32> {
    let v = model.config.n_vocab as u64;
    (0..n as u64)
        .map(|i| ((i * 2654435761 + 12345) % v) as u32)
        .collect()
}

/// The tokens a recording decodes: the first `n` of `file`, or `n` bench tokens.
pub fn recording_tokens(model: &Model, file: Option<&Path>, n: usize) -> Result<Vec<u32>> {
    if n == 0 {
        return Err(RuntimeError::option("--tokens", "must be at least 1"));
    }
    let Some(f) = file else {
        return Ok(bench_tokens(model, n));
    };
    let text = std::fs::read_to_string(f).map_err(|source| RuntimeError::Read {
        path: f.to_path_buf(),
        source,
    })?;
    let ids = model.tokenizer.encode(&text, true, false);
    if ids.len() < n {
        return Err(RuntimeError::option(
            "--tokens",
            format!("{} holds {} tokens, fewer than {n}", f.display(), ids.len()),
        ));
    }
    Ok(ids[..n].to_vec())
}

/// Shapes, file layout and a recording of `tokens` sparse decode steps.
pub fn model_profile(
    model: &Model,
    path: &Path,
    sparse: &SparseFfn<'_>,
    threads: usize,
    tokens: &[u32],
) -> Result<ModelProfile> {
    let c = &model.config;
    let f = &model.file;
    let head = pi2_engine::ClusteredHead::load(model, true)?;
    let mut e = Engine::with_parts(
        model,
        &EngineConfig {
            threads,
            n_ctx: tokens.len() + 1,
            record_neurons: true,
            ..EngineConfig::default()
        },
        EngineParts {
            sparse: Some(sparse),
            head: head.as_ref(),
            offload: None,
            experts: None,
        },
    )?;
    for &t in tokens {
        e.forward(&[t], Logits::Last)?;
    }
    let steps = e
        .take_neuron_record()
        .into_iter()
        .map(|s| Step {
            layer: s.layer,
            candidates: s.candidates,
            confirmed: s.confirmed,
        })
        .collect();
    // The recording engine's copies of the weights are freed; give their pages back, or a
    // budget applied next would count them as this process's own memory.
    drop(e);
    crate::offload::return_freed_memory();
    // Where each neuron's rows lie (`pi2_model::bundle`).
    let mut ffn = Vec::new();
    for l in &model.weights.layers {
        let [gate, up, down] =
            pi2_model::bundle::neuron_parts(f, l, c.n_ff, 1, 0)?.map(|p| RowPart {
                ty: p.ty.to_string(),
                offset: p.offset,
                row_bytes: p.row_bytes,
            });
        ffn.push(FfnLayer { gate, up, down });
    }
    let kv_bytes_per_pos = {
        let probe = EngineConfig {
            threads: 1,
            n_ctx: 64,
            ..EngineConfig::default()
        };
        pi2_engine::kv_bytes_full(model, &probe, 1) as u64 / 64
    };
    let mp = ModelProfile {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        digest: model_digest(model, path)?,
        file_bytes: f.file_size(),
        n_layer: c.n_layer,
        n_ff: c.n_ff,
        n_embd: c.n_embd,
        kv_bytes_per_pos,
        attention: model
            .weights
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo]
                    .map(|w| mat_shape(w.mat(f)))
                    .to_vec()
            })
            .collect(),
        predictor: sparse
            .layers
            .iter()
            .map(|sl| match (&sl.predictor, sparse.use_predictor) {
                (Some(p), true) => vec![mat_shape(p.fc1.mat()), mat_shape(p.fc2.mat())],
                _ => vec![],
            })
            .collect(),
        output: mat_shape(model.weights.output.mat(f)),
        head: head.as_ref().map(|h| pi2_planner::model::HeadShape {
            share: f64::from(h.share()),
            cluster: h.cluster(),
            frequency: h.frequency().to_vec(),
            probes: h.probes().map(mat_shape).to_vec(),
        }),
        ffn,
        steps,
    };
    mp.validate()?;
    Ok(mp)
}

/// Threads the recording runs with: the fastest class's cores.
pub fn recording_threads(hw: &HardwareProfile) -> usize {
    hw.classes.first().map_or(1, |c| c.cpus.len()).max(1)
}

/// The cost model of a recording of `tokens` decode steps.
pub fn cost_model<'a>(
    hw: &'a HardwareProfile,
    mp: &'a ModelProfile,
    res: &'a EngineResidency<'a>,
    tokens: usize,
    n_batch: usize,
) -> CostModel<'a> {
    let mut cm = CostModel::new(hw, mp, res, tokens / 2, n_batch);
    // Every 4th step's reads simulated: planning in seconds, not minutes.
    cm.io_stride = 4;
    cm
}

/// Applies `--fix KEY=VALUE` knobs to the search space; returns a fixed budget if given.
pub fn apply_fixes(fix: &[String], space: &mut Space, file_bytes: u64) -> Result<Option<u64>> {
    let mut budget = None;
    for item in fix {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            RuntimeError::option("--fix", format!("`{item}`: expected KEY=VALUE"))
        })?;
        let size = |v: &str| parse_size("--fix", v, file_bytes).map(|s| s as usize);
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| RuntimeError::option("--fix", format!("{k}: `{v}` is not a number")))
        };
        match k.trim() {
            "mode" => {
                space.modes = vec![match v {
                    "dense" => Mode::Dense,
                    "sparse" => Mode::Sparse,
                    "offload" => Mode::Offload,
                    _ => {
                        return Err(RuntimeError::option(
                            "--fix",
                            format!("mode: dense, sparse or offload (got `{v}`)"),
                        ))
                    }
                }]
            }
            "threads" => space.threads = vec![num(v)?],
            "budget" => budget = Some(size(v)? as u64),
            "hot_share" => {
                let h: f64 = v
                    .parse()
                    .ok()
                    .filter(|h| (0.0..=1.0).contains(h))
                    .ok_or_else(|| {
                        RuntimeError::option("--fix", format!("hot_share `{v}` is not in 0..1"))
                    })?;
                space.hot_shares = vec![h];
            }
            "cluster" => space.clusters = vec![num(v)?],
            "merge_gap" => space.merge_gaps = vec![size(v)?],
            "max_read" => space.max_reads = vec![size(v)?],
            "io_depth" => space.io_depths = vec![num(v)?],
            other => {
                return Err(RuntimeError::option(
                    "--fix",
                    format!("unknown knob `{other}`"),
                ))
            }
        }
    }
    Ok(budget)
}

/// What to solve for.
#[derive(Clone, Debug)]
pub struct PlanRequest<'a> {
    pub mem_limit: u64,
    pub min_speed: f64,
    pub objective: Objective,
    /// Decode steps recorded, from `file` or bench tokens.
    pub tokens: usize,
    pub file: Option<&'a Path>,
    pub n_batch: usize,
    pub fix: &'a [String],
    pub emulate: Option<&'a str>,
    /// Also predict the best plan's speed at 11 memory limits (minimum to in memory).
    pub curve: bool,
}

/// A solved plan and what the planner saw.
pub struct Solved {
    pub plan: PlanFile,
    pub solve_secs: f64,
    /// (memory limit, predicted decode tokens/s or `None` if infeasible).
    pub curve: Vec<(u64, Option<f64>)>,
}

/// Solves for the best plan for `model` on this device under `req`.
pub fn solve(
    model: &Model,
    path: &Path,
    engine: &EngineOptions,
    hw: &HardwareProfile,
    req: &PlanRequest<'_>,
) -> Result<Solved> {
    let Some(sparse) = crate::sparse::build(&Default::default(), model, path, false)? else {
        return Err(RuntimeError::Unsupported(
            "planning needs a model made by `pi2 convert` (neuron bundles, predictors, thresholds)"
                .into(),
        ));
    };
    let fp = fingerprint(path, req.emulate)?;
    if hw.fingerprint != fp {
        return Err(RuntimeError::Unsupported(format!(
            "the hardware profile is for device {}, this is {fp}: run `pi2 profile-hw` here",
            hw.fingerprint
        )));
    }
    // Cores: the classes `--cores` touches, at most `-t` threads.
    let topo = Topology::detect();
    let allowed = match &engine.cores {
        Some(spec) => topo.select(spec)?,
        None => topo.cpus(),
    };
    let mut space = Space::default();
    let fixed_budget = apply_fixes(req.fix, &mut space, model.file.file_size())?;
    let n_ctx = match engine.n_ctx {
        0 => model.config.n_ctx_train,
        n => n,
    };
    let res = EngineResidency::new(model, &sparse, n_ctx, req.n_batch, None)?;
    let toks = recording_tokens(model, req.file, req.tokens)?;
    let mp = model_profile(model, path, &sparse, recording_threads(hw), &toks)?;
    let cm = cost_model(hw, &mp, &res, toks.len(), req.n_batch);
    let mut limit = req.mem_limit;
    if let Some(b) = fixed_budget {
        space.memory_points = 1;
        space.modes.retain(|&m| m == Mode::Offload);
        if space.modes.is_empty() {
            return Err(RuntimeError::option(
                "--fix",
                "budget applies to offloading only",
            ));
        }
        limit = limit.min(b);
    }
    let cons = Constraints {
        mem_limit: limit,
        classes: hw
            .classes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.cpus.iter().any(|x| allowed.contains(x)))
            .map(|(i, _)| i)
            .collect(),
        max_threads: engine.threads.unwrap_or(0),
        min_decode_tps: req.min_speed,
        objective: req.objective,
    };
    let t0 = std::time::Instant::now();
    let sol = pi2_planner::plan(&cm, &cons, &space)?;
    let solve_secs = t0.elapsed().as_secs_f64();
    let cpus: Vec<usize> = hw.classes[sol.knobs.class]
        .cpus
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .take(sol.knobs.threads)
        .collect();
    let curve = match req.curve {
        false => Vec::new(),
        true => {
            let lo = res.min_budget().min(res.in_memory_bytes());
            let hi = res.in_memory_bytes();
            let limits: Vec<u64> = (0..=10).map(|k| lo + (hi - lo) * k / 10).collect();
            pi2_planner::speed_curve(&cm, &cons, &space, &limits)
        }
    };
    let plan = PlanFile {
        version: PLAN_VERSION,
        model: PlanModel {
            name: mp.name.clone(),
            digest: mp.digest.clone(),
            file_bytes: mp.file_bytes,
        },
        device: PlanDevice {
            fingerprint: fp,
            cpu: hw.cpu.clone(),
            emulated: req.emulate.map(String::from),
            engine: hw.flash.engine.clone(),
        },
        constraints: cons,
        knobs: sol.knobs.clone(),
        dense_layers: cm.dense_layers(&sol.knobs)?,
        cpus,
        n_ctx,
        n_batch: req.n_batch,
        predicted: sol.predicted.clone(),
        evaluated: sol.evaluated,
        space_size: sol.space_size,
    };
    Ok(Solved {
        plan,
        solve_secs,
        curve,
    })
}

/// What `--plan` sets up.
pub struct Applied {
    pub plan: PlanFile,
    pub cfg: EngineConfig,
    pub offload: Option<pi2_engine::OffloadConfig>,
}

/// `--plan FILE` (checked against this model and device) or `--plan auto` (planned now, for
/// `auto_limit` bytes or the whole model in memory).
pub fn apply(
    spec: &str,
    model: &Model,
    path: &Path,
    engine: &EngineOptions,
    auto_limit: Option<u64>,
    emulate: Option<&str>,
) -> Result<Applied> {
    if spec != "auto" && auto_limit.is_some() {
        return Err(RuntimeError::option(
            "--plan",
            "a plan file sets the memory budget itself; --mem-budget goes with --plan auto",
        ));
    }
    let plan = if spec == "auto" {
        let hw = load_hw(None, path, emulate)?;
        let req = PlanRequest {
            mem_limit: auto_limit.unwrap_or(u64::MAX),
            min_speed: 0.0,
            objective: Objective::Fastest,
            tokens: 32,
            file: None,
            n_batch: 64,
            fix: &[],
            emulate,
            curve: false,
        };
        let p = solve(model, path, engine, &hw, &req)?.plan;
        // The search's replays are freed; give their pages back before a budget counts this
        // process's memory.
        crate::offload::return_freed_memory();
        p
    } else {
        let p = PlanFile::load(Path::new(spec))?;
        if emulate.is_some() && p.device.emulated.as_deref() != emulate {
            return Err(RuntimeError::option(
                "--emulate-flash",
                "goes with --plan auto (a plan file says which device it is for)",
            ));
        }
        let fp = fingerprint(path, p.device.emulated.as_deref())?;
        p.check(&model_digest(model, path)?, &fp)?;
        p
    };
    let k: &Knobs = &plan.knobs;
    let cfg = EngineConfig {
        threads: k.threads,
        n_ctx: plan.n_ctx,
        cpus: plan.cpus.clone(),
        cluster: k.cluster,
        ..EngineOptions {
            threads: None,
            cores: None,
            ..engine.clone()
        }
        .config()?
    };
    let offload = match k.mode {
        Mode::Offload => Some(pi2_engine::OffloadConfig {
            budget: k.budget,
            // Measured when the offload is built (`offload::build`).
            process: 0,
            hot_share: k.hot_share,
            // Set when the offload is built, from the engine's context (`offload::build`).
            kv_growth: 0,
            direct: true,
            // The engine the hardware profile measured.
            engine: match plan.device.engine.starts_with("uring") {
                true => pi2_io::IoEngine::Uring,
                false => pi2_io::IoEngine::Pread,
            },
            reader: pi2_io::ReaderConfig {
                max_request: k.max_read,
                depth: k.io_depth,
                merge_gap: k.merge_gap,
            },
            prefetch_experts: true,
            expert_cache: Default::default(),
            routing_memory: None,
            faults: None,
            emulate: plan
                .device
                .emulated
                .as_deref()
                .map(parse_emulate)
                .transpose()?,
            // Older plans say nothing: no layer runs dense.
            dense_layers: (!plan.dense_layers.is_empty()).then(|| plan.dense_layers.clone()),
        }),
        _ => None,
    };
    Ok(Applied { plan, cfg, offload })
}
