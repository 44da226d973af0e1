//! One module per subcommand, plus what they share: loading a model and building an engine.

pub mod bench;
pub mod chat;
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
            let path = dir.join(m.file);
            let here = if !path.exists() {
                "not fetched".to_string()
            } else {
                match pi2_catalog::verify(m, &path, &stamps)? {
                    pi2_catalog::Check::Verified => "present, sha256 verified".into(),
                    pi2_catalog::Check::Changed(_) => format!(
                        "present but CORRUPT or replaced (sha256 differs): `pi2 fetch-model {} --force`",
                        m.name
                    ),
                }
            };
            let default = if m.name == pi2_catalog::DEFAULT {
                " (default)"
            } else {
                ""
            };
            println!("{}{default}", m.name);
            println!(
                "  file     {} ({:.1} MiB, {here})",
                path.display(),
                m.size as f64 / (1 << 20) as f64
            );
            println!("  source   {}", m.source);
            println!("  licence  {}", m.licence);
            println!("  sha256   {}", m.sha256);
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

/// The model path from `-m` (a file, or a catalogue name fetched on first use), or the
/// default model.
/// Refuses outputs that would replace a file this command reads (whatever `force` says: paths
/// compared after resolving links), or an existing file without `force`. Every command that
/// writes files checks its outputs here before any work.
pub fn check_outputs(
    outputs: &[&std::path::Path],
    inputs: &[&std::path::Path],
    force: bool,
) -> Result<()> {
    let resolved: Vec<PathBuf> = inputs
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    for out in outputs {
        if let Ok(o) = out.canonicalize() {
            if let Some(i) = inputs.iter().zip(&resolved).find(|(_, r)| **r == o) {
                bail!(
                    "{} is {} this command reads; choose another output file",
                    out.display(),
                    if i.0 == out {
                        "a file".to_string()
                    } else {
                        format!("{} (a file)", i.0.display())
                    }
                );
            }
        }
        if out.exists() && !force {
            bail!("{} exists; pass --force to replace it", out.display());
        }
        // Checked before any work, and never created: a mistyped folder is the user's to fix.
        let dir = out.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir.filter(|d| !d.is_dir()) {
            bail!(
                "cannot write {}: the folder {} does not exist (create it, or choose another output)",
                out.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

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
    let budget = opts.mem_budget.clone().unwrap_or_default();
    Ok(pi2_runtime::open::model_file(&path, &opts, &mut |n| {
        use pi2_runtime::open::Notice;
        match n {
            Notice::FitsInMemory { whole, budget: b } => eprintln!(
                "pi2: the whole model ({} with this process and its KV cache) fits in --mem-budget {budget} ({}): it runs in memory, no budget applies",
                crate::rss::human(whole),
                crate::rss::human(b)
            ),
            Notice::Converting { from, to } => eprintln!(
                "pi2: converting {} for --mem-budget (once: profile and convert on the built-in calibration text, a few minutes) into {}",
                from.display(),
                to.display()
            ),
            Notice::Progress { phase, done, total } => bars.show(phase, done, total),
            Notice::Converted { seconds } => eprintln!(
                "pi2: converted in {seconds:.0} s ({}); later runs reuse it",
                bars.summary()
            ),
            Notice::Catalog(_) => {}
        }
    })?)
}

pub fn load_model(a: &ModelArgs) -> Result<Model> {
    let path = model_path(a)?;
    Model::load(&path).with_context(|| format!("cannot load model {}", path.display()))
}

impl ModelArgs {
    /// The engine options with the first of several thread counts (`pi2 bench` sweeps them).
    pub fn engine_options_first(&self) -> Result<pi2_runtime::EngineOptions> {
        ModelArgs {
            threads: self
                .threads
                .first()
                .map(|&t| t.max(1))
                .into_iter()
                .collect(),
            ..self.clone()
        }
        .engine_options()
    }

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

pub fn engine<'m>(model: &'m Model, a: &ModelArgs) -> Result<Engine<'m>> {
    Ok(Engine::new(model, &engine_config(a)?)?)
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

/// The model `--draft-model` names, loaded and checked against the model's vocabulary.
pub fn draft_model(d: &crate::args::DraftArgs, target: &ModelArgs) -> Result<Option<Model>> {
    let Some(spec) = &d.draft_model else {
        return Ok(None);
    };
    let draft = pi2_runtime::load_model(&fetch::resolve(Some(spec))?)?;
    let target = pi2_runtime::load_model(&model_path(target)?)?;
    pi2_runtime::draft::check(&target, &draft)?;
    Ok(Some(draft))
}

/// The session's options with the draft model's memory taken out of `--mem-budget` (its
/// context sized as `run` sizes the session's: the prompt, `n_predict` tokens and room for a
/// chat template's markup).
pub fn session_beside_draft(
    a: &ModelArgs,
    session: &sparse_args::SessionArgs,
    draft: &Model,
    prompt: &str,
    n_predict: i64,
    command: &str,
) -> Result<sparse_args::SessionArgs> {
    let Some(budget) = session.offload.one_budget(command)? else {
        return Ok(session.clone());
    };
    let mut cfg = engine_config(a)?;
    let train = draft.config.n_ctx_train;
    let asked = if cfg.n_ctx == 0 { train } else { cfg.n_ctx };
    cfg.n_ctx = match usize::try_from(n_predict) {
        Ok(n) => asked.min(draft.tokenizer.encode(prompt, true, true).len() + n + 64),
        Err(_) => asked,
    };
    let reserved = pi2_runtime::draft::footprint(draft, &cfg, 512);
    let file = std::fs::metadata(model_path(a)?)?.len();
    let mut out = session.clone();
    out.offload.mem_budget = vec![pi2_runtime::draft::budget_less(&budget, file, reserved)?];
    Ok(out)
}
