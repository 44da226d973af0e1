//! pi2-server: an OpenAI-compatible HTTP server over a [`pi2_runtime::Prepared`] session.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: whole answers or server-sent events
//!   ending `data: [DONE]`, with `usage` and llama-server style `timings`;
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), and a chat page at `/`;
//! - llama-server's `POST /tokenize`, `POST /detokenize` and `GET /props`.
//!
//! Requests go through one bounded queue to `parallel` slots, each on its own thread keeping
//! its conversation's KV cache: in memory each slot has its own engine; under a memory budget
//! the slots share one engine and its budget, their decode steps batched (continuous
//! batching). A full queue answers 503 at once, and a client that leaves stops its generation
//! at the next token.

pub mod api;
pub mod conn;
pub mod embeddings;
pub mod error;
pub mod fields;
pub mod guard;
pub mod guided;
pub mod metrics;
pub mod native;
pub mod routes;
pub mod sched;
pub mod slot_file;
pub mod slots;
pub mod state;
pub mod tokens;
pub mod tools;
pub mod wire;

pub use api::Drafts;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How the server listens and schedules.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Slots: requests generated at the same time, one engine each.
    pub parallel: usize,
    /// Requests that may wait for a slot; more get 503.
    pub queue: usize,
    /// With a key, every route but `/health` and `/` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Names clients may ask for in `model`; the first is the listed id.
    pub model_names: Vec<String>,
    /// What `/v1/models` and `/props` say of the model besides its names.
    pub labels: Labels,
    /// Prompt batch size (the engines' buffers are sized for it).
    pub n_batch: usize,
    /// Open connections served at once; one more gets 503 (fewer when file descriptors run
    /// short).
    pub max_connections: usize,
    /// A request's header must arrive within this of the connection opening or of the last
    /// answer on it (so it is also the keep-alive idle timeout).
    pub header_timeout: Duration,
    /// A request's body must arrive within this of its header (408 otherwise).
    pub body_timeout: Duration,
    /// The one origin browsers may call the API from (`*` for any); no CORS headers without.
    pub cors_origin: Option<String>,
    /// How requests draft unless they say (`"draft": "none"`, `"lookup"` or `"model"`).
    pub draft: Drafts,
    /// A draft model with the model's vocabulary (`--draft-model`): each slot drafts with it on
    /// an engine of its own.
    pub draft_model: Option<&'static pi2_model::Model>,
    /// The longest draft a request checks (the engines' logit rows must hold it and one more).
    pub draft_max: usize,
    /// A chat longer than the context drops its oldest messages (else: 400).
    pub context_shift: bool,
    /// How `/v1/embeddings` pools token states.
    pub pooling: pi2_runtime::embed::Pooling,
    /// Where `POST /slots/{id}?action=save|restore` keep slot files (none: those actions
    /// are refused; erase works).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Serve the chat page at `/` (`--no-ui`: no page).
    pub ui: bool,
    /// Serve `/slots` and its actions (`--no-slots`: 501).
    pub slots_route: bool,
    /// Most tokens an answer gets, and the default (llama-server's `--n-predict`).
    pub n_predict: Option<usize>,
    /// How chat answers give their reasoning unless the request says (llama-server's
    /// `--reasoning-format`: `auto`, `deepseek`, `deepseek-legacy`, `none`).
    pub reasoning_format: Option<String>,
    /// Whether thinking templates think unless the request says (llama-server's `--reasoning
    /// on|off`: their `enable_thinking` variable; `None`: the template's default).
    pub thinking: Option<bool>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 1,
            queue: 16,
            api_key: None,
            max_body: 2 << 20,
            model_names: vec!["pi2".into()],
            labels: Labels::default(),
            n_batch: 512,
            max_connections: 4096,
            header_timeout: Duration::from_secs(15),
            body_timeout: Duration::from_secs(30),
            cors_origin: None,
            draft: Drafts::None,
            draft_model: None,
            draft_max: 16,
            context_shift: false,
            pooling: Default::default(),
            slot_save_path: None,
            ui: true,
            slots_route: true,
            n_predict: None,
            reasoning_format: None,
            thinking: None,
        }
    }
}

/// What the server says of its model (llama-server's `model_path`, `aliases`, `tags`).
#[derive(Clone, Debug, Default)]
pub struct Labels {
    /// The file the user gave.
    pub path: String,
    /// `--alias` names.
    pub aliases: Vec<String>,
    /// `--tags`: labels for clients that sort models.
    pub tags: Vec<String>,
}

/// Most slots and queued requests accepted.
pub const MAX_PARALLEL: usize = 64;
pub const MAX_QUEUE: usize = 4096;
pub const MAX_CONNECTIONS: usize = 65536;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// An option's value cannot work; the message says what to pass instead.
    #[error("{option}: {msg}")]
    Option { option: &'static str, msg: String },
    #[error("cannot listen on {addr}: {source} ({hint})")]
    Bind {
        addr: String,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error(transparent)]
    Runtime(#[from] pi2_runtime::RuntimeError),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

impl ServerConfig {
    /// The addresses `--host` lists (comma-separated, as llama-server takes them).
    pub fn hosts(&self) -> Vec<String> {
        (self.host.split(','))
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn check(&self, prepared: &pi2_runtime::Prepared<'_>) -> Result<(), ServerError> {
        let bad = |option, msg: String| Err(ServerError::Option { option, msg });
        if !(1..=MAX_PARALLEL).contains(&self.parallel) {
            return bad(
                "--parallel",
                format!("{} is outside 1..{MAX_PARALLEL}", self.parallel),
            );
        }
        if !(1..=MAX_QUEUE).contains(&self.queue) {
            return bad(
                "--queue",
                format!("{} is outside 1..{MAX_QUEUE}", self.queue),
            );
        }
        if self.max_body < 1024 {
            return bad("--max-body", "must be at least 1K".into());
        }
        if self
            .api_key
            .as_deref()
            .is_some_and(|k| k.trim().is_empty() || k.trim() != k)
        {
            return bad(
                "--api-key",
                "must be non-empty, without surrounding spaces".into(),
            );
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return bad(
                "--max-connections",
                format!("{} is outside 1..{MAX_CONNECTIONS}", self.max_connections),
            );
        }
        for (option, t) in [
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
        ] {
            if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&t) {
                return bad(option, "must be between 0.1 and 3600 seconds".into());
            }
        }
        if let Some(o) = &self.cors_origin {
            if let Some(bad_one) = guard::cors_origin_problem(o) {
                return bad(
                    "--cors-origin",
                    format!("`{bad_one}` is not an origin such as https://app.example, `localhost` or *"),
                );
            }
        }
        if self.hosts().is_empty() {
            return bad("--host", "give at least one address".into());
        }
        if self.model_names.is_empty() {
            return bad("--alias", "the model needs a name".into());
        }
        if let Err(e) = pi2_engine::DraftConfig::checked(self.draft_max, 1) {
            return bad("--draft-max", e.to_string());
        }
        if self.draft == Drafts::SelfDraft && !prepared.offloads() {
            return bad(
                "--draft",
                "self drafts from what --mem-budget keeps resident; in memory every neuron is resident and a draft costs a whole step (use lookup)".into(),
            );
        }
        if self.parallel > 1 && prepared.offloads() && self.draft_model.is_some() {
            return bad(
                "--parallel",
                "slots under --mem-budget share one engine and its budget, which holds no draft model per slot: use --draft lookup or self, or --parallel 1 with --draft-model".into(),
            );
        }
        Ok(())
    }
}

/// The model's names, the first one listed by `/v1/models` and named in answers: `aliases`
/// first (as llama-server lists `--alias`), then the model file's stem and what the user typed
/// for it (a path or a catalogue name).
pub fn model_names(file: &Path, given: Option<&Path>, aliases: &[String]) -> Vec<String> {
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
    let mut names = aliases.to_vec();
    names.push(stem.unwrap_or_else(|| "model".into()));
    names.extend(given.map(|g| g.to_string_lossy().into_owned()));
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// Threads and cores for the slots' engines where the user chose no cores: slots with their
/// own engines share the cores (`threads` defaults to cores / parallel; slots `shared` under a
/// memory budget run one engine on them all); and with a core to spare (one engine, `threads`
/// below the cores), the compute threads are pinned to the fastest cores, so that the HTTP
/// thread and local clients, woken every token, run beside them instead of displacing them.
pub fn place_slots(engine: &mut pi2_runtime::EngineOptions, parallel: usize, shared: bool) {
    if engine.cores.is_some() {
        return;
    }
    let cpus = pi2_engine::topology::Topology::detect().cpus();
    let n = cpus.len().max(1);
    let parallel = if shared { 1 } else { parallel };
    if engine.threads.is_none() && parallel > 1 {
        engine.threads = Some((n / parallel).max(1));
    }
    if let Some(t) = engine.threads.filter(|&t| parallel == 1 && t < cpus.len()) {
        engine.cores = Some(pi2_engine::topology::format_cpu_list(&cpus[..t]));
    }
}

/// Serves `prepared` until Ctrl-C or SIGTERM. Engines are made before listening;
/// `on_listening` gets each bound address (`--host` may list several; port 0 picks a free one).
pub fn serve(
    prepared: &'static pi2_runtime::Prepared<'static>,
    cfg: &ServerConfig,
    mut on_listening: impl FnMut(SocketAddr),
) -> Result<(), ServerError> {
    cfg.check(prepared)?;
    let metrics = Arc::new(metrics::Metrics::new(cfg.parallel));
    let (queue, n_ctx) = slots::start(
        prepared,
        cfg.draft_model,
        cfg.parallel,
        cfg.queue,
        cfg.n_batch,
        metrics.clone(),
    )?;
    let mut state = state::AppState::new(
        prepared.model,
        cfg.model_names.clone(),
        n_ctx,
        queue,
        metrics,
        cfg.api_key.clone(),
    );
    state.max_body = cfg.max_body;
    state.draft = cfg.draft;
    state.draft_model = cfg.draft_model.is_some();
    state.offloads = prepared.offloads();
    state.draft_max = cfg.draft_max;
    state.slots = cfg.parallel;
    state.context_shift = cfg.context_shift;
    state.pooling = cfg.pooling;
    state.body_timeout = cfg.body_timeout;
    state.slot_save_path = cfg.slot_save_path.clone();
    state.n_predict = cfg.n_predict;
    state.labels = cfg.labels.clone();
    if let (Some(on), Ok(t)) = (cfg.thinking, &state.template) {
        let vars = serde_json::Map::from_iter([("enable_thinking".to_string(), on.into())]);
        state.template = t.with_variables(&vars).map_err(|e| e.to_string());
    }
    if let Some(f) = &cfg.reasoning_format {
        routes::reasoning_format(Some(f)).map_err(|e| ServerError::Option {
            option: "--reasoning-format",
            msg: e.message,
        })?;
        state.reasoning_format = Some(f.clone());
    }
    let hosts = cfg.hosts();
    let rules = Arc::new(guard::Rules::new(&hosts, cfg.max_body));
    let offered = routes::Offered {
        page: cfg.ui,
        slots: cfg.slots_route,
    };
    let mut app = routes::router(Arc::new(state), offered)
        .layer(axum::middleware::from_fn_with_state(rules, guard::check));
    if let Some(cors) = guard::cors(cfg.cors_origin.as_deref()) {
        app = app.layer(cors);
    }
    let limits = conn::Limits {
        max_connections: conn::connections_that_fit(cfg.max_connections),
        header_timeout: cfg.header_timeout,
    };
    // Requests are checked (template, tokens, grammar) on blocking threads, so the one async
    // thread keeps answering; a few such threads bound what many heavy requests can take.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()?;
    rt.block_on(async {
        let mut serving = Vec::new();
        for host in &hosts {
            let addr = format!("{host}:{}", cfg.port);
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|source| {
                    let hint = match source.kind() {
                        std::io::ErrorKind::AddrInUse => {
                            "is another server using the port? choose another --port"
                        }
                        std::io::ErrorKind::PermissionDenied => {
                            "ports below 1024 need privileges; choose another --port"
                        }
                        _ => {
                            "check --host: addresses of this machine, such as 127.0.0.1 or 0.0.0.0"
                        }
                    };
                    ServerError::Bind { addr, source, hint }
                })?;
            on_listening(listener.local_addr()?);
            serving.push(conn::serve(listener, app.clone(), limits, shutdown()));
        }
        futures_util::future::try_join_all(serving).await?;
        Ok(())
    })
}

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod names_tests {
    use super::model_names;
    use std::path::Path;

    #[test]
    fn an_alias_is_the_listed_name() {
        let file = Path::new("/m/Qwen2.5-0.5B.Q4_K_M.gguf");
        assert_eq!(
            model_names(file, Some(Path::new("qwen")), &["gpt-4o".into()]),
            ["gpt-4o", "Qwen2.5-0.5B.Q4_K_M", "qwen"]
        );
        assert_eq!(model_names(file, None, &[])[0], "Qwen2.5-0.5B.Q4_K_M");
    }
}
