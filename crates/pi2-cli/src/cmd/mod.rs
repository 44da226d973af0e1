//! One module per subcommand, plus what they share: loading a model and building an engine.

pub mod bench;
pub mod chat;
mod chat_set;
pub mod convert;
pub mod embed;
pub mod info;
pub mod perplexity;
pub mod plan;
pub mod profile;
pub mod profile_io;
pub mod run;
pub mod serve;
pub mod sparse_args;
pub mod synth;
pub mod tokenize;

use crate::args::{ModelArgs, SampleArgs};
use crate::fetch;
use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_engine::{Engine, EngineConfig, Sampler, SamplerConfig};
use pi2_model::Model;
use std::path::PathBuf;

#[derive(Args)]
pub struct FetchArgs {
    /// Catalogue names to fetch (default: the default model); see --list
    pub names: Vec<String>,
    /// List the catalogue: name, size, source, licence, SHA-256 and whether it is present
    #[arg(long)]
    pub list: bool,
    /// Folder to put the models in (default: $PI2_MODELS_DIR, else $XDG_CACHE_HOME/pi2/models,
    /// else ~/.cache/pi2/models)
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Replace a file of the same name whose checksum differs
    #[arg(long)]
    pub force: bool,
}

pub fn fetch(a: FetchArgs) -> Result<()> {
    let dir = match a.dir {
        Some(d) => d,
        None => pi2_catalog::models_dir()?,
    };
    if a.list {
        let stamps = pi2_runtime::convert_cache::stamps_path();
        for m in pi2_catalog::MODELS {
            println!("{}", pi2_catalog::describe(m, &dir, &stamps)?);
        }
        return Ok(());
    }
    let names = if a.names.is_empty() {
        vec![pi2_catalog::DEFAULT.to_string()]
    } else {
        a.names
    };
    for name in &names {
        let m = pi2_catalog::find(name).with_context(|| {
            format!(
                "`{name}` is not in the catalogue (known: {})",
                pi2_catalog::names()
            )
        })?;
        println!("{}", fetch::fetch(m, &dir, a.force)?.display());
    }
    Ok(())
}

pub use pi2_runtime::files::check_outputs;

/// A notice when `-m` is a catalogue model (by name or file name) that does not follow chat
/// turns.
pub fn base_model_notice(a: &ModelArgs) -> Option<String> {
    let given = a.model.as_deref()?;
    let file = given.file_name()?.to_str()?;
    let m = pi2_catalog::MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(file) || m.file == file)?;
    (!m.chat).then(|| format!("note: {} is a {}", m.name, pi2_catalog::kind(m)))
}

/// The model path from `-m` (a file, or a catalogue name fetched on first use), or the
/// default model.
pub fn model_path(a: &ModelArgs) -> Result<PathBuf> {
    fetch::resolve(a.model.as_deref())
}

/// The model file a session runs, and its options (see [`pi2_runtime::open::model_file`]),
/// with its notices and the conversion's progress bars on stderr.
pub fn session_model(
    a: &ModelArgs,
    session: &sparse_args::SessionArgs,
    command: &str,
) -> Result<(PathBuf, pi2_runtime::SessionOptions)> {
    let path = model_path(a)?;
    let opts = session_options(a, session, command)?;
    let mut bars = profile::Bars::default();
    Ok(pi2_runtime::open::model_file(&path, &opts, &mut |n| {
        use pi2_runtime::open::Notice;
        match n {
            Notice::Progress { phase, done, total } => bars.show(phase, done, total),
            Notice::Converted {
                seconds,
                own,
                resident,
            } => eprintln!(
                "pi2: converted in {seconds:.0} s ({}){}; later runs reuse it",
                bars.summary(),
                pi2_runtime::open::peak_words(own, resident)
            ),
            other => {
                if let Some(line) = other.line() {
                    eprintln!("{line}");
                }
            }
        }
    })?)
}

pub fn load_model(a: &ModelArgs) -> Result<Model> {
    let path = model_path(a)?;
    Model::load(&path).with_context(|| format!("cannot load model {}", path.display()))
}

impl ModelArgs {
    /// The runtime's engine options (one thread count; `pi2 bench` sweeps its list itself).
    pub fn engine_options(&self) -> Result<pi2_runtime::EngineOptions> {
        let threads = match self.threads[..] {
            [] => None,
            [t] => Some(t),
            _ => bail!("--threads takes one number here (lists are for `pi2 bench`)"),
        };
        Ok(pi2_runtime::EngineOptions {
            threads,
            n_ctx: self.ctx_size,
            tier: self.kernel_tier.clone(),
            cores: self.cores.clone(),
            repack: !self.no_repack,
            ..Default::default()
        })
    }
}

/// The runtime's session options from a command's arguments (`command` names it in errors).
pub fn session_options(
    model: &ModelArgs,
    session: &sparse_args::SessionArgs,
    command: &str,
) -> Result<pi2_runtime::SessionOptions> {
    Ok(pi2_runtime::SessionOptions {
        engine: pi2_runtime::EngineOptions {
            head_share: session.sparse.head_share(),
            // `--sparse` asks for the sparse step even where a layer could run dense.
            dense_resident: !session.sparse.sparse,
            ..model.engine_options()?
        },
        sparse: session.sparse.options(),
        mem_budget: session.offload.one_budget(command)?,
        offload: session.offload.options(),
        plan: session.plan.clone(),
        sparse_batches: false,
    })
}

pub fn engine_config(a: &ModelArgs) -> Result<EngineConfig> {
    Ok(a.engine_options()?.config()?)
}

/// The sampler of `a` for a model of `n_vocab` tokens.
pub fn sampler(a: &SampleArgs, n_vocab: usize) -> anyhow::Result<Sampler> {
    if let Some((t, _)) = a.logit_bias.iter().find(|b| b.0 as usize >= n_vocab) {
        anyhow::bail!("--logit-bias: token {t} is outside the vocabulary of {n_vocab}");
    }
    let cfg = SamplerConfig {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        logit_bias: a.logit_bias.clone(),
        seed: a.seed.unwrap_or_else(pi2_runtime::options::clock_seed),
    };
    if let Some((name, v, want)) = pi2_runtime::options::sampling_problem(&cfg) {
        let flag = match name {
            "temperature" => "--temp",
            "top_p" => "--top-p",
            "min_p" => "--min-p",
            "presence_penalty" => "--presence-penalty",
            "frequency_penalty" => "--frequency-penalty",
            "logit_bias" => "--logit-bias",
            _ => "--repeat-penalty",
        };
        anyhow::bail!("{flag} {v} must be {want}");
    }
    Ok(Sampler::new(cfg))
}

/// A session's model file and options beside its drafts, and the `--draft-model` (loaded and
/// checked against the model's vocabulary), whose memory is taken out of `--mem-budget` (its
/// context sized for `prompt` and `n_predict` tokens, -1: the whole context); engines keep a
/// row of logits per checked token.
/// A draft model and the engine settings its engine starts from.
pub type DraftModel = (Model, EngineConfig);

pub fn drafted_session(
    a: &ModelArgs,
    session: &sparse_args::SessionArgs,
    draft: &crate::args::DraftArgs,
    prompt: &str,
    n_predict: i64,
    command: &str,
) -> Result<(Option<DraftModel>, PathBuf, pi2_runtime::SessionOptions)> {
    let drafts = draft.drafter()?.map(|(_, cfg)| cfg.max);
    let draft_model = match &draft.draft_model {
        Some(spec) => {
            let dm = pi2_runtime::load_model(&fetch::resolve(Some(spec))?)?;
            pi2_runtime::draft::check(&pi2_runtime::load_model(&model_path(a)?)?, &dm)?;
            Some((dm, engine_config(a)?))
        }
        None => None,
    };
    let mut session = session.clone();
    if let (Some((dm, cfg)), Some(budget)) = (&draft_model, session.offload.one_budget(command)?) {
        let file = std::fs::metadata(model_path(a)?)?.len();
        let n = usize::try_from(n_predict).ok();
        let left = pi2_runtime::draft::budget_beside(&budget, file, dm, cfg, prompt, n)?;
        session.offload.mem_budget = vec![left];
    }
    let (path, mut opts) = session_model(a, &session, command)?;
    if draft.draft == crate::args::DraftSource::SelfDraft && opts.mem_budget.is_none() {
        bail!("--draft self drafts from what --mem-budget keeps resident; in memory every neuron is resident and a draft costs a whole step (use --draft lookup)");
    }
    if let Some(max) = drafts {
        // A checked draft returns a row of logits per token: the budget holds them.
        opts.engine.logit_rows = max + 1;
    }
    Ok((draft_model, path, opts))
}

/// The engine for batches of up to `want` tokens (fewer under a budget), refused when a draft
/// of `draft_max` tokens and its token do not fit a batch; with a draft model, its drafter.
pub fn drafted_engine<'p>(
    prepared: &'p pi2_runtime::Prepared<'_>,
    want: usize,
    drafter: &mut Option<(Box<dyn pi2_engine::Drafter + 'p>, pi2_engine::DraftConfig)>,
    draft_model: Option<&'p DraftModel>,
) -> Result<(Engine<'p>, usize)> {
    let draft_max = drafter.as_ref().map_or(0, |(_, d)| d.max);
    let (engine, n_batch) = prepared.engine_for_drafts(want, draft_max)?;
    if let (Some((dm, base)), Some((d, _))) = (draft_model, drafter) {
        let budget = prepared.offloads();
        *d = Box::new(pi2_runtime::draft::engine(dm, base, &engine, budget)?);
    }
    Ok((engine, n_batch))
}
