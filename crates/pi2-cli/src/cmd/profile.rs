//! `pi2 profile`: run the dense model over calibration text and record how its FFN neurons
//! activate (see `pi2_sparse::Profile`), with two pictures.

use super::load_model;
use crate::args::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pi2_model::Model;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Calibration text (keep it apart from evaluation text); default: the built-in mix of
    /// prose, Python source and chat turns in the model's template
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to profile (one byte per token, layer and FFN neuron, kept in temporary files beside the output)
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Tokens per chunk; each chunk starts with an empty context, as in perplexity runs
    #[arg(long = "chunk", default_value_t = 512)]
    pub chunk: usize,
    /// Sparsity at which "active" is decided for frequencies, co-activation, trace and cache
    /// curves (default: 0.5; for ReLU-family models "active" is "activation > 0" unless given)
    #[arg(long = "sparsity")]
    pub sparsity: Option<f32>,
    /// Output profile (JSON); the trace and pictures go next to it
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Replace existing output files
    #[arg(long)]
    pub force: bool,
}

/// The profile's companions: `<stem>.trace`, `<stem>-hotness.svg`, `<stem>-hitrate.svg`.
pub fn companions(output: &Path) -> [PathBuf; 3] {
    let stem = output.with_extension("");
    let s = stem.display();
    [
        PathBuf::from(format!("{s}.trace")),
        PathBuf::from(format!("{s}-hotness.svg")),
        PathBuf::from(format!("{s}-hitrate.svg")),
    ]
}

pub fn run(a: ProfileArgs) -> Result<()> {
    if let Some(s) = a.sparsity.filter(|s| !(0.0..1.0).contains(s)) {
        bail!("--sparsity must be in 0..1 (got {s})");
    }
    if a.tokens == 0 || a.chunk == 0 {
        bail!("--tokens and --chunk must be at least 1");
    }
    let [trace_path, hot_svg, hit_svg] = companions(&a.output);
    let path = super::model_path(&a.model)?;
    let inputs: Vec<&Path> = std::iter::once(path.as_path())
        .chain(a.file.as_deref())
        .collect();
    super::check_outputs(
        &[&a.output, &trace_path, &hot_svg, &hit_svg],
        &inputs,
        a.force,
    )?;
    let model = load_model(&a.model)?;
    let c = &model.config;
    let mut engine = pi2_engine::Engine::new(&model, &super::engine_config(&a.model)?)?;
    let (tokens, name) = pi2_convert::calibration::tokens(&model, a.file.as_deref(), a.tokens)?;
    let n = tokens.len();
    if n < a.tokens {
        eprintln!("profile: the calibration text has only {n} tokens; profiling all of them");
    }
    let chunk = a.chunk.min(engine.n_ctx());
    // The scores wait on disk beside the output (unnamed files the system removes), not in
    // memory: a long calibration text's scores can outgrow the model.
    let spill_dir = match a.output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    eprintln!(
        "profile: {n} tokens of {name} in chunks of {chunk}, {} layers x {} neurons ({:.0} MiB of scores, kept in temporary files in {})",
        c.n_layer,
        c.n_ff,
        (n * c.n_layer * c.n_ff) as f64 / (1 << 20) as f64,
        spill_dir.display()
    );
    let opts = pi2_convert::pipeline::ProfileOptions {
        chunk,
        sparsity: a.sparsity,
        calibration: name,
        spill_dir: Some(spill_dir),
    };
    let start = std::time::Instant::now();
    let mut bar = Bars::default();
    if c.n_expert > 0 {
        let show = &mut |w: &str, d, t| bar.show(w, d, t);
        let counts =
            pi2_convert::pipeline::profile_experts(&model, &mut engine, &tokens, &opts, show)?;
        drop(bar);
        print_expert_counts(&model, &counts);
        std::fs::write(&a.output, serde_json::to_vec(&counts.to_json(&model))?)
            .with_context(|| format!("cannot write {}", a.output.display()))?;
        eprintln!("profile: wrote {}", a.output.display());
        return Ok(());
    }
    let (profile, trace) = pi2_convert::pipeline::profile(
        &model,
        &path,
        &mut engine,
        &tokens,
        &opts,
        &mut |w, d, t| bar.show(w, d, t),
    )?;
    drop(bar);
    eprintln!(
        "profile: profiled and summarised in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if let Some(spec) = &pi2_model::stand_in::StandInSpec::from_file(&model.file) {
        let profile = &profile;
        println!("{}", pi2_convert::describe::PlantedTable { spec, profile });
    }
    profile.save(&a.output)?;
    trace.write(&trace_path)?;
    pi2_sparse::plots::hotness_svg(&profile, &hot_svg)?;
    pi2_sparse::plots::hit_rate_svg(&profile, &hit_svg)?;
    println!("{}", pi2_convert::describe::ProfileSummary(&profile));
    for p in [&a.output, &trace_path, &hot_svg, &hit_svg] {
        eprintln!("profile: wrote {}", p.display());
    }
    Ok(())
}

/// One progress bar per phase of a pipeline (`(phase, done, total)`), cleared when done; the
/// time each phase took.
#[derive(Default)]
pub struct Bars {
    bar: Option<(String, ProgressBar)>,
    started: Option<std::time::Instant>,
    times: Vec<(String, f64)>,
}

impl Bars {
    pub fn show(&mut self, phase: &str, done: usize, total: usize) {
        if self.bar.as_ref().is_none_or(|(p, _)| p != phase) {
            if let Some((p, b)) = self.bar.take() {
                b.finish_and_clear();
                let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
                self.times.push((p, secs));
            }
            self.started = Some(std::time::Instant::now());
            // A phase of one step (fitting, writing) shows a spinner and the time it has taken,
            // so a long one never looks stuck at 0/1.
            let template = match total <= 1 {
                true => "{msg:>15} {spinner} {elapsed}",
                false => "{msg:>15} {bar:30} {pos}/{len} {eta}",
            };
            let b = ProgressBar::new(total as u64)
                .with_style(ProgressStyle::with_template(template).expect("valid template"));
            if total <= 1 {
                b.enable_steady_tick(std::time::Duration::from_millis(250));
            }
            b.set_message(phase.to_string());
            self.bar = Some((phase.to_string(), b));
        }
        if let Some((_, b)) = &self.bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    }

    /// Seconds per phase so far ("profile 27.3 s, sensitivity 88.1 s, ..."), the last included.
    pub fn summary(&mut self) -> String {
        if let Some((p, b)) = self.bar.take() {
            b.finish_and_clear();
            let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
            self.times.push((p, secs));
        }
        let parts: Vec<String> = self
            .times
            .iter()
            .map(|(p, s)| format!("{p} {s:.1} s"))
            .collect();
        parts.join(", ")
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        if let Some((_, b)) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Per layer of a mixture-of-experts model: experts' shares and rates (stand-ins: against
/// the planted rates).
pub fn print_expert_counts(model: &Model, counts: &pi2_convert::moe::ExpertCounts) {
    let spec = pi2_model::stand_in::StandInSpec::from_file(&model.file);
    let spec = spec.as_ref();
    println!("{}", pi2_convert::describe::ExpertTable { counts, spec });
}
