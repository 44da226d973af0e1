//! `pi2 profile-hw`, `pi2 plan`, and printing plans. The engine<->planner glue (memory
//! accounting, the recorded model profile, solving and applying plans) is `pi2_runtime::plan`.

use crate::args::ModelArgs;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use pi2_planner::Objective;
use pi2_runtime::hardware::{measure, ProfileRequest};
use pi2_runtime::plan::{solve, PlanRequest};
use std::path::PathBuf;
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

pub fn profile_hw(a: ProfileHwArgs) -> Result<()> {
    let path = crate::fetch::resolve(a.model.as_deref())?;
    let emulate = a.emulate_flash.as_deref();
    let out = match &a.output {
        Some(o) => {
            super::check_outputs(&[o], &[&path], a.force)?;
            o.clone()
        }
        None => {
            // pi2's own cache folder: made if missing.
            let out = pi2_runtime::device::hw_path(&path, emulate)?;
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            out
        }
    };
    let progress = |s: &str| eprintln!("profile-hw: {s}");
    let hw = measure(&ProfileRequest {
        file: &path,
        kernel_time: Duration::from_millis(a.kernel_ms),
        read_time: Duration::from_millis(a.read_ms),
        emulate,
        uring: a.io_engine == super::sparse_args::IoEngineArg::Uring,
        progress: &progress,
    })?;
    hw.save(&out)?;
    println!("{hw}");
    println!(
        "hardware profile {} written to {}",
        hw.fingerprint,
        out.display()
    );
    Ok(())
}

pub fn plan(a: PlanArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let model = pi2_runtime::load_model(&path)?;
    if let Some(o) = &a.output {
        let inputs: Vec<&std::path::Path> =
            [Some(path.as_path()), a.hw.as_deref(), a.file.as_deref()]
                .into_iter()
                .flatten()
                .collect();
        super::check_outputs(&[o], &inputs, a.force)?;
    }
    // The user's own arguments are checked before anything is read for them.
    let file_bytes = model.file.file_size();
    let limit = pi2_runtime::options::parse_size("--mem-limit", &a.mem_limit, file_bytes)?;
    let engine = a.model.engine_options()?;
    let emulate = a.emulate_flash.as_deref();
    let hw = pi2_runtime::device::load_hw(a.hw.as_deref(), &path, emulate)?;
    let req = PlanRequest {
        mem_limit: limit,
        min_speed: a.min_speed,
        objective: match a.objective {
            ObjectiveArg::Fastest => Objective::Fastest,
            ObjectiveArg::LeastMemory => Objective::LeastMemory,
        },
        tokens: a.tokens,
        file: a.file.as_deref(),
        n_batch: a.n_batch,
        fix: &a.fix,
        emulate,
        curve: a.explain,
    };
    let solved = solve(&model, &path, &engine, &hw, &req)?;
    eprintln!("{} in {:.2} s", solved.plan, solved.solve_secs);
    if a.explain {
        eprint!("{}", solved.plan.predicted.breakdown);
        let points = &solved.curve;
        eprint!(
            "{}",
            pi2_planner::describe::SpeedCurve { points, file_bytes }
        );
    }
    if let Some(o) = &a.output {
        solved.plan.save(o, a.force)?;
        eprintln!("plan written to {}", o.display());
    }
    Ok(())
}
