//! `pi2 run`: one prompt in, streamed text out (or one JSON object with `--json`).

use super::sampler;
use crate::{rss, utf8::Utf8Stream, ModelArgs, SampleArgs};
use anyhow::{bail, Result};
use clap::Args;
use pi2_engine::{generate, GenerateConfig};
use pi2_model::Message;
use serde_json::json;
use std::io::Write;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Prompt text
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// Tokens to generate (-1 = until end of generation or a full context)
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Wrap the prompt as a user message in the model's chat template
    #[arg(long)]
    pub chat: bool,
    /// Keep generating past end-of-generation tokens
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (ids, text, timings, peak RSS) instead of streaming
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sparse: super::sparse_args::SparseArgs,
    #[command(flatten)]
    pub offload: super::sparse_args::OffloadArgs,
    /// Run a plan from `pi2 plan` (threads, cores, memory split, I/O), or `auto` to plan now
    /// (for --mem-budget, else the whole model in memory)
    #[arg(long)]
    pub plan: Option<String>,
}

pub fn run(a: RunArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let model = pi2_runtime::load_model(&path)?;
    let opts = super::session_options(&a.model, &a.sparse, &a.offload, a.plan.clone(), "run")?;
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    let tok = &model.tokenizer;
    let prompt_text = if a.chat {
        model
            .chat_template()?
            .render(&[Message::new("user", &a.prompt)], true)?
    } else {
        a.prompt.clone()
    };
    // Chat-rendered text carries control tokens; plain prompts are tokenized as text.
    let prompt = tok.encode(&prompt_text, true, a.chat);
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let cfg = GenerateConfig {
        max_tokens: (a.n_predict >= 0).then_some(a.n_predict as usize),
        ignore_eos: a.ignore_eos,
        ..Default::default()
    };
    // The prompt is evaluated in batches of `cfg.n_batch`: buffers (and a budget) for those.
    let mut engine = prepared.engine(prompt.len().min(cfg.n_batch))?;
    if prompt.len() >= engine.n_ctx() {
        bail!(
            "the prompt is {} tokens, longer than the context of {} (raise -c/--ctx-size)",
            prompt.len(),
            engine.n_ctx()
        );
    }
    let mut sampler = sampler(&a.sample);
    let mut stream = Utf8Stream::default();
    let mut stdout = std::io::stdout().lock();
    if !a.json {
        write!(stdout, "{}", a.prompt)?;
        stdout.flush()?;
    }
    let mut cached = Vec::new();
    let g = generate(
        &mut engine,
        &mut sampler,
        &mut cached,
        &prompt,
        &cfg,
        |id| {
            if !a.json {
                let text = stream.push(&tok.token_bytes(id, false));
                let _ = write!(stdout, "{text}");
                let _ = stdout.flush();
            }
            true
        },
    )?;
    if a.json {
        let out = report_json(&prepared, &engine, &prompt, &g);
        writeln!(stdout, "{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        writeln!(stdout, "{}", stream.finish())?;
        print_timings(&g);
        super::sparse_args::print_head_stats(&engine.head_stats(), model.config.n_vocab);
    }
    Ok(())
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

/// The `--json` object: ids, text, llama-server style timings, peak RSS, sparse and offload
/// statistics, the plan.
fn report_json(
    prepared: &pi2_runtime::Prepared<'_>,
    engine: &pi2_engine::Engine<'_>,
    prompt: &[u32],
    g: &pi2_engine::Generation,
) -> serde_json::Value {
    let tok = &prepared.model.tokenizer;
    let prompt_ms = g.prompt_time.as_secs_f64() * 1e3;
    let predicted_ms = g.predicted_time.as_secs_f64() * 1e3;
    let text = String::from_utf8_lossy(&tok.decode(&g.tokens, false)).into_owned();
    json!({
        "prompt_ids": prompt,
        "generated_ids": g.tokens,
        "text": text,
        "stop": format!("{:?}", g.stop),
        "timings": {
            "prompt_n": g.prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_second": per_second(g.prompt_n, prompt_ms),
            "predicted_n": g.tokens.len(),
            "predicted_ms": predicted_ms,
            "predicted_per_second": per_second(g.tokens.len(), predicted_ms),
        },
        "peak_rss_bytes": rss::peak_rss_bytes(),
        "threads": engine.threads(),
        "kernel_tier": engine.tier().name(),
        "sparse": prepared.sparse.as_ref().map(|_| super::sparse_args::stats_json(engine.sparse_stats())),
        "head": super::sparse_args::head_json(&engine.head_stats(), prepared.model.config.n_vocab),
        "offload": engine.offload().map(|o| super::sparse_args::offload_json(o, g.tokens.len(), predicted_ms / 1e3)),
        "plan": prepared.applied.as_ref().map(|ap| json!({
            "knobs": ap.plan.knobs,
            "predicted_decode_per_second": ap.plan.predicted.decode_tps,
            "predicted_prefill_per_second": ap.plan.predicted.prefill_tps,
            "predicted_memory_bytes": ap.plan.predicted.memory,
        })),
    })
}

/// llama.cpp's timing lines, on stderr.
fn print_timings(g: &pi2_engine::Generation) {
    let prompt_ms = g.prompt_time.as_secs_f64() * 1e3;
    let predicted_ms = g.predicted_time.as_secs_f64() * 1e3;
    eprintln!();
    eprintln!(
        "prompt eval: {:>8.2} ms / {:>4} tokens ({:>8.2} tokens per second)",
        prompt_ms,
        g.prompt_n,
        per_second(g.prompt_n, prompt_ms)
    );
    eprintln!(
        "       eval: {:>8.2} ms / {:>4} tokens ({:>8.2} tokens per second)",
        predicted_ms,
        g.tokens.len(),
        per_second(g.tokens.len(), predicted_ms)
    );
    if let Some(p) = rss::peak_rss_bytes() {
        eprintln!("   peak RSS: {}", rss::human(p));
    }
}
