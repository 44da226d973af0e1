//! `pi2 chat`: interactive chat. Each turn re-renders the whole conversation with the model's
//! template and evaluates only the tokens that differ from what the KV cache already holds.
//! On a terminal, lines are edited with rustyline (arrows, history); Ctrl-C stops a reply and
//! keeps the conversation; commands start with `/` (`/help`).

use super::chat_set::{Settings, SET_HELP};
use super::sampler;
use crate::args::{DraftArgs, ModelArgs, SampleArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_engine::{generate_drafted, GenerateConfig, StopReason};
use pi2_model::answer::{Channels, ReasoningFormat};
use pi2_model::Message;
use pi2_runtime::conversation::Conversation;
use pi2_runtime::text::Utf8Stream;
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// System prompt
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Most tokens per reply
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
    /// When the conversation outgrows the context, drop its oldest turns (the system prompt
    /// stays), as llama.cpp does; without it such a message is refused
    #[arg(long)]
    pub context_shift: bool,
    #[command(flatten)]
    pub template: crate::args::TemplateArgs,
    #[command(flatten)]
    pub session: super::sparse_args::SessionArgs,
}

const HELP: &str = "commands:
  /help            this list
  /system [TEXT]   set the system prompt (without TEXT: remove it); the conversation stays
  /reset           clear the conversation (the system prompt stays)
  /save FILE       write the conversation as JSON (an existing file is never replaced)
  /load FILE       replace the conversation with one /save wrote
  /exit, /quit     leave (or Ctrl-D)
{SET}
  //text           send a message that starts with /text
Ctrl-C stops a reply and keeps the conversation; Up and Down recall earlier lines.";

/// Where lines come from: a line editor on a terminal, plain lines from a pipe.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    fn open() -> Result<Self> {
        if std::io::stdin().is_terminal() {
            let ed = rustyline::DefaultEditor::new().context("cannot start the line editor")?;
            return Ok(Input::Editor(Box::new(ed)));
        }
        Ok(Input::Lines(std::io::stdin().lock()))
    }

    /// The next line (`None` at the end of input).
    fn line(&mut self) -> Result<Option<String>> {
        match self {
            Input::Editor(ed) => loop {
                match ed.readline("> ") {
                    Ok(l) => {
                        if !l.trim().is_empty() {
                            let _ = ed.add_history_entry(l.as_str());
                        }
                        return Ok(Some(l));
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) => {
                        eprintln!("(Ctrl-D or /exit leaves)");
                    }
                    Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                    Err(e) => bail!("cannot read the terminal: {e}"),
                }
            },
            Input::Lines(stdin) => loop {
                eprint!("> ");
                let mut bytes = Vec::new();
                if stdin.read_until(b'\n', &mut bytes)? == 0 {
                    eprintln!();
                    return Ok(None);
                }
                match String::from_utf8(bytes) {
                    Ok(l) => return Ok(Some(l.trim_end_matches(['\n', '\r']).to_string())),
                    Err(_) => eprintln!("(that line of input is not UTF-8 text, so it was not sent; set the terminal or the piped file to UTF-8)"),
                }
            },
        }
    }
}

/// What a line asks for.
enum Action {
    Send(String),
    Done,
    Nothing,
    /// The sampling options changed.
    Resample,
}

/// Runs a command line (starting with `/`) on the conversation and the settings.
fn command(line: &str, conv: &mut Conversation, settings: &mut Settings) -> Action {
    let (cmd, arg) = line
        .split_once(' ')
        .map_or((line, ""), |(c, a)| (c, a.trim()));
    let result: Result<&str> =
        match cmd {
            "/exit" | "/quit" => return Action::Done,
            "/help" => {
                eprintln!("{}", HELP.replace("{SET}", SET_HELP));
                return Action::Nothing;
            }
            "/set" => match settings.set(arg) {
                Ok(done) => {
                    eprintln!("({done})");
                    return Action::Resample;
                }
                Err(e) => Err(e),
            },
            "/show" => {
                eprintln!("{}", settings.show());
                return Action::Nothing;
            }
            "/reset" => {
                conv.turns.clear();
                Ok("conversation cleared")
            }
            "/system" => {
                conv.system = (!arg.is_empty()).then(|| arg.to_string());
                Ok(if arg.is_empty() {
                    "system prompt removed"
                } else {
                    "system prompt set"
                })
            }
            "/save" if !arg.is_empty() => conv
                .save(Path::new(arg))
                .map(|_| "saved")
                .map_err(Into::into),
            "/load" if !arg.is_empty() => Conversation::load(Path::new(arg))
                .map_err(Into::into)
                .map(|c| {
                    *conv = c;
                    "loaded"
                }),
            "/save" | "/load" => Err(anyhow::anyhow!("{cmd} needs a file name")),
            _ if line.starts_with("//") => return Action::Send(line[1..].to_string()),
            _ => Err(anyhow::anyhow!("unknown command `{cmd}`: /help lists them")),
        };
    match result {
        Ok(done) => eprintln!("({done})"),
        Err(e) => eprintln!("({})", crate::errors::one_line(&e)),
    }
    Action::Nothing
}

pub fn run(a: ChatArgs) -> Result<()> {
    if let Some(note) = super::base_model_notice(&a.model) {
        eprintln!("{note}");
    }
    let (dm, path, opts) = super::drafted_session(&a.model, &a.session, &a.draft, "", -1, "chat")?;
    let mut model = pi2_runtime::load_model(&path)?;
    a.template.apply(&mut model)?;
    let template = model.chat_template()?;
    let dialect = template.dialect();
    let shown = dialect.shown_ids(&model.tokenizer);
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    let mut drafter = a.draft.drafter()?;
    // Turns are evaluated in batches of `GenerateConfig::n_batch` tokens (fewer where a memory
    // budget cannot hold the buffers of such batches): buffers for those.
    let want = GenerateConfig::default().n_batch;
    let (mut engine, n_batch) = super::drafted_engine(&prepared, want, &mut drafter, dm.as_ref())?;
    let mut sampler = sampler(&a.sample, model.config.n_vocab)?;
    let mut settings = Settings {
        sample: a.sample.clone(),
        verbose: false,
        last: None,
    };
    let tok = &model.tokenizer;
    let mut conv = Conversation::new(a.system.clone());
    let cfg = GenerateConfig {
        max_tokens: Some(a.n_predict),
        ignore_eos: false,
        n_batch,
        draft: drafter.as_ref().map_or_else(Default::default, |(_, d)| *d),
    };
    // Ctrl-C stops the reply being written; a second one while nothing stops it ends pi2.
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        stop.clone(),
    )?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    let mut cached = Vec::new();
    let mut input = Input::open()?;
    eprintln!("pi2 chat: type a message and press Enter; /help lists commands, Ctrl-C stops a reply, /exit or Ctrl-D quits.");
    let mut out = std::io::stdout();
    while let Some(line) = input.line()? {
        stop.store(false, Ordering::Relaxed);
        let text = match line.trim() {
            "" => continue,
            t if t.starts_with('/') => match command(t, &mut conv, &mut settings) {
                Action::Send(s) => s,
                Action::Done => return Ok(()),
                Action::Nothing => continue,
                Action::Resample => {
                    sampler = super::sampler(&settings.sample, model.config.n_vocab)?;
                    continue;
                }
            },
            _ => line,
        };
        conv.turns.push(Message::new("user", &text));
        // Room for the prompt and at least a short reply.
        let room = engine
            .n_ctx()
            .saturating_sub(a.n_predict.min(engine.n_ctx() / 4) + 1);
        let (prompt, dropped) = conv.encode_within(&template, tok, room, a.context_shift)?;
        if dropped > 0 {
            eprintln!("(context shift: dropped the {dropped} oldest turns)");
        }
        if prompt.len() + 1 >= engine.n_ctx() {
            conv.turns.pop();
            eprintln!(
                "(the conversation no longer fits the context of {} tokens; /reset to start over{})",
                engine.n_ctx(),
                if a.context_shift { ", or shorten the message" } else { ", or pass --context-shift" }
            );
            continue;
        }
        let mut stream = Utf8Stream::default();
        let tail = tok.decode(&prompt[prompt.len().saturating_sub(8)..], true);
        let opened = dialect.opens_reasoning(&String::from_utf8_lossy(&tail));
        let mut parts = Reply::new(Channels::new(dialect, ReasoningFormat::Apart, opened));
        let started = std::time::Instant::now();
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
                let text = stream.push(&tok.token_bytes(id, shown.contains(&id)));
                parts.push(&text, &mut out);
                !stop.load(Ordering::Relaxed)
            },
        )?;
        parts.push(&stream.finish(), &mut out);
        parts.end(&mut out);
        writeln!(out)?;
        settings.last = Some((g.tokens.len(), started.elapsed().as_secs_f64()));
        if settings.verbose {
            eprintln!("{}", settings.show().lines().last().unwrap_or_default());
        }
        if stop.swap(false, Ordering::Relaxed) {
            eprintln!("(stopped)");
        }
        if g.stop == StopReason::ContextFull {
            eprintln!("(context full)");
        }
        // The answer without its reasoning, as the families' templates keep past turns.
        conv.turns.push(Message::new("assistant", &parts.content));
    }
    Ok(())
}

/// A reply as it is shown: its reasoning dimmed on stderr, its content on stdout (and kept).
struct Reply {
    channels: Channels,
    content: String,
    dim: bool,
}

impl Reply {
    fn new(channels: Channels) -> Self {
        Reply {
            channels,
            content: String::new(),
            dim: std::io::stderr().is_terminal(),
        }
    }

    fn push(&mut self, text: &str, out: &mut impl Write) {
        let parts = self.channels.feed(text);
        self.show(parts, out);
    }

    fn end(&mut self, out: &mut impl Write) {
        let parts = self.channels.finish();
        self.show(parts, out);
    }

    fn show(&mut self, (reasoning, content): (String, String), out: &mut impl Write) {
        if !reasoning.is_empty() {
            // stderr is unbuffered: each piece shows as it comes.
            let _ = match self.dim {
                true => write!(std::io::stderr(), "\x1b[2m{reasoning}\x1b[0m"),
                false => write!(std::io::stderr(), "{reasoning}"),
            };
        }
        if !content.is_empty() {
            self.content.push_str(&content);
            let _ = write!(out, "{content}");
            let _ = out.flush();
        }
    }
}
