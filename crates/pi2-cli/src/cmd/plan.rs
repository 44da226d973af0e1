//! `pi2 profile-hw`, `pi2 plan`, and printing plans. The engine<->planner glue (memory
//! accounting, the recorded model profile, solving and applying plans) is `pi2_runtime::plan`.

use crate::args::ModelArgs;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use pi2_planner::cost::Mode;
use pi2_planner::{Objective, PlanFile};
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
    print_hw(&hw);
    println!(
        "hardware profile {} written to {}",
        hw.fingerprint,
        out.display()
    );
    Ok(())
}

/// A table of the measured rates, and the flash fit.
fn print_hw(hw: &pi2_planner::HardwareProfile) {
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
        "reader handling (copy, checksum, report): {:.0} ns per request + size / {:.0} MB/s",
        f.handling_ns_per_request,
        f.handling_bytes_per_sec / 1e6
    );
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

/// The predicted speed of the best plan at each memory limit, as bars.
fn print_curve(curve: &[(u64, Option<f64>)], file_bytes: u64) {
    let top = curve
        .iter()
        .filter_map(|c| c.1)
        .fold(0.0, f64::max)
        .max(1e-9);
    eprintln!("predicted decode speed vs memory limit:");
    for &(l, tps) in curve {
        let bar = tps.map_or(0, |t| (t / top * 50.0).round() as usize);
        eprintln!(
            "  {:>8.1} MiB ({:>3.0}%) {:<50} {}",
            l as f64 / (1 << 20) as f64,
            l as f64 / file_bytes as f64 * 100.0,
            "#".repeat(bar),
            tps.map_or("infeasible".into(), |t| format!("{t:.2} tok/s"))
        );
    }
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
    print_plan(&solved.plan, solved.solve_secs);
    if a.explain {
        print_explain(&solved.plan);
        print_curve(&solved.curve, file_bytes);
    }
    if let Some(o) = &a.output {
        solved.plan.save(o, a.force)?;
        eprintln!("plan written to {}", o.display());
    }
    Ok(())
}
