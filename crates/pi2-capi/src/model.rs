//! Models: open and close, tokenize and detokenize, chat templates.

use crate::{call, opt_text, out, pi2_status, text, write_text, CapiError, Handles, Result};
use ::pi2_model::{Message, TokenId};
use pi2_runtime::handle::LoadedModel;
use pi2_runtime::{EngineOptions, SessionOptions};
use std::ffi::c_char;
use std::path::Path;
use std::sync::Arc;

/// An open model (opaque). Made by `pi2_model_open`, closed by `pi2_model_free`.
pub struct pi2_model {
    _private: [u8; 0],
}

/// How a model is opened. Start from `pi2_model_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pi2_model_options {
    /// Memory budget: bytes with a unit ("300M", "1G") or a share of the model file ("50%");
    /// NULL for none. A plain GGUF under a budget runs from its cached conversion, made on first
    /// use (minutes; up to half an hour on a small or busy CPU).
    pub mem_budget: *const c_char,
    /// A plan file from `pi2 plan`, or "auto" to plan now; NULL for none.
    pub plan: *const c_char,
    /// Compute threads; 0 for one per core.
    pub threads: u32,
    /// Cores to run on: clusters ("big", "little") or CPU numbers ("0-3,6"); NULL for all.
    pub cores: *const c_char,
    /// Context size in tokens; 0 for 4096.
    pub n_ctx: u32,
    /// Prompt batch of sessions in tokens; 0 for 512 in memory, 64 under a budget (whose room
    /// the batch buffers share).
    pub n_batch: u32,
    /// Print fetch and conversion notices on stderr.
    pub verbose: bool,
}

/// A chat message: role ("system", "user", "assistant" or "tool") and text.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pi2_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

/// An open model and the prompt batch of its sessions (0: the default).
pub(crate) struct ModelHandle {
    pub(crate) loaded: Arc<LoadedModel>,
    pub(crate) n_batch: usize,
}

pub(crate) static MODELS: Handles<ModelHandle> = Handles::new();

pub(crate) fn model(m: *const pi2_model) -> Result<Arc<LoadedModel>> {
    Ok(MODELS.get(m as u64, "model")?.loaded.clone())
}

/// The default options: no budget, no plan, every core, a context of 4096. Thread-safe.
#[no_mangle]
pub extern "C" fn pi2_model_options_default() -> pi2_model_options {
    pi2_model_options {
        mem_budget: std::ptr::null(),
        plan: std::ptr::null(),
        threads: 0,
        cores: std::ptr::null(),
        n_ctx: 0,
        n_batch: 0,
        verbose: false,
    }
}

impl pi2_model_options {
    /// # Safety
    /// The strings are NULL or NUL-terminated.
    unsafe fn session(&self) -> Result<SessionOptions> {
        // SAFETY: the caller's contract on the strings.
        let (budget, plan, cores) = unsafe {
            (
                opt_text(self.mem_budget, "mem_budget")?,
                opt_text(self.plan, "plan")?,
                opt_text(self.cores, "cores")?,
            )
        };
        Ok(SessionOptions {
            engine: EngineOptions {
                threads: (self.threads > 0).then_some(self.threads as usize),
                n_ctx: match self.n_ctx {
                    0 => EngineOptions::default().n_ctx,
                    n => n as usize,
                },
                cores: cores.map(str::to_string),
                ..EngineOptions::default()
            },
            mem_budget: budget.map(str::to_string),
            plan: plan.map(str::to_string),
            ..SessionOptions::default()
        })
    }
}

/// Opens `model`: a GGUF path, or a catalogue name (fetched and verified on first use), or NULL
/// for the default catalogue model. `options` may be NULL for the defaults. On success
/// `*out_model` holds the handle. Thread-safe.
///
/// # Safety
/// `model` and the option strings are NULL or NUL-terminated; `options` is NULL or valid; `out`
/// is a valid place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_model_open(
    model: *const c_char,
    options: *const pi2_model_options,
    out_model: *mut *mut pi2_model,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let slot = unsafe { out(out_model, "out_model") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: the caller's contract.
        let spec = unsafe { opt_text(model, "model") }?;
        // SAFETY: NULL or valid, by the caller's contract.
        let o = unsafe { options.as_ref() }
            .copied()
            .unwrap_or_else(|| pi2_model_options_default());
        // SAFETY: the caller's contract on the option strings.
        let opts = unsafe { o.session() }?;
        let verbose = o.verbose;
        let lm = LoadedModel::open(spec.map(Path::new), &opts, &mut |n| {
            if let Some(line) = n.line().filter(|_| verbose) {
                eprintln!("{line}");
            }
        })?;
        *slot = MODELS.insert(ModelHandle {
            loaded: lm,
            n_batch: o.n_batch as usize,
        }) as *mut pi2_model;
        Ok(())
    })
}

/// Closes a model. Its open sessions keep working until they are closed. NULL is allowed (and
/// does nothing); a closed handle is `PI2_ERR_INVALID_HANDLE`. Thread-safe.
#[no_mangle]
pub extern "C" fn pi2_model_free(model: *mut pi2_model) -> pi2_status {
    call(|| {
        if !model.is_null() {
            MODELS.remove(model as u64, "model")?;
        }
        Ok(())
    })
}

/// Tokenizes `text` into `tokens` (room for `capacity`); `*n_tokens` gets the count, also when
/// the room is too small (`PI2_ERR_BUFFER_TOO_SMALL`). `add_special` adds the model's BOS;
/// `parse_special` turns control-token text such as `<|im_start|>` into control tokens.
/// Thread-safe.
///
/// # Safety
/// `text` is NUL-terminated; `tokens` is NULL or holds `capacity` values; `n_tokens` is a valid
/// place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_tokenize(
    model: *const pi2_model,
    text: *const c_char,
    add_special: bool,
    parse_special: bool,
    tokens: *mut u32,
    capacity: usize,
    n_tokens: *mut usize,
) -> pi2_status {
    call(|| {
        // SAFETY: the caller's contract.
        let n = unsafe { out(n_tokens, "n_tokens") }?;
        let lm = self::model(model)?;
        // SAFETY: the caller's contract.
        let t = unsafe { crate::text(text, "text") }?;
        let ids = lm.model().tokenizer.encode(t, add_special, parse_special);
        *n = ids.len();
        if tokens.is_null() || capacity < ids.len() {
            return Err(CapiError::new(
                pi2_status::PI2_ERR_BUFFER_TOO_SMALL,
                format!("the text is {} tokens: pass room for them", ids.len()),
            ));
        }
        // SAFETY: `tokens` holds `capacity` >= ids.len() values.
        unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), tokens, ids.len()) };
        Ok(())
    })
}

/// The checked token ids at `tokens` (`n` of them; NULL allowed when `n` is 0).
///
/// # Safety
/// `tokens` is NULL or holds `n` values.
pub(crate) unsafe fn token_ids<'a>(
    lm: &LoadedModel,
    tokens: *const u32,
    n: usize,
) -> Result<&'a [TokenId]> {
    if n == 0 {
        return Ok(&[]);
    }
    if tokens.is_null() {
        return Err(CapiError::arg("tokens is NULL"));
    }
    // SAFETY: `tokens` holds `n` values, by the caller's contract.
    let ids = unsafe { std::slice::from_raw_parts(tokens, n) };
    let vocab = lm.model().tokenizer.vocab_size();
    if let Some((i, t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        return Err(CapiError::arg(format!(
            "tokens[{i}] = {t} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(ids)
}

/// The text of `n` tokens (control tokens as nothing), NUL-terminated, into `text` (room for
/// `capacity` bytes); `*length` gets its length without the NUL, also when the room is too
/// small. Thread-safe.
///
/// # Safety
/// `tokens` holds `n` values; `text` is NULL or holds `capacity` bytes; `length` is a valid
/// place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_detokenize(
    model: *const pi2_model,
    tokens: *const u32,
    n: usize,
    text: *mut c_char,
    capacity: usize,
    length: *mut usize,
) -> pi2_status {
    call(|| {
        let lm = self::model(model)?;
        // SAFETY: the caller's contract.
        let ids = unsafe { token_ids(&lm, tokens, n) }?;
        let s = String::from_utf8_lossy(&lm.model().tokenizer.decode(ids, false)).into_owned();
        // SAFETY: the caller's contract.
        unsafe { write_text(&s, text, capacity, length) }
    })
}

/// The model's chat template (`PI2_ERR_MODEL` if it has none that works).
pub(crate) fn chat_template(m: &::pi2_model::Model) -> Result<::pi2_model::ChatTemplate> {
    m.chat_template()
        .map_err(|e| CapiError::new(pi2_status::PI2_ERR_MODEL, e.to_string()))
}

/// The checked messages at `messages` (`n` of them).
///
/// # Safety
/// `messages` holds `n` messages whose strings are NULL or NUL-terminated.
pub(crate) unsafe fn messages(messages: *const pi2_message, n: usize) -> Result<Vec<Message>> {
    if n == 0 {
        return Err(CapiError::arg("there are no messages"));
    }
    if messages.is_null() {
        return Err(CapiError::arg("messages is NULL"));
    }
    // SAFETY: `messages` holds `n` values, by the caller's contract.
    let ms = unsafe { std::slice::from_raw_parts(messages, n) };
    ms.iter()
        .enumerate()
        .map(|(i, m)| {
            // SAFETY: the caller's contract on the strings.
            let (role, content) = unsafe {
                (
                    text(m.role, &format!("messages[{i}].role"))?,
                    text(m.content, &format!("messages[{i}].content"))?,
                )
            };
            if !["system", "user", "assistant", "tool"].contains(&role) {
                return Err(CapiError::arg(format!(
                    "messages[{i}].role is `{role}`: use system, user, assistant or tool"
                )));
            }
            Ok(Message::new(role, content))
        })
        .collect()
}

/// The model's chat template applied to `n` messages, ending with the start of the
/// assistant's turn when `add_assistant`; NUL-terminated into `text` (room for `capacity`
/// bytes), `*length` its length without the NUL (also when the room is too small). To
/// generate from messages, prefer `pi2_chat_generate`: it keeps control-token text inside a
/// message as text. Thread-safe.
///
/// # Safety
/// `messages` holds `n` messages with NUL-terminated strings; `text` is NULL or holds
/// `capacity` bytes; `length` is a valid place to write.
#[no_mangle]
pub unsafe extern "C" fn pi2_chat_apply(
    model: *const pi2_model,
    messages: *const pi2_message,
    n: usize,
    add_assistant: bool,
    text: *mut c_char,
    capacity: usize,
    length: *mut usize,
) -> pi2_status {
    call(|| {
        let lm = self::model(model)?;
        // SAFETY: the caller's contract.
        let msgs = unsafe { self::messages(messages, n) }?;
        let template = chat_template(lm.model())?;
        let s = template
            .render(&msgs, add_assistant)
            .map_err(|e| CapiError::arg(e.to_string()))?;
        // SAFETY: the caller's contract.
        unsafe { write_text(&s, text, capacity, length) }
    })
}
