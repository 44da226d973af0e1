//! `pi2 run`: one prompt in, streamed text out (or one JSON object with `--json`).

use super::sampler;
use crate::args::{DraftArgs, GrammarArgs, ModelArgs, SampleArgs};
use crate::rss;
use anyhow::{bail, Result};
use clap::Args;
use pi2_engine::{generate_drafted, GenerateConfig};
use pi2_model::Message;
use pi2_runtime::report::per_second;
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
    let draft_model = super::draft_model(&a.draft, &a.model)?;
    let mut drafter: Option<(Box<dyn pi2_engine::Drafter + '_>, _)> = a.draft.drafter()?;
    let session = match &draft_model {
        Some(dm) => {
            super::session_beside_draft(&a.model, &a.session, dm, &user_text, a.n_predict, "run")?
        }
        None => a.session.clone(),
    };
    let (path, mut opts) = super::session_model(&a.model, &session, "run")?;
    let model = pi2_runtime::load_model(&path)?;
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
        let need = prompt.len().saturating_add(n).saturating_add(1);
        let asked = match opts.engine.n_ctx {
            0 => model.config.n_ctx_train,
            c => c,
        };
        // An absurd -c stays as given, for the engine to refuse by name.
        if asked <= pi2_engine::MAX_CTX {
            opts.engine.n_ctx = asked.min(need);
        }
    }
    if let Some((_, d)) = &drafter {
        // A checked draft returns a row of logits per token: the budget holds them.
        opts.engine.logit_rows = d.max + 1;
    }
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
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
    let checked = drafter.as_ref().map_or(1, |(_, d)| d.max + 1);
    let want = prompt.len().min(cfg.n_batch).max(checked);
    let (mut engine, n_batch) = prepared.engine_within_budget(want)?;
    if n_batch < checked {
        bail!(
            "--mem-budget leaves room for batches of {n_batch} tokens, fewer than a draft of --draft-max {} and its token: lower --draft-max or raise the budget",
            checked - 1
        );
    }
    cfg.n_batch = n_batch;
    if let (Some(dm), Some((d, _))) = (&draft_model, &mut drafter) {
        let base = super::engine_config(&a.model)?;
        let budget = opts.mem_budget.is_some();
        *d = Box::new(pi2_runtime::draft::engine(dm, &base, &engine, budget)?);
    }
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
        print_timings(&g);
        super::sparse_args::print_head_stats(&engine.head_stats(), model.config.n_vocab);
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
    use std::io::Read;
    let (name, reader): (String, Box<dyn Read>) = match (&a.prompt, &a.file) {
        (Some(p), _) => return Ok(p.clone()),
        (None, Some(f)) if f.as_os_str() == "-" => {
            ("standard input".into(), Box::new(std::io::stdin().lock()))
        }
        (None, Some(f)) => {
            let file = std::fs::File::open(f)
                .map_err(|e| anyhow::anyhow!("cannot read the prompt file {}: {e}", f.display()))?;
            if !file.metadata()?.is_file() {
                bail!(
                    "{} is not a regular file (use -f - for standard input)",
                    f.display()
                );
            }
            (f.display().to_string(), Box::new(file))
        }
        (None, None) => bail!("no prompt: give -p TEXT or -f FILE (-f - reads standard input)"),
    };
    let mut bytes = Vec::new();
    reader
        .take(MAX_PROMPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot read the prompt from {name}: {e}"))?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        bail!(
            "the prompt in {name} is over {} MiB",
            MAX_PROMPT_BYTES >> 20
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the prompt in {name} is not UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        )
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
    if g.drafted > 0 {
        eprintln!(
            "      draft: {} drafted, {} accepted ({:.0}%), {:.2} tokens per forward pass",
            g.drafted,
            g.accepted,
            100.0 * g.accepted as f64 / g.drafted as f64,
            g.tokens.len() as f64 / g.decode_passes.max(1) as f64
        );
    }
    if let Some(p) = rss::peak_rss_bytes() {
        eprintln!("   peak RSS: {}", rss::human(p));
    }
}
