//! `pi2 perplexity`: llama-perplexity's chunking, running output and final line.

use super::load_model;
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_engine::perplexity::{n_chunks, perplexity_with, PerplexityConfig};
use pi2_engine::HeadTv;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to evaluate
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per forward call (at most the context size)
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Evaluate only the first N chunks
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Tokenize special-token text in the file as plain text (by default it is parsed, the
    /// same rule as `run`)
    #[arg(long)]
    pub no_parse_special: bool,
    #[command(flatten)]
    pub sparse: super::sparse_args::SparseArgs,
    /// Also measure, on every scored token, the total-variation distance between what the
    /// sampling options below draw from over the dense head and over the sparse head's
    /// candidates (a model made by `pi2 convert --head`)
    #[arg(long = "head-tv")]
    pub head_tv: bool,
    /// Sampling options for --head-tv
    #[command(flatten)]
    pub sample: crate::SampleArgs,
}

pub fn run(mut a: PerplexityArgs) -> Result<()> {
    // llama-perplexity's context default is the model's; here -c keeps pi2's common default of
    // 4096 unless given, so pass `-c 512` to reproduce the usual numbers.
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let model = load_model(&a.model)?;
    if a.model.ctx_size == 0 {
        a.model.ctx_size = model.config.n_ctx_train;
    }
    let n_ctx = a.model.ctx_size;
    if n_ctx < 4 {
        bail!("-c {n_ctx} is too small: perplexity scores the second half of each chunk (use at least 4, usually 512)");
    }
    let sampler_cfg = super::sampler(&a.sample)?.config().clone();
    if !a.head_tv && sampling_given(&a.sample) {
        bail!("sampling options only matter with --head-tv (perplexity itself scores the dense distribution)");
    }
    let path = super::model_path(&a.model)?;
    let opts = pi2_runtime::SessionOptions {
        engine: a.model.engine_options()?,
        sparse: a.sparse.options(),
        sparse_batches: true,
        ..Default::default()
    };
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    let sparse = prepared.sparse.as_ref();
    let mut engine = prepared.engine(a.batch.min(n_ctx))?;
    if prepared.head.is_some() {
        eprintln!("perplexity: the output matrix is computed whole (the exact dense head); the sparse head serves decode only");
    }
    let mut head_tv = match (a.head_tv, prepared.head.as_ref()) {
        (false, _) => None,
        (true, None) => bail!("--head-tv needs a model made by `pi2 convert --head` (this one has no sparse-head factors), without --dense-head"),
        (true, Some(h)) => {
            let act = model.weights.output.mat(&model.file).ty.act_kind();
            match HeadTv::new(h, &sampler_cfg, act) {
                Some(tv) => Some(tv),
                None => bail!("--head-tv: with a repetition penalty decode uses the dense head, so there is nothing to compare (drop --repeat-penalty)"),
            }
        }
    };
    eprintln!("perplexity: tokenizing the input ..");
    let tokens = model.tokenizer.encode(&text, true, !a.no_parse_special);
    if tokens.len() < 2 * n_ctx {
        bail!("you need at least {} tokens to evaluate perplexity with a context of {n_ctx} (the file has {})", 2 * n_ctx, tokens.len());
    }
    let cfg = PerplexityConfig {
        n_ctx,
        n_batch: a.batch.min(n_ctx),
        max_chunks: a.chunks,
        bos: model
            .tokenizer
            .add_bos
            .then_some(model.tokenizer.bos)
            .flatten(),
    };
    eprintln!(
        "perplexity: calculating perplexity over {} chunks, n_ctx={n_ctx}, batch_size={}, n_seq=1",
        n_chunks(tokens.len(), &cfg),
        cfg.n_batch
    );
    let t0 = Instant::now();
    let mut out = std::io::stdout().lock();
    let steps = perplexity_with(&mut engine, &tokens, &cfg, head_tv.as_mut(), |s| {
        if s.chunk == 1 {
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {secs:.2} seconds per pass - ETA {:.2} minutes",
                secs * n_chunks(tokens.len(), &cfg) as f64 / 60.0
            );
        }
        let _ = write!(out, "[{}]{:.4},", s.chunk, s.ppl);
        let _ = out.flush();
    })?;
    let last = steps.last().context("no chunk evaluated")?;
    writeln!(out)?;
    writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        last.ppl, last.stderr
    )?;
    if sparse.is_some() {
        super::sparse_args::print_stats(engine.sparse_stats());
    }
    if let Some(tv) = &head_tv {
        let st = tv.stats();
        let t = st.tokens.max(1) as f64;
        let vocab = model.config.n_vocab as f64;
        writeln!(
            out,
            "Sparse head for --temp {} --top-k {} --top-p {} --min-p {}: total-variation distance to the dense head mean {:.6}, max {:.6} over {} tokens; rows {:.0} per token ({:.2}% of the vocabulary); {} tokens ({:.1}%) beyond the fallback share (decode computes those densely)",
            a.sample.temp, a.sample.top_k, a.sample.top_p, a.sample.min_p,
            st.mean_tv(), st.tv_max, st.tokens,
            st.rows as f64 / t, 100.0 * st.rows as f64 / t / vocab,
            st.fallbacks, 100.0 * st.fallbacks as f64 / t
        )?;
    }
    eprintln!(
        "perplexity: {} tokens scored in {:.1} s",
        last.chunk * (n_ctx - n_ctx / 2 - 1),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Whether any sampling option differs from its default.
fn sampling_given(s: &crate::SampleArgs) -> bool {
    let d = pi2_engine::SamplerConfig::default();
    s.temp != d.temperature
        || s.top_k != d.top_k
        || s.top_p != d.top_p
        || s.min_p != d.min_p
        || s.repeat_penalty != d.repeat_penalty
        || s.repeat_last_n != d.repeat_last_n
        || s.seed.is_some()
}
