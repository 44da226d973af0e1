//! The HTTP side: routes, the API key check, request bodies into jobs, and answers whole or
//! as server-sent events.

use crate::api::{ApiError, ChatEnding, CompletionRequest, Envelope, Kind};
use crate::guided::logprobs_value;
use crate::slots::{Event, Job};
use crate::state::{read_body, unix_now, AppState};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use pi2_model::answer::calls::parse_calls;
use pi2_model::answer::{calls_json, CallStream, Channels, Dialect, ReasoningFormat};
use pi2_model::tokenizer::Tokenizer;
use serde_json::json;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The routes that may be left out (llama-server's `--no-ui`, `--no-slots`).
#[derive(Clone, Copy, Debug)]
pub struct Offered {
    /// The chat page at `/`.
    pub page: bool,
    /// `/slots` and its actions (else 501, as llama-server answers).
    pub slots: bool,
}

/// The routes, with the API key check.
pub fn router(state: Arc<AppState>, offered: Offered) -> Router {
    let page = Router::new().route("/", get(|| async { Html(include_str!("page.html")) }));
    let slots = match offered.slots {
        true => Router::new()
            .route("/slots", get(crate::tokens::slots))
            .route("/slots/{id}", post(crate::slot_file::slot_action)),
        false => {
            let off = || async {
                ApiError::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "this server does not serve /slots: start it without --no-slots",
                )
            };
            Router::new()
                .route("/slots", get(off))
                .route("/slots/{id}", post(off))
        }
    };
    Router::new()
        .merge(if offered.page { page } else { Router::new() })
        .merge(slots)
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/apply-template", post(apply_template))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/chat/completions/input_tokens", post(input_tokens))
        .route("/chat/completions/input_tokens", post(input_tokens))
        .route("/v1/completions", post(completion))
        // llama-server's native route, under both its names.
        .route("/completion", post(native))
        .route("/completions", post(native))
        .route("/infill", post(infill))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/embeddings", post(crate::embeddings::embeddings))
        .route("/tokenize", post(crate::tokens::tokenize))
        .route("/detokenize", post(crate::tokens::detokenize))
        .route("/props", get(crate::tokens::props))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), check_key))
        .with_state(state)
}

/// With an API key, every route but `/health` and the static chat page needs
/// `Authorization: Bearer KEY` (or `X-Api-Key: KEY`).
async fn check_key(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = &s.api_key else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/health" || path == "/" {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110), the key is not.
        .and_then(|(scheme, key)| scheme.eq_ignore_ascii_case("bearer").then_some(key))
        // llama-server also takes the key in `X-Api-Key` (some clients send it there).
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()));
    match given {
        Some(g) if same_secret(g.trim().as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "wrong API key").into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs an API key: send `Authorization: Bearer KEY`",
        )
        .into_response(),
    }
}

/// Compares without stopping at the first difference (no timing hint at the key).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            // llama-server's: when the counts started (the server's start).
            (
                header::HeaderName::from_static("process-start-time-unix"),
                s.created.to_string(),
            ),
        ],
        s.metrics.render(s.queue.waiting()),
    )
}

async fn models(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.names[0],
            "object": "model",
            "created": s.created,
            "owned_by": "pi2",
            "aliases": s.labels.aliases,
            "tags": s.labels.tags,
            "meta": {
                "n_ctx": s.n_ctx,
                "n_params": s.model.n_params(),
                "size": s.model.file.file_size(),
                "n_vocab": s.model.tokenizer.vocab_size(),
            },
        }],
    }))
}

/// llama-server's `/apply-template`: the chat request's messages in the model's template, as
/// the text a completion would be given (`{"prompt"}`), nothing generated.
async fn apply_template(State(s): State<Arc<AppState>>, body: Body) -> Response {
    on_request(s, body, "rendering", |state, req| {
        let template = state
            .template
            .as_ref()
            .map_err(|e| ApiError::bad(format!("this model has no usable chat template ({e})")))?;
        let template = req.template(template)?;
        let msgs = req.chat_messages()?;
        let prompt = match req.chat_ending(&msgs)? {
            ChatEnding::Close {
                add_generation_prompt,
            } => template.render(&msgs, add_generation_prompt),
            ChatEnding::Continue => template.render_continuing(&msgs, None),
        }
        .map_err(|e| {
            ApiError::bad(format!("the chat template refused the messages: {e}")).param("messages")
        })?;
        Ok(json!({ "prompt": prompt }))
    })
    .await
}

/// The number of tokens a chat request's prompt takes (llama-server's
/// `/v1/chat/completions/input_tokens`): its messages and tools through the template, as
/// `/v1/chat/completions` would read them, without running the model.
async fn input_tokens(State(s): State<Arc<AppState>>, body: Body) -> Response {
    on_request(s, body, "counting", |state, req| {
        let plan = req.tool_plan()?;
        let n = chat_prompt(state, &req, plan.as_ref())?.len();
        Ok(json!({ "object": "response.input_tokens", "input_tokens": n }))
    })
    .await
}

/// A request answered without the model: read, parsed and answered by `answer` on a blocking
/// thread (templates and tokenizing can take long), its JSON or its error as the response.
async fn on_request(
    s: Arc<AppState>,
    body: Body,
    doing: &'static str,
    answer: impl FnOnce(&AppState, CompletionRequest) -> Result<serde_json::Value, ApiError>
        + Send
        + 'static,
) -> Response {
    let done = async {
        let body = read_body(&s, body).await?;
        let state = s.clone();
        tokio::task::spawn_blocking(move || answer(&state, CompletionRequest::parse(&body)?))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{doing} failed: {e}"),
                )
            })?
    };
    match done.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn chat(State(s): State<Arc<AppState>>, body: Body) -> Response {
    answer(&s, body, Kind::Chat).await
}

async fn completion(State(s): State<Arc<AppState>>, body: Body) -> Response {
    answer(&s, body, Kind::Completion).await
}

async fn native(State(s): State<Arc<AppState>>, body: Body) -> Response {
    answer(&s, body, Kind::Native).await
}

async fn infill(State(s): State<Arc<AppState>>, body: Body) -> Response {
    answer(&s, body, Kind::Infill).await
}

async fn answer(s: &Arc<AppState>, body: Body, kind: Kind) -> Response {
    s.metrics.request();
    match start(s, body, kind).await {
        Ok(r) => r,
        Err(e) => {
            // 5xx errors here are counted where the engine failed (slots).
            if e.status.is_client_error() || e.status == StatusCode::SERVICE_UNAVAILABLE {
                s.metrics.refused(e.status);
            }
            e.into_response()
        }
    }
}

/// A request checked and made ready to queue: the work that can take long (parsing, the chat
/// template, tokenizing, compiling a grammar), done off the server's one async thread.
struct Checked {
    req: CompletionRequest,
    plan: Option<crate::tools::ToolPlan>,
    /// Each prompt (several: a completion's list), with its text for `echo`.
    prompts: Vec<(Vec<pi2_model::TokenId>, Option<String>)>,
    /// A chat answer's reasoning, split from its content.
    think: Option<Channels>,
    /// How the answer is written (its reasoning and calls).
    dialect: Dialect,
    logprobs: Option<usize>,
    grammar: Option<Arc<pi2_grammar::Grammar>>,
}

/// Checks a request, queues its job and answers (whole, or as a stream).
async fn start(s: &Arc<AppState>, body: Body, kind: Kind) -> Result<Response, ApiError> {
    let body = read_body(s, body).await?;
    let state = s.clone();
    let Checked {
        req,
        plan,
        prompts,
        think,
        dialect,
        logprobs,
        grammar,
    } = tokio::task::spawn_blocking(move || check(&state, &body, kind))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("checking the request failed: {e}"),
            )
        })??;
    let echo = match req.echo == Some(true) {
        true if kind != Kind::Completion => {
            return Err(ApiError::bad("`echo` is for /v1/completions").param("echo"))
        }
        true => {
            req.prompt_text()
                .map(|_| ())
                .or_else(|e| match prompts.len() > 1 {
                    true => Ok(()),
                    false => Err(e),
                })?;
            true
        }
        false => false,
    };
    let n = req.choices(kind)?;
    let sampler = req.sampler(s.model.tokenizer.vocab_size(), s.n_ctx)?;
    // The server's `--n-predict` is each answer's default and its cap, as llama-server's.
    let max_tokens = match (req.max_tokens(s.n_ctx)?, s.n_predict) {
        (Some(m), Some(cap)) => Some(m.min(cap)),
        (m, cap) => m.or(cap),
    };
    let (native_prompt, settings) = match kind {
        Kind::Native | Kind::Infill => (
            String::from_utf8_lossy(&s.model.tokenizer.decode(&prompts[0].0, true)).into_owned(),
            crate::native::settings(&sampler, max_tokens, s.n_ctx, &req),
        ),
        _ => (String::new(), serde_json::Value::Null),
    };
    // Each prompt's choice i samples with seed + i (each its own job: batched slots run them
    // together); answers are in that order.
    let mut answers = Vec::with_capacity(n * prompts.len());
    for ((prompt, text), i) in prompts.iter().flat_map(|p| (0..n).map(move |i| (p, i))) {
        let (tx, rx) = mpsc::channel(64);
        if let Some(text) = text.as_ref().filter(|_| echo) {
            // The prompt's text, as the answer's first text (the channel is new: there is room).
            let _ = tx.try_send(Event::Text(text.clone(), Vec::new()));
        }
        let mut sampler = sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(i as u64);
        s.queue.submit(Job {
            prompt: prompt.clone(),
            sampler,
            max_tokens,
            stops: req.stops()?,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            stream: req.streams(),
            drafts: req.drafts(s.draft, s.draft_model, s.offloads)?,
            draft_max: s.draft_max,
            grammar: grammar.clone(),
            logprobs,
            shown_tokens: match kind {
                Kind::Chat => dialect.shown_ids(&s.model.tokenizer),
                _ => Vec::new(),
            },
            embed: None,
            slot_action: None,
            events: tx,
        })?;
        answers.push(rx);
    }
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion | Kind::Native | Kind::Infill => "cmpl",
    };
    let env = Envelope {
        id: format!("{prefix}-{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
        created: unix_now(),
        model: s.names[0].clone(),
        kind,
        usage_chunk: req.streams()
            && req
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage == Some(true)),
        prompt: native_prompt,
        settings,
    };
    let out = Output {
        env,
        think,
        dialect,
        scores: logprobs.map(|_| &s.model.tokenizer),
        max_calls: plan.as_ref().map_or(0, |p| p.max_calls),
        tools: plan.map(|p| p.names),
    };
    if req.streams() {
        let rx = answers.pop().expect("a stream has one choice");
        Ok(Sse::new(events(out, rx))
            .keep_alive(KeepAlive::default())
            .into_response())
    } else {
        whole(out, answers, n).await
    }
}

/// The slow, synchronous part of [`start`]: see [`Checked`].
fn check(s: &AppState, body: &[u8], kind: Kind) -> Result<Checked, ApiError> {
    let req = CompletionRequest::parse(body)?;
    let tok = &s.model.tokenizer;
    let plan = match kind {
        Kind::Chat => req.tool_plan()?,
        _ if req.tools.as_ref().is_some_and(|t| !t.is_empty()) => {
            return Err(ApiError::bad("`tools` are for /v1/chat/completions").param("tools"))
        }
        _ => None,
    };
    let fim_fields = [
        ("input_prefix", req.input_prefix.is_some()),
        ("input_suffix", req.input_suffix.is_some()),
        ("input_extra", req.input_extra.is_some()),
    ];
    if let Some((name, _)) = fim_fields.iter().find(|f| f.1 && kind != Kind::Infill) {
        return Err(ApiError::bad(format!("`{name}` is for /infill")).param(*name));
    }
    let prompts = match kind {
        Kind::Chat => vec![(chat_prompt(s, &req, plan.as_ref())?, None)],
        // A completion prompt is the model's whole input, control tokens and all (as
        // llama-server takes it): text, token ids (as OpenAI's API allows), or both; OpenAI's
        // list of texts, one answer each.
        Kind::Completion => (req.prompts(tok)?.into_iter())
            .map(|(p, t)| (p, t.map(str::to_string)))
            .collect(),
        Kind::Native => vec![(req.prompt_tokens(tok)?, None)],
        Kind::Infill => vec![(crate::native::infill_prompt(tok, &req, s.n_ctx)?, None)],
    };
    for (prompt, _) in &prompts {
        check_prompt_length(s, prompt)?;
    }
    let logprobs = req.top_logprobs(kind)?;
    let asked = req.grammar_spec()?;
    if asked.is_some() && plan.as_ref().is_some_and(|p| p.grammar.is_some()) {
        return Err(ApiError::bad(
            "`tool_choice` asks for a call, which has its own format: drop `response_format`/`grammar`/`json_schema`",
        )
        .param("tool_choice"));
    }
    let grammar = match asked {
        None => match plan.as_ref().and_then(|p| p.grammar.as_ref()) {
            Some(spec) => Some(s.grammar(spec, "tools")?),
            None => None,
        },
        Some(spec) => {
            let field = match (&req.grammar, &req.json_schema) {
                (Some(_), _) => "grammar",
                (_, Some(_)) => "json_schema",
                _ => "response_format",
            };
            Some(s.grammar(&spec, field)?)
        }
    };
    let dialect = match (kind, &s.template) {
        (Kind::Chat, Ok(t)) => t.dialect(),
        _ => Dialect::ThinkTags,
    };
    let think = match kind {
        Kind::Chat => {
            let asked = req.reasoning_format.as_deref();
            let format = reasoning_format(asked.or(s.reasoning_format.as_deref()))?;
            // Whether the template left the answer inside an open reasoning block.
            let p = &prompts[0].0;
            let tail = tok.decode(&p[p.len().saturating_sub(8)..], true);
            let opened = dialect.opens_reasoning(&String::from_utf8_lossy(&tail));
            Some(Channels::new(dialect, format, opened))
        }
        _ if req.reasoning_format.is_some() => {
            return Err(ApiError::bad("`reasoning_format` is for chat").param("reasoning_format"))
        }
        _ => None,
    };
    Ok(Checked {
        req,
        plan,
        prompts,
        think,
        dialect,
        logprobs,
        grammar,
    })
}

/// llama-server's `reasoning_format`.
pub(crate) fn reasoning_format(v: Option<&str>) -> Result<ReasoningFormat, ApiError> {
    match v {
        None | Some("auto") | Some("deepseek") => Ok(ReasoningFormat::Apart),
        Some("none") => Ok(ReasoningFormat::None),
        Some("deepseek-legacy") => Ok(ReasoningFormat::ApartAndInContent),
        Some(other) => Err(ApiError::bad(format!(
            "`reasoning_format` is `auto`, `deepseek`, `deepseek-legacy` or `none`, not `{other}`"
        ))
        .param("reasoning_format")),
    }
}

/// A prompt the model can take: not empty, shorter than the context.
fn check_prompt_length(s: &AppState, prompt: &[pi2_model::TokenId]) -> Result<(), ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty"));
    }
    if prompt.len() >= s.n_ctx {
        return Err(ApiError::over_context(
            format!(
                "the prompt is {} tokens; the context holds {} (start `pi2 serve` with a larger -c or with --context-shift, or shorten the prompt)",
                prompt.len(),
                s.n_ctx
            ),
            prompt.len(),
            s.n_ctx,
        ));
    }
    Ok(())
}

/// A chat request's prompt: its messages (with the tools, through the template's `tools` or a
/// system message) in the model's template; with `--context-shift` the oldest messages after
/// the system prompt go until it fits.
fn chat_prompt(
    s: &AppState,
    req: &CompletionRequest,
    plan: Option<&crate::tools::ToolPlan>,
) -> Result<Vec<pi2_model::TokenId>, ApiError> {
    let tok = &s.model.tokenizer;
    let template = s.template.as_ref().map_err(|e| {
        ApiError::bad(format!(
            "this model has no usable chat template ({e}); use /v1/completions"
        ))
    })?;
    let template = &req.template(template)?;
    // Message text stays text: only the template's markup becomes control tokens.
    let mut msgs = req.chat_messages()?;
    let tools = plan.map(|p| &p.tools);
    if let Some(t) = tools.filter(|_| !template.reads_tools()) {
        // A template that cannot show tools: they go in the system message.
        let prompt = pi2_model::answer::calls::tools_prompt(t);
        match msgs.first_mut().filter(|m| m.role == "system") {
            Some(m) => m.content = format!("{}\n\n{prompt}", m.content),
            None => msgs.insert(0, pi2_model::Message::new("system", &prompt)),
        }
    }
    let tools = tools.filter(|_| template.reads_tools());
    let ending = req.chat_ending(&msgs)?;
    let encode = |m: &[pi2_model::Message]| {
        match ending {
            ChatEnding::Close {
                add_generation_prompt,
            } => template.encode_with_tools(tok, m, tools, add_generation_prompt),
            ChatEnding::Continue => template.encode_continuing(tok, m, tools),
        }
        .map_err(|e| {
            ApiError::bad(format!("the chat template refused the messages: {e}")).param("messages")
        })
    };
    let mut prompt = encode(&msgs)?;
    // Context shift: the oldest messages after the system prompt go, the last stays.
    let first = usize::from(msgs.first().is_some_and(|m| m.role == "system"));
    while s.context_shift && prompt.len() >= s.n_ctx && msgs.len() > first + 1 {
        msgs.remove(first);
        prompt = encode(&msgs)?;
    }
    Ok(prompt)
}

/// How an answer is written: its envelope, the tokenizer that renders its tokens' scores
/// (when asked for), and the functions offered (their calls are parsed from the text).
struct Output {
    env: Envelope,
    think: Option<Channels>,
    dialect: Dialect,
    scores: Option<&'static Tokenizer>,
    tools: Option<Vec<String>>,
    /// Calls one answer may make (`parallel_tool_calls: false`: one).
    max_calls: usize,
}

/// Collects the answers (choice i from `answers[i]`; each prompt's `per_prompt` in a row)
/// into one response: the first's, with the others' choices after it and every prompt's and
/// choice's tokens counted in its usage. If the client leaves, this future is dropped with the
/// receivers, and the slots stop at their next token.
async fn whole(
    out: Output,
    answers: Vec<mpsc::Receiver<Event>>,
    per_prompt: usize,
) -> Result<Response, ApiError> {
    let mut merged: Option<serde_json::Value> = None;
    for (i, rx) in answers.into_iter().enumerate() {
        let mut v = one_answer(&out, rx).await?;
        let Some(m) = merged.as_mut() else {
            merged = Some(v);
            continue;
        };
        let mut choice = v["choices"][0].take();
        choice["index"] = i.into();
        m["choices"].as_array_mut().expect("choices").push(choice);
        let count = |v: &serde_json::Value, key: &str| v["usage"][key].as_u64().unwrap_or(0);
        let mut keys = vec!["completion_tokens"];
        if i % per_prompt.max(1) == 0 {
            keys.push("prompt_tokens");
        }
        for key in keys {
            m["usage"][key] = (count(m, key) + count(&v, key)).into();
        }
        m["usage"]["total_tokens"] =
            (count(m, "prompt_tokens") + count(m, "completion_tokens")).into();
    }
    Ok(Json(merged.expect("at least one choice")).into_response())
}

/// One choice's answer, as the whole response it would be alone.
async fn one_answer(
    out: &Output,
    mut rx: mpsc::Receiver<Event>,
) -> Result<serde_json::Value, ApiError> {
    let env = &out.env;
    let (mut text, mut lps) = (String::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t, l) => {
                text.push_str(&t);
                lps.extend(l);
            }
            Event::Done(s) => {
                let lp = out.scores.map(|tok| logprobs_value(env.kind, tok, &lps, 0));
                let (reasoning, text) = match out.think.clone() {
                    Some(split) => split.whole(&text),
                    None => (None, text),
                };
                let names = out.tools.as_deref().unwrap_or(&[]);
                let (content, mut calls) = parse_calls(&text, names, out.dialect);
                calls.truncate(out.max_calls);
                let mut v = match out.tools.is_none() || calls.is_empty() {
                    true => env.answer(&text, &s, lp),
                    false => {
                        let mut v = env.answer(&content, &s, lp);
                        let choice = &mut v["choices"][0];
                        choice["message"]["tool_calls"] = calls_json(&calls, &env.id);
                        if content.is_empty() {
                            choice["message"]["content"] = serde_json::Value::Null;
                        }
                        choice["finish_reason"] = "tool_calls".into();
                        v
                    }
                };
                if let Some(r) = reasoning {
                    v["choices"][0]["message"]["reasoning_content"] = r.into();
                }
                return Ok(v);
            }
            Event::Failed(m) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m)),
            Event::Busy(m) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m)),
            Event::Embedding(_) | Event::Slot(_) => {}
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the generation ended without an answer",
    ))
}

/// The answer as SSE `data:` chunks, ending `[DONE]`. Dropping the stream (the client left)
/// drops `rx`, and the slot stops at its next token.
fn events(
    out: Output,
    rx: mpsc::Receiver<Event>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let first = match out.env.kind {
        Kind::Chat => Some(data(out.env.chunk(None, true, None, None))),
        Kind::Completion | Kind::Native | Kind::Infill => None,
    };
    // llama-server ends a native stream with its last chunk, OpenAI's with `[DONE]`.
    let done = (!out.env.kind.native()).then(|| SseEvent::default().data("[DONE]"));
    let calls = out.tools.is_some().then(|| CallStream::new(out.dialect));
    let state = Streamed {
        out,
        rx,
        ended: false,
        sent: 0,
        calls,
    };
    let body = stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        let evs = match st.rx.recv().await {
            Some(ev) => st.chunks(ev),
            None => return None,
        };
        Some((stream::iter(evs), st))
    });
    stream::iter(first)
        .chain(body.flatten())
        .chain(stream::iter(done))
        .map(Ok)
}

/// A chat chunk of reasoning (`delta.reasoning_content`, as llama-server streams it).
fn reasoning_chunk(env: &Envelope, text: &str) -> serde_json::Value {
    let mut v = env.chunk(None, false, None, None);
    v["choices"][0]["delta"]["reasoning_content"] = text.into();
    v
}

fn data(v: serde_json::Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// A stream's state between events.
struct Streamed {
    out: Output,
    rx: mpsc::Receiver<Event>,
    ended: bool,
    /// Bytes of text sent, for completions' token offsets.
    sent: usize,
    /// With tools offered: the text held while it may be a call.
    calls: Option<CallStream>,
}

impl Streamed {
    /// The chunks for one event from the slot.
    fn chunks(&mut self, ev: Event) -> Vec<SseEvent> {
        let env = &self.out.env;
        match ev {
            Event::Text(t, l) => {
                let lp = self
                    .out
                    .scores
                    .map(|tok| logprobs_value(env.kind, tok, &l, self.sent));
                let (reasoning, t) = match &mut self.out.think {
                    Some(split) => split.feed(&t),
                    None => (String::new(), t),
                };
                let mut evs = Vec::new();
                if !reasoning.is_empty() {
                    evs.push(data(reasoning_chunk(env, &reasoning)));
                }
                let shown = match &mut self.calls {
                    Some(c) => c.push(&t),
                    None => t,
                };
                self.sent += shown.len();
                if !shown.is_empty() || lp.is_some() {
                    evs.push(data(env.chunk(Some(&shown), false, None, lp)));
                }
                evs
            }
            Event::Done(mut s) => {
                self.ended = true;
                let mut evs = Vec::new();
                if let Some(split) = self.out.think.as_mut() {
                    let (reasoning, rest) = split.finish();
                    if !reasoning.is_empty() {
                        evs.push(data(reasoning_chunk(env, &reasoning)));
                    }
                    let rest = match &mut self.calls {
                        Some(c) => c.push(&rest),
                        None => rest,
                    };
                    if !rest.is_empty() {
                        evs.push(data(env.chunk(Some(&rest), false, None, None)));
                    }
                }
                let names = self.out.tools.as_deref().unwrap_or(&[]);
                if let Some(c) = self.calls.take() {
                    let (rest, mut calls) = c.finish(names);
                    calls.truncate(self.out.max_calls);
                    if !rest.is_empty() {
                        evs.push(data(env.chunk(Some(&rest), false, None, None)));
                    }
                    if !calls.is_empty() {
                        let mut v = env.chunk(None, false, None, None);
                        v["choices"][0]["delta"]["tool_calls"] = calls_json(&calls, &env.id);
                        evs.push(data(v));
                        s.finish = crate::api::Finish::ToolCalls;
                    }
                }
                evs.push(data(match env.kind {
                    Kind::Native | Kind::Infill => crate::native::last(env, &s),
                    _ => env.chunk(None, false, Some(&s), None),
                }));
                if env.usage_chunk {
                    evs.push(data(env.usage(&s)));
                }
                evs
            }
            Event::Failed(m) => {
                self.ended = true;
                vec![data(
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m).body(),
                )]
            }
            Event::Busy(m) => {
                self.ended = true;
                vec![data(
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m).body(),
                )]
            }
            Event::Embedding(_) | Event::Slot(_) => Vec::new(),
        }
    }
}
