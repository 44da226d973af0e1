//! Sessions: generation with a streaming callback, statistics, reset.

use crate::model::{messages, pi2_message, pi2_model};
use crate::{call, out, pi2_status, text, CapiError, Handles, Result};
use ::pi2_model::TokenId;
use pi2_engine::SamplerConfig;
use pi2_runtime::handle::{Finish, Session, Stats, TextRequest};
use std::ffi::{c_char, c_void, CString};
use std::sync::Mutex;

/// A session (opaque): a conversation with its own KV cache. Made by `pi2_session_new`, closed
/// by `pi2_session_free`.
pub struct pi2_session {
    _private: [u8; 0],
}

/// Called with each piece of generated text (whole UTF-8 characters, NUL-terminated, `length`
/// bytes without the NUL; valid during the call only). Return `false` to stop generating.
pub type pi2_text_callback = Option<
    unsafe extern "C" fn(text: *const c_char, length: usize, user_data: *mut c_void) -> bool,
>;

/// How a generation samples and stops. Start from `pi2_generate_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pi2_generate_options {
    /// Tokens to generate at most; -1 for until end of generation or a full context.
    pub max_tokens: i32,
    /// 0 for greedy decoding.
    pub temperature: f32,
    /// 0 for off.
    pub top_k: u32,
    /// 1 for off.
    pub top_p: f32,
    /// 0 for off.
    pub min_p: f32,
    /// 1 for off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: u32,
    /// OpenAI's presence and frequency penalties over the recent tokens, in [-2, 2]; 0 for off.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// `n_logit_bias` pairs of token ids and biases added to their logits (in [-100, 100]);
    /// NULL if none.
    pub logit_bias_tokens: *const u32,
    pub logit_bias_values: *const f32,
    pub n_logit_bias: usize,
    pub seed: u64,
    /// `n_stops` strings that end the generation (not included in its text); NULL if none.
    pub stops: *const *const c_char,
    pub n_stops: usize,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// `pi2_generate` only: turn control-token text in the prompt (`<|im_start|>`) into
    /// control tokens, as `pi2 run -p` does.
    pub parse_special: bool,
    /// Speculative decoding with drafts from the context (prompt lookup) of up to this many
    /// tokens; 0 for plain decoding. The output is the same either way.
    pub draft_max: u32,
    /// The output follows this GBNF grammar (llama.cpp's format); NULL for none.
    pub grammar: *const c_char,
    /// The output is JSON valid against this JSON schema (`{}`: any object); NULL for none. At
    /// most one of `grammar` and `json_schema`.
    pub json_schema: *const c_char,
}

/// How the last generation ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum pi2_finish {
    PI2_FINISH_NONE = 0,
    /// An end-of-generation token or a stop string.
    PI2_FINISH_STOP = 1,
    /// `max_tokens` or a full context.
    PI2_FINISH_LENGTH = 2,
    /// The callback returned false.
    PI2_FINISH_CANCELLED = 3,
}

/// The last generation's counts.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pi2_stats {
    /// Prompt tokens evaluated (those not already in the session's cache).
    pub prompt_tokens: u64,
    pub prompt_ms: f64,
    pub generated_tokens: u64,
    pub generated_ms: f64,
    /// Generated tokens per second.
    pub tokens_per_second: f64,
    /// Bytes read from flash per generated token (0 in memory).
    pub bytes_read_per_token: f64,
    /// This process's peak resident memory; 0 where the OS does not say.
    pub peak_rss_bytes: u64,
    /// Speculative decoding: tokens drafted, and of those kept.
    pub drafted: u64,
    pub accepted: u64,
    pub finish: pi2_finish,
}

struct SessionHandle {
    session: Mutex<Session>,
    finish: Mutex<pi2_finish>,
}

static SESSIONS: Handles<SessionHandle> = Handles::new();

/// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, 256
/// tokens, control-token text parsed. Thread-safe.
#[no_mangle]
pub extern "C" fn pi2_generate_options_default() -> pi2_generate_options {
    let s = SamplerConfig::default();
    pi2_generate_options {
        max_tokens: 256,
        temperature: s.temperature,
        top_k: s.top_k as u32,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        repeat_last_n: s.repeat_last_n as u32,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        logit_bias_tokens: std::ptr::null(),
        logit_bias_values: std::ptr::null(),
        n_logit_bias: 0,
        seed: s.seed,
        stops: std::ptr::null(),
        n_stops: 0,
        ignore_eos: false,
        parse_special: true,
        draft_max: 0,
        grammar: std::ptr::null(),
        json_schema: std::ptr::null(),
    }
}

impl pi2_generate_options {
    /// The grammar asked for, compiled for `model`.
    ///
    /// # Safety
    /// `grammar` and `json_schema` are NULL or NUL-terminated.
    unsafe fn grammar(
        &self,
        model: &pi2_runtime::handle::LoadedModel,
    ) -> Result<Option<std::sync::Arc<pi2_grammar::Grammar>>> {
        use pi2_grammar::GrammarSpec;
        let spec = match (self.grammar.is_null(), self.json_schema.is_null()) {
            (true, true) => return Ok(None),
            (false, false) => {
                return Err(CapiError::arg(
                    "grammar and json_schema both constrain the output: set one",
                ))
            }
            // SAFETY: NUL-terminated, by the caller's contract.
            (false, true) => GrammarSpec::Gbnf(unsafe { text(self.grammar, "grammar") }?.into()),
            (true, false) => {
                // SAFETY: NUL-terminated, by the caller's contract.
                let s = unsafe { text(self.json_schema, "json_schema") }?;
                GrammarSpec::json_schema_text(s)
                    .map_err(|e| CapiError::arg(format!("json_schema: {e}")))?
            }
        };
        Ok(Some(model.grammar(&spec)?))
    }

    /// # Safety
    /// `stops` is NULL or holds `n_stops` NUL-terminated strings; the logit bias arrays are
    /// NULL or hold `n_logit_bias` values each.
    unsafe fn request(&self) -> Result<TextRequest> {
        if self.max_tokens < -1 {
            return Err(CapiError::arg(format!(
                "max_tokens is {}: pass a number of tokens, or -1 for until end of generation",
                self.max_tokens
            )));
        }
        let stops = if self.n_stops == 0 {
            Vec::new()
        } else if self.stops.is_null() {
            return Err(CapiError::arg("stops is NULL but n_stops is not 0"));
        } else {
            // SAFETY: `stops` holds `n_stops` pointers, by the caller's contract.
            let ptrs = unsafe { std::slice::from_raw_parts(self.stops, self.n_stops) };
            ptrs.iter()
                .enumerate()
                // SAFETY: each is NUL-terminated, by the caller's contract.
                .map(|(i, &p)| unsafe { text(p, &format!("stops[{i}]")) }.map(str::to_string))
                .collect::<Result<_>>()?
        };
        let logit_bias = if self.n_logit_bias == 0 {
            Vec::new()
        } else if self.logit_bias_tokens.is_null() || self.logit_bias_values.is_null() {
            return Err(CapiError::arg(
                "logit_bias_tokens or logit_bias_values is NULL but n_logit_bias is not 0",
            ));
        } else {
            // SAFETY: both hold `n_logit_bias` values, by the caller's contract.
            let (ids, values) = unsafe {
                (
                    std::slice::from_raw_parts(self.logit_bias_tokens, self.n_logit_bias),
                    std::slice::from_raw_parts(self.logit_bias_values, self.n_logit_bias),
                )
            };
            ids.iter().copied().zip(values.iter().copied()).collect()
        };
        Ok(TextRequest {
            sampler: SamplerConfig {
                temperature: self.temperature,
                top_k: self.top_k as usize,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_last_n: self.repeat_last_n as usize,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                logit_bias,
                seed: self.seed,
            },
            max_tokens: usize::try_from(self.max_tokens).ok(),
            stops,
            ignore_eos: self.ignore_eos,
            draft_max: self.draft_max as usize,
            grammar: None,
            logprobs: None,
            shown_tokens: Vec::new(),
        })
    }
}

/// A new session on `model`, into `*out_session`. In memory a model holds several; under a
/// memory budget one (`PI2_ERR_OPTION` for a second). Thread-safe.
///
/// # Safety
/// `out_session` is a valid place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_session_new(
    model: *mut pi2_model,
    out_session: *mut *mut pi2_session,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let slot = unsafe { out(out_session, "out_session") }?;
        *slot = std::ptr::null_mut();
        let m = crate::model::MODELS.get(model as u64, "model")?;
        let session = match m.n_batch {
            0 => Session::new(m.loaded.clone())?,
            b => Session::with_batch(m.loaded.clone(), b)?,
        };
        *slot = SESSIONS.insert(SessionHandle {
            session: Mutex::new(session),
            finish: Mutex::new(pi2_finish::PI2_FINISH_NONE),
        }) as *mut pi2_session;
        Ok(())
    })
}

/// Closes a session (after a generation running on it in another thread ends). NULL is allowed
/// (and does nothing); a closed handle is `PI2_ERR_INVALID_HANDLE`. Thread-safe.
#[no_mangle]
pub extern "C" fn pi2_session_free(session: *mut pi2_session) -> pi2_status {
    call(|| {
        if !session.is_null() {
            SESSIONS.remove(session as u64, "session")?;
        }
        Ok(())
    })
}

/// Runs `f` on the session, or `PI2_ERR_BUSY` if another thread is using it.
fn with_session<T>(
    s: *const pi2_session,
    f: impl FnOnce(&mut Session, &SessionHandle) -> Result<T>,
) -> Result<T> {
    let h = SESSIONS.get(s as u64, "session")?;
    let mut guard = match h.session.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::WouldBlock) => {
            return Err(CapiError::new(
                pi2_status::PI2_ERR_BUSY,
                "the session is in use by another thread: use one session per thread",
            ))
        }
        // A panic mid-generation was caught and reported; the engine's cache is reset below.
        Err(std::sync::TryLockError::Poisoned(p)) => {
            let mut g = p.into_inner();
            g.reset();
            h.session.clear_poison();
            g
        }
    };
    f(&mut guard, &h)
}

/// Forgets the session's conversation: the next generation evaluates its whole prompt. One
/// thread at a time per session.
#[no_mangle]
pub extern "C" fn pi2_session_reset(session: *mut pi2_session) -> pi2_status {
    call(|| {
        with_session(session, |s, _| {
            s.reset();
            Ok(())
        })
    })
}

/// Generates a continuation of `prompt` (text; the model's BOS is added), passing the text to
/// `callback` (NULL: no text is passed) as it comes. The session keeps its cache: a next prompt
/// that starts with this one's text and continuation evaluates only what is new. One thread at a
/// time per session.
///
/// # Safety
/// `prompt` is NUL-terminated; `options` is NULL or valid (with valid `stops`); `callback` is
/// NULL or a function that may be called with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn pi2_generate(
    session: *mut pi2_session,
    prompt: *const c_char,
    options: *const pi2_generate_options,
    callback: pi2_text_callback,
    user_data: *mut c_void,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let p = unsafe { text(prompt, "prompt") }?;
        // SAFETY: the caller's contract.
        let o = unsafe { options.as_ref() }
            .copied()
            .unwrap_or_else(|| pi2_generate_options_default());
        with_session(session, |s, h| {
            let ids = s.model().model().tokenizer.encode(p, true, o.parse_special);
            // SAFETY: the caller's contract on the options and the callback.
            unsafe { run(s, h, &ids, &o, callback, user_data) }
        })
    })
}

/// Generates the assistant's reply to `n` chat messages, rendered with the model's chat
/// template (message text never becomes control tokens), passing the text to `callback`. One
/// thread at a time per session.
///
/// # Safety
/// `messages` holds `n` messages with NUL-terminated strings; otherwise as `pi2_generate`.
#[no_mangle]
pub unsafe extern "C" fn pi2_chat_generate(
    session: *mut pi2_session,
    messages: *const pi2_message,
    n: usize,
    options: *const pi2_generate_options,
    callback: pi2_text_callback,
    user_data: *mut c_void,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let msgs = unsafe { self::messages(messages, n) }?;
        // SAFETY: the caller's contract.
        let o = unsafe { options.as_ref() }
            .copied()
            .unwrap_or_else(|| pi2_generate_options_default());
        with_session(session, |s, h| {
            let m = s.model().model();
            let template = crate::model::chat_template(m)?;
            let ids = template
                .encode(&m.tokenizer, &msgs, true)
                .map_err(|e| CapiError::arg(e.to_string()))?;
            // SAFETY: the caller's contract on the options and the callback.
            unsafe { run(s, h, &ids, &o, callback, user_data) }
        })
    })
}

/// # Safety
/// As `pi2_generate`'s options and callback.
unsafe fn run(
    s: &mut Session,
    h: &SessionHandle,
    ids: &[TokenId],
    o: &pi2_generate_options,
    callback: pi2_text_callback,
    user_data: *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract on `stops` and the grammar strings.
    let mut req = unsafe { o.request() }?;
    // SAFETY: as above.
    req.grammar = unsafe { o.grammar(s.model()) }?;
    let mut on_text = |t: &str| match callback {
        None => true,
        Some(cb) => {
            let c = CString::new(t.replace('\0', "")).unwrap_or_default();
            // SAFETY: a valid NUL-terminated string for the call; the callback and its data are
            // the caller's.
            unsafe { cb(c.as_ptr(), c.as_bytes().len(), user_data) }
        }
    };
    let out = s.generate(ids, &req, &mut on_text);
    let finish = match &out {
        Ok(o) => match o.finish {
            Finish::Stop => pi2_finish::PI2_FINISH_STOP,
            Finish::Length => pi2_finish::PI2_FINISH_LENGTH,
            Finish::Cancelled => pi2_finish::PI2_FINISH_CANCELLED,
        },
        Err(_) => pi2_finish::PI2_FINISH_NONE,
    };
    *h.finish.lock().unwrap_or_else(|e| e.into_inner()) = finish;
    out.map(|_| ()).map_err(CapiError::from)
}

/// The last generation's counts into `*out_stats` (zeros before the first). One thread at a
/// time per session.
///
/// # Safety
/// `out_stats` is a valid place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_session_stats(
    session: *mut pi2_session,
    out_stats: *mut pi2_stats,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let slot = unsafe { out(out_stats, "out_stats") }?;
        with_session(session, |s, h| {
            let st = s.stats().unwrap_or_else(Stats::default);
            *slot = pi2_stats {
                prompt_tokens: st.prompt_tokens as u64,
                prompt_ms: st.prompt_ms,
                generated_tokens: st.generated_tokens as u64,
                generated_ms: st.generated_ms,
                tokens_per_second: st.tokens_per_second,
                bytes_read_per_token: st.bytes_read_per_token,
                peak_rss_bytes: st.peak_rss_bytes.unwrap_or(0),
                drafted: st.drafted as u64,
                accepted: st.accepted as u64,
                finish: *h.finish.lock().unwrap_or_else(|e| e.into_inner()),
            };
            Ok(())
        })
    })
}

/// How `pi2_embed` pools the token states into one vector (passed as its number: any other
/// value is `PI2_ERR_INVALID_ARGUMENT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum pi2_pooling {
    /// The mean over the tokens (llama.cpp's default).
    PI2_POOLING_MEAN = 0,
    /// The first token's state.
    PI2_POOLING_CLS = 1,
    /// The last token's state.
    PI2_POOLING_LAST = 2,
}

/// The embedding of `text` (the model's final hidden states pooled as `pooling`, a
/// `pi2_pooling`, and L2-normalized) into
/// `embedding` (room for `capacity` floats); `*n_embd` gets its length, also when the room is
/// too small (`PI2_ERR_BUFFER_TOO_SMALL`). The session's conversation is forgotten (the
/// evaluation takes its KV cache). One thread at a time per session.
///
/// # Safety
/// `text` is NUL-terminated; `embedding` is NULL or holds `capacity` floats; `n_embd` is a
/// valid place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_embed(
    session: *mut pi2_session,
    text: *const c_char,
    pooling: u32,
    embedding: *mut f32,
    capacity: usize,
    n_embd: *mut usize,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let n = unsafe { out(n_embd, "n_embd") }?;
        // SAFETY: the caller's contract.
        let t = unsafe { crate::text(text, "text") }?;
        let pooling = match pooling {
            p if p == pi2_pooling::PI2_POOLING_MEAN as u32 => pi2_runtime::embed::Pooling::Mean,
            p if p == pi2_pooling::PI2_POOLING_CLS as u32 => pi2_runtime::embed::Pooling::Cls,
            p if p == pi2_pooling::PI2_POOLING_LAST as u32 => pi2_runtime::embed::Pooling::Last,
            other => {
                return Err(CapiError::arg(format!(
                    "pooling is {other}: pass PI2_POOLING_MEAN, PI2_POOLING_CLS or PI2_POOLING_LAST"
                )))
            }
        };
        with_session(session, |s, _| {
            let d = s.model().model().config.n_embd;
            *n = d;
            if embedding.is_null() || capacity < d {
                return Err(CapiError::new(
                    pi2_status::PI2_ERR_BUFFER_TOO_SMALL,
                    format!("embeddings of this model have {d} floats: pass room for them"),
                ));
            }
            let ids = s.model().model().tokenizer.encode(t, true, false);
            let v = s.embed(&ids, pooling)?;
            // SAFETY: `embedding` holds `capacity` >= d floats.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), embedding, d) };
            Ok(())
        })
    })
}
