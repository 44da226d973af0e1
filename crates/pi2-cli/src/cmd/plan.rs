//! `pi2 profile-hw`, `pi2 plan`, and the `--plan` option of `run` and `bench`: the glue between
//! the engine and `pi2-planner` (the planner knows the engine only through the data and the
//! memory accounting given here).

use super::sparse_args::{frequencies, parse_size};
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use pi2_engine::topology::Topology;
use pi2_engine::{Engine, EngineConfig, Logits, SparseFfn};
use pi2_model::Model;
use pi2_planner::cost::Mode;
use pi2_planner::hw::{CoreSpec, HardwareProfile, HwOptions};
use pi2_planner::model::{
    FfnLayer, MatShape, ModelProfile, Residency, ResidencySplit, RowPart, Step,
};
use pi2_planner::plan::{PlanDevice, PlanModel, Solution, PLAN_VERSION};
use pi2_planner::{Constraints, CostModel, Knobs, Objective, PlanFile, Space};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub struct ProfileHwArgs {
    /// A file on the storage to profile, normally the model (default: the default model)
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Where to write the profile (default: the per-device cache `pi2 plan` reads)
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Replace an existing --output file
    #[arg(long)]
    pub force: bool,
    /// Milliseconds per kernel point
    #[arg(long, default_value_t = 60)]
    pub kernel_ms: u64,
    /// Milliseconds per flash point
    #[arg(long, default_value_t = 1500)]
    pub read_ms: u64,
    /// Profile an emulated flash device (LATENCYus,BANDWIDTHMB/s, e.g. 100us,800MB/s): reads
    /// from the page cache, each taking the latency plus its size over the bandwidth (for
    /// disks whose speed drifts)
    #[arg(long)]
    pub emulate_flash: Option<String>,
    /// The read engine to profile (and so to plan for): `pread` (one read at a time) or
    /// `uring` (io_uring on Linux, measured at depths 1, 2, 4 and 8)
    #[arg(long, value_enum, default_value_t = super::sparse_args::IoEngineArg::Pread)]
    pub io_engine: super::sparse_args::IoEngineArg,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ObjectiveArg {
    Fastest,
    LeastMemory,
}

#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Memory the engine may keep resident: bytes with K/M/G suffix, or % of the model file
    #[arg(long = "mem-limit")]
    pub mem_limit: String,
    /// Minimum decode speed in tokens/s
    #[arg(long = "min-speed", default_value_t = 0.0)]
    pub min_speed: f64,
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Fastest)]
    pub objective: ObjectiveArg,
    /// Write the plan here (never replaces a file without --force)
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Replace an existing --output file
    #[arg(long)]
    pub force: bool,
    /// Print the predicted time per component and predicted speed against memory limit
    #[arg(long)]
    pub explain: bool,
    /// Hardware profile (default: this device's cached `pi2 profile-hw` result)
    #[arg(long)]
    pub hw: Option<PathBuf>,
    /// Decode steps recorded to profile the model (the tokens `pi2 bench` decodes, or the
    /// start of --file)
    #[arg(long, default_value_t = 32)]
    pub tokens: usize,
    /// Text whose tokens are decoded for the recording
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Prefill batch the plan is sized for
    #[arg(long = "batch", default_value_t = 64)]
    pub n_batch: usize,
    /// Plan for an emulated flash device (as given to `pi2 profile-hw --emulate-flash`)
    #[arg(long)]
    pub emulate_flash: Option<String>,
    /// Fix knobs instead of searching them: mode=dense|sparse|offload, threads=N, budget=SIZE,
    /// hot_share=F, cluster=N, merge_gap=SIZE, max_read=SIZE, io_depth=N (comma separated)
    #[arg(long = "fix", value_delimiter = ',')]
    pub fix: Vec<String>,
}

/// Where profiles of this device are cached.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PI2_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("pi2")
}

/// The CPU's name as the OS reports it.
fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    for key in ["model name", "Hardware", "CPU part"] {
        if let Some(v) = info
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
        {
            return v.trim().to_string();
        }
    }
    std::env::consts::ARCH.to_string()
}

/// The storage device holding `path` (its device number).
fn storage_id(path: &Path) -> Result<String> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(format!("dev{}", meta.dev()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        Ok("unknown".into())
    }
}

fn classes(topo: &Topology) -> Vec<CoreSpec> {
    topo.clusters
        .iter()
        .map(|c| CoreSpec {
            name: c.kind.name().to_string(),
            max_freq_khz: c.max_freq_khz,
            cpus: c.cpus.clone(),
        })
        .collect()
}

/// An emulated flash device: `LATENCY_us,BANDWIDTH_MB/s` (e.g. `100us,800MB/s`).
pub fn parse_emulate(spec: &str) -> Result<pi2_io::FaultPlan> {
    let bad = || {
        anyhow::anyhow!(
            "--emulate-flash `{spec}`: expected LATENCYus,BANDWIDTHMB/s (e.g. 100us,800MB/s)"
        )
    };
    let (lat, bw) = spec.split_once(',').ok_or_else(bad)?;
    let lat: f64 = lat
        .trim()
        .trim_end_matches("us")
        .parse()
        .map_err(|_| bad())?;
    let bw: f64 = bw
        .trim()
        .trim_end_matches("MB/s")
        .parse()
        .map_err(|_| bad())?;
    if !(lat >= 0.0 && bw > 0.0 && lat.is_finite() && bw.is_finite()) {
        return Err(bad());
    }
    Ok(pi2_io::FaultPlan {
        latency: Duration::from_nanos((lat * 1e3) as u64),
        ns_per_byte: 1e3 / bw,
        ..Default::default()
    })
}

/// The storage a model at `path` is read from: its device, or the emulated one.
fn storage(path: &Path, emulate: Option<&str>) -> Result<String> {
    match emulate {
        Some(spec) => {
            parse_emulate(spec)?;
            Ok(format!("emulated {spec}"))
        }
        None => storage_id(path),
    }
}

/// This device's fingerprint, for a model stored at `path` (or on an emulated device).
pub fn device_fingerprint(path: &Path, emulate: Option<&str>) -> Result<String> {
    let fp: Vec<(Option<u64>, Vec<usize>)> = classes(&Topology::detect())
        .into_iter()
        .map(|c| (c.max_freq_khz, c.cpus))
        .collect();
    Ok(pi2_planner::hw::fingerprint(
        &cpu_name(),
        &fp,
        &pi2_planner::hw::tier_name(),
        &storage(path, emulate)?,
    ))
}

fn default_hw_path(model_path: &Path, emulate: Option<&str>) -> Result<PathBuf> {
    Ok(cache_dir().join(format!(
        "hw-{}.json",
        device_fingerprint(model_path, emulate)?
    )))
}

/// A model file's identity: its header and tensor table (names, types, shapes, offsets) and
/// its size. Cheap for any model size; a re-converted or different model differs.
pub fn model_digest(model: &Model, path: &Path) -> Result<String> {
    use std::io::Read;
    let mut head = vec![0u8; model.file.data_offset as usize];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = Sha256::new();
    h.update(&head);
    h.update(model.file.file_size().to_le_bytes());
    Ok(h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

pub fn profile_hw(a: ProfileHwArgs) -> Result<()> {
    let path = crate::fetch::resolve(a.model.as_deref())?;
    let out = match &a.output {
        Some(o) => {
            if o.exists() && !a.force {
                bail!("{} exists; pass --force to replace it", o.display());
            }
            o.clone()
        }
        None => default_hw_path(&path, a.emulate_flash.as_deref())?,
    };
    let topo = Topology::detect();
    let types = vec![
        pi2_kernels::QuantType::Q4_0,
        pi2_kernels::QuantType::Q4_1,
        pi2_kernels::QuantType::Q8_0,
        pi2_kernels::QuantType::Q4_K,
        pi2_kernels::QuantType::Q6_K,
        pi2_kernels::QuantType::F16,
        pi2_kernels::QuantType::F32,
    ];
    let progress = |s: &str| eprintln!("profile-hw: {s}");
    let uring = a.io_engine == super::sparse_args::IoEngineArg::Uring;
    if uring && a.emulate_flash.is_some() {
        bail!("--emulate-flash models a device read one request at a time: use --io-engine pread");
    }
    let hw = pi2_planner::hw::measure(HwOptions {
        cpu: cpu_name(),
        storage: storage(&path, a.emulate_flash.as_deref())?,
        emulate: a.emulate_flash.as_deref().map(parse_emulate).transpose()?,
        classes: classes(&topo),
        types,
        kernel_time: Duration::from_millis(a.kernel_ms),
        flash_file: &path,
        read_sizes: vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20],
        depths: match uring {
            true => vec![1, 2, 4, 8],
            false => vec![1],
        },
        read_time: Duration::from_millis(a.read_ms),
        uring,
        // Best effort: an unpinned thread only measures less precisely.
        pin: Some(|cpu| {
            let _ = pi2_engine::topology::pin_current_thread(cpu);
        }),
        progress: &progress,
    })?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    hw.save(&out)?;
    println!("| class | threads | step us | RAM GB/s | Q4_1 matvec GB/s | Q4_1 gather GB/s | Q8_0 axpy GB/s |");
    println!("| ----- | ------: | ------: | -------: | ---------------: | ---------------: | -------------: |");
    for c in &hw.classes {
        for r in &c.rates {
            let rate = |op, ty: &str| {
                r.kernels
                    .iter()
                    .find(|k| k.op == op && k.ty == ty)
                    .map_or(0.0, |k| k.bytes_per_sec / 1e9)
            };
            use pi2_planner::hw::KernelOp::*;
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} |",
                c.name,
                r.threads,
                r.step_ns / 1e3,
                r.mem_bytes_per_sec / 1e9,
                rate(Matvec, "Q4_1"),
                rate(Gather, "Q4_1"),
                rate(Axpy, "Q8_0")
            );
        }
    }
    let f = &hw.flash;
    println!(
        "flash ({}): {:.0} us + size / {:.0} MB/s per read",
        f.engine,
        f.latency_us,
        f.bytes_per_sec / 1e6
    );
    println!(
        "hardware profile {} written to {}",
        hw.fingerprint,
        out.display()
    );
    Ok(())
}

/// The engine's memory accounting, for the planner.
struct EngineResidency<'a> {
    model: &'a Model,
    sparse: &'a SparseFfn<'a>,
    kv: u64,
    scratch: u64,
    freq: Option<Vec<Vec<f32>>>,
}

impl Residency for EngineResidency<'_> {
    fn split(&self, budget: u64, hot_share: f64) -> Result<ResidencySplit, pi2_planner::PlanError> {
        let r = pi2_engine::regions(
            self.model,
            self.sparse,
            self.kv,
            self.scratch,
            self.freq.as_deref(),
            budget,
            hot_share,
        )
        .map_err(|e| pi2_planner::PlanError::Infeasible(e.to_string()))?;
        Ok(ResidencySplit {
            hot_counts: r.hot_counts.clone(),
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
        pi2_engine::min_budget(self.model, self.sparse, self.kv, self.scratch).unwrap_or(u64::MAX)
    }
    fn in_memory_bytes(&self) -> u64 {
        self.model.file.file_size() + self.kv + self.scratch
    }
}

fn mat_shape(m: pi2_kernels::MatRef<'_>) -> MatShape {
    MatShape {
        ty: m.ty.to_string(),
        rows: m.rows,
        row_bytes: m.row_bytes(),
    }
}

/// The tokens the recording decodes.
fn recording_tokens(model: &Model, file: Option<&Path>, n: usize) -> Result<Vec<u32>> {
    if n == 0 {
        bail!("--tokens must be at least 1");
    }
    match file {
        None => Ok(super::bench::tokens(model, n)),
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            let ids = model.tokenizer.encode(&text, true, false);
            if ids.len() < n {
                bail!(
                    "{} has {} tokens, fewer than --tokens {n}",
                    f.display(),
                    ids.len()
                );
            }
            Ok(ids[..n].to_vec())
        }
    }
}

/// Shapes, file layout and a recording of `tokens` sparse decode steps.
fn model_profile(
    model: &Model,
    path: &Path,
    sparse: &SparseFfn<'_>,
    threads: usize,
    tokens: &[u32],
) -> Result<ModelProfile> {
    let c = &model.config;
    let f = &model.file;
    let mut e = Engine::new(
        model,
        &EngineConfig {
            threads,
            n_ctx: tokens.len() + 1,
            ..EngineConfig::default()
        },
    )?;
    e.set_sparse(Some(sparse))?;
    e.record_neurons(true);
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
    let kv_per_pos = {
        let probe = Engine::new(
            model,
            &EngineConfig {
                threads: 1,
                n_ctx: 64,
                ..EngineConfig::default()
            },
        )?;
        probe.kv_bytes_full() as u64 / 64
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
        kv_bytes_per_pos: kv_per_pos,
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
        ffn,
        steps,
    };
    mp.validate()
        .map_err(|e| anyhow::anyhow!("model profile: {e}"))?;
    Ok(mp)
}

fn parse_fix(fix: &[String], space: &mut Space, file_bytes: u64) -> Result<Option<u64>> {
    let mut budget = None;
    for item in fix {
        let (k, v) = item
            .split_once('=')
            .with_context(|| format!("--fix `{item}`: expected KEY=VALUE"))?;
        let size = |v: &str| parse_size(v, file_bytes).map(|s| s as usize);
        let num = |v: &str| {
            v.parse::<usize>()
                .with_context(|| format!("--fix {k}: `{v}` is not a number"))
        };
        match k.trim() {
            "mode" => {
                space.modes = vec![match v {
                    "dense" => Mode::Dense,
                    "sparse" => Mode::Sparse,
                    "offload" => Mode::Offload,
                    _ => bail!("--fix mode: dense, sparse or offload (got `{v}`)"),
                }]
            }
            "threads" => space.threads = vec![num(v)?],
            "budget" => budget = Some(size(v)? as u64),
            "hot_share" => {
                let h: f64 = v
                    .parse()
                    .with_context(|| format!("--fix hot_share: `{v}`"))?;
                if !(0.0..=1.0).contains(&h) {
                    bail!("--fix hot_share {h} is outside 0..1");
                }
                space.hot_shares = vec![h];
            }
            "cluster" => space.clusters = vec![num(v)?],
            "merge_gap" => space.merge_gaps = vec![size(v)?],
            "max_read" => space.max_reads = vec![size(v)?],
            "io_depth" => space.io_depths = vec![num(v)?],
            other => bail!("--fix: unknown knob `{other}`"),
        }
    }
    Ok(budget)
}

fn residency<'a>(
    model: &'a Model,
    sparse: &'a SparseFfn<'a>,
    n_ctx: usize,
    n_batch: usize,
) -> Result<EngineResidency<'a>> {
    let sizing = Engine::new(
        model,
        &EngineConfig {
            threads: 1,
            n_ctx,
            ..EngineConfig::default()
        },
    )?;
    Ok(EngineResidency {
        model,
        sparse,
        kv: sizing.kv_bytes_full() as u64,
        scratch: sizing.scratch_bytes(n_batch) as u64,
        freq: frequencies(model)?,
    })
}

fn recording_threads(hw: &HardwareProfile) -> usize {
    hw.classes.first().map_or(1, |c| c.cpus.len()).max(1)
}

fn cost_model<'a>(
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

/// The plan's prediction again, with the flash measured now (the device's speed drifts; on a
/// shared virtual disk by half within minutes): separates the cost model's error from the
/// device's drift. `None` for plans that read nothing or without a cached hardware profile.
pub fn repredict_now(model: &Model, path: &Path, plan: &PlanFile) -> Result<Option<(f64, f64)>> {
    if plan.knobs.mode != Mode::Offload {
        return Ok(None);
    }
    let emulate = plan.device.emulated.as_deref();
    let Ok(mut hw) = load_hw(None, path, emulate) else {
        return Ok(None);
    };
    let Some(sparse) = super::sparse_args::build(&Default::default(), model, path, false)? else {
        return Ok(None);
    };
    let progress = |_: &str| {};
    let topo = Topology::detect();
    let flash = pi2_planner::hw::measure_flash(&HwOptions {
        cpu: String::new(),
        storage: String::new(),
        classes: classes(&topo),
        types: vec![],
        kernel_time: Duration::from_millis(30),
        flash_file: path,
        read_sizes: vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20],
        // The engine and depths the plan's profile measured.
        depths: {
            let mut d: Vec<usize> = hw.flash.points.iter().map(|p| p.depth).collect();
            d.sort_unstable();
            d.dedup();
            d
        },
        uring: hw.flash.engine.starts_with("uring"),
        read_time: Duration::from_millis(600),
        emulate: emulate.map(parse_emulate).transpose()?,
        // Best effort: an unpinned thread only measures less precisely.
        pin: Some(|cpu| {
            let _ = pi2_engine::topology::pin_current_thread(cpu);
        }),
        progress: &progress,
    })?;
    hw.flash = flash;
    let res = residency(model, &sparse, plan.n_ctx, plan.n_batch)?;
    let toks = recording_tokens(model, None, 32)?;
    let mp = model_profile(model, path, &sparse, recording_threads(&hw), &toks)?;
    let cm = cost_model(&hw, &mp, &res, toks.len(), plan.n_batch);
    let p = cm.evaluate(&plan.knobs).map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some((p.decode_tps, p.prefill_tps)))
}

/// Everything `plan` and `--plan auto` share: the solved plan file.
#[allow(clippy::too_many_arguments)]
fn solve(
    model: &Model,
    path: &Path,
    margs: &ModelArgs,
    hw: &HardwareProfile,
    mem_limit: u64,
    min_speed: f64,
    objective: Objective,
    n_tokens: usize,
    file: Option<&Path>,
    n_batch: usize,
    fix: &[String],
    explain: bool,
    emulate: Option<&str>,
) -> Result<PlanFile> {
    let Some(sparse) = super::sparse_args::build(&Default::default(), model, path, false)? else {
        bail!(
            "planning needs a model made by `pi2 convert` (neuron bundles, predictors, thresholds)"
        );
    };
    let fingerprint = device_fingerprint(path, emulate)?;
    if hw.fingerprint != fingerprint {
        bail!(
            "the hardware profile is for device {}, this is {fingerprint}: run `pi2 profile-hw` here",
            hw.fingerprint
        );
    }
    // Cores: the classes `--cores` touches, at most `-t` threads.
    let topo = Topology::detect();
    let allowed = match &margs.cores {
        Some(spec) => topo.select(spec)?,
        None => topo.cpus(),
    };
    let class_ids: Vec<usize> = hw
        .classes
        .iter()
        .enumerate()
        .filter(|(_, c)| c.cpus.iter().any(|x| allowed.contains(x)))
        .map(|(i, _)| i)
        .collect();
    let max_threads = match margs.threads[..] {
        [] => 0,
        [t] if t > 0 => t,
        _ => bail!("-t/--threads takes one number here: the most threads a plan may use"),
    };
    let mut space = Space::default();
    let fixed_budget = parse_fix(fix, &mut space, model.file.file_size())?;
    let n_ctx = if margs.ctx_size == 0 {
        model.config.n_ctx_train
    } else {
        margs.ctx_size
    };
    let res = residency(model, &sparse, n_ctx, n_batch)?;
    let toks = recording_tokens(model, file, n_tokens)?;
    let mp = model_profile(model, path, &sparse, recording_threads(hw), &toks)?;
    let cm = cost_model(hw, &mp, &res, toks.len(), n_batch);
    let mut limit = mem_limit;
    if let Some(b) = fixed_budget {
        space.memory_points = 1;
        space.modes.retain(|&m| m == Mode::Offload);
        if space.modes.is_empty() {
            bail!("--fix budget applies to offloading only");
        }
        limit = limit.min(b);
    }
    let cons = Constraints {
        mem_limit: limit,
        classes: class_ids.clone(),
        max_threads,
        min_decode_tps: min_speed,
        objective,
    };
    let t0 = std::time::Instant::now();
    let sol: Solution = pi2_planner::plan(&cm, &cons, &space)?;
    let solve_secs = t0.elapsed().as_secs_f64();
    let class = &hw.classes[sol.knobs.class];
    let cpus: Vec<usize> = class
        .cpus
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .take(sol.knobs.threads)
        .collect();
    let pf = PlanFile {
        version: PLAN_VERSION,
        model: PlanModel {
            name: mp.name.clone(),
            digest: mp.digest.clone(),
            file_bytes: mp.file_bytes,
        },
        device: PlanDevice {
            fingerprint,
            cpu: hw.cpu.clone(),
            emulated: emulate.map(String::from),
            engine: hw.flash.engine.clone(),
        },
        constraints: cons.clone(),
        knobs: sol.knobs.clone(),
        cpus,
        n_ctx,
        n_batch,
        predicted: sol.predicted.clone(),
        evaluated: sol.evaluated,
        space_size: sol.space_size,
    };
    print_plan(&pf, solve_secs);
    if explain {
        print_explain(&pf);
        // Predicted speed of the best plan at each memory limit, from the minimum to the whole
        // model in memory.
        let lo = res.min_budget().min(res.in_memory_bytes());
        let hi = res.in_memory_bytes();
        let limits: Vec<u64> = (0..=10).map(|k| lo + (hi - lo) * k / 10).collect();
        let curve = pi2_planner::speed_curve(&cm, &cons, &space, &limits);
        let top = curve
            .iter()
            .filter_map(|c| c.1)
            .fold(0.0, f64::max)
            .max(1e-9);
        eprintln!("predicted decode speed vs memory limit:");
        for (l, tps) in curve {
            let bar = tps.map_or(0, |t| (t / top * 50.0).round() as usize);
            eprintln!(
                "  {:>8.1} MiB ({:>3.0}%) {:<50} {}",
                l as f64 / (1 << 20) as f64,
                l as f64 / mp.file_bytes as f64 * 100.0,
                "#".repeat(bar),
                tps.map_or("infeasible".into(), |t| format!("{t:.2} tok/s"))
            );
        }
    }
    Ok(pf)
}

fn print_plan(p: &PlanFile, secs: f64) {
    let k = &p.knobs;
    let mode = match k.mode {
        Mode::Dense => "dense (in memory)".to_string(),
        Mode::Sparse => "sparse (in memory)".to_string(),
        Mode::Offload => format!(
            "offload: budget {:.1} MiB, hot share {}, cluster {}, merge gap {} K, max read {} K, depth {}",
            k.budget as f64 / (1 << 20) as f64,
            k.hot_share,
            k.cluster,
            k.merge_gap >> 10,
            k.max_read >> 10,
            k.io_depth
        ),
    };
    eprintln!(
        "plan: {} thread(s) on CPUs {:?}, {mode}{}",
        k.threads,
        p.cpus,
        if k.mode == Mode::Sparse {
            format!(", cluster {}", k.cluster)
        } else {
            String::new()
        }
    );
    let pr = &p.predicted;
    eprintln!(
        "predicted: decode {:.2} tok/s, prefill {:.1} tok/s (batches of {}), memory {:.1} MiB{}",
        pr.decode_tps,
        pr.prefill_tps,
        p.n_batch,
        pr.memory as f64 / (1 << 20) as f64,
        pr.hit_rate.map_or(String::new(), |h| format!(
            ", hit rate {:.3}, {:.2} MB read per token in {:.0} reads",
            h,
            pr.read_bytes_per_token / 1e6,
            pr.device_reads_per_token
        ))
    );
    eprintln!(
        "solver: {} of {} plans evaluated in {:.2} s",
        p.evaluated, p.space_size, secs
    );
}

fn print_explain(p: &PlanFile) {
    let b = &p.predicted.breakdown;
    let total = b.total();
    eprintln!("predicted time per decoded token: {:.2} ms", total * 1e3);
    for (name, v) in [
        ("attention", b.attention),
        ("predictor", b.predictor),
        ("FFN compute", b.ffn_compute),
        ("reads not hidden", b.io_exposed),
        ("output head", b.output),
        ("parallel steps", b.steps),
        ("serial work", b.serial),
    ] {
        eprintln!(
            "  {name:<17} {:>8.3} ms {:>5.1}%",
            v * 1e3,
            v / total * 100.0
        );
    }
    if b.io_total > 0.0 {
        eprintln!("  (device busy {:.3} ms per token)", b.io_total * 1e3);
    }
}

fn load_hw(hw: Option<&Path>, model_path: &Path, emulate: Option<&str>) -> Result<HardwareProfile> {
    let p = match hw {
        Some(p) => p.to_path_buf(),
        None => default_hw_path(model_path, emulate)?,
    };
    if !p.exists() && hw.is_none() {
        bail!(
            "no hardware profile for this device at {}: run `pi2 profile-hw -m {}` first (about a minute)",
            p.display(),
            model_path.display()
        );
    }
    Ok(HardwareProfile::load(&p)?)
}

pub fn plan(a: PlanArgs) -> Result<()> {
    let model = super::load_model(&a.model)?;
    let path = super::model_path(&a.model)?;
    if let Some(o) = &a.output {
        if o.exists() && !a.force {
            bail!("{} exists; pass --force to replace it", o.display());
        }
    }
    // The user's own arguments are checked before anything is read for them.
    let limit = parse_size(&a.mem_limit, model.file.file_size())?;
    let hw = load_hw(a.hw.as_deref(), &path, a.emulate_flash.as_deref())?;
    let objective = match a.objective {
        ObjectiveArg::Fastest => Objective::Fastest,
        ObjectiveArg::LeastMemory => Objective::LeastMemory,
    };
    let pf = solve(
        &model,
        &path,
        &a.model,
        &hw,
        limit,
        a.min_speed,
        objective,
        a.tokens,
        a.file.as_deref(),
        a.n_batch,
        &a.fix,
        a.explain,
        a.emulate_flash.as_deref(),
    )?;
    if let Some(o) = &a.output {
        pf.save(o, a.force)?;
        eprintln!("plan written to {}", o.display());
    }
    Ok(())
}

impl Applied {
    /// The sparse options under this plan (a dense plan turns sparsity off).
    pub fn sparse_args(
        &self,
        base: &super::sparse_args::SparseArgs,
    ) -> super::sparse_args::SparseArgs {
        super::sparse_args::SparseArgs {
            dense: base.dense || self.plan.knobs.mode == Mode::Dense,
            ..base.clone()
        }
    }
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
    margs: &ModelArgs,
    auto_limit: Option<u64>,
    emulate: Option<&str>,
) -> Result<Applied> {
    if spec != "auto" && auto_limit.is_some() {
        bail!("--plan FILE sets the memory budget itself; --mem-budget goes with --plan auto");
    }
    let plan = if spec == "auto" {
        let hw = load_hw(None, path, emulate)?;
        let limit = auto_limit.unwrap_or(u64::MAX);
        solve(
            model,
            path,
            margs,
            &hw,
            limit,
            0.0,
            Objective::Fastest,
            32,
            None,
            64,
            &[],
            false,
            emulate,
        )?
    } else {
        let p = PlanFile::load(Path::new(spec))?;
        if emulate.is_some() && p.device.emulated.as_deref() != emulate {
            bail!(
                "--emulate-flash goes with --plan auto (a plan file says which device it is for)"
            );
        }
        let fp = device_fingerprint(path, p.device.emulated.as_deref())?;
        p.check(&model_digest(model, path)?, &fp)?;
        p
    };
    let k: &Knobs = &plan.knobs;
    let cfg = EngineConfig {
        threads: k.threads,
        n_ctx: plan.n_ctx,
        cpus: plan.cpus.clone(),
        cluster: k.cluster,
        ..super::engine_config(&ModelArgs {
            threads: vec![],
            cores: None,
            ..margs.clone()
        })?
    };
    let offload = (k.mode == Mode::Offload).then_some(pi2_engine::OffloadConfig {
        budget: k.budget,
        hot_share: k.hot_share,
        direct: true,
        // The engine the hardware profile measured.
        engine: match plan.device.engine.starts_with("uring") {
            true => pi2_engine::IoEngine::Uring,
            false => pi2_engine::IoEngine::Pread,
        },
        reader: pi2_io::ReaderConfig {
            max_request: k.max_read,
            depth: k.io_depth,
            merge_gap: k.merge_gap,
        },
        faults: None,
        emulate: plan
            .device
            .emulated
            .as_deref()
            .map(parse_emulate)
            .transpose()
            .ok()
            .flatten(),
    });
    Ok(Applied { plan, cfg, offload })
}

#[cfg(test)]
mod tests {
    use super::parse_emulate;

    #[test]
    fn emulated_devices_parse() {
        let p = parse_emulate("100us,800MB/s").unwrap();
        assert_eq!(p.latency, std::time::Duration::from_micros(100));
        assert!((p.ns_per_byte - 1.25).abs() < 1e-12);
        assert!(parse_emulate("100,500").is_ok());
        for bad in ["100us", "x,800MB/s", "100us,0MB/s", "-1us,5MB/s"] {
            assert!(parse_emulate(bad).is_err(), "{bad}");
        }
    }
}
