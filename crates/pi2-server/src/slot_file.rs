//! llama-server's slot actions: `POST /slots/{id}?action=save|restore|erase`. A slot's KV cache
//! and the tokens it holds are written to a file in `--slot-save-path` and read back, checked
//! against the model (its name, shape and file size), the context and the vocabulary before the
//! cache is replaced; erase empties the slot. Each action runs on the slot's own thread, after
//! what the slot is doing.

use crate::error::ApiError;
use crate::slots::{Event, Job};
use crate::state::AppState;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use pi2_engine::Engine;
use pi2_model::{Model, TokenId};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

const MAGIC: &[u8; 8] = b"PI2SLOT1";

/// What a slot is asked to do with its KV cache.
#[derive(Clone, Debug)]
pub enum SlotAction {
    Save { file: PathBuf, name: String },
    Restore { file: PathBuf, name: String },
    Erase,
}

/// The model a saved slot belongs to, as a line.
fn identity(m: &Model) -> String {
    let c = &m.config;
    format!(
        "{} `{}`: {} layers of {}, {} tokens, a file of {} bytes",
        c.arch.name(),
        m.name.as_deref().unwrap_or(""),
        c.n_layer,
        c.n_embd,
        c.n_vocab,
        m.file.file_size()
    )
}

/// Writes `tokens` and the engine's cache to `file` (through a temporary file, so a failed
/// write leaves any earlier save whole); returns the bytes written.
pub fn save(e: &Engine<'_>, tokens: &[TokenId], file: &Path) -> Result<u64, String> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    let id = identity(e.model());
    out.extend_from_slice(&(id.len() as u64).to_le_bytes());
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    tokens
        .iter()
        .for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    e.save_cache(&mut out).map_err(|e| e.to_string())?;
    let tmp = file.with_extension("pi2-partial");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    };
    write().map_err(|err| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {err}", file.display())
    })?;
    Ok(out.len() as u64)
}

/// Reads a slot `save` wrote for this model into the engine; returns its tokens and the bytes
/// read. Anything else (another model, a changed or cut file) is an error and the engine's
/// cache stays as it was.
pub fn restore(e: &mut Engine<'_>, file: &Path) -> Result<(Vec<TokenId>, u64), String> {
    let bytes =
        std::fs::read(file).map_err(|err| format!("cannot read {}: {err}", file.display()))?;
    let mut r = bytes.as_slice();
    let word = |r: &mut &[u8]| -> Result<u64, String> {
        let mut b = [0u8; 8];
        r.read_exact(&mut b)
            .map_err(|_| "the file is cut short".to_string())?;
        Ok(u64::from_le_bytes(b))
    };
    if r.len() < 8 || &r[..8] != MAGIC {
        return Err("not a slot file pi2 saved".into());
    }
    r = &r[8..];
    let id_len = word(&mut r)? as usize;
    if id_len > r.len() {
        return Err("the file is cut short".into());
    }
    let (id, rest) = r.split_at(id_len);
    let want = identity(e.model());
    if id != want.as_bytes() {
        return Err(format!(
            "saved for {}, this server runs {want}",
            String::from_utf8_lossy(id)
        ));
    }
    r = rest;
    let n = word(&mut r)? as usize;
    if n > e.n_ctx() || n * 4 > r.len() {
        return Err(format!(
            "{n} tokens do not fit a context of {} or the file",
            e.n_ctx()
        ));
    }
    let (ids, mut rest) = r.split_at(n * 4);
    let tokens: Vec<TokenId> = ids
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n_vocab = e.model().config.n_vocab;
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(format!(
            "token {bad} is outside the vocabulary of {n_vocab}"
        ));
    }
    let held = e.load_cache(&mut rest).map_err(|e| e.to_string())?;
    if held != tokens.len() {
        // Cannot happen for a file pi2 wrote; refuse rather than mismatch tokens and cache.
        e.truncate(0);
        return Err(format!(
            "{} tokens but a cache of {held} positions",
            tokens.len()
        ));
    }
    Ok((tokens, bytes.len() as u64))
}

/// A slot file's name as a client gives it: a plain file name in `--slot-save-path`.
fn file_in(dir: &Path, name: &str) -> Result<PathBuf, ApiError> {
    let plain = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0']);
    match plain {
        true => Ok(dir.join(name)),
        false => Err(ApiError::bad(format!(
            "`filename` {name:?} must be a plain file name (no path, not starting with a dot)"
        ))),
    }
}

/// `POST /slots/{id}?action=save|restore|erase` (`filename` in the body for save and restore).
pub async fn slot_action(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    RawQuery(query): RawQuery,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let id: usize = (id.parse().ok())
        .filter(|&i| i < s.slots)
        .ok_or_else(|| ApiError::bad(format!("no slot `{id}`: slots are 0..{}", s.slots)))?;
    let query = query.unwrap_or_default();
    let action = (query.split('&'))
        .find_map(|kv| kv.strip_prefix("action="))
        .unwrap_or("");
    let name = || -> Result<String, ApiError> {
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad(format!("the body is not JSON: {e}")))?;
        match v.get("filename").and_then(Value::as_str) {
            Some(n) => Ok(n.to_string()),
            None => Err(ApiError::bad("`filename` (a string) is required")),
        }
    };
    let dir = || {
        s.slot_save_path.clone().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "slot save and restore need a folder: start the server with --slot-save-path DIR",
            )
        })
    };
    let action = match action {
        "save" => {
            let name = name()?;
            SlotAction::Save {
                file: file_in(&dir()?, &name)?,
                name,
            }
        }
        "restore" => {
            let name = name()?;
            SlotAction::Restore {
                file: file_in(&dir()?, &name)?,
                name,
            }
        }
        "erase" => SlotAction::Erase,
        other => {
            return Err(ApiError::bad(format!(
                "action `{other}`: save, restore or erase"
            )))
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    s.queue.submit_to(id, Job::slot(action, tx))?;
    match rx.recv().await {
        Some(Event::Slot(v)) => Ok(Json(v)),
        Some(Event::Failed(m)) => Err(ApiError::bad(m)),
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the slot ended the action",
        )),
    }
}

/// Runs `action` on a slot's engine holding `cached`: the answer llama-server gives, or why not.
pub fn run(
    action: &SlotAction,
    id: usize,
    e: &mut Engine<'_>,
    cached: &mut Vec<TokenId>,
) -> Result<Value, String> {
    let started = Instant::now();
    let ms = || started.elapsed().as_secs_f64() * 1e3;
    Ok(match action {
        SlotAction::Save { file, name } => {
            // The last generated token may not be in the cache yet.
            let held = &cached[..e.n_past().min(cached.len())];
            let written = save(e, held, file)?;
            json!({"id_slot": id, "filename": name, "n_saved": held.len(), "n_written": written,
                   "timings": {"save_ms": ms()}})
        }
        SlotAction::Restore { file, name } => {
            let (tokens, read) = restore(e, file)?;
            *cached = tokens;
            json!({"id_slot": id, "filename": name, "n_restored": cached.len(), "n_read": read,
                   "timings": {"restore_ms": ms()}})
        }
        SlotAction::Erase => {
            let n = cached.len();
            e.truncate(0);
            cached.clear();
            json!({"id_slot": id, "n_erased": n})
        }
    })
}
