//! `pi2 bench`: llama-bench style prompt-processing (ppN) and text-generation (tgN) throughput.
//! The measuring is `pi2_runtime::bench` (one engine per mode, repetitions interleaved); this
//! parses the arguments and prints the rows.

use crate::args::ModelArgs;
use anyhow::Result;
use clap::{Args, ValueEnum};
use pi2_runtime::bench::{BenchOptions, BenchRow};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    Md,
    Json,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// With --mem-budget: measure only the offloaded configurations (skip dense and in-memory
    /// sparse, which page the whole file through memory)
    #[arg(long)]
    pub offload_only: bool,
    /// With one --mem-budget: the ablation ladder, one mechanism added per row: naive per-row
    /// reads (the least cache, nothing pinned, one read at a time, no merging, no overlap of
    /// reads and compute) -> + merged reads -> + hot/cold cache at the budget -> + cluster
    /// pipeline -> + I/O queue depth (--io-depth; it takes --io-engine uring to keep several
    /// reads in flight, pread issues them one by one)
    #[arg(long)]
    pub ablation: bool,
    /// Prompt lengths to test (comma separated; 0 skips)
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma separated; 0 skips)
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Repetitions per test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    pub output: Format,
    /// With sparsity on, every test also runs dense, interleaved repetition by repetition, so
    /// the two rows compare within one run
    #[command(flatten)]
    pub sparse: super::sparse_args::SparseArgs,
    /// With --mem-budget, each budget adds a row of the same test read from flash under it
    #[command(flatten)]
    pub offload: super::sparse_args::OffloadArgs,
    /// Run only the plan from `pi2 plan` (or `auto`: plan now for the first --mem-budget, else
    /// the whole model in memory) and report its predicted speed beside the measured one
    #[arg(long)]
    pub plan: Option<String>,
    /// Also measure speculative decoding: each generation length as greedy generation on a
    /// built-in editing workload (a 40-line file to repeat with one change), rows genN without
    /// drafts and genN+SOURCE with them (`self` in the modes under --mem-budget)
    #[arg(long = "draft", value_enum, default_value_t = crate::args::DraftSource::None)]
    pub draft: crate::args::DraftSource,
    /// Most tokens drafted per pass (the length adapts to acceptance below it)
    #[arg(long = "draft-max", default_value_t = 16)]
    pub draft_max: usize,
}

pub fn run(a: BenchArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let model = pi2_runtime::load_model(&path)?;
    let session = pi2_runtime::SessionOptions {
        // Thread counts are swept by the bench (`opts.threads`).
        engine: pi2_runtime::EngineOptions {
            head_share: a.sparse.head_share(),
            ..ModelArgs {
                threads: Vec::new(),
                ..a.model.clone()
            }
            .engine_options()?
        },
        sparse: a.sparse.options(),
        mem_budget: None,
        offload: a.offload.options(),
        plan: a.plan.clone(),
        sparse_batches: false,
    };
    let opts = BenchOptions {
        n_prompt: a.n_prompt.clone(),
        n_gen: a.n_gen.clone(),
        reps: a.reps,
        threads: a.model.threads.clone(),
        budgets: a.offload.mem_budget.clone(),
        offload_only: a.offload_only,
        ablation: a.ablation,
        draft: match a.draft {
            crate::args::DraftSource::None => None,
            crate::args::DraftSource::Lookup => Some(pi2_runtime::bench::DraftKind::Lookup),
            crate::args::DraftSource::SelfDraft => Some(pi2_runtime::bench::DraftKind::SelfDraft),
        },
        draft_max: a.draft_max,
    };
    let planned = a.plan.is_some();
    let mut first = true;
    let rows = pi2_runtime::bench::bench(&model, &path, &session, &opts, |row| {
        if let Format::Md = a.output {
            if std::mem::take(&mut first) {
                println!("{}", BenchRow::markdown_header(planned));
            }
            println!("{}", row.markdown());
        }
    })?;
    if let Format::Json = a.output {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}
