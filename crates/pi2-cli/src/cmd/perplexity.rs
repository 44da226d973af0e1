//! `pi2 perplexity`: llama-perplexity's chunking, running output and final line.

use crate::args::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_engine::perplexity::{n_chunks, perplexity, PerplexityConfig};
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
    /// The sparse FFN, the clustered head and the memory budget: what `run` computes with
    /// the same options is what is scored (a converted model runs its sparse FFN on every
    /// token unless --dense, and its clustered head unless --dense-head)
    #[command(flatten)]
    pub session: super::sparse_args::SessionArgs,
    /// Print the result as JSON (`ppl`, `stderr`, `head_top1_agreement`, `head_mass`, ...)
    #[arg(long)]
    pub json: bool,
}

pub fn run(mut a: PerplexityArgs) -> Result<()> {
    // llama-perplexity's context default is the model's; here -c keeps pi2's common default of
    // 4096 unless given, so pass `-c 512` to reproduce the usual numbers.
    let text = pi2_runtime::files::read_text(&a.file, "the text", 1 << 30)?;
    let (path, mut opts) = super::session_model(&a.model, &a.session, "perplexity")?;
    let model = pi2_runtime::load_model(&path)?;
    if a.model.ctx_size == 0 {
        a.model.ctx_size = model.config.n_ctx_train;
    }
    let n_ctx = a.model.ctx_size;
    if n_ctx < 4 {
        bail!("-c {n_ctx} is too small: perplexity scores the second half of each chunk (use at least 4, usually 512)");
    }
    opts.engine.n_ctx = n_ctx;
    opts.sparse_batches = true;
    // The clustered head is checked against the whole matrix on every scored token.
    opts.engine.head_check = opts.engine.head_share.is_none_or(|s| s < 1.0);
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    let sparse = prepared.sparse.as_ref();
    let mut engine = prepared.engine(a.batch.min(n_ctx))?;
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
    // With --json, standard output holds the JSON alone; llama-perplexity's lines go to stderr.
    let mut out: Box<dyn Write> = if a.json {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    let steps = perplexity(&mut engine, &tokens, &cfg, |s| {
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
        eprintln!(
            "{}",
            pi2_runtime::report::sparse_text(engine.sparse_stats())
        );
    }
    let head = engine.head_stats();
    if let Some(check) = pi2_runtime::report::head_check_text(&head) {
        eprintln!("{check}");
    }
    let scored = last.chunk * (n_ctx - n_ctx / 2 - 1);
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("perplexity: {scored} tokens scored in {secs:.1} s");
    if a.json {
        drop(out);
        let report = pi2_runtime::report::perplexity_json(&engine, last, n_ctx, scored, secs);
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
