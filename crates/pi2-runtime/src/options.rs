//! Plain options (no argument parser's types): the engine's threads and context, the sparse
//! FFN, offloading, and the size and device strings users type (`48M`, `50%`,
//! `100us,800MB/s`).

use crate::error::{Result, RuntimeError};
use pi2_engine::topology::Topology;
use pi2_engine::{EngineConfig, SamplerConfig};
use pi2_io::IoEngine;
use pi2_kernels::{QuantType, Tier};
use std::path::PathBuf;
use std::time::Duration;

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Compute threads (`None`: one per selected core, or every core).
    pub threads: Option<usize>,
    /// Context length in tokens (0: the model's training context).
    pub n_ctx: usize,
    /// A kernel tier by name (`scalar`, `avx2`, ...), lower than the detected one.
    pub tier: Option<String>,
    /// Cores to pin to: clusters (`big`, `mid`, `little`, `all`) or CPU numbers (`0-3,6`).
    pub cores: Option<String>,
    /// Row-interleaved copies of the matrices multiplied whole.
    pub repack: bool,
    /// Share of the output rows a converted model's clustered head scores exactly (`None`: the
    /// file's; 1: every row, the dense head).
    pub head_share: Option<f32>,
    /// Check the clustered head against the whole output matrix every step (perplexity).
    pub head_check: bool,
    /// Run a converted model's layers dense where they are in memory (see
    /// `pi2_engine::EngineConfig::dense_resident`); `--sparse` turns it off.
    pub dense_resident: bool,
    /// Rows of logits a forward pass returns at most (`pi2_engine::EngineConfig::logit_rows`).
    pub logit_rows: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: None,
            n_ctx: 4096,
            tier: None,
            cores: None,
            repack: true,
            head_share: None,
            head_check: false,
            dense_resident: true,
            logit_rows: 1,
        }
    }
}

/// Most compute threads accepted: far beyond any device, small enough to start.
pub const MAX_THREADS: usize = 1024;

impl EngineOptions {
    /// Shrinks the context to `tokens` and the token after them when a run never holds more (a
    /// KV cache, and a memory budget's share for it, sized for more would go unused). An
    /// absurd context stays as given, for [`EngineOptions::config`] to refuse by name.
    pub fn fit_context(&mut self, model: &pi2_model::Model, tokens: usize) {
        let asked = match self.n_ctx {
            0 => model.config.n_ctx_train,
            c => c,
        };
        if asked <= pi2_engine::MAX_CTX {
            self.n_ctx = asked.min(tokens.saturating_add(1));
        }
    }

    /// The engine configuration, every option checked.
    pub fn config(&self) -> Result<EngineConfig> {
        if self.n_ctx > pi2_engine::MAX_CTX {
            return Err(RuntimeError::option(
                "--ctx-size",
                format!(
                    "a context of {} tokens is outside 1..{} (0: the model's training context)",
                    self.n_ctx,
                    pi2_engine::MAX_CTX
                ),
            ));
        }
        let tier = match &self.tier {
            None => None,
            Some(name) => {
                let t = Tier::from_name(name).ok_or_else(|| {
                    let names: Vec<_> = Tier::ALL.iter().map(|t| t.name()).collect();
                    RuntimeError::option(
                        "--kernel-tier",
                        format!("unknown tier `{name}` (known: {})", names.join(", ")),
                    )
                })?;
                if !t.is_supported() {
                    return Err(RuntimeError::option(
                        "--kernel-tier",
                        format!(
                            "`{name}` is not supported by this CPU (best: {})",
                            Tier::detect().name()
                        ),
                    ));
                }
                Some(t)
            }
        };
        let cpus = match &self.cores {
            None => Vec::new(),
            Some(spec) => Topology::detect().select(spec)?,
        };
        let threads = match self.threads {
            None if !cpus.is_empty() => cpus.len(),
            None => EngineConfig::default().threads,
            Some(0) => return Err(RuntimeError::option("--threads", "must be at least 1")),
            Some(t) if t > MAX_THREADS => {
                return Err(RuntimeError::option(
                    "--threads",
                    format!("{t} is more than {MAX_THREADS}"),
                ))
            }
            Some(t) => t,
        };
        if let Some(share) = self.head_share.filter(|s| !(*s > 0.0 && *s <= 1.0)) {
            return Err(RuntimeError::option(
                "--head-share",
                format!("{share} is outside (0, 1]: the share of output rows scored exactly"),
            ));
        }
        Ok(EngineConfig {
            threads,
            n_ctx: self.n_ctx,
            tier,
            cpus,
            repack: self.repack,
            head_share: self.head_share,
            head_check: self.head_check,
            dense_resident: self.dense_resident,
            logit_rows: self.logit_rows,
            ..EngineConfig::default()
        })
    }
}

/// The sparse FFN asked for.
#[derive(Clone, Debug, Default)]
pub struct SparseOptions {
    /// Compute the FFN sparsely in decode (automatic for a converted model).
    pub sparse: bool,
    /// Compute the FFN densely, even for a converted model.
    pub dense: bool,
    /// Target sparsity (0..0.95): per-layer thresholds from the profile.
    pub sparsity: Option<f32>,
    /// One threshold for every layer.
    pub threshold: Option<f32>,
    /// A profile from `pi2 profile` (thresholds for an unconverted model).
    pub profile: Option<PathBuf>,
    /// Every neuron a candidate: no predictor.
    pub no_predictor: bool,
    /// Type of transposed down rows built at load for an unconverted model.
    pub down_type: Option<String>,
}

impl SparseOptions {
    /// Whether any option asks for sparsity.
    pub fn wanted(&self) -> bool {
        self.sparse || self.sparsity.is_some() || self.threshold.is_some()
    }
}

/// Offloading: reads of neurons from flash under a budget.
#[derive(Clone, Debug)]
pub struct OffloadOptions {
    /// Share of the neuron memory pinned to the hottest neurons (0..1).
    pub hot_share: f64,
    /// `O_DIRECT` reads (else buffered with dropped pages).
    pub direct: bool,
    /// Reads in flight; `None`: what this device rewards ([`crate::io_choice`]).
    pub io_depth: Option<usize>,
    /// How reads reach the device; `None`: what this device rewards, measured once.
    pub io_engine: Option<IoEngine>,
    /// Largest merged read, e.g. `128K`.
    pub max_read: String,
    /// Reads at most this far apart are merged, e.g. `0`, `16K`.
    pub merge_gap: String,
    /// An emulated device, `LATENCYus,BANDWIDTHMB/s`.
    pub emulate_flash: Option<String>,
    /// What the process's own memory counts against the budget; `None`: measured when the
    /// offload is built ([`crate::offload::process_bytes`]). A program that embeds pi2 beside
    /// memory of its own says here how much of it the budget covers (`Some(0)` counts as
    /// `None`).
    pub process_bytes: Option<u64>,
    /// A plain mixture of experts under a budget: read the next layer's likely experts ahead.
    pub prefetch_experts: bool,
    /// A plain mixture of experts under a budget: which experts a full cache keeps.
    pub expert_cache: pi2_engine::ExpertCache,
    /// A plain mixture of experts under a budget: start the cache from the routing an earlier
    /// run kept, and keep this run's for the next (in pi2's cache directory).
    pub remember_routing: bool,
}

impl Default for OffloadOptions {
    fn default() -> Self {
        Self {
            hot_share: 1.0,
            direct: true,
            io_depth: None,
            io_engine: None,
            max_read: "128K".into(),
            merge_gap: "0".into(),
            emulate_flash: None,
            process_bytes: None,
            prefetch_experts: true,
            expert_cache: Default::default(),
            remember_routing: true,
        }
    }
}

impl OffloadOptions {
    /// The engine and depth: as given, else chosen for the device holding `path` (an
    /// emulated device reads one request at a time through `pread`, so nothing is measured).
    fn reader(&self, path: &std::path::Path, emulated: bool) -> Result<(IoEngine, usize)> {
        // `pread` reads its group one read at a time; 4 is the reader's long-standing group.
        const PREAD_GROUP: usize = 4;
        if emulated || self.io_engine == Some(IoEngine::Pread) {
            return Ok((IoEngine::Pread, self.io_depth.unwrap_or(PREAD_GROUP)));
        }
        if let (Some(engine), Some(depth)) = (self.io_engine, self.io_depth) {
            return Ok((engine, depth));
        }
        let c = crate::io_choice::for_device(path)?;
        let engine = self.io_engine.unwrap_or(c.engine);
        let depth = match engine {
            IoEngine::Uring => c.uring_depth.unwrap_or(PREAD_GROUP),
            IoEngine::Pread => c.depth,
        };
        Ok((engine, self.io_depth.unwrap_or(depth)))
    }
}

/// Most reads in flight accepted.
pub const MAX_IO_DEPTH: usize = 256;
/// Largest single read accepted.
pub const MAX_READ_BYTES: u64 = 64 << 20;

impl OffloadOptions {
    /// The offload configuration for `budget` bytes of the file at `path` of `file_bytes`,
    /// every option checked; an engine or depth not given is chosen for the device.
    pub fn config(
        &self,
        budget: u64,
        file_bytes: u64,
        path: &std::path::Path,
    ) -> Result<pi2_engine::OffloadConfig> {
        if !(0.0..=1.0).contains(&self.hot_share) {
            return Err(RuntimeError::option(
                "--hot-share",
                format!("{} is outside 0..1", self.hot_share),
            ));
        }
        if let Some(d) = self.io_depth.filter(|&d| d == 0 || d > MAX_IO_DEPTH) {
            return Err(RuntimeError::option(
                "--io-depth",
                format!("{d} is outside 1..{MAX_IO_DEPTH}"),
            ));
        }
        let max_read = parse_size("--max-read", &self.max_read, file_bytes)?;
        if !(64..=MAX_READ_BYTES).contains(&max_read) {
            return Err(RuntimeError::option(
                "--max-read",
                format!("{max_read} bytes is outside 64..64M"),
            ));
        }
        let merge_gap = parse_size("--merge-gap", &self.merge_gap, file_bytes)?;
        if merge_gap > MAX_READ_BYTES {
            return Err(RuntimeError::option("--merge-gap", "is over 64M"));
        }
        let emulate = self
            .emulate_flash
            .as_deref()
            .map(parse_emulate)
            .transpose()?;
        let (engine, depth) = self.reader(path, emulate.is_some())?;
        Ok(pi2_engine::OffloadConfig {
            budget,
            // 0: measured when the offload is built (`offload::build`).
            process: self.process_bytes.unwrap_or(0),
            hot_share: self.hot_share,
            // Set when the offload is built, from the engine's context (`offload::build`).
            kv_growth: 0,
            direct: self.direct,
            engine,
            reader: pi2_io::ReaderConfig {
                max_request: max_read as usize,
                depth,
                merge_gap: merge_gap as usize,
            },
            faults: None,
            emulate,
            // Without a plan every layer runs the sparse step: the text is the same at every
            // budget (a plan runs wholly pinned layers dense where that is faster).
            dense_layers: None,
            prefetch_experts: self.prefetch_experts,
            expert_cache: self.expert_cache,
            routing_memory: self
                .remember_routing
                .then(|| crate::device::routing_file(path))
                .flatten(),
        })
    }
}

/// Sizes from 2^60 bytes on mean a typo, and would overflow the arithmetic downstream.
pub const MAX_SIZE: u64 = 1 << 60;

/// `48M`, `1.5G`, `4096`, `512K`, or `50%` of `file_bytes`; `option` names the option in
/// errors. Always below [`MAX_SIZE`].
pub fn parse_size(option: &'static str, s: &str, file_bytes: u64) -> Result<u64> {
    let t = s.trim();
    let bad = || {
        RuntimeError::option(
            option,
            format!("cannot read `{s}` as a size (examples: 48M, 1.5G, 50%)"),
        )
    };
    if let Some(p) = t.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        if !(p > 0.0 && p.is_finite() && p <= 1e6) {
            return Err(RuntimeError::option(
                option,
                format!("size `{s}` must be a positive percentage"),
            ));
        }
        let bytes = file_bytes as f64 * p / 100.0;
        if bytes >= MAX_SIZE as f64 {
            return Err(bad());
        }
        return Ok(bytes as u64);
    }
    let (num, mult) = match t.char_indices().last().map(|(_, c)| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let bytes = v * mult as f64;
    if !(v >= 0.0 && v.is_finite() && bytes < MAX_SIZE as f64) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// An emulated flash device: `LATENCYus,BANDWIDTHMB/s` (e.g. `100us,800MB/s`).
pub fn parse_emulate(spec: &str) -> Result<pi2_io::FaultPlan> {
    let bad = || {
        RuntimeError::option(
            "--emulate-flash",
            format!("`{spec}`: expected LATENCYus,BANDWIDTHMB/s (e.g. 100us,800MB/s)"),
        )
    };
    let (lat, bw) = spec.split_once(',').ok_or_else(bad)?;
    let lat: f64 = lat
        .trim()
        .trim_end_matches("us")
        .parse()
        .map_err(|_| bad())?;
    let bw: f64 = bw
        .trim()
        .trim_end_matches("MB/s")
        .parse()
        .map_err(|_| bad())?;
    if !(lat >= 0.0 && bw > 0.0 && lat.is_finite() && bw.is_finite() && lat < 1e7 && bw < 1e7) {
        return Err(bad());
    }
    Ok(pi2_io::FaultPlan {
        latency: Duration::from_nanos((lat * 1e3) as u64),
        ns_per_byte: 1e3 / bw,
        ..Default::default()
    })
}

/// The first sampling setting out of range, if any: its name (`temperature`, `top_p`,
/// `min_p`, `repeat_penalty`), its value and what it must be. Front ends name it their way
/// (`--temp`, a JSON field).
pub fn sampling_problem(c: &SamplerConfig) -> Option<(&'static str, f32, &'static str)> {
    let checks = [
        (
            "temperature",
            c.temperature,
            c.temperature.is_finite() && c.temperature >= 0.0,
            "a number >= 0",
        ),
        (
            "top_p",
            c.top_p,
            c.top_p > 0.0 && c.top_p <= 1.0,
            "in (0, 1]",
        ),
        (
            "min_p",
            c.min_p,
            (0.0..=1.0).contains(&c.min_p),
            "in [0, 1]",
        ),
        (
            "repeat_penalty",
            c.repeat_penalty,
            c.repeat_penalty.is_finite() && c.repeat_penalty > 0.0,
            "a number > 0",
        ),
        (
            "presence_penalty",
            c.presence_penalty,
            (-2.0..=2.0).contains(&c.presence_penalty),
            "in [-2, 2]",
        ),
        (
            "frequency_penalty",
            c.frequency_penalty,
            (-2.0..=2.0).contains(&c.frequency_penalty),
            "in [-2, 2]",
        ),
        (
            "logit_bias",
            c.logit_bias
                .iter()
                .map(|b| b.1)
                .find(|b| !(-100.0..=100.0).contains(b))
                .unwrap_or(0.0),
            c.logit_bias.iter().all(|b| (-100.0..=100.0).contains(&b.1)),
            "in [-100, 100]",
        ),
    ];
    checks
        .into_iter()
        .find(|c| !c.2)
        .map(|(name, v, _, want)| (name, v, want))
}

/// A seed from the clock, for sampling without a given seed.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A tensor type by name (`q8_0`, `Q4_K`, ...).
pub fn parse_type(option: &'static str, name: &str) -> Result<QuantType> {
    QuantType::ALL
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(name))
        .ok_or_else(|| RuntimeError::option(option, format!("unknown tensor type `{name}`")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_absurd_ones_are_refused() {
        let f = 1000;
        assert_eq!(parse_size("x", "48M", f).unwrap(), 48 << 20);
        assert_eq!(parse_size("x", "1.5G", f).unwrap(), 3 << 29);
        assert_eq!(parse_size("x", "50%", f).unwrap(), 500);
        assert_eq!(parse_size("x", "4096", f).unwrap(), 4096);
        for bad in [
            "",
            "-1",
            "abc",
            "1e30",
            "inf",
            "NaN",
            "0%",
            "-5%",
            "10000000000G",
            "9e18",
        ] {
            let e = parse_size("--mem-budget", bad, f).unwrap_err().to_string();
            assert!(e.starts_with("--mem-budget:"), "{bad}: {e}");
        }
    }

    proptest::proptest! {
        /// Any text and any file size give a size below `MAX_SIZE` or an error naming the
        /// option: never a panic, never a wrapped or saturated number.
        #[test]
        fn any_size_text_is_in_range_or_refused(
            s in "[ 0-9.eE+%KMGTkmgtinfa-]{0,12}",
            file in proptest::prelude::any::<u64>(),
        ) {
            match parse_size("--mem-budget", &s, file) {
                Ok(v) => proptest::prop_assert!(v < MAX_SIZE),
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("--mem-budget:")),
            }
        }
    }

    #[test]
    fn emulated_devices_parse() {
        let p = parse_emulate("100us,800MB/s").unwrap();
        assert_eq!(p.latency, Duration::from_micros(100));
        assert!((p.ns_per_byte - 1.25).abs() < 1e-9);
        for bad in [
            "100",
            "100us",
            "x,800MB/s",
            "100us,0MB/s",
            "-1us,800MB/s",
            "1e300us,1MB/s",
        ] {
            assert!(parse_emulate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn engine_and_offload_options_are_range_checked() {
        let e = |threads| EngineOptions {
            threads,
            ..Default::default()
        };
        assert!(e(Some(0)).config().is_err());
        assert!(e(Some(3000)).config().is_err());
        assert_eq!(e(Some(2)).config().unwrap().threads, 2);
        let o = |f: &dyn Fn(&mut OffloadOptions)| {
            let mut o = OffloadOptions {
                io_engine: Some(IoEngine::Pread),
                ..Default::default()
            };
            f(&mut o);
            o.config(1 << 20, 1 << 30, std::path::Path::new("Cargo.toml"))
        };
        assert!(o(&|_| {}).is_ok());
        assert!(o(&|o| o.io_depth = Some(100_000_000)).is_err());
        assert!(o(&|o| o.io_depth = Some(0)).is_err());
        assert!(o(&|o| o.max_read = "1000G".into()).is_err());
        assert!(o(&|o| o.hot_share = 1.5).is_err());
        assert!(o(&|o| o.merge_gap = "1G".into()).is_err());
    }
}
