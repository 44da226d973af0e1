//! A draft model beside a session (speculative decoding with a second, smaller model): what it
//! takes of a memory budget, charged before the session is planned, so the whole process stays
//! inside the budget.

use crate::error::{Result, RuntimeError};
use crate::options::parse_size;
use pi2_engine::{Engine, EngineConfig, ModelDraft};
use pi2_model::Model;

/// Bytes a draft model takes beside the session: its file (mapped, and read on every drafted
/// token), its KV cache when `cfg`'s context is full and its buffers for batches of `n_batch`.
pub fn footprint(draft: &Model, cfg: &EngineConfig, n_batch: usize) -> u64 {
    draft.file.file_size()
        + pi2_engine::kv_bytes_full(draft, cfg, n_batch) as u64
        + pi2_engine::scratch_bytes(draft, cfg, n_batch) as u64
}

/// `budget` as the user wrote it (a size, or a share of `file_bytes`, the file they named)
/// less `reserved`, as a size; refused in one line when the rest cannot hold anything.
pub fn budget_less(budget: &str, file_bytes: u64, reserved: u64) -> Result<String> {
    let bytes = parse_size("--mem-budget", budget, file_bytes)?;
    match bytes.checked_sub(reserved) {
        Some(left) if left > 0 => Ok(left.to_string()),
        _ => Err(RuntimeError::option(
            "--draft-model",
            format!(
                "the draft model takes {:.1} MiB of --mem-budget {budget} ({:.1} MiB), which leaves nothing for the model: raise the budget or use a smaller draft model",
                reserved as f64 / (1 << 20) as f64,
                bytes as f64 / (1 << 20) as f64
            ),
        )),
    }
}

/// `budget` less what `draft` takes beside a session with `base`'s settings, its context sized
/// as a run of `prompt` and `n_predict` tokens sizes it (with room for a chat template's markup;
/// `None`: the whole context), as a size.
pub fn budget_beside(
    budget: &str,
    target_file: u64,
    draft: &Model,
    base: &EngineConfig,
    prompt: &str,
    n_predict: Option<usize>,
) -> Result<String> {
    let mut cfg = base.clone();
    let asked = match cfg.n_ctx {
        0 => draft.config.n_ctx_train,
        n => n,
    };
    cfg.n_ctx = match n_predict {
        Some(n) => asked.min(draft.tokenizer.encode(prompt, true, true).len() + n + 64),
        None => asked,
    };
    budget_less(budget, target_file, footprint(draft, &cfg, 512))
}

/// The draft model's drafter beside `target`: an engine with `base`'s settings at the target's
/// context and threads; under a budget (`budget`) its weights stay in the mapping (no packed
/// copy beside them, which [`footprint`] does not count).
pub fn engine<'m>(
    draft: &'m Model,
    base: &EngineConfig,
    target: &Engine<'_>,
    budget: bool,
) -> Result<ModelDraft<'m>> {
    let mut cfg = base.clone();
    cfg.n_ctx = target.n_ctx();
    cfg.threads = target.threads();
    if budget {
        cfg.repack = false;
    }
    Ok(ModelDraft::new(Engine::new(draft, &cfg)?, 512))
}

/// `draft` checked against `target`'s vocabulary (refused in one line when they differ).
pub fn check(target: &Model, draft: &Model) -> Result<()> {
    match pi2_engine::vocabulary_mismatch(target, draft) {
        Some(why) => Err(RuntimeError::option("--draft-model", why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_is_charged_to_the_budget() {
        assert_eq!(
            budget_less("100M", 0, 40 << 20).unwrap(),
            (60u64 << 20).to_string()
        );
        assert_eq!(budget_less("50%", 1000, 100).unwrap(), "400");
        let e = budget_less("10M", 0, 20 << 20).unwrap_err().to_string();
        assert!(
            e.contains("--draft-model") && e.contains("leaves nothing"),
            "{e}"
        );
    }
}
