//! `pi2 synth`: a full-size stand-in model (real shape, real tokenizer, planted activation
//! statistics) streamed to disk. See `pi2_model::stand_in` for the construction.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pi2_model::stand_in::{Shape, StandIn, StandInSpec, SHAPES};
use pi2_model::{FfnAct, GgufFile};
use pi2_runtime::options::parse_type;
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

#[derive(Args)]
pub struct SynthArgs {
    /// Model shape: llama2-7b, llama2-13b, mistral-7b, mixtral-8x7b, qwen2.5-1.5b,
    /// qwen3-30b-a3b, olmoe-1b-7b, gpt-oss-20b (MXFP4 experts; use --quant q8_0) (tiny,
    /// tiny-moe: tests)
    #[arg(long)]
    pub shape: String,
    /// FFN: relu (ReGLU), dreglu (dReLU, TurboSparse), silu (SwiGLU)
    #[arg(long, default_value = "relu")]
    pub ffn: String,
    /// Type of every matrix: q4_0, q4_1, q4_k, q8_0, f16
    #[arg(long, default_value = "q4_0")]
    pub quant: String,
    /// Mean planted firing rate of a layer's neurons (default: 0.1 for ReLU-family FFNs, as
    /// TurboSparse and ProSparse report; 0.5 for SiLU)
    #[arg(long)]
    pub rate: Option<f32>,
    /// Power-law exponent of neuron hotness (rate of the r-th hottest neuron ~ 1/r^alpha)
    #[arg(long, default_value_t = 1.0)]
    pub alpha: f32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// GGUF file whose tokenizer the stand-in copies (default: SmolLM2, fetched on first use)
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Replace an existing output file
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: SynthArgs) -> Result<()> {
    let shape = Shape::by_name(&a.shape).with_context(|| {
        let names: Vec<_> = SHAPES.iter().map(|s| s.name).collect();
        format!("unknown shape `{}` (known: {})", a.shape, names.join(", "))
    })?;
    let ffn_act = FfnAct::parse(&a.ffn)
        .with_context(|| format!("unknown FFN `{}` (relu, dreglu, silu)", a.ffn))?;
    let spec = StandInSpec {
        shape,
        ffn_act,
        quant: parse_type("--quant", &a.quant)?,
        rate: a
            .rate
            .unwrap_or(if ffn_act.exact_sparsity() { 0.1 } else { 0.5 }),
        alpha: a.alpha,
        seed: a.seed,
    };
    super::check_outputs(&[&a.output], &[], a.force)?;
    let tok_path = crate::fetch::resolve(a.tokenizer.as_deref())?;
    let tok = GgufFile::open(&tok_path)
        .with_context(|| format!("cannot read the tokenizer source {}", tok_path.display()))?;
    let model = StandIn::new(spec, &tok)?;
    let total = model.file_bytes();
    let dir = match a.output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let free = pi2_io::measure::free_bytes(&dir).unwrap_or(u64::MAX / 2);
    // A file being replaced gives its room back.
    let reclaimed = std::fs::metadata(&a.output).map_or(0, |m| m.len());
    if total > free + reclaimed {
        bail!(
            "{} needs {:.2} GiB but {} has {:.2} GiB free",
            a.output.display(),
            gib(total),
            dir.display(),
            gib(free + reclaimed)
        );
    }
    eprintln!(
        "synth: {} {} {}, {} tensors, {:.2} GiB -> {}",
        shape.name,
        ffn_act.name(),
        model.spec.quant,
        model.tensors.len(),
        gib(total),
        a.output.display()
    );
    // Complete or not at all: an interrupted run leaves nothing (see `write_atomic`).
    pi2_convert::write_atomic(
        &a.output,
        &[&tok_path],
        a.force,
        |out| write(&model, out, total),
        |_| Ok(()),
    )?;
    println!("{}", a.output.display());
    Ok(())
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn write(model: &StandIn, out: &mut BufWriter<File>, total: u64) -> std::io::Result<()> {
    let pb = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec}, eta {eta}")
            .expect("valid template"),
    );
    model.write(out, &mut |n| pb.inc(n))?;
    pb.finish_and_clear();
    Ok(())
}
