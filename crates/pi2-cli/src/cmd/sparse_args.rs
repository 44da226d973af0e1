//! The sparse-FFN options shared by `run`, `perplexity` and `bench`, and building the engine's
//! sparse weights from them.

use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_engine::SparseFfn;
use pi2_kernels::QuantType;
use pi2_model::Model;
use pi2_sparse::Profile;
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug, Default)]
pub struct SparseArgs {
    /// Compute the FFN sparsely in decode (automatic for a model made by `pi2 convert`)
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
}

impl SparseArgs {
    /// Whether any option asks for sparsity.
    pub fn wanted(&self) -> bool {
        self.sparse || self.sparsity.is_some() || self.threshold.is_some()
    }
}

pub fn parse_type(name: &str) -> Result<QuantType> {
    QuantType::ALL
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(name))
        .with_context(|| format!("unknown tensor type `{name}`"))
}

pub fn check_sparsity(s: f32) -> Result<f32> {
    if !(0.0..=0.95).contains(&s) {
        bail!("--sparsity {s} is outside 0..0.95");
    }
    Ok(s)
}

fn load_profile(path: &Path, model: &Model, model_path: &Path) -> Result<Profile> {
    let p = Profile::load(path)?;
    p.model
        .check_compatible(&super::profile::model_info(model, model_path))
        .with_context(|| format!("profile {}", path.display()))?;
    Ok(p)
}

/// Per-layer thresholds for `sparsity` from a profile.
pub fn thresholds(p: &Profile, sparsity: f32) -> Result<Vec<f32>> {
    check_sparsity(sparsity)?;
    Ok(p.layers
        .iter()
        .map(|l| l.threshold_for(sparsity))
        .collect::<Result<_, _>>()?)
}

/// The sparse FFN the options ask for (`None`: dense). `batches` makes batches sparse too
/// (perplexity measures the sparse model; prefill otherwise stays dense).
pub fn build<'m>(
    a: &SparseArgs,
    model: &'m Model,
    model_path: &Path,
    batches: bool,
) -> Result<Option<SparseFfn<'m>>> {
    if a.dense {
        return Ok(None);
    }
    let converted = pi2_engine::load_sparse(model)?;
    if converted.is_none() && !a.wanted() {
        return Ok(None);
    }
    let n_layer = model.config.n_layer;
    let chosen: Option<Vec<f32>> = match (a.threshold, a.sparsity) {
        (Some(t), _) => {
            if !(t.is_finite() && t >= 0.0) {
                bail!("--threshold {t} must be a number >= 0");
            }
            Some(vec![t; n_layer])
        }
        (None, Some(s)) => {
            let profile = match (&a.profile, &converted) {
                (Some(p), _) => load_profile(p, model, model_path)?,
                (None, Some((_, Some(p)))) => p.clone(),
                _ => bail!(
                    "--sparsity needs per-layer thresholds: pass --profile (from `pi2 profile`) \
                     or use a model made by `pi2 convert`"
                ),
            };
            Some(thresholds(&profile, s)?)
        }
        (None, None) => None,
    };
    let mut sp = match converted {
        Some((sp, _)) => sp,
        None => {
            // ReLU-family FFNs are exactly sparse at threshold 0: nothing to choose.
            let exact = model
                .config
                .ffn_act
                .exact_sparsity()
                .then(|| vec![0.0; n_layer]);
            let Some(t) = chosen.as_ref().or(exact.as_ref()) else {
                bail!("--sparse on a model that was not converted needs --sparsity with --profile, or --threshold");
            };
            let down = a.down_type.as_deref().map(parse_type).transpose()?;
            SparseFfn::from_dense(model, t, down)?
        }
    };
    if let Some(t) = &chosen {
        sp.set_thresholds(t)?;
    }
    sp.use_predictor = sp.has_predictors() && !a.no_predictor;
    sp.batches_too = batches;
    Ok(Some(sp))
}

/// The measured fractions on stderr: candidates, confirmed, FFN bytes, recall per layer.
pub fn print_stats(st: &pi2_engine::SparseStats) {
    eprintln!(
        "sparse: candidates {:.3}, confirmed {:.3} (FFN sparsity {:.3}), FFN bytes {:.3} of dense",
        st.candidate_fraction(),
        st.confirmed_fraction(),
        1.0 - st.confirmed_fraction(),
        st.byte_fraction()
    );
    if let Some(r) = st.total_recall() {
        let per: Vec<String> = st
            .recall()
            .iter()
            .map(|r| r.map_or("-".into(), |r| format!("{r:.3}")))
            .collect();
        eprintln!(
            "sparse: predictor recall {r:.4}; per layer {}",
            per.join(" ")
        );
    }
}

/// The measured fractions as JSON.
pub fn stats_json(st: &pi2_engine::SparseStats) -> serde_json::Value {
    serde_json::json!({
        "candidates": st.candidate_fraction(),
        "confirmed": st.confirmed_fraction(),
        "ffn_sparsity": 1.0 - st.confirmed_fraction(),
        "ffn_bytes_per_token": st.ffn_bytes as f64 / (st.token_layers.max(1) as f64 / st.layer_tokens.len().max(1) as f64),
        "ffn_bytes_fraction": st.byte_fraction(),
        "recall": st.total_recall(),
    })
}

/// Options for running a converted model larger than memory (`run`, `bench`).
#[derive(Args, Clone, Debug, Default)]
pub struct OffloadArgs {
    /// Keep at most SIZE resident and read FFN neurons from flash (needs a model made by
    /// `pi2 convert`): bytes with an optional K/M/G suffix (48M, 1.5G) or a percentage of the
    /// model file (50%). `bench` takes a comma-separated list
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
    /// Reads handed to the device at once
    #[arg(long, default_value_t = 4)]
    pub io_depth: usize,
    /// How reads reach the device: `pread` (portable, one read at a time) or `uring` (Linux
    /// io_uring: --io-depth reads in flight together, from the one I/O thread)
    #[arg(long, value_enum, default_value_t = IoEngineArg::Pread)]
    pub io_engine: IoEngineArg,
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
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IoEngineArg {
    #[default]
    Pread,
    Uring,
}

impl From<IoEngineArg> for pi2_engine::IoEngine {
    fn from(a: IoEngineArg) -> Self {
        match a {
            IoEngineArg::Pread => Self::Pread,
            IoEngineArg::Uring => Self::Uring,
        }
    }
}

/// `48M`, `1.5G`, `4096`, `512K`, or `50%` of `file_bytes`.
pub fn parse_size(s: &str, file_bytes: u64) -> Result<u64> {
    let t = s.trim();
    let bad = || anyhow::anyhow!("cannot read `{s}` as a size (examples: 48M, 1.5G, 50%)");
    if let Some(p) = t.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        if !(p > 0.0 && p.is_finite()) {
            bail!("size `{s}` must be a positive percentage");
        }
        return Ok((file_bytes as f64 * p / 100.0) as u64);
    }
    let (num, mult) = match t.char_indices().last().map(|(_, c)| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(bad());
    }
    Ok((v * mult as f64) as u64)
}

/// The offloaded FFN for `budget` bytes, for `engine` (its KV cache and buffers for batches of
/// `n_batch` tokens count against the budget).
pub fn build_offload(
    a: &OffloadArgs,
    budget: u64,
    model: &Model,
    path: &Path,
    sparse: &SparseFfn<'_>,
    engine: &pi2_engine::Engine<'_>,
    n_batch: usize,
) -> Result<pi2_engine::Offload> {
    let file = model.file.file_size();
    let cfg = pi2_engine::OffloadConfig {
        budget,
        hot_share: a.hot_share,
        direct: !a.no_direct,
        engine: a.io_engine.into(),
        reader: pi2_io::ReaderConfig {
            max_request: parse_size(&a.max_read, file)? as usize,
            depth: a.io_depth.max(1),
            merge_gap: parse_size(&a.merge_gap, file)? as usize,
        },
        faults: None,
        emulate: a
            .emulate_flash
            .as_deref()
            .map(super::plan::parse_emulate)
            .transpose()?,
    };
    if !(0.0..=1.0).contains(&a.hot_share) {
        bail!("--hot-share {} is outside 0..1", a.hot_share);
    }
    offload_with(&cfg, model, path, sparse, engine, n_batch)
}

/// The hot-neuron frequencies a converted model carries (pinning order across layers).
pub fn frequencies(model: &Model) -> Result<Option<Vec<Vec<f32>>>> {
    Ok(pi2_engine::unit_frequencies(model)?)
}

/// The offloaded FFN for `cfg` (see [`build_offload`]).
pub fn offload_with(
    cfg: &pi2_engine::OffloadConfig,
    model: &Model,
    path: &Path,
    sparse: &SparseFfn<'_>,
    engine: &pi2_engine::Engine<'_>,
    n_batch: usize,
) -> Result<pi2_engine::Offload> {
    let freq = frequencies(model)?;
    let o = pi2_engine::Offload::new(
        model,
        sparse,
        path,
        engine.kv_bytes_full() as u64,
        engine.scratch_bytes(n_batch) as u64,
        freq.as_deref(),
        cfg,
    )?;
    if let (_, Some(why)) = o.engine() {
        eprintln!("note: direct I/O is off ({why}); reading buffered and dropping the pages");
    }
    Ok(o)
}

/// What the offloaded FFN did, for `--json` (decode of `tokens` tokens in `decode_secs`).
pub fn offload_json(o: &pi2_engine::Offload, tokens: usize, decode_secs: f64) -> serde_json::Value {
    let st = o.stats();
    let rd = o.reader_stats();
    let b = o.budget();
    let regions: serde_json::Map<String, serde_json::Value> = b
        .breakdown()
        .map(|(r, v)| (format!("{r:?}").to_lowercase(), v.into()))
        .collect();
    serde_json::json!({
        "budget_bytes": b.limit(),
        "regions_bytes": regions,
        "hot_neurons": o.hot_counts().iter().sum::<usize>(),
        "cold_slots": o.cold_slots(),
        "engine": o.engine().0,
        "hit_rate": st.hit_rate(),
        "gate_rows": {"hot": st.gate_hot, "cached": st.gate_hits, "read": st.gate_reads},
        "updown_rows": {"hot": st.updown_hot, "cached": st.updown_hits, "read": st.updown_reads},
        "bytes_read": rd.bytes_read,
        "decode_bytes_requested_per_token": st.decode_bytes as f64 / tokens.max(1) as f64,
        "streamed_attention_layers": o.streamed_layers(),
        "attention_bytes_per_token": st.attn_bytes as f64 / tokens.max(1) as f64,
        "streamed_output_rows": o.streamed_output_rows(),
        "output_bytes_per_token": st.out_bytes as f64 / tokens.max(1) as f64,
        "embedding_rows_read": st.embd_rows,
        "device_reads": rd.reads,
        "device_busy_secs": rd.busy_ns as f64 / 1e9,
        "io_wait_share": if decode_secs > 0.0 { st.io_wait_ns as f64 / 1e9 / decode_secs } else { 0.0 },
    })
}
