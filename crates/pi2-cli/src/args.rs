//! Arguments shared by several commands: the model and engine, and sampling.

use clap::Args;
use std::path::PathBuf;

/// Options shared by every command that loads a model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file, or a catalogue name fetched on first use (`pi2 fetch-model --list`);
    /// default: smollm2-135m
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores); `pi2 bench` takes a comma-separated list
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Context size in tokens (0 = the model's training context)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    /// Force a kernel tier lower than the detected one (scalar, avx2, avxvnni, avx512,
    /// avx512vnni, neon, dotprod)
    #[arg(long = "kernel-tier")]
    pub kernel_tier: Option<String>,
    /// Pin compute threads to these cores: clusters (big, mid, little, all) or CPU numbers
    /// (0-3,6), in placement order; threads default to the number of cores selected
    #[arg(long = "cores")]
    pub cores: Option<String>,
    /// Keep every weight in the file mapping: no row-interleaved copies of the attention,
    /// output and dense FFN matrices (slower matvec; for comparison and tight memory)
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

/// Sampling options (llama.cpp names and defaults).
#[derive(Args, Clone, Debug)]
pub struct SampleArgs {
    /// Temperature; 0 = greedy
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off)
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1.0 = off)
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p: keep tokens at least this share as probable as the top one (0 = off)
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1.0 = off)
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Presence penalty: subtracted once from each recent token's logit (0 = off)
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Frequency penalty: subtracted per occurrence among the recent tokens (0 = off)
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Bias a token's logit: TOKEN_ID+BIAS or TOKEN_ID-BIAS (repeatable; -100 bans a token)
    #[arg(short = 'l', long = "logit-bias", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed (default: random)
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
}

/// What the output must match (llama.cpp's names); one at most.
#[derive(Args, Clone, Debug, Default)]
#[group(multiple = false)]
pub struct GrammarArgs {
    /// The output follows this GBNF grammar (llama.cpp's format; `root` is the start)
    #[arg(long)]
    pub grammar: Option<String>,
    /// The output follows the GBNF grammar in this file
    #[arg(long)]
    pub grammar_file: Option<std::path::PathBuf>,
    /// The output is JSON valid against this JSON schema (`{}` for any JSON object)
    #[arg(short = 'j', long)]
    pub json_schema: Option<String>,
    /// The output is JSON valid against the JSON schema in this file
    #[arg(long)]
    pub json_schema_file: Option<std::path::PathBuf>,
}

impl GrammarArgs {
    /// The grammar asked for, read and parsed (not yet compiled).
    pub fn spec(&self) -> anyhow::Result<Option<pi2_grammar::GrammarSpec>> {
        use pi2_grammar::GrammarSpec;
        let read =
            |what: &str, p: &std::path::Path| pi2_runtime::files::read_text(p, what, 64 << 20);
        let schema = |flag: &str, text: &str| -> anyhow::Result<GrammarSpec> {
            GrammarSpec::json_schema_text(text).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
        };
        Ok(Some(match self {
            Self {
                grammar: Some(g), ..
            } => GrammarSpec::Gbnf(g.clone()),
            Self {
                grammar_file: Some(p),
                ..
            } => GrammarSpec::Gbnf(read("the grammar", p)?),
            Self {
                json_schema: Some(s),
                ..
            } => schema("--json-schema", s)?,
            Self {
                json_schema_file: Some(p),
                ..
            } => schema("--json-schema-file", &read("the JSON schema", p)?)?,
            _ => return Ok(None),
        }))
    }
}

/// `TOKEN_ID+BIAS` or `TOKEN_ID-BIAS`, as llama.cpp's `--logit-bias`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let at = s
        .find(['+', '-'])
        .ok_or_else(|| format!("`{s}`: write TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1.5"))?;
    let id = s[..at]
        .parse()
        .map_err(|_| format!("`{s}`: `{}` is not a token id", &s[..at]))?;
    let bias: f32 = s[at..]
        .parse()
        .map_err(|_| format!("`{s}`: `{}` is not a number", &s[at..]))?;
    Ok((id, bias))
}

/// Where speculative decoding's drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftSource {
    /// No drafts: one token per forward pass
    None,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the context's
    /// last n-gram (editing answers repeat their prompt)
    Lookup,
    /// The model itself from what --mem-budget keeps resident (pinned and cached neurons,
    /// resident output clusters): drafts that read nothing from flash
    #[value(name = "self")]
    SelfDraft,
}

/// Speculative decoding (llama.cpp's names).
#[derive(Args, Clone, Debug)]
pub struct DraftArgs {
    /// Draft tokens and check them in one forward pass (`lookup`, `self` under --mem-budget);
    /// output is distributed as without drafts (greedy: the same text)
    #[arg(long = "draft", value_enum, default_value_t = DraftSource::None)]
    pub draft: DraftSource,
    /// Most tokens drafted per step (the length adapts to acceptance below it)
    #[arg(long = "draft-max", default_value_t = 16)]
    pub draft_max: usize,
    /// Fewest drafted tokens worth checking
    #[arg(long = "draft-min", default_value_t = 1)]
    pub draft_min: usize,
    /// Draft with a second, smaller model of the same vocabulary (a file or a catalogue name;
    /// llama.cpp's --model-draft): greedy drafts from its own KV cache. Its file, KV cache and
    /// buffers count against --mem-budget
    #[arg(long = "draft-model", alias = "model-draft")]
    pub draft_model: Option<std::path::PathBuf>,
}

/// Stands for a draft model until its engine is built (after the session's, whose budget it
/// shares).
pub struct NoDraft;

impl pi2_engine::Drafter for NoDraft {
    fn propose(&mut self, _history: &[u32], _max: usize) -> Vec<u32> {
        Vec::new()
    }
}

impl DraftArgs {
    /// The drafter and its lengths, or None without drafts.
    pub fn drafter(
        &self,
    ) -> anyhow::Result<Option<(Box<dyn pi2_engine::Drafter>, pi2_engine::DraftConfig)>> {
        let cfg = pi2_engine::DraftConfig::checked(self.draft_max, self.draft_min)?;
        Ok(match (self.draft, &self.draft_model) {
            (DraftSource::Lookup | DraftSource::SelfDraft, Some(_)) => {
                anyhow::bail!("--draft and --draft-model are two draft sources: give one")
            }
            (DraftSource::SelfDraft, None) => Some((Box::new(pi2_engine::SelfDraft), cfg)),
            (DraftSource::None, None) => None,
            (DraftSource::None, Some(_)) => Some((Box::new(NoDraft), cfg)),
            (DraftSource::Lookup, None) => Some((Box::new(pi2_engine::Lookup::default()), cfg)),
        })
    }
}

/// The chat template used instead of the model's (llama-server's options); one at most.
#[derive(Args, Clone, Debug, Default)]
#[group(multiple = false)]
pub struct TemplateArgs {
    /// Chat template instead of the model's: a Jinja template, or a format by name (chatml,
    /// llama3, gemma, phi3)
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// Chat template instead of the model's, from a Jinja file
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<std::path::PathBuf>,
}

impl TemplateArgs {
    pub fn given(&self) -> bool {
        self.chat_template.is_some() || self.chat_template_file.is_some()
    }

    /// Sets the template `model` renders chats with, checked now (a template that does not
    /// compile is this option's error, not the first request's).
    pub fn apply(&self, model: &mut pi2_model::Model) -> anyhow::Result<()> {
        use anyhow::Context;
        let (option, text) = match (&self.chat_template, &self.chat_template_file) {
            (Some(t), _) if t.contains("{{") || t.contains("{%") => ("--chat-template", t.clone()),
            (Some(name), _) => match pi2_model::chat_builtin::named(name) {
                Some(t) => ("--chat-template", t.to_string()),
                None => anyhow::bail!(
                    "--chat-template: `{name}` is neither a Jinja template nor a format pi2 knows ({}); give the template's text or --chat-template-file",
                    pi2_model::chat_builtin::names()
                ),
            },
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--chat-template-file: cannot read {}", path.display()))?;
                ("--chat-template-file", text)
            }
            (None, None) => return Ok(()),
        };
        model.chat_template = Some(text);
        model
            .chat_template()
            .map(drop)
            .with_context(|| format!("{option}: the template does not compile"))
    }
}
