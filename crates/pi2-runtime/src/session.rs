//! Building a ready engine from plain options, in the one valid order: the plan (a file, or
//! solved now) decides threads, cores and the memory split; the sparse FFN follows the plan's
//! mode or the options; the engine is made; its sparse weights are set; then the offloaded FFN
//! (sized with the engine's own KV cache and buffers) is attached. `run`, `chat`, `bench`,
//! `perplexity` and `serve` all go through here.

use crate::error::{Result, RuntimeError};
use crate::options::{parse_size, EngineOptions, OffloadOptions, SparseOptions};
use crate::plan::{apply, Applied};
use pi2_engine::{ClusteredHead, Engine, EngineParts, Offload, SparseFfn};
use pi2_model::Model;
use pi2_planner::cost::Mode;
use std::path::{Path, PathBuf};

/// Everything a session is built from.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    pub engine: EngineOptions,
    pub sparse: SparseOptions,
    /// `--mem-budget`: bytes (`48M`), or a share of the model file (`50%`).
    pub mem_budget: Option<String>,
    pub offload: OffloadOptions,
    /// `--plan`: a plan file from `pi2 plan`, or `auto` to plan now.
    pub plan: Option<String>,
    /// Batches run the sparse FFN too (perplexity of the sparse model).
    pub sparse_batches: bool,
}

/// A model with its sparse weights and plan, ready to make engines.
pub struct Prepared<'m> {
    pub model: &'m Model,
    pub path: PathBuf,
    pub sparse: Option<SparseFfn<'m>>,
    /// A converted file's clustered output head (centroids packed when in memory).
    pub head: Option<ClusteredHead<'m>>,
    pub applied: Option<Applied>,
    /// The offload budget in bytes (from the options; a plan carries its own).
    pub budget: Option<u64>,
    engine: EngineOptions,
    offload: OffloadOptions,
}

/// Checks the options against `model` (at `path`), plans if asked, and loads the sparse
/// weights.
pub fn prepare<'m>(model: &'m Model, path: &Path, o: &SessionOptions) -> Result<Prepared<'m>> {
    let budget = o
        .mem_budget
        .as_deref()
        .map(|b| parse_size("--mem-budget", b, model.file.file_size()))
        .transpose()?;
    let emulate = o.offload.emulate_flash.as_deref();
    let applied = o
        .plan
        .as_deref()
        .map(|spec| apply(spec, model, path, &o.engine, budget, emulate))
        .transpose()?;
    let offloads = budget.is_some() || applied.as_ref().is_some_and(|a| a.offload.is_some());
    if offloads {
        // Before anything touches the tensors: see `GgufFile::advise_random`.
        model.file.advise_random();
    }
    // A dense plan turns sparsity off.
    let mut sparse_opts = o.sparse.clone();
    if applied
        .as_ref()
        .is_some_and(|a| a.plan.knobs.mode == Mode::Dense)
    {
        sparse_opts.dense = true;
    }
    let sparse = crate::sparse::build(&sparse_opts, model, path, o.sparse_batches)?;
    let streams = offloads && crate::offload::streams_experts(model);
    if offloads && sparse.is_none() && !streams {
        return Err(RuntimeError::option(
            "--mem-budget",
            "reads FFN neurons from flash: it needs a model made by `pi2 convert` (and not --dense)",
        ));
    }
    if !offloads {
        // Run from memory: read in now, not in the first tokens' time.
        model.file.populate();
        // Used from memory: its bytes are checked once here (offloads check theirs as read).
        pi2_engine::verify_checksums(model).map_err(|e| RuntimeError::Damaged {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
    }
    let head = ClusteredHead::load(model, !offloads && o.engine.repack)?;
    Ok(Prepared {
        model,
        path: path.to_path_buf(),
        sparse,
        head,
        // A plan sets the budget itself (`apply` refuses both).
        budget: if applied.is_some() { None } else { budget },
        applied,
        engine: o.engine.clone(),
        offload: o.offload.clone(),
    })
}

impl<'m> Prepared<'m> {
    /// The engine configuration: the plan's, or the options'.
    pub fn engine_config(&self) -> Result<pi2_engine::EngineConfig> {
        match &self.applied {
            Some(a) => Ok(a.cfg.clone()),
            None => self.engine.config(),
        }
    }

    /// Whether engines read FFN neurons from flash (a budget, or a plan that offloads).
    pub fn offloads(&self) -> bool {
        self.budget.is_some() || self.applied.as_ref().is_some_and(|a| a.offload.is_some())
    }

    /// A ready engine for batches of up to `n_batch` tokens, built once with its parts: the
    /// sparse weights, and the offloaded FFN if the options or the plan offload.
    pub fn engine(&self, n_batch: usize) -> Result<Engine<'_>> {
        let cfg = self.engine_config()?;
        let parts = EngineParts {
            sparse: self.sparse.as_ref(),
            head: self.head.as_ref(),
            offload: self.offload(&cfg, n_batch)?,
            experts: self.experts(&cfg, n_batch)?,
        };
        Ok(Engine::with_parts(self.model, &cfg, parts)?)
    }

    /// [`Prepared::engine`] for batches of up to `n_batch` tokens, or, when a memory budget
    /// cannot also hold the buffers of such batches, of the largest halving of it (down to 16)
    /// that fits: a budget never needs a batch size picked by hand. Returns the engine and its
    /// batch size; the error of the smallest batch when none fits.
    pub fn engine_within_budget(&self, n_batch: usize) -> Result<(Engine<'_>, usize)> {
        let mut b = n_batch.max(1);
        loop {
            match self.engine(b) {
                Err(RuntimeError::Option {
                    option: "--mem-budget",
                    ..
                }) if self.offloads() && b > 16 => b = (b / 2).max(16),
                other => return other.map(|e| (e, b)),
            }
        }
    }

    /// [`Prepared::engine_within_budget`] for batches of `want` tokens and at least a checked
    /// draft of `draft_max` tokens with its token (0: no drafts); refused, naming `--draft-max`,
    /// when a budget cannot hold such a batch.
    pub fn engine_for_drafts(&self, want: usize, draft_max: usize) -> Result<(Engine<'_>, usize)> {
        let checked = draft_max + 1;
        let (engine, n_batch) = self.engine_within_budget(want.max(checked))?;
        if n_batch < checked {
            return Err(RuntimeError::option(
                "--draft-max",
                format!("{draft_max}: --mem-budget leaves room for batches of {n_batch} tokens, fewer than such a draft and its token; lower --draft-max or raise the budget"),
            ));
        }
        Ok((engine, n_batch))
    }

    /// A plain mixture-of-experts model's experts streamed under the options' budget (`None`
    /// without a budget, or for a converted or dense model).
    pub fn experts(
        &self,
        cfg: &pi2_engine::EngineConfig,
        n_batch: usize,
    ) -> Result<Option<pi2_engine::ExpertStream>> {
        let Some(b) = self
            .budget
            .filter(|_| crate::offload::streams_experts(self.model))
        else {
            return Ok(None);
        };
        let file = self.model.file.file_size();
        let ocfg = self.offload.config(b, file, &self.path)?;
        let x = crate::offload::build_experts(&ocfg, self.model, &self.path, cfg, n_batch)?;
        Ok(Some(x))
    }

    /// The offloaded FFN the options or plan ask for, for an engine built with `cfg` (`None`
    /// if they do not offload).
    pub fn offload(
        &self,
        cfg: &pi2_engine::EngineConfig,
        n_batch: usize,
    ) -> Result<Option<Offload>> {
        let Some(sp) = self.sparse.as_ref() else {
            return Ok(None);
        };
        let file = self.model.file.file_size();
        let (ocfg, n_batch) = match (&self.applied, self.budget) {
            (Some(a), _) => match &a.offload {
                Some(c) => (c.clone(), n_batch.max(a.plan.n_batch)),
                None => return Ok(None),
            },
            (None, Some(b)) => (self.offload.config(b, file, &self.path)?, n_batch),
            (None, None) => return Ok(None),
        };
        let o = crate::offload::build(&ocfg, self.model, &self.path, sp, cfg, n_batch)?;
        Ok(Some(o))
    }
}
