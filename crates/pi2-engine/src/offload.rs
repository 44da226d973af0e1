//! Models larger than memory: the FFN neuron bundles of a converted model stay on flash and are
//! read on demand into a segmented cache (pinned hot neurons + LRU cold slots) under one byte
//! budget. The unit of layout, pinning and caching is an FFN unit: a layer's FFN, or one expert
//! of a mixture-of-experts layer (unit `layer * n_expert + expert`). The engine's cluster pipeline ([`crate::Engine`]) computes resident clusters while
//! the I/O thread reads missing rows.
//!
//! When the budget cannot hold every layer's attention projections too, the last layers'
//! attention streams from flash: each is read whole into one of two buffers, the next streamed
//! layer's read issued as soon as the current one is in, so it overlaps the compute in between.
//! The last rows of the output matrix may stream the same way, in chunks (see `vocab`), and a
//! separate token embedding is never resident (each lookup reads its row). Attention and output
//! weights are used by every token, so a byte of them kept resident saves one byte of reading
//! per token, at least as much as any neuron byte: they are streamed only when the smallest
//! neuron cache would not fit otherwise, in the mix that reads the fewest bytes per token.
//!
//! Residency never changes arithmetic: the same rows in the same clusters give the same logits
//! as in-memory sparse decode.

mod vocab;

use crate::sparse::SparseFfn;
use pi2_cache::{Budget, CacheError, Lru, Region, SlotCache};
use pi2_io::{AlignedBuf, IoError, PreadEngine, ReadEngine, Reader, ReaderConfig, Request};
use pi2_kernels::{MatRef, QuantType};
use pi2_model::Model;
use std::path::Path;
use vocab::{VocabStream, EMBD_BATCH};
pub(crate) use vocab::{EMBD_TAG, OUT_TAG};

use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Release},
};

/// Offloading errors.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error(transparent)]
    Budget(#[from] CacheError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("cannot offload this model: {0}")]
    Model(String),
}

/// How reads reach the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoEngine {
    /// `pread`, one read at a time: portable (Android apps cannot count on io_uring).
    #[default]
    Pread,
    /// io_uring (Linux): the reader's `depth` reads in flight together.
    Uring,
}

/// How to offload.
#[derive(Clone, Debug)]
pub struct OffloadConfig {
    /// Bytes the engine may keep resident: fixed region, pinned hot neurons, cold cache and
    /// working buffers (process overhead not included, see the README).
    pub budget: u64,
    /// Share of the neuron memory pinned to the hottest neurons (the rest is the LRU cache).
    pub hot_share: f64,
    /// Use `O_DIRECT` (falls back to buffered reads with dropped pages where refused).
    pub direct: bool,
    pub engine: IoEngine,
    pub reader: ReaderConfig,
    /// Inject faults/latency (tests, the ablation bench).
    pub faults: Option<pi2_io::FaultPlan>,
    /// Read from an emulated device of this speed ([`pi2_io::emulated`]) instead of the file's
    /// real device.
    pub emulate: Option<pi2_io::FaultPlan>,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        Self {
            budget: u64::MAX,
            hot_share: 1.0,
            direct: true,
            engine: IoEngine::default(),
            reader: ReaderConfig::default(),
            faults: None,
            emulate: None,
        }
    }
}

/// Where one FFN matrix of a layer lies in the file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Part {
    pub offset: u64,
    pub ty: QuantType,
    pub row_bytes: usize,
    /// Offset of this part's row inside a cache slot / hot block.
    pub slot_at: usize,
}

impl Part {
    pub fn row_offset(&self, i: usize) -> u64 {
        self.offset + (i * self.row_bytes) as u64
    }
}

/// A layer's three bundle parts: gate rows, up rows, transposed down rows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FfnLayout {
    pub gate: Part,
    pub up: Part,
    pub down: Part,
}

impl FfnLayout {
    fn bytes(&self, n_ff: usize) -> usize {
        n_ff * (self.gate.row_bytes + self.up.row_bytes + self.down.row_bytes)
    }
}

/// The pinned hot neurons of one unit (`n` first neurons of the hot-first file order):
/// gate rows, up rows and down rows, each block padded to 64 bytes.
pub(crate) struct HotLayer {
    pub n: usize,
    pub buf: AlignedBuf,
    pub up_at: usize,
    pub down_at: usize,
}

/// Part bits of a cold slot.
pub(crate) const GATE: u8 = 1;
pub(crate) const UPDOWN: u8 = 2;

/// What offloaded decode did (since the last reset).
#[derive(Clone, Debug, Default)]
pub struct OffloadStats {
    /// Candidate gate rows found pinned / in the cold cache / read from flash.
    pub gate_hot: u64,
    pub gate_hits: u64,
    pub gate_reads: u64,
    /// Confirmed neurons' up and down rows found pinned / cached / read.
    pub updown_hot: u64,
    pub updown_hits: u64,
    pub updown_reads: u64,
    /// Bytes of rows decode asked the reader for.
    pub decode_bytes: u64,
    /// Time the decode spent blocked waiting for reads, in nanoseconds.
    pub io_wait_ns: u64,
    /// Token-layers computed sparsely from the cache.
    pub token_layers: u64,
    /// Units (layers, or experts) read whole for dense batches (prefill).
    pub dense_layer_reads: u64,
    /// Layers whose attention projections were read from flash, and their bytes.
    pub attn_layer_reads: u64,
    pub attn_bytes: u64,
    /// Chunks of output rows read from flash, and their bytes.
    pub out_chunk_reads: u64,
    pub out_bytes: u64,
    /// Token embedding rows read from flash.
    pub embd_rows: u64,
}

impl OffloadStats {
    /// Neuron parts served from memory (pinned or cached) among all needed.
    pub fn hit_rate(&self) -> f64 {
        let hit = self.gate_hot + self.gate_hits + self.updown_hot + self.updown_hits;
        hit as f64 / (hit + self.gate_reads + self.updown_reads).max(1) as f64
    }
}

/// The offloaded FFN: reader, layout, pinned hot rows, cold cache, prefill staging.
pub struct Offload {
    pub(crate) reader: Reader,
    /// Per unit.
    pub(crate) layers: Vec<FfnLayout>,
    pub(crate) hot: Vec<HotLayer>,
    pub(crate) cache: SlotCache<Lru>,
    /// Two unit-sized buffers: prefill computes from one while the next unit is read into
    /// the other.
    pub(crate) stage: [AlignedBuf; 2],
    pub(crate) stage_unit: [Option<usize>; 2],
    pub(crate) stats: OffloadStats,
    pub(crate) n_ff: usize,
    /// Streamed attention: every layer's projections in the file, the first streamed layer
    /// (layers from it on are read each time they run), two layer buffers, and the streamed
    /// reads not yet received.
    attn: Vec<AttnLayout>,
    stream_from: usize,
    attn_buf: [AlignedBuf; 2],
    attn_buf_layer: [Option<usize>; 2],
    pub(crate) attn_pending: AtomicU64,
    /// The token embedding and output matrix: resident rows and streamed ones.
    vocab: VocabStream,
    budget: Budget,
    direct: bool,
    fallback: Option<String>,
}

const PAD: usize = 64;
fn pad(n: usize) -> usize {
    n.div_ceil(PAD) * PAD
}

/// One attention projection of a layer: where it lies in the file and in a layer buffer.
#[derive(Clone, Copy, Debug)]
struct AttnMat {
    offset: u64,
    len: usize,
    at: usize,
    ty: QuantType,
    rows: usize,
    cols: usize,
}

/// A layer's q, k, v and output projections (what a streamed layer reads).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnLayout {
    mats: [AttnMat; 4],
    /// Bytes of a buffer holding all four (each padded).
    size: usize,
}

/// Non-FFN resident bytes, the working buffers and what one decode step needs at least.
pub(crate) struct Plan {
    pub layout: Vec<FfnLayout>,
    pub attn: Vec<AttnLayout>,
    pub vocab: VocabLayout,
    /// With every layer's attention and the whole output matrix resident (the token embedding
    /// of a model with a separate output matrix never is: lookups read its rows).
    pub fixed: u64,
    pub stage: usize,
    pub bundle: usize,
}

/// What streams from flash every token: the last `attn_layers` layers' attention and the last
/// `out_rows` rows of the output matrix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Streaming {
    pub attn_layers: usize,
    pub out_rows: usize,
}

impl Plan {
    /// Attention bytes of the last `k` layers.
    fn attn_bytes(&self, k: usize) -> u64 {
        let n = self.attn.len();
        self.attn[n - k..]
            .iter()
            .map(|a| a.mats.iter().map(|m| m.len as u64).sum::<u64>())
            .sum()
    }

    /// The fixed region under `s`: two layer buffers replace the streamed layers' projections,
    /// two chunk buffers the streamed output rows.
    fn fixed_streaming(&self, s: Streaming) -> u64 {
        let mut fixed = self.fixed;
        if s.attn_layers > 0 {
            let bufs = 2 * self.attn.iter().map(|a| a.size).max().unwrap_or(0) as u64;
            fixed = fixed - self.attn_bytes(s.attn_layers) + bufs;
        }
        if s.out_rows > 0 {
            let v = &self.vocab;
            fixed = fixed - (s.out_rows * v.output.row_bytes) as u64 + v.chunk_buffers();
        }
        fixed
    }

    /// Bytes `s` reads per token.
    fn streamed_bytes(&self, s: Streaming) -> u64 {
        self.attn_bytes(s.attn_layers) + (s.out_rows * self.vocab.output.row_bytes) as u64
    }

    /// What to stream so that the fixed region leaves `rest` bytes of `budget`: the least
    /// bytes read per token (every streamed byte costs one byte of reading per token, whatever
    /// it holds), fewer streamed layers on a tie. If nothing fits, everything streams (the
    /// smallest fixed region).
    fn streaming(&self, budget: u64, rest: u64) -> Streaming {
        let n = self.attn.len();
        let v = &self.vocab;
        let all = Streaming {
            attn_layers: n,
            out_rows: v.output.rows,
        };
        let mut best: Option<Streaming> = None;
        for k in 0..=n {
            let over = (self.fixed_streaming(Streaming {
                attn_layers: k,
                out_rows: 0,
            }) + rest)
                .saturating_sub(budget);
            let out_rows = match over {
                0 => 0,
                // Streamed rows are the last ones, so that the resident ones start at a multiple
                // of 8 (the kernels' row groups stay where a whole-matrix product puts them).
                _ => {
                    let need = (over + v.chunk_buffers()).div_ceil(v.output.row_bytes as u64);
                    match (v.output.rows as u64).checked_sub(need) {
                        Some(resident) => v.output.rows - (resident as usize / 8 * 8),
                        None => continue,
                    }
                }
            };
            let s = Streaming {
                attn_layers: k,
                out_rows,
            };
            if self.fixed_streaming(s) + rest <= budget
                && best.is_none_or(|b| self.streamed_bytes(s) < self.streamed_bytes(b))
            {
                best = Some(s);
            }
        }
        best.unwrap_or_else(|| {
            (0..=n)
                .flat_map(|k| {
                    [0, all.out_rows].map(|out_rows| Streaming {
                        attn_layers: k,
                        out_rows,
                    })
                })
                .min_by_key(|&s| self.fixed_streaming(s))
                .unwrap_or(all)
        })
    }
}

fn is_bundle_tensor(name: &str) -> bool {
    name.starts_with("blk.")
        && [
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down_t.weight",
            "ffn_down.weight",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_t_exps.weight",
            "ffn_down_exps.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// A vocabulary-sized matrix in the file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VocabMat {
    pub offset: u64,
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
}

/// The token embedding and the output matrix (the same tensor when the model ties them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct VocabLayout {
    pub embd: VocabMat,
    pub output: VocabMat,
    pub tied: bool,
}

/// Most bytes of one read of streamed output rows.
const OUT_CHUNK_BYTES: usize = 1 << 20;

impl VocabLayout {
    /// Output rows per streamed chunk: a multiple of 8, at most 1 MiB and a sixteenth of the
    /// matrix (its two buffers stay small next to what streaming saves).
    pub fn chunk_rows(&self) -> usize {
        let o = &self.output;
        ((OUT_CHUNK_BYTES / o.row_bytes.max(1)).min(o.rows / 16) / 8 * 8).max(8)
    }

    /// The two chunk buffers of streamed output rows.
    fn chunk_buffers(&self) -> u64 {
        2 * pad(self.chunk_rows() * self.output.row_bytes) as u64
    }
}

/// The file layout of the FFN bundles and the size of everything else.
pub(crate) fn plan(
    model: &Model,
    sparse: &SparseFfn<'_>,
    kv_bytes: u64,
    scratch: u64,
) -> Result<Plan, OffloadError> {
    let f = &model.file;
    let c = &model.config;
    if !model.weights.layers.iter().all(|l| l.down_transposed) {
        return Err(OffloadError::Model(
            "offloading reads neuron bundles: convert the model first (`pi2 convert`)".into(),
        ));
    }
    let experts = c.n_expert.max(1);
    if sparse.layers.len() != c.n_layer * experts {
        return Err(OffloadError::Model(format!(
            "{} sparse units for {} layers of {experts}",
            sparse.layers.len(),
            c.n_layer
        )));
    }
    let mut layout = Vec::with_capacity(c.n_layer * experts);
    let mut attn = Vec::with_capacity(c.n_layer);
    for l in &model.weights.layers {
        // Expert e's rows follow the e experts before it in each stacked tensor.
        let part = |name: &str, at: usize, e: usize| -> Result<Part, OffloadError> {
            let t = f
                .tensor(name)
                .ok_or_else(|| OffloadError::Model(format!("tensor `{name}` is missing")))?;
            let ty = QuantType::from_ggml_id(t.ggml_type)
                .ok_or_else(|| OffloadError::Model(format!("`{name}`: unsupported type")))?;
            let row_bytes = (t.size as usize) / (c.n_ff * experts);
            Ok(Part {
                offset: f.data_offset + t.offset + (e * c.n_ff * row_bytes) as u64,
                ty,
                row_bytes,
                slot_at: at,
            })
        };
        for e in 0..experts {
            let gate = part(&l.gate.name, 0, e)?;
            let up = part(&l.up.name, pad(gate.row_bytes), e)?;
            let down = part(&l.down.name, up.slot_at + pad(up.row_bytes), e)?;
            let u = layout.len();
            if sparse.layers[u].down_t.rows != c.n_ff {
                return Err(OffloadError::Model(format!(
                    "unit {u}: transposed down shape"
                )));
            }
            layout.push(FfnLayout { gate, up, down });
        }
        let mut at = 0;
        let mats = [&l.wq, &l.wk, &l.wv, &l.wo].map(|w| {
            let t = f.tensor(&w.name).expect("checked at load");
            let m = AttnMat {
                offset: f.data_offset + t.offset,
                len: t.size as usize,
                at,
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
            };
            at += pad(m.len);
            m
        });
        attn.push(AttnLayout { mats, size: at });
    }
    let w = &model.weights;
    let vocab_mat = |v: &pi2_model::TensorView| {
        let t = f.tensor(&v.name).expect("checked at load");
        VocabMat {
            offset: f.data_offset + t.offset,
            ty: v.ty,
            rows: v.rows,
            cols: v.cols,
            row_bytes: t.size as usize / v.rows,
        }
    };
    let vocab = VocabLayout {
        embd: vocab_mat(&w.token_embd),
        output: vocab_mat(&w.output),
        tied: w.tied_output,
    };
    // A separate token embedding is read a row per token, never resident.
    let embd_bytes = match vocab.tied {
        true => 0,
        false => (vocab.embd.rows * vocab.embd.row_bytes) as u64,
    };
    let fixed: u64 = f
        .tensors
        .iter()
        .filter(|t| !is_bundle_tensor(&t.name))
        .map(|t| t.size)
        .sum::<u64>()
        - embd_bytes
        + kv_bytes
        + scratch
        + pad(EMBD_BATCH * vocab.embd.row_bytes) as u64;
    let stage = layout
        .iter()
        .map(|l| l.bytes(c.n_ff) + 3 * PAD)
        .max()
        .unwrap_or(0);
    let bundle = layout
        .iter()
        .map(|l| l.down.slot_at + pad(l.down.row_bytes))
        .max()
        .unwrap_or(0);
    Ok(Plan {
        layout,
        attn,
        vocab,
        fixed,
        stage,
        bundle,
    })
}

/// How a budget splits: regions, pinned neurons per layer and cold cache slots.
pub struct Regions {
    pub(crate) plan: Plan,
    /// The budget's regions (fixed, scratch, hot, cold).
    pub budget: Budget,
    /// Neurons pinned per layer (the first of each layer in the hot-first file order).
    pub hot_counts: Vec<usize>,
    /// Cold cache slots (one neuron bundle each).
    pub cold_slots: usize,
    /// The last layers that read their attention from flash each time they run.
    pub streamed_layers: usize,
    /// The last rows of the output matrix, read from flash each time logits are computed.
    pub streamed_output_rows: usize,
}

impl Regions {
    /// Bytes of one cold slot (a neuron's gate, up and down rows).
    pub fn slot_bytes(&self) -> usize {
        self.plan.bundle
    }

    /// Rows per read of streamed output rows.
    pub fn output_chunk_rows(&self) -> usize {
        self.plan.vocab.chunk_rows()
    }

    /// Bytes of the embedding row a token reads from flash: 0 if the embedding is resident
    /// (tied weights with no streamed rows; with some, only tokens among them read).
    pub fn embedding_row_bytes(&self) -> usize {
        let v = &self.plan.vocab;
        match v.tied && self.streamed_output_rows == 0 {
            true => 0,
            false => v.embd.row_bytes,
        }
    }
}

/// The smallest budget [`Offload::new`] accepts: the fixed region, prefill staging and one
/// layer of cache slots.
pub fn min_budget(
    model: &Model,
    sparse: &SparseFfn<'_>,
    kv_bytes: u64,
    scratch: u64,
) -> Result<u64, OffloadError> {
    let p = plan(model, sparse, kv_bytes, scratch)?;
    let (stage, min_cold) = least_regions(&p, &model.config);
    Ok(p.fixed_streaming(p.streaming(0, u64::MAX)) + stage + min_cold)
}

/// Prefill staging (two units) and the least neuron cache (the neurons of one decode step: a
/// layer, or the experts a token uses).
fn least_regions(p: &Plan, c: &pi2_model::ModelConfig) -> (u64, u64) {
    let min_cold = SlotCache::<Lru>::bytes_for(p.bundle, step_neurons(c), p.layout.len() * c.n_ff);
    (2 * pad(p.stage) as u64, min_cold)
}

/// Neurons one decode step may touch.
fn step_neurons(c: &pi2_model::ModelConfig) -> usize {
    c.n_ff * c.n_expert_used.max(1)
}

/// How [`Offload::new`] would split `budget` (no allocation, no I/O): planners size plans with
/// it. Errors name the minimum budget when it is too small.
pub fn regions(
    model: &Model,
    sparse: &SparseFfn<'_>,
    kv_bytes: u64,
    scratch: u64,
    frequency: Option<&[Vec<f32>]>,
    budget: u64,
    hot_share: f64,
) -> Result<Regions, OffloadError> {
    let c = &model.config;
    let n_ff = c.n_ff;
    let p = plan(model, sparse, kv_bytes, scratch)?;
    let n_units = p.layout.len();
    let mut budget = Budget::new(budget);
    let (stage_bytes, min_cold) = least_regions(&p, c);
    let streaming = p.streaming(budget.limit(), stage_bytes + min_cold);
    budget.reserve_with_minimum(
        Region::Fixed,
        p.fixed_streaming(streaming),
        "the fixed region (attention, norms, output, predictors, KV cache, buffers)",
        stage_bytes + min_cold,
    )?;
    budget.reserve_with_minimum(
        Region::Scratch,
        stage_bytes,
        "prefill staging (two FFN units)",
        min_cold,
    )?;
    let neuron_bytes = budget.left();
    if neuron_bytes < min_cold {
        budget.reserve_with_minimum(
            Region::Cold,
            min_cold,
            "the neuron cache (one decode step of bundles)",
            0,
        )?;
    }
    // Pinned hot neurons: the most frequent across units (file order is hot-first per unit).
    let hot_budget = ((neuron_bytes - min_cold) as f64 * hot_share.clamp(0.0, 1.0)) as u64;
    let hot_counts = hot_counts(&p.layout, n_ff, hot_budget, frequency);
    let hot_bytes: u64 = hot_counts
        .iter()
        .zip(&p.layout)
        .map(|(&h, l)| hot_block(l, h).2 as u64)
        .sum();
    budget.reserve(Region::Hot, hot_bytes, "pinned hot neurons")?;
    // The rest is the LRU cache, never more slots than neurons outside the pinned set.
    let unpinned = n_units * n_ff - hot_counts.iter().sum::<usize>();
    let slots = SlotCache::<Lru>::slots_in(budget.left(), p.bundle, n_units * n_ff)
        .min(unpinned)
        .max(step_neurons(c).min(unpinned).max(1));
    let cold_bytes = SlotCache::<Lru>::bytes_for(p.bundle, slots, n_units * n_ff);
    budget.reserve(Region::Cold, cold_bytes, "the neuron cache")?;
    Ok(Regions {
        plan: p,
        budget,
        hot_counts,
        cold_slots: slots,
        streamed_layers: streaming.attn_layers,
        streamed_output_rows: streaming.out_rows,
    })
}

impl Offload {
    /// Open `path` (the file `model` was loaded from) for offloaded FFN reads under `cfg.budget`.
    /// `kv_bytes` and `scratch` are the engine's KV cache and working buffers (fixed region).
    pub fn new(
        model: &Model,
        sparse: &SparseFfn<'_>,
        path: &Path,
        kv_bytes: u64,
        scratch: u64,
        frequency: Option<&[Vec<f32>]>,
        cfg: &OffloadConfig,
    ) -> Result<Offload, OffloadError> {
        let n_ff = model.config.n_ff;
        let Regions {
            plan: p,
            budget,
            hot_counts,
            cold_slots: slots,
            streamed_layers,
            streamed_output_rows,
        } = regions(
            model,
            sparse,
            kv_bytes,
            scratch,
            frequency,
            cfg.budget,
            cfg.hot_share,
        )?;
        let n_units = p.layout.len();
        let cache = SlotCache::new(n_units * n_ff, n_ff, p.bundle, slots, Lru::default())?;

        let (engine, direct, fallback) = open_engine(path, cfg)?;
        if engine.size() != model.file.file_size() {
            return Err(OffloadError::Model(format!(
                "{} is not the file the model was loaded from",
                path.display()
            )));
        }
        // Injected faults and an emulated device both wrap the file's engine.
        let reader = match cfg.faults.as_ref().or(cfg.emulate.as_ref()) {
            Some(plan) => Reader::new(
                pi2_io::FaultEngine::new(engine, plan.clone()),
                cfg.reader.clone(),
            ),
            None => Reader::new(engine, cfg.reader.clone()),
        };
        // Preload the pinned neurons with sequential reads.
        let mut hot = Vec::with_capacity(n_units);
        for (l, &h) in p.layout.iter().zip(&hot_counts) {
            let (up_at, down_at, size) = hot_block(l, h);
            let mut buf = AlignedBuf::new(size, PAD);
            if h > 0 {
                reader.read_exact_at(l.gate.offset, &mut buf[..h * l.gate.row_bytes])?;
                reader.read_exact_at(l.up.offset, &mut buf[up_at..up_at + h * l.up.row_bytes])?;
                reader.read_exact_at(
                    l.down.offset,
                    &mut buf[down_at..down_at + h * l.down.row_bytes],
                )?;
            }
            hot.push(HotLayer {
                n: h,
                buf,
                up_at,
                down_at,
            });
        }
        let stage = [AlignedBuf::new(p.stage, PAD), AlignedBuf::new(p.stage, PAD)];
        let attn_size = match streamed_layers {
            0 => 0,
            _ => p.attn.iter().map(|a| a.size).max().unwrap_or(0),
        };
        let attn_buf = [
            AlignedBuf::new(attn_size, PAD),
            AlignedBuf::new(attn_size, PAD),
        ];
        Ok(Offload {
            reader,
            layers: p.layout,
            hot,
            cache,
            stage,
            stage_unit: [None, None],
            stats: OffloadStats::default(),
            n_ff,
            stream_from: p.attn.len() - streamed_layers,
            attn: p.attn,
            attn_buf,
            attn_buf_layer: [None, None],
            attn_pending: AtomicU64::new(0),
            vocab: VocabStream::new(p.vocab, streamed_output_rows),
            budget,
            direct,
            fallback,
        })
    }

    /// The budget's breakdown by region.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Pinned neurons per unit.
    pub fn hot_counts(&self) -> Vec<usize> {
        self.hot.iter().map(|h| h.n).collect()
    }

    /// Cold cache slots (neuron bundles).
    pub fn cold_slots(&self) -> usize {
        self.cache.n_slots()
    }

    /// Layers whose attention is read from flash each time they run (the last ones).
    pub fn streamed_layers(&self) -> usize {
        self.attn.len() - self.stream_from
    }

    /// Output matrix rows read from flash each time logits are computed (the last ones).
    pub fn streamed_output_rows(&self) -> usize {
        self.vocab.streamed_rows()
    }

    /// Whether embedding lookups read rows from flash (a separate token embedding, or tied
    /// weights whose last rows stream).
    pub fn streams_embedding(&self) -> bool {
        self.vocab.streams_embedding()
    }

    pub fn stats(&self) -> &OffloadStats {
        &self.stats
    }

    pub fn reader_stats(&self) -> pi2_io::ReaderStats {
        self.reader.stats()
    }

    pub fn cache_stats(&self) -> &pi2_cache::CacheStats {
        self.cache.stats()
    }

    pub fn reset_stats(&mut self) {
        self.stats = OffloadStats::default();
        self.cache.reset_stats();
    }

    /// The read engine (`pread-direct`, ...) and why direct I/O is off, if it is.
    pub fn engine(&self) -> (&'static str, Option<&str>) {
        (self.reader.engine_name(), self.fallback.as_deref())
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl Offload {
    /// Byte ranges of a staged unit's gate, up and down blocks.
    fn stage_parts(&self, unit: usize) -> [(Part, usize, usize); 3] {
        let l = &self.layers[unit];
        let n = self.n_ff;
        let g = (l.gate, 0, n * l.gate.row_bytes);
        let u_at = pad(g.2);
        let u = (l.up, u_at, n * l.up.row_bytes);
        let d_at = u_at + pad(u.2);
        [g, u, (l.down, d_at, n * l.down.row_bytes)]
    }

    fn read_stage(&mut self, u: usize, b: usize) -> Result<(), IoError> {
        let parts = self.stage_parts(u);
        let base = self.stage[b].as_mut_ptr();
        let reqs = parts.map(|(p, at, len)| Request {
            offset: p.offset,
            len,
            // SAFETY: inside the staging buffer (sized for the largest unit).
            dst: unsafe { base.add(at) },
            tag: STAGE_TAG,
        });
        self.stage_unit[b] = Some(u);
        // SAFETY: the buffer is not read until `wait_stage` has received every completion.
        unsafe { self.reader.submit(&reqs) }
    }

    fn wait_stage(&mut self) -> Result<(), IoError> {
        while self.reader.outstanding() > 0 {
            match self.reader.recv().and_then(|c| c.result.map(|()| c.tag)) {
                Ok(tag) => self.received(tag),
                Err(e) => {
                    self.fail();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Account for a completion taken from the reader by whoever was waiting: a streamed
    /// read (attention, output rows, embedding rows) is no longer pending.
    pub(crate) fn received(&self, tag: u64) {
        let pending = match tag {
            ATTN_TAG => &self.attn_pending,
            EMBD_TAG => &self.vocab.embd_pending,
            t if t == OUT_TAG[0] => &self.vocab.pending[0],
            t if t == OUT_TAG[1] => &self.vocab.pending[1],
            _ => return,
        };
        pending.fetch_sub(1, AcqRel);
    }

    /// Receive completions (accounting for each) until `done`; the time blocked counts as
    /// I/O wait.
    fn wait_until(&mut self, done: impl Fn(&Offload) -> bool) -> Result<(), IoError> {
        let t0 = std::time::Instant::now();
        while !done(self) {
            match self.reader.recv().and_then(|c| c.result.map(|()| c.tag)) {
                Ok(tag) => self.received(tag),
                Err(e) => {
                    self.fail();
                    return Err(e);
                }
            }
        }
        self.stats.io_wait_ns += t0.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// After a failed read: wait out what is still in flight into this offload's buffers and
    /// forget what they held.
    pub(crate) fn fail(&mut self) {
        while self.reader.outstanding() > 0 && self.reader.recv().is_ok() {}
        self.attn_pending.store(0, Release);
        self.stage_unit = [None, None];
        self.attn_buf_layer = [None, None];
        self.vocab.forget();
    }

    /// Start reading layer `li`'s attention projections into buffer `b`.
    fn read_attention(&mut self, li: usize, b: usize) -> Result<(), IoError> {
        let a = self.attn[li];
        let base = self.attn_buf[b].as_mut_ptr();
        let reqs = a.mats.map(|m| Request {
            offset: m.offset,
            len: m.len,
            // SAFETY: inside the buffer (sized for the largest layer).
            dst: unsafe { base.add(m.at) },
            tag: ATTN_TAG,
        });
        self.attn_buf_layer[b] = Some(li);
        self.attn_pending.fetch_add(reqs.len() as u64, AcqRel);
        self.stats.attn_layer_reads += 1;
        self.stats.attn_bytes += a.mats.iter().map(|m| m.len as u64).sum::<u64>();
        // SAFETY: the buffer is not read until every attention read has been received
        // (`wait_attention`), and not written by anything else meanwhile.
        let submitted = unsafe { self.reader.submit(&reqs) };
        if submitted.is_err() {
            self.attn_pending.fetch_sub(reqs.len() as u64, AcqRel);
            self.attn_buf_layer[b] = None;
        }
        submitted
    }

    fn wait_attention(&mut self) -> Result<(), IoError> {
        self.wait_until(|o| o.attn_pending.load(Acquire) == 0)
    }

    /// Whether layer `li`'s attention streams from flash; if it does, make it resident (wait for
    /// its read, issuing it now if no earlier call prefetched it) and start reading the next
    /// streamed layer into the other buffer: after the last layer, the first streamed one,
    /// which the next token needs after the resident layers.
    pub(crate) fn stream_attention(&mut self, li: usize) -> Result<bool, IoError> {
        if li < self.stream_from {
            return Ok(false);
        }
        let b = match self.attn_buf_layer.iter().position(|&x| x == Some(li)) {
            Some(b) => b,
            None => {
                self.wait_attention()?;
                self.read_attention(li, 0)?;
                0
            }
        };
        self.wait_attention()?;
        let next = if li + 1 < self.attn.len() {
            li + 1
        } else {
            self.stream_from
        };
        if next != li && self.attn_buf_layer[1 - b] != Some(next) {
            self.read_attention(next, 1 - b)?;
        }
        Ok(true)
    }

    /// The q, k, v and output projections of streamed layer `li` (after
    /// [`Offload::stream_attention`] returned true for it).
    pub(crate) fn attention_mats(&self, li: usize) -> [MatRef<'_>; 4] {
        let b = self
            .attn_buf_layer
            .iter()
            .position(|&x| x == Some(li))
            .expect("the layer was streamed in");
        let buf = &self.attn_buf[b];
        self.attn[li].mats.map(|m| {
            MatRef::new(m.ty, m.rows, m.cols, &buf[m.at..m.at + m.len]).expect("checked at load")
        })
    }

    /// Make unit `u`'s whole FFN resident in a staging buffer (returned) and start reading unit
    /// `next` into the other one, so prefill computes while the next unit streams in.
    pub(crate) fn stage_unit(&mut self, u: usize, next: Option<usize>) -> Result<usize, IoError> {
        self.wait_stage()?;
        let b = match self.stage_unit.iter().position(|&x| x == Some(u)) {
            Some(b) => b,
            None => {
                self.read_stage(u, 0)?;
                self.wait_stage()?;
                0
            }
        };
        self.stats.dense_layer_reads += 1;
        if let Some(n) = next {
            self.read_stage(n, 1 - b)?;
        }
        Ok(b)
    }

    /// The staged gate, up and transposed down matrices of unit `u` in buffer `b`.
    pub(crate) fn stage_mats(
        &self,
        b: usize,
        u: usize,
        d: usize,
    ) -> (MatRef<'_>, MatRef<'_>, MatRef<'_>) {
        let buf = &self.stage[b];
        let [g, up, dn] = self.stage_parts(u).map(|(p, at, len)| {
            MatRef::new(p.ty, self.n_ff, d, &buf[at..at + len]).expect("checked at load")
        });
        (g, up, dn)
    }
}

type OpenedEngine = (Box<dyn ReadEngine>, bool, Option<String>);

/// The configured read engine, whether it reads direct, and why not if `O_DIRECT` was refused.
/// An emulated device always reads through `pread` from the page cache (its delays model the
/// device one read at a time).
fn open_engine(path: &Path, cfg: &OffloadConfig) -> Result<OpenedEngine, OffloadError> {
    let pread = |e: PreadEngine| {
        let (d, f) = (e.is_direct(), e.fallback_reason().map(String::from));
        (Box::new(e) as Box<dyn ReadEngine>, d, f)
    };
    Ok(match (&cfg.emulate, cfg.engine) {
        (Some(_), _) => pread(PreadEngine::open_cached(path)?),
        (None, IoEngine::Pread) => pread(PreadEngine::open(path, cfg.direct)?),
        #[cfg(target_os = "linux")]
        (None, IoEngine::Uring) => {
            let e = pi2_io::UringEngine::open(path, cfg.direct, cfg.reader.depth)?;
            let (d, f) = (e.is_direct(), e.fallback_reason().map(String::from));
            (Box::new(e), d, f)
        }
        #[cfg(not(target_os = "linux"))]
        (None, IoEngine::Uring) => {
            return Err(OffloadError::Model(
                "the io_uring engine needs Linux; use the pread engine".into(),
            ))
        }
    })
}

/// Tag of staging reads (prefill), distinct from decode's neuron tags.
const STAGE_TAG: u64 = u64::MAX;
/// Tag of streamed attention reads.
pub(crate) const ATTN_TAG: u64 = u64::MAX - 1;
/// Tags from here on are streamed reads (not neurons): [`Offload::received`] accounts for them.
pub(crate) const FIRST_STREAM_TAG: u64 = EMBD_TAG;

/// Offsets of the up and down blocks and the total size of a hot block of `h` neurons.
fn hot_block(l: &FfnLayout, h: usize) -> (usize, usize, usize) {
    let up_at = pad(h * l.gate.row_bytes);
    let down_at = up_at + pad(h * l.up.row_bytes);
    (up_at, down_at, down_at + pad(h * l.down.row_bytes))
}

/// How many neurons of each layer to pin with `bytes`: the globally most frequent (by the
/// profile), else the same number per layer.
fn hot_counts(
    layout: &[FfnLayout],
    n_ff: usize,
    bytes: u64,
    frequency: Option<&[Vec<f32>]>,
) -> Vec<usize> {
    let per = |l: &FfnLayout| (l.gate.row_bytes + l.up.row_bytes + l.down.row_bytes) as u64;
    // Each layer's three blocks are padded.
    let bytes = bytes.saturating_sub((3 * PAD * layout.len()) as u64);
    let mut counts = vec![0usize; layout.len()];
    match frequency {
        Some(freq) if freq.len() == layout.len() && freq.iter().all(|f| f.len() == n_ff) => {
            let mut all: Vec<(f32, usize)> = freq
                .iter()
                .enumerate()
                .flat_map(|(li, f)| f.iter().map(move |&v| (v, li)))
                .collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut left = bytes;
            for (_, li) in all {
                let cost = per(&layout[li]);
                if left < cost {
                    break;
                }
                left -= cost;
                counts[li] += 1;
            }
        }
        _ => {
            let total: u64 = layout.iter().map(per).sum::<u64>().max(1);
            let h = (bytes / total) as usize;
            counts.iter_mut().for_each(|c| *c = h.min(n_ff));
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight layers of 10,000 attention bytes (buffers of 10,240) and a 1000-row output
    /// matrix of 64-byte rows (chunks of 56 rows, two buffers of 7168 bytes), in a fixed region
    /// of 200,000 bytes.
    fn plan() -> Plan {
        let mat = |at| AttnMat {
            offset: 0,
            len: 2500,
            at,
            ty: QuantType::Q8_0,
            rows: 1,
            cols: 1,
        };
        let out = VocabMat {
            offset: 0,
            ty: QuantType::Q8_0,
            rows: 1000,
            cols: 32,
            row_bytes: 64,
        };
        Plan {
            layout: Vec::new(),
            attn: vec![
                AttnLayout {
                    mats: [mat(0), mat(2560), mat(5120), mat(7680)],
                    size: 10240,
                };
                8
            ],
            vocab: VocabLayout {
                embd: out,
                output: out,
                tied: true,
            },
            fixed: 200_000,
            stage: 0,
            bundle: 0,
        }
    }

    #[test]
    fn streaming_reads_the_least_that_fits() {
        let p = plan();
        assert_eq!(p.vocab.chunk_rows(), 56);
        let s = |attn_layers, out_rows| Streaming {
            attn_layers,
            out_rows,
        };
        // (bytes short of the budget, hand-computed choice)
        for (short, want) in [
            (0, s(0, 0)),
            // 1000 + 7168 bytes of buffers = 127.6 rows; resident rows 872 (a multiple of 8).
            (1000, s(0, 128)),
            // Streaming 3 layers would also fit but reads 30,000 bytes; 192 rows read 12,288.
            (5000, s(0, 192)),
            // Output rows alone cannot free 60,000 bytes; of the mixes, 6 layers + 432 rows
            // read the least (87,648 bytes; 3 layers + 904 rows 87,856; 8 + 120 87,680).
            (60_000, s(6, 432)),
        ] {
            let got = p.streaming(200_000 - short, 0);
            assert_eq!(got, want, "{short} short");
            assert!(p.fixed_streaming(got) <= 200_000 - short);
        }
        assert_eq!(p.streamed_bytes(s(6, 432)), 87_648);
        // Nothing fits: everything streams, the smallest fixed region (200,000 - 59,520 -
        // 56,832), which is the minimum budget.
        let all = p.streaming(200_000 - 120_000, 0);
        assert_eq!(all, s(8, 1000));
        assert_eq!(p.fixed_streaming(all), 83_648);
        assert_eq!(p.streaming(83_648, 0), all);
    }
}
