//! `pi2 run`: one prompt in, streamed text out (or one JSON object with `--json`).

use super::sampler;
use crate::args::{DraftArgs, GrammarArgs, ModelArgs, SampleArgs};
use anyhow::{bail, Result};
use clap::Args;
use pi2_engine::{generate_drafted, GenerateConfig};
use pi2_model::Message;
use pi2_runtime::text::Utf8Stream;
use std::io::Write;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub grammar: GrammarArgs,
    /// With --chat
    #[command(flatten)]
    pub template: crate::args::TemplateArgs,
    /// Prompt text (special tokens such as `<|im_start|>` are parsed, as llama.cpp does)
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file (`-` for standard input)
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
    /// Tokenize special-token text in the prompt as plain text
    #[arg(long)]
    pub no_parse_special: bool,
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
    /// Most prompt tokens evaluated in one batch (fewer where a memory budget cannot hold the
    /// buffers of such batches, whose room the neuron cache shares)
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub n_batch: usize,
    /// Print one JSON object (ids, text, timings, peak RSS) instead of streaming
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub session: super::sparse_args::SessionArgs,
}

pub fn run(a: RunArgs) -> Result<()> {
    if a.n_predict < -1 {
        bail!(
            "-n {}: pass a number of tokens, or -1 for until end of generation",
            a.n_predict
        );
    }
    let user_text = prompt_text(&a)?;
    let (dm, path, mut opts) = super::drafted_session(
        &a.model,
        &a.session,
        &a.draft,
        &user_text,
        a.n_predict,
        "run",
    )?;
    if a.template.given() && !a.chat {
        bail!("--chat-template and --chat-template-file shape --chat prompts: add --chat");
    }
    let mut model = pi2_runtime::load_model(&path)?;
    a.template.apply(&mut model)?;
    let tok = &model.tokenizer;
    // A hand-written prompt's control-token text becomes control tokens (as llama.cpp parses
    // it) unless --no-parse-special; with --chat that flag keeps the message's text as text
    // inside the template's markup.
    let prompt = if a.chat {
        let template = model.chat_template()?;
        let msgs = [Message::new("user", &user_text)];
        if a.no_parse_special {
            template.encode(tok, &msgs, true)?
        } else {
            tok.encode(&template.render(&msgs, true)?, true, true)
        }
    } else {
        tok.encode(&user_text, true, !a.no_parse_special)
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    // A run of known length never holds more than its prompt and continuation: a KV cache (and
    // a memory budget's share for it) sized for more would go unused.
    if let Ok(n) = usize::try_from(a.n_predict) {
        opts.engine
            .fit_context(&model, prompt.len().saturating_add(n));
    }
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    let mut drafter = a.draft.drafter()?;
    let mut cfg = GenerateConfig {
        max_tokens: (a.n_predict >= 0).then_some(a.n_predict as usize),
        ignore_eos: a.ignore_eos,
        ..Default::default()
    };
    if let Some((_, d)) = &drafter {
        cfg.draft = *d;
    }
    // The prompt is evaluated in batches of `cfg.n_batch` (fewer where a memory budget cannot
    // hold their buffers), and a checked draft in one: buffers (and a budget) for those.
    if !(1..=pi2_engine::MAX_CTX).contains(&a.n_batch) {
        bail!("-b {} is outside 1..{}", a.n_batch, pi2_engine::MAX_CTX);
    }
    let want = prompt.len().min(a.n_batch);
    let (mut engine, n_batch) = super::drafted_engine(&prepared, want, &mut drafter, dm.as_ref())?;
    cfg.n_batch = n_batch;
    if prompt.len() >= engine.n_ctx() {
        bail!(
            "the prompt is {} tokens, longer than the context of {} (raise -c/--ctx-size)",
            prompt.len(),
            engine.n_ctx()
        );
    }
    let mut sampler = sampler(&a.sample, model.config.n_vocab)?;
    if let Some(spec) = a.grammar.spec()? {
        let grammar = pi2_grammar::Vocabulary::new(tok)?.compile(&spec)?;
        sampler = sampler.with_constraint(Box::new(grammar.start()));
    }
    let mut stream = Utf8Stream::default();
    let mut stdout = std::io::stdout().lock();
    // A plain prompt is continued, so it is printed first (as llama.cpp does); with --chat
    // the reply is an answer of its own, printed alone.
    if !a.json && !a.chat {
        write!(stdout, "{user_text}")?;
        stdout.flush()?;
    }
    let mut cached = Vec::new();
    let g = generate_drafted(
        &mut engine,
        &mut sampler,
        &mut cached,
        &prompt,
        &cfg,
        drafter
            .as_mut()
            .map(|(d, _)| d.as_mut() as &mut dyn pi2_engine::Drafter),
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
        let out = pi2_runtime::report::run_json(&prepared, &engine, &prompt, &g);
        writeln!(stdout, "{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        writeln!(stdout, "{}", stream.finish())?;
        eprintln!("\n{}", pi2_runtime::report::timings_text(&engine, &g));
    }
    if g.stop == pi2_engine::StopReason::ContextFull {
        eprintln!(
            "run: stopped: the context of {} tokens is full (raise -c/--ctx-size)",
            engine.n_ctx()
        );
    }
    Ok(())
}

/// Largest prompt file read (a prompt longer than any context is refused later anyway).
const MAX_PROMPT_BYTES: u64 = 64 << 20;

/// The prompt from -p, or from -f (a file, or standard input for `-`).
fn prompt_text(a: &RunArgs) -> Result<String> {
    match (&a.prompt, &a.file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => Ok(pi2_runtime::files::read_text(
            f,
            "the prompt",
            MAX_PROMPT_BYTES,
        )?),
        (None, None) => bail!("no prompt: give -p TEXT or -f FILE (-f - reads standard input)"),
    }
}
