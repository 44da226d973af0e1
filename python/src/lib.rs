//! `pi2._native`: the Rust side of the `pi2` Python package. A thin layer over
//! [`pi2_runtime::handle`] (models, sessions, streamed text): the GIL is released while a model
//! opens and while text is generated, and Ctrl-C stops a generation cleanly. The Pythonic API
//! (`pi2.Model`, OpenAI-shaped results) is `pi2/__init__.py`.

use pi2_engine::SamplerConfig;
use pi2_grammar::GrammarSpec;
use pi2_model::TokenId;
use pi2_runtime::embed::Pooling;
use pi2_runtime::handle::{Finish, LoadedModel, Session, Stats, TextRequest};
use pi2_runtime::{EngineOptions, RuntimeError, SessionOptions};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

create_exception!(
    _native,
    Pi2Error,
    PyRuntimeError,
    "pi2 could not do what was asked: the message says why and what to do."
);

/// A runtime error as Python sees it: a bad option is a `ValueError`, anything else a
/// `Pi2Error`.
fn py_err(e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Option { .. } => PyValueError::new_err(e.to_string()),
        other => Pi2Error::new_err(other.to_string()),
    }
}

/// How often a generation looks for Ctrl-C.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

mod chat;

#[pyclass(module = "pi2._native", name = "NativeModel")]
struct NativeModel {
    model: Option<Arc<LoadedModel>>,
    session: Option<Arc<Mutex<Session>>>,
    /// The cancel flag of the last stream started: a new generation on the model supersedes
    /// a stream still running (one conversation, one KV cache), even one its reader abandoned
    /// without closing it (a Ctrl-C between two pieces).
    stream: Mutex<Option<Arc<AtomicBool>>>,
}

impl NativeModel {
    /// Stops the last stream (at its next token), if it is still running.
    fn supersede_stream(&self) {
        if let Some(flag) = self.stream.lock().unwrap_or_else(|e| e.into_inner()).take() {
            flag.store(true, Ordering::Relaxed);
        }
    }

    fn loaded(&self) -> PyResult<&Arc<LoadedModel>> {
        self.model
            .as_ref()
            .ok_or_else(|| Pi2Error::new_err("the model is closed"))
    }

    fn session(&self) -> PyResult<Arc<Mutex<Session>>> {
        self.session
            .clone()
            .ok_or_else(|| Pi2Error::new_err("the model is closed"))
    }
}

impl NativeModel {
    /// `request`'s settings with its grammar compiled for this model (a bad grammar is a
    /// `ValueError` naming what is wrong).
    /// A chat answer (`request.2`) shows its template dialect's markers, so it can be read.
    fn request(&self, request: &Request) -> PyResult<TextRequest> {
        let mut req = request.0.clone();
        if request.2 {
            let m = self.loaded()?.model();
            if let Ok(t) = m.chat_template() {
                req.shown_tokens = t.dialect().shown_ids(&m.tokenizer);
            }
        }
        if let Some(spec) = &request.1 {
            let g = self
                .loaded()?
                .grammar(spec)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            req.grammar = Some(g);
        }
        Ok(req)
    }
}

impl NativeModel {
    /// Log probabilities as JSON of OpenAI chat's `logprobs.content` entries.
    fn scores_json(&self, scores: &[pi2_engine::TokenLogprob]) -> PyResult<String> {
        let tok = &self.loaded()?.model().tokenizer;
        Ok(pi2_runtime::logprobs::chat(tok, scores)["content"].to_string())
    }
}

fn lock(s: &Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    // A generation that failed left the session usable (its cache cleared).
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a generation samples and stops, checked once (`pi2.Model` makes it from keyword
/// arguments).
/// A generation's settings, and the grammar its output follows (compiled against the model's
/// vocabulary when it runs).
#[pyclass(module = "pi2._native", frozen)]
struct Request(TextRequest, Option<GrammarSpec>, bool);

#[pymethods]
impl Request {
    #[new]
    #[pyo3(signature = (max_tokens=256, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, seed=None, stop=Vec::new(), ignore_eos=false, draft_max=0, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=Vec::new(), grammar=None, json_schema=None, logprobs=None, calls_grammar=None, chat=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: i64,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        seed: Option<u64>,
        stop: Vec<String>,
        ignore_eos: bool,
        draft_max: usize,
        presence_penalty: f32,
        frequency_penalty: f32,
        logit_bias: Vec<(TokenId, f32)>,
        grammar: Option<String>,
        json_schema: Option<String>,
        logprobs: Option<usize>,
        calls_grammar: Option<String>,
        chat: bool,
    ) -> PyResult<Self> {
        let spec = match (grammar, json_schema, calls_grammar) {
            (None, None, Some(lark)) => Some(GrammarSpec::Lark(lark)),
            (_, _, Some(_)) => {
                return Err(PyValueError::new_err(
                    "tool_choice asks for a call, which has its own format: drop response_format/grammar/json_schema",
                ))
            }
            (Some(_), Some(_), None) => {
                return Err(PyValueError::new_err(
                    "grammar and json_schema both constrain the output: give one",
                ))
            }
            (Some(g), None, None) => Some(GrammarSpec::Gbnf(g)),
            (None, Some(s), None) => Some(
                GrammarSpec::json_schema_text(&s)
                    .map_err(|e| PyValueError::new_err(format!("json_schema: {e}")))?,
            ),
            (None, None, None) => None,
        };
        if logprobs.is_some_and(|n| n > 20) {
            return Err(PyValueError::new_err(
                "top_logprobs is 0 to 20 alternatives per token",
            ));
        }
        if max_tokens < -1 {
            return Err(PyValueError::new_err(format!(
                "max_tokens={max_tokens}: pass a number of tokens, or -1 for until end of generation"
            )));
        }
        let sampler = SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            seed: seed.unwrap_or_else(pi2_runtime::options::clock_seed),
            ..SamplerConfig::default()
        };
        if let Some((name, v, want)) = pi2_runtime::options::sampling_problem(&sampler) {
            return Err(PyValueError::new_err(format!("{name}={v} must be {want}")));
        }
        Ok(Self(
            TextRequest {
                sampler,
                max_tokens: usize::try_from(max_tokens).ok(),
                stops: stop,
                ignore_eos,
                draft_max,
                grammar: None,
                logprobs,
                shown_tokens: Vec::new(),
            },
            spec,
            chat,
        ))
    }
}

fn finish_name(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Cancelled => "cancelled",
    }
}

fn stats_dict<'py>(py: Python<'py>, st: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("prompt_tokens", st.prompt_tokens)?;
    d.set_item("prompt_ms", st.prompt_ms)?;
    d.set_item("generated_tokens", st.generated_tokens)?;
    d.set_item("generated_ms", st.generated_ms)?;
    d.set_item("tokens_per_second", st.tokens_per_second)?;
    d.set_item("bytes_read_per_token", st.bytes_read_per_token)?;
    d.set_item("peak_rss_bytes", st.peak_rss_bytes)?;
    d.set_item("drafted", st.drafted)?;
    d.set_item("accepted", st.accepted)?;
    Ok(d)
}

#[pymethods]
impl NativeModel {
    #[new]
    #[pyo3(signature = (model=None, mem_budget=None, plan=None, threads=None, cores=None, n_ctx=4096, n_batch=None, verbose=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Option<String>,
        mem_budget: Option<String>,
        plan: Option<String>,
        threads: Option<usize>,
        cores: Option<String>,
        n_ctx: usize,
        n_batch: Option<usize>,
        verbose: bool,
    ) -> PyResult<Self> {
        if threads == Some(0) {
            return Err(PyValueError::new_err(
                "threads=0: pass at least 1, or None for every core",
            ));
        }
        let opts = SessionOptions {
            engine: EngineOptions {
                threads,
                n_ctx,
                cores,
                ..EngineOptions::default()
            },
            mem_budget,
            plan,
            ..SessionOptions::default()
        };
        let (lm, session) = py
            .detach(|| {
                let lm = LoadedModel::open(model.as_deref().map(Path::new), &opts, &mut |n| {
                    if let Some(line) = n.line().filter(|_| verbose) {
                        eprintln!("{line}");
                    }
                })?;
                let s = match n_batch {
                    Some(b) => Session::with_batch(lm.clone(), b)?,
                    None => Session::new(lm.clone())?,
                };
                Ok::<_, RuntimeError>((lm, s))
            })
            .map_err(py_err)?;
        Ok(Self {
            model: Some(lm),
            session: Some(Arc::new(Mutex::new(session))),
            stream: Mutex::new(None),
        })
    }

    /// Closes the model (a running stream finishes first); later calls raise `Pi2Error`.
    fn close(&mut self) {
        self.supersede_stream();
        self.session = None;
        self.model = None;
    }

    #[getter]
    fn closed(&self) -> bool {
        self.model.is_none()
    }

    #[getter]
    fn n_ctx(&self) -> PyResult<usize> {
        let s = self.session()?;
        let n = lock(&s).n_ctx();
        Ok(n)
    }

    #[getter]
    fn n_vocab(&self) -> PyResult<usize> {
        Ok(self.loaded()?.model().tokenizer.vocab_size())
    }

    #[getter]
    fn path(&self) -> PyResult<String> {
        Ok(self.loaded()?.prepared().path.display().to_string())
    }

    /// Whether the model runs under a memory budget (reading neurons from flash).
    #[getter]
    fn offloaded(&self) -> PyResult<bool> {
        Ok(self.loaded()?.prepared().offloads())
    }

    #[pyo3(signature = (text, add_special=true, parse_special=false))]
    fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> PyResult<Vec<TokenId>> {
        Ok(self
            .loaded()?
            .model()
            .tokenizer
            .encode(text, add_special, parse_special))
    }

    fn detokenize(&self, tokens: Vec<i64>) -> PyResult<String> {
        let m = self.loaded()?.model();
        let vocab = m.tokenizer.vocab_size();
        let ids = m.tokenizer.checked_ids(tokens).map_err(|(i, t)| {
            PyValueError::new_err(format!(
                "tokens[{i}] = {t} is outside the vocabulary of {vocab}"
            ))
        })?;
        Ok(String::from_utf8_lossy(&m.tokenizer.decode(&ids, false)).into_owned())
    }

    /// The chat template applied to `messages` (and `tools`, JSON text of OpenAI's list).
    #[pyo3(signature = (messages, add_generation_prompt=true, tools=None))]
    fn apply_chat_template(
        &self,
        messages: Vec<chat::PyMessage>,
        add_generation_prompt: bool,
        tools: Option<&str>,
    ) -> PyResult<String> {
        self.render_chat(messages, add_generation_prompt, tools)
    }

    /// The tokens of a chat prompt (with `tools`): message text never becomes control tokens.
    #[pyo3(signature = (messages, tools=None))]
    fn chat_tokens(
        &self,
        messages: Vec<chat::PyMessage>,
        tools: Option<&str>,
    ) -> PyResult<Vec<TokenId>> {
        self.chat_prompt(messages, tools)
    }

    /// A reader of the answer to chat prompt `prompt` (see `chat::AnswerReader`).
    #[pyo3(signature = (prompt, reasoning_format="auto", tools=None))]
    fn answer_reader(
        &self,
        prompt: Vec<TokenId>,
        reasoning_format: &str,
        tools: Option<Vec<String>>,
    ) -> PyResult<chat::AnswerReader> {
        self.reader(prompt, reasoning_format, tools)
    }

    /// Generates from `tokens`; returns `(text, finish_reason, stats, scores)` (`scores`: JSON
    /// of OpenAI chat's `logprobs.content` entries, when the request asks for them). The GIL is released;
    /// Ctrl-C stops the generation and raises `KeyboardInterrupt`.
    fn generate_tokens<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<TokenId>,
        request: PyRef<'_, Request>,
    ) -> PyResult<(String, &'static str, Bound<'py, PyDict>, Option<String>)> {
        let req = self.request(&request)?;
        let session = self.session()?;
        self.supersede_stream();
        let mut text = String::new();
        let mut scores = Vec::new();
        let mut interrupted: Option<PyErr> = None;
        let out = py.detach(|| {
            let mut last_check = Instant::now();
            let mut s = lock(&session);
            let out = s.generate_pieces(&tokens, &req, &mut |p| {
                text.push_str(p.text);
                scores.extend_from_slice(p.logprobs);
                if last_check.elapsed() >= SIGNAL_CHECK {
                    last_check = Instant::now();
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        interrupted = Some(e);
                        return false;
                    }
                }
                true
            });
            out.map(|o| (o.finish, s.stats().unwrap_or_default()))
        });
        if let Some(e) = interrupted {
            return Err(e);
        }
        let (finish, st) = out.map_err(py_err)?;
        let scores = req
            .logprobs
            .map(|_| self.scores_json(&scores))
            .transpose()?;
        Ok((text, finish_name(finish), stats_dict(py, &st)?, scores))
    }

    /// Starts a generation from `tokens` on a worker thread; returns an iterator of text
    /// pieces.
    fn stream_tokens(
        &self,
        tokens: Vec<TokenId>,
        request: PyRef<'_, Request>,
    ) -> PyResult<TextStream> {
        let req = self.request(&request)?;
        let session = self.session()?;
        self.supersede_stream();
        let (tx, rx) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        *self.stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
        let stop_flag = cancel.clone();
        let s_model = self.loaded()?.clone();
        std::thread::Builder::new()
            .name("pi2-stream".into())
            .spawn(move || {
                let mut s = lock(&session);
                let scored = req.logprobs.is_some();
                let out = s.generate_pieces(&tokens, &req, &mut |p| {
                    if p.text.is_empty() && p.logprobs.is_empty() {
                        return !stop_flag.load(Ordering::Relaxed);
                    }
                    let scores = scored.then(|| {
                        let tok = &s_model.model().tokenizer;
                        pi2_runtime::logprobs::chat(tok, p.logprobs)["content"].to_string()
                    });
                    !stop_flag.load(Ordering::Relaxed)
                        && tx.send(Piece::Text(p.text.to_string(), scores)).is_ok()
                });
                let done = out
                    .map(|o| (o.finish, s.stats().unwrap_or_default()))
                    .map_err(|e| e.to_string());
                let _ = tx.send(Piece::Done(done));
            })
            .map_err(|e| Pi2Error::new_err(format!("cannot start a generation thread: {e}")))?;
        Ok(TextStream {
            rx: Mutex::new(Some(rx)),
            cancel,
            result: Mutex::new(None),
        })
    }

    /// The embedding of `tokens` (pooled `mean`, `cls` or `last`, L2-normalized); the
    /// conversation in the KV cache is forgotten. The GIL is released.
    #[pyo3(signature = (tokens, pooling="mean"))]
    fn embed_tokens(
        &self,
        py: Python<'_>,
        tokens: Vec<TokenId>,
        pooling: &str,
    ) -> PyResult<Vec<f32>> {
        let pooling: Pooling = pooling
            .parse()
            .map_err(|e: RuntimeError| PyValueError::new_err(e.to_string()))?;
        let session = self.session()?;
        self.supersede_stream();
        py.detach(|| lock(&session).embed(&tokens, pooling))
            .map_err(py_err)
    }

    /// The last generation's counts (`None` before the first).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let s = self.session()?;
        let st = lock(&s).stats();
        st.map(|s| stats_dict(py, &s)).transpose()
    }

    /// Forgets the conversation held in the KV cache.
    fn reset(&self) -> PyResult<()> {
        let s = self.session()?;
        self.supersede_stream();
        lock(&s).reset();
        Ok(())
    }
}

enum Piece {
    /// Text, with its tokens' log probabilities (JSON, OpenAI chat's `content` list) when asked.
    Text(String, Option<String>),
    Done(Result<(Finish, Stats), String>),
}

/// Text pieces of a running generation. Closing it (or dropping it, or Ctrl-C while waiting)
/// stops the generation at its next token.
#[pyclass(module = "pi2._native")]
struct TextStream {
    rx: Mutex<Option<mpsc::Receiver<Piece>>>,
    cancel: Arc<AtomicBool>,
    result: Mutex<Option<(Finish, Stats)>>,
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece of text, or with log probabilities asked for, `(text, scores)`
    /// (`scores`: JSON of OpenAI chat's `logprobs.content` entries for the piece's tokens).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let mut guard = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let Some(rx) = guard.take() else {
                return Ok(None);
            };
            let (got, rx) = py.detach(move || (rx.recv_timeout(SIGNAL_CHECK), rx));
            *guard = Some(rx);
            match got {
                Ok(Piece::Text(t, None)) => {
                    return Ok(Some(t.into_pyobject(py)?.into_any().unbind()))
                }
                Ok(Piece::Text(t, Some(scores))) => {
                    return Ok(Some((t, scores).into_pyobject(py)?.into_any().unbind()))
                }
                Ok(Piece::Done(done)) => {
                    *guard = None;
                    let (finish, st) = done.map_err(Pi2Error::new_err)?;
                    *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some((finish, st));
                    return Ok(None);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.cancel.store(true, Ordering::Relaxed);
                        *guard = None;
                        return Err(e);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    *guard = None;
                    return Err(Pi2Error::new_err(
                        "the generation thread ended without an answer",
                    ));
                }
            }
        }
    }

    /// Stops the generation (at its next token).
    fn close(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        *self.rx.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// "stop", "length" or "cancelled" once the stream has ended; `None` before.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(f, _)| finish_name(*f))
    }

    /// The generation's counts once the stream has ended; `None` before.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let r = self.result.lock().unwrap_or_else(|e| e.into_inner());
        r.as_ref().map(|(_, s)| stats_dict(py, s)).transpose()
    }
}

impl Drop for TextStream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// The catalogue: `(name, file, size in bytes, licence)` of each model `pi2.Model` can fetch by
/// name.
#[pyfunction]
fn catalogue() -> Vec<(&'static str, &'static str, u64, &'static str)> {
    pi2_catalog::MODELS
        .iter()
        .map(|m| (m.name, m.file, m.size, m.licence))
        .collect()
}

#[pymodule(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A memory budget bounds what pi2 adds to the interpreter, not the interpreter itself.
    pi2_runtime::offload::exclude_host_memory();
    m.add_class::<NativeModel>()?;
    m.add_class::<TextStream>()?;
    m.add_class::<Request>()?;
    m.add_class::<chat::AnswerReader>()?;
    m.add_function(wrap_pyfunction!(chat::calls_grammar, m)?)?;
    m.add_function(wrap_pyfunction!(catalogue, m)?)?;
    m.add("Pi2Error", m.py().get_type::<Pi2Error>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
