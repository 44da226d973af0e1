//! The sparse-FFN and offloading options shared by `run`, `chat`, `perplexity` and `bench`, as
//! the runtime's plain options, and how their statistics print.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone, Debug, Default)]
pub struct SparseArgs {
    /// Compute the FFN sparsely in decode (automatic for a model made by `pi2 convert` under a
    /// memory budget; in memory its layers run dense where that is faster unless this is given)
    #[arg(long)]
    pub sparse: bool,
    /// Compute the FFN densely, even for a converted model
    #[arg(long, conflicts_with = "sparse")]
    pub dense: bool,
    /// Target FFN sparsity in 0..0.95 (fraction of neurons skipped): per-layer thresholds from
    /// the converted model's profile or from --profile
    #[arg(long)]
    pub sparsity: Option<f32>,
    /// One threshold for every layer: a neuron fires when act(gate . x) is not 0 and
    /// |act(gate . x)| >= T (act: SiLU, or ReLU for ReLU-family models, exact at T = 0)
    #[arg(long, conflicts_with = "sparsity")]
    pub threshold: Option<f32>,
    /// Activation profile from `pi2 profile` (needed for --sparsity on an unconverted model)
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Skip the predictor: every neuron is a candidate (gate rows all computed)
    #[arg(long)]
    pub no_predictor: bool,
    /// Type of the transposed down rows built at load for an unconverted model
    /// (q8_0, q4_1, q4_0, f16, f32; default: the model's down type)
    #[arg(long)]
    pub down_type: Option<String>,
    /// Compute the whole output matrix every token, even when the converted model has a
    /// clustered output head
    #[arg(long)]
    pub dense_head: bool,
    /// Share of the output rows a converted model's clustered head computes exactly, in
    /// (0, 1] (default: the share the file was converted for)
    #[arg(long, conflicts_with = "dense_head")]
    pub head_share: Option<f32>,
}

impl SparseArgs {
    /// The runtime's sparse options.
    pub fn options(&self) -> pi2_runtime::SparseOptions {
        pi2_runtime::SparseOptions {
            sparse: self.sparse,
            dense: self.dense,
            sparsity: self.sparsity,
            threshold: self.threshold,
            profile: self.profile.clone(),
            no_predictor: self.no_predictor,
            down_type: self.down_type.clone(),
        }
    }

    /// The clustered head's share the options ask for (`None`: the file's).
    pub fn head_share(&self) -> Option<f32> {
        match self.dense_head {
            true => Some(1.0),
            false => self.head_share,
        }
    }
}

/// Options for running a converted model larger than memory (`run`, `bench`).
#[derive(Args, Clone, Debug, Default)]
pub struct OffloadArgs {
    /// Keep at most SIZE resident and read the rest from flash (a plain GGUF is profiled and
    /// converted once into the per-user cache, a plain mixture of experts streams its experts
    /// from the file as it is; a file made by `pi2 convert` runs as it is):
    /// bytes with an optional K/M/G suffix (48M, 1.5G) or a percentage of the model file
    /// (50%). `bench` takes a comma-separated list
    #[arg(long = "mem-budget", value_delimiter = ',')]
    pub mem_budget: Vec<String>,
    /// Share of the neuron memory (beyond one layer of cache slots) pinned to the hottest
    /// neurons; the rest is the LRU cache. Decode visits every layer per token, so an LRU
    /// smaller than a token's working set thrashes: pinning measured faster on SmolLM2-135M
    #[arg(long, default_value_t = 1.0)]
    pub hot_share: f64,
    /// Buffered reads whose pages are dropped, instead of O_DIRECT
    #[arg(long)]
    pub no_direct: bool,
    /// Reads handed to the device at once [default: what this device rewards, measured once
    /// and cached]
    #[arg(long)]
    pub io_depth: Option<usize>,
    /// How reads reach the device: `pread` (portable, one read at a time) or `uring` (Linux
    /// io_uring: --io-depth reads in flight together, from the one I/O thread) [default: the
    /// faster on this device, measured once and cached]
    #[arg(long, value_enum)]
    pub io_engine: Option<IoEngineArg>,
    /// Largest merged read (bytes, K/M suffix)
    #[arg(long, default_value = "128K")]
    pub max_read: String,
    /// Nearby reads at most this far apart are merged (bytes, K/M suffix)
    #[arg(long, default_value = "0")]
    pub merge_gap: String,
    /// Read from an emulated flash device (LATENCYus,BANDWIDTHMB/s, e.g. 100us,800MB/s):
    /// the page cache, each read taking the latency plus its size over the bandwidth
    #[arg(long)]
    pub emulate_flash: Option<String>,
    /// A mixture of experts streamed from its file: do not read the next layer's likely
    /// experts ahead (a guess from the next layer's router on this layer's input; a wrong
    /// guess costs reads, never a different answer)
    #[arg(long)]
    pub no_prefetch: bool,
    /// A mixture of experts streamed from its file: which experts a full cache keeps —
    /// `frequent` (the most often chosen so far; a layer's popular experts stay) or `recent`
    /// (the most recently chosen)
    #[arg(long, default_value = "frequent")]
    pub expert_cache: pi2_engine::ExpertCache,
    /// A mixture of experts streamed from its file: neither start from the routing an earlier
    /// run kept (how often each expert was chosen, in pi2's cache directory) nor keep this
    /// run's; the cache's counts start from zero
    #[arg(long)]
    pub forget_routing: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IoEngineArg {
    #[default]
    Pread,
    Uring,
}

impl OffloadArgs {
    /// The runtime's offload options (the budget is separate: `bench` takes a list).
    pub fn options(&self) -> pi2_runtime::OffloadOptions {
        pi2_runtime::OffloadOptions {
            hot_share: self.hot_share,
            direct: !self.no_direct,
            io_depth: self.io_depth,
            io_engine: self.io_engine.map(Into::into),
            max_read: self.max_read.clone(),
            merge_gap: self.merge_gap.clone(),
            emulate_flash: self.emulate_flash.clone(),
            process_bytes: None,
            prefetch_experts: !self.no_prefetch,
            expert_cache: self.expert_cache,
            remember_routing: !self.forget_routing,
        }
    }

    /// The one budget of `run`, `chat` and `serve`.
    pub fn one_budget(&self, command: &str) -> Result<Option<String>> {
        match &self.mem_budget[..] {
            [] => Ok(None),
            [b] => Ok(Some(b.clone())),
            _ => bail!("`{command}` takes one --mem-budget (lists are for `pi2 bench`)"),
        }
    }
}

/// What a session is built from beyond the model and threads: sparsity, offloading, a plan
/// (`run`, `chat`, `serve`).
#[derive(Args, Clone)]
pub struct SessionArgs {
    #[command(flatten)]
    pub sparse: SparseArgs,
    #[command(flatten)]
    pub offload: OffloadArgs,
    /// Run a plan from `pi2 plan` (threads, cores, memory split, I/O), or `auto` to plan now
    /// (for --mem-budget, else the whole model in memory)
    #[arg(long)]
    pub plan: Option<String>,
}

impl From<IoEngineArg> for pi2_io::IoEngine {
    fn from(a: IoEngineArg) -> Self {
        match a {
            IoEngineArg::Pread => Self::Pread,
            IoEngineArg::Uring => Self::Uring,
        }
    }
}
