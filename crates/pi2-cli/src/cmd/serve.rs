//! `pi2 serve`: the OpenAI-compatible server (pi2-server) over a session built by the runtime.

use crate::args::{DraftArgs, DraftSource, ModelArgs};
use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The default for requests (each may say `"draft": "lookup"`, `"self"` or `"none"`)
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub template: crate::args::TemplateArgs,
    /// Addresses to listen on, comma-separated (127.0.0.1: this machine only; 0.0.0.0: every
    /// interface)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests generated at the same time (slots, one engine and KV cache each); threads
    /// default to the cores shared among them
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// Requests that may wait for a free slot; more are answered 503 at once
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health and the chat page
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Largest request body accepted (e.g. 2M)
    #[arg(long = "max-body", default_value = "2M")]
    pub max_body: String,
    /// Prompt tokens evaluated per batch (the engines' batch buffers are sized for it)
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Other names clients may use for the model (comma-separated or repeated; the first is listed as its id; the default is the file's name)
    #[arg(long)]
    pub alias: Vec<String>,
    /// Labels `/v1/models` lists for the model (comma-separated), as llama-server's
    #[arg(long)]
    pub tags: Vec<String>,
    /// Open connections served at once; one more is answered 503 (fewer if the process's
    /// file-descriptor limit is lower)
    #[arg(long = "max-connections", default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds a request's header may take to arrive, from the connection opening or the
    /// last answer (also the keep-alive idle timeout)
    #[arg(long = "header-timeout", default_value_t = 15.0)]
    pub header_timeout: f64,
    /// Seconds a request's body may take to arrive (408 after)
    #[arg(long = "body-timeout", default_value_t = 30.0)]
    pub body_timeout: f64,
    /// The origins web pages may call the API from (comma-separated, e.g. https://app.example;
    /// `localhost` for pages of this machine; * for any), as llama-server's --cors-origins;
    /// without it no CORS headers are sent and browsers keep other sites out
    #[arg(long = "cors-origin", visible_alias = "cors-origins")]
    pub cors_origin: Option<String>,
    /// A chat longer than the context drops its oldest messages (the system prompt and the
    /// last message stay), as llama-server does; without it such a request gets a 400
    #[arg(long)]
    pub context_shift: bool,
    /// How /v1/embeddings pools token states: mean, cls (first token) or last
    #[arg(long, default_value = "mean")]
    pub pooling: pi2_runtime::embed::Pooling,
    /// No chat page at / (the API only)
    #[arg(long)]
    pub no_ui: bool,
    /// No /slots route (501), as llama-server's --no-slots
    #[arg(long = "no-slots", conflicts_with = "slots")]
    pub no_slots: bool,
    /// Folder where `POST /slots/{id}?action=save|restore` keep slot KV caches (created if
    /// missing); without it those actions are refused
    #[arg(long, value_name = "DIR")]
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Most tokens an answer gets, and the default when a request gives none (-1: until the
    /// context is full), as llama-server's
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// How chat answers give a thinking model's reasoning unless the request says: auto
    /// (apart, in `reasoning_content`), deepseek, deepseek-legacy (apart and in the content),
    /// none (in the content)
    #[arg(long = "reasoning-format")]
    pub reasoning_format: Option<String>,
    /// Whether thinking models think unless a request says (the template's `enable_thinking`,
    /// as llama-server's): on, off, or auto (the template's own default)
    #[arg(long = "reasoning", value_name = "on|off|auto", value_parser = ["on", "off", "auto"], default_value = "auto")]
    pub reasoning: String,
    #[command(flatten)]
    pub llama_server: LlamaServerSwitches,
    #[command(flatten)]
    pub session: super::sparse_args::SessionArgs,
}

/// llama-server switches for what pi2 always does: accepted so its command lines run unchanged.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "llama-server switches accepted as they are (pi2 always does this)")]
pub struct LlamaServerSwitches {
    /// Chat templates are always Jinja
    #[arg(long)]
    jinja: bool,
    /// Slots' decode steps are always batched together
    #[arg(long = "cont-batching")]
    cont_batching: bool,
    /// /v1/embeddings is always served
    #[arg(long = "embeddings", visible_alias = "embedding")]
    embeddings: bool,
    /// /metrics is always served
    #[arg(long)]
    metrics: bool,
    /// /slots is served unless --no-slots
    #[arg(long)]
    slots: bool,
    /// Each slot has its own KV cache of the full context
    #[arg(long = "kv-unified")]
    kv_unified: bool,
    /// Sliding-window layers keep what their window needs
    #[arg(long = "swa-full")]
    swa_full: bool,
    /// One batch size (-b) serves prompts
    #[arg(long = "ubatch-size", value_name = "N")]
    ubatch_size: Option<usize>,
    /// Attention is one kernel whatever this says (on, off, auto)
    #[arg(long = "flash-attn", value_name = "on|off|auto", value_parser = ["on", "off", "auto", "1", "0", "true", "false"])]
    flash_attn: Option<String>,
}

pub fn run(a: ServeArgs) -> Result<()> {
    // The draft model lives as long as the server; its memory comes out of the budget first.
    let (draft_model, path, mut opts) =
        super::drafted_session(&a.model, &a.session, &a.draft, "", -1, "serve")?;
    let draft_model: Option<&'static _> = draft_model.map(|(m, _)| &*Box::leak(Box::new(m)));
    // Any request may check a draft: every engine's logit rows (and a budget) hold one.
    opts.engine.logit_rows = a.draft.draft_max + 1;
    // Under a budget the slots share one engine.
    let shared = opts.mem_budget.is_some();
    pi2_server::place_slots(&mut opts.engine, a.parallel, shared);
    let max_body = pi2_runtime::options::parse_size("--max-body", &a.max_body, 0)?;
    if a.n_predict == 0 || a.n_predict < -1 {
        anyhow::bail!(
            "--n-predict: {} is not a number of tokens (1 or more, or -1 for until the context is full)",
            a.n_predict
        );
    }
    // The server runs until the process ends: the model and session live as long.
    let mut model = pi2_runtime::load_model(&path)?;
    a.template.apply(&mut model)?;
    let model: &'static _ = Box::leak(Box::new(model));
    let prepared: &'static _ = Box::leak(Box::new(pi2_runtime::prepare(model, &path, &opts)?));
    // Named after the file the user gave, not its cached conversion.
    let file = super::model_path(&a.model)?;
    // llama-server takes several names in one `--alias a,b`.
    let aliases: Vec<String> = (a.alias.iter())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let names = pi2_server::model_names(&file, a.model.model.as_deref(), &aliases);
    let labels = pi2_server::Labels {
        path: file.display().to_string(),
        aliases,
        tags: (a.tags.iter().flat_map(|s| s.split(',')))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    };
    let cfg = pi2_server::ServerConfig {
        host: a.host.clone(),
        port: a.port,
        parallel: a.parallel,
        queue: a.queue,
        api_key: a.api_key.clone(),
        max_body: usize::try_from(max_body).unwrap_or(usize::MAX),
        model_names: names,
        labels,
        n_batch: a.batch_size,
        max_connections: a.max_connections,
        header_timeout: seconds("--header-timeout", a.header_timeout)?,
        body_timeout: seconds("--body-timeout", a.body_timeout)?,
        cors_origin: a.cors_origin.clone(),
        ui: !a.no_ui,
        slots_route: !a.no_slots,
        draft: match (a.draft.draft, draft_model) {
            (DraftSource::Lookup, _) => pi2_server::Drafts::Lookup,
            (DraftSource::SelfDraft, _) => pi2_server::Drafts::SelfDraft,
            (DraftSource::None, Some(_)) => pi2_server::Drafts::Model,
            (DraftSource::None, None) => pi2_server::Drafts::None,
        },
        draft_model,
        draft_max: a.draft.draft_max,
        context_shift: a.context_shift,
        pooling: a.pooling,
        n_predict: usize::try_from(a.n_predict).ok(),
        reasoning_format: a.reasoning_format.clone(),
        thinking: match a.reasoning.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        slot_save_path: match &a.slot_save_path {
            Some(dir) => {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("--slot-save-path: cannot create {}", dir.display())
                })?;
                Some(dir.clone())
            }
            None => None,
        },
    };
    let id = cfg.model_names[0].clone();
    pi2_server::serve(prepared, &cfg, |addr| {
        eprintln!(
            "pi2 serve: {id} on http://{addr} ({} slot(s)); Ctrl-C stops",
            cfg.parallel
        );
    })?;
    eprintln!("pi2 serve: stopped");
    Ok(())
}

/// A timeout option in seconds (the server checks its range).
fn seconds(option: &str, s: f64) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{option}: {s} is not a number of seconds"))
}
