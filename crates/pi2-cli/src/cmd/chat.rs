//! `pi2 chat`: interactive chat. Each turn re-renders the whole conversation with the model's
//! template and evaluates only the tokens that differ from what the KV cache already holds.

use super::sampler;
use crate::args::{ModelArgs, SampleArgs};
use anyhow::Result;
use clap::Args;
use pi2_engine::{generate, GenerateConfig, StopReason};
use pi2_model::Message;
use pi2_runtime::text::Utf8Stream;
use std::io::{BufRead, Write};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// System prompt
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Most tokens per reply
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
    #[command(flatten)]
    pub session: super::sparse_args::SessionArgs,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let (path, opts) = super::session_model(&a.model, &a.session, "chat")?;
    let model = pi2_runtime::load_model(&path)?;
    let template = model.chat_template()?;
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    // Turns are evaluated in batches of `GenerateConfig::n_batch` tokens (fewer where a memory
    // budget cannot hold the buffers of such batches): buffers for those.
    let (mut engine, n_batch) = prepared.engine_within_budget(GenerateConfig::default().n_batch)?;
    let mut sampler = sampler(&a.sample, model.config.n_vocab)?;
    let tok = &model.tokenizer;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message::new("system", s));
    }
    let cfg = GenerateConfig {
        max_tokens: Some(a.n_predict),
        ignore_eos: false,
        n_batch,
        ..Default::default()
    };
    let mut cached = Vec::new();
    eprintln!("pi2 chat: type a message and press Enter; /reset clears the conversation, /exit or Ctrl-D quits.");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        eprint!("> ");
        let mut bytes = Vec::new();
        if stdin.lock().read_until(b'\n', &mut bytes)? == 0 {
            eprintln!();
            return Ok(());
        }
        let Ok(line) = String::from_utf8(bytes) else {
            eprintln!("(that line of input is not UTF-8 text, so it was not sent; set the terminal or the piped file to UTF-8)");
            continue;
        };
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                messages.truncate(a.system.is_some() as usize);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", line));
        let prompt = template.encode(tok, &messages, true)?;
        if prompt.len() + 1 >= engine.n_ctx() {
            messages.pop();
            eprintln!(
                "(the conversation no longer fits the context of {} tokens; /reset to start over)",
                engine.n_ctx()
            );
            continue;
        }
        let mut stream = Utf8Stream::default();
        let g = generate(
            &mut engine,
            &mut sampler,
            &mut cached,
            &prompt,
            &cfg,
            |id| {
                let _ = write!(out, "{}", stream.push(&tok.token_bytes(id, false)));
                let _ = out.flush();
                true
            },
        )?;
        writeln!(out, "{}", stream.finish())?;
        if g.stop == StopReason::ContextFull {
            eprintln!("(context full)");
        }
        let reply = String::from_utf8_lossy(&tok.decode(&g.tokens, false)).into_owned();
        messages.push(Message::new("assistant", &reply));
    }
}
