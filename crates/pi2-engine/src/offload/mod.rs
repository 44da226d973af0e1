//! Models larger than memory: the FFN neuron bundles of a converted model stay on flash and are
//! read on demand into a segmented cache (pinned hot neurons + LRU cold slots) under one byte
//! budget. The unit of layout, pinning and caching is an FFN unit: a layer's FFN, or one expert
//! of a mixture-of-experts layer (unit `layer * n_expert + expert`). The engine's cluster
//! pipeline computes resident clusters while the I/O thread reads missing rows; it reaches the
//! cache only through the `StepRows` interface (`residency.rs` here).
//!
//! Files: `layout` (where everything lies, how a budget splits, what streams), `streaming`
//! (prefill staging and streamed attention), `vocab` (embedding and output rows), `residency`
//! (the neuron rows of a decode step), `store` (all of it as the engine's weight store).
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
//! StepRows never changes arithmetic: the same rows in the same clusters give the same logits
//! as in-memory sparse decode.

use crate::EngineError;
mod experts;
mod layout;
mod moving;
mod residency;
mod routing_memory;
mod store;
mod streaming;
mod vocab;

use crate::residency::Tag;
use crate::sparse::SparseFfn;
pub(crate) use experts::Streamed;
pub use experts::{expert_budget, ExpertBudget, ExpertStats, ExpertStream};
pub(crate) use layout::Part;
use layout::{hot_block, least_cold_slots, AttnLayout, FfnLayout, HotLayer, PAD};
pub use layout::{min_budget, planned_min_budget, regions, PlannedConversion, Regions};
use pi2_cache::{Budget, Lru, SlotCache};
use pi2_io::{
    AlignedBuf, Checksums, IoEngine, IoError, OpenedEngine, PreadEngine, ReadEngine, Reader,
    ReaderConfig, SumRegion,
};
use pi2_model::Model;
use std::path::Path;
use std::sync::Arc;
pub(crate) use store::Offloaded;
use vocab::VocabStream;

use std::sync::atomic::{AtomicU64, Ordering::AcqRel, Ordering::Release};

/// How to offload.
#[derive(Clone, Debug)]
pub struct OffloadConfig {
    /// Bytes the engine may keep resident: fixed region, pinned hot neurons, cold cache,
    /// working buffers and `process`.
    pub budget: u64,
    /// Bytes the process holds outside the engine's regions (code, heap: tokenizer, metadata,
    /// parsed profile; slack for later allocations), charged against `budget` first so that
    /// the budget bounds the whole process. 0 leaves them outside the budget.
    pub process: u64,
    /// Share of the neuron memory pinned to the hottest neurons (the rest is the LRU cache).
    pub hot_share: f64,
    /// Bytes the KV cache may grow by beyond what [`Offload::new`] is given: the budget keeps
    /// them for it before making attention or output rows resident, in the neuron memory,
    /// which gives them back as positions are written. 0: the KV cache given is all there is.
    pub kv_growth: u64,
    /// Use `O_DIRECT` (falls back to buffered reads with dropped pages where refused).
    pub direct: bool,
    pub engine: IoEngine,
    pub reader: ReaderConfig,
    /// Inject faults/latency (tests, the ablation bench).
    pub faults: Option<pi2_io::FaultPlan>,
    /// Read from an emulated device of this speed ([`pi2_io::emulated`]) instead of the file's
    /// real device.
    pub emulate: Option<pi2_io::FaultPlan>,
    /// Per layer, whether it runs dense when every row of it is pinned (a plan says where that
    /// is faster on the device), computing what the sparse step would; `None`: none does, so
    /// decode's text does not depend on how a budget splits. Only with
    /// [`crate::EngineConfig::dense_resident`] and no predictor.
    pub dense_layers: Option<Vec<bool>>,
    /// A plain mixture's streamed experts: read the next layer's likely experts ahead, on the
    /// next layer's router applied to this layer's input ([`ExpertStream`]).
    pub prefetch_experts: bool,
    /// Which streamed experts the cache keeps when it is full.
    pub expert_cache: ExpertCache,
    /// A plain mixture's streamed experts: a file where how often each expert was chosen is kept
    /// between runs (read when the stream opens, saved when it closes), so a `frequent` cache
    /// keeps the popular experts from the first token. `None`: each run starts from zero.
    pub routing_memory: Option<std::path::PathBuf>,
}

/// Which experts a full expert cache keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertCache {
    /// The most recently chosen.
    Recent,
    /// The most often chosen over the run (the least recent among equals): a layer's popular
    /// experts stay pinned by their counts while one-off choices pass through.
    #[default]
    Frequent,
}

impl ExpertCache {
    /// The cache's eviction policy; `frequent` starts from `prior` counts where given.
    pub fn policy(self, prior: Option<Vec<u32>>) -> Box<dyn pi2_cache::EvictionPolicy> {
        match self {
            ExpertCache::Recent => Box::new(pi2_cache::Lru::default()),
            ExpertCache::Frequent => {
                Box::new(pi2_cache::Frequent::with_prior(prior.unwrap_or_default()))
            }
        }
    }
}

impl std::str::FromStr for ExpertCache {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "recent" | "lru" => Ok(ExpertCache::Recent),
            "frequent" => Ok(ExpertCache::Frequent),
            other => Err(format!(
                "`{other}` is not an expert cache: recent or frequent"
            )),
        }
    }
}

impl Default for OffloadConfig {
    fn default() -> Self {
        Self {
            budget: u64::MAX,
            process: 0,
            hot_share: 1.0,
            kv_growth: 0,
            direct: true,
            engine: IoEngine::default(),
            reader: ReaderConfig::default(),
            faults: None,
            emulate: None,
            dense_layers: None,
            prefetch_experts: true,
            expert_cache: ExpertCache::default(),
            routing_memory: None,
        }
    }
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
    /// Units (layers, or experts) read whole for dense batches (prefill, checked drafts), and
    /// their bytes.
    pub dense_layer_reads: u64,
    pub stage_bytes: u64,
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
    reader: Reader,
    /// Per unit.
    layers: Vec<FfnLayout>,
    hot: Vec<HotLayer>,
    cache: SlotCache<Lru>,
    /// Two unit-sized buffers: prefill computes from one while the next unit is read into
    /// the other.
    stage: [AlignedBuf; 2],
    stage_unit: [Option<usize>; 2],
    stats: OffloadStats,
    n_ff: usize,
    /// Streamed attention: every layer's projections in the file, the first streamed layer
    /// (layers from it on are read each time they run), two layer buffers, and the streamed
    /// reads not yet received.
    attn: Vec<AttnLayout>,
    stream_from: usize,
    attn_buf: [AlignedBuf; 2],
    attn_buf_layer: [Option<usize>; 2],
    attn_pending: AtomicU64,
    /// The token embedding and output matrix: resident rows and streamed ones.
    vocab: VocabStream,
    budget: Budget,
    /// The KV cache's bytes charged so far (`moving`), and what may not be given back to it:
    /// the least cold slots; per unit, the firing frequency of each file neuron (which pinned
    /// rows go first).
    kv_charged: u64,
    least_slots: usize,
    frequency: Option<Vec<Vec<f32>>>,
    direct: bool,
    fallback: Option<String>,
    dense_layers: Option<Vec<bool>>,
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
    ) -> Result<Offload, EngineError> {
        let n_ff = model.config.n_ff;
        let Regions {
            layout: p,
            budget,
            hot_counts,
            hot_gate_counts,
            cold_slots: slots,
            streamed_layers,
            streamed_output_rows,
        } = regions(
            model,
            sparse,
            kv_bytes,
            cfg.kv_growth,
            scratch,
            frequency,
            cfg.budget,
            cfg.hot_share,
            cfg.process,
        )?;
        let table = pi2_model::checksum::table(&model.file)?;
        if let Some(t) = &table {
            verify_resident(model, t, &p, streamed_layers, streamed_output_rows)?;
        }
        let n_units = p.ffn.len();
        let cache = SlotCache::new(n_units * n_ff, n_ff, p.bundle, slots, Lru::default())?;

        let OpenedEngine {
            engine,
            direct,
            fallback,
        } = open_engine(path, cfg)?;
        if engine.size() != model.file.file_size() {
            return Err(EngineError::Offload(format!(
                "{} is not the file the model was loaded from",
                path.display()
            )));
        }
        // Every read is checked against the converted file's checksums as it lands.
        let sums = table.map(|t| checksums(t, path)).transpose()?;
        // Injected faults and an emulated device both wrap the file's engine.
        let reader = match cfg.faults.as_ref().or(cfg.emulate.as_ref()) {
            Some(plan) => Reader::with_checksums(
                pi2_io::FaultEngine::new(engine, plan.clone()),
                cfg.reader.clone(),
                sums,
            )?,
            None => Reader::with_checksums(engine, cfg.reader.clone(), sums)?,
        };
        // Preload the pinned rows with sequential reads.
        let mut hot = Vec::with_capacity(n_units);
        for ((l, &h), &g) in p.ffn.iter().zip(&hot_counts).zip(&hot_gate_counts) {
            let (up_at, down_at, size) = hot_block(l, g, h);
            let mut buf = AlignedBuf::new(size, PAD);
            if g > 0 {
                reader.read_exact_at(l.gate.offset, &mut buf[..g * l.gate.row_bytes])?;
            }
            if h > 0 {
                reader.read_exact_at(l.up.offset, &mut buf[up_at..up_at + h * l.up.row_bytes])?;
                reader.read_exact_at(
                    l.down.offset,
                    &mut buf[down_at..down_at + h * l.down.row_bytes],
                )?;
            }
            hot.push(HotLayer {
                n: h,
                n_gate: g,
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
            layers: p.ffn,
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
            kv_charged: kv_bytes,
            least_slots: least_cold_slots(&model.config, slots),
            frequency: frequency.map(|f| f.to_vec()),
            direct,
            fallback,
            dense_layers: cfg.dense_layers.clone(),
        })
    }

    /// FFN units (layers, or layers x experts).
    pub fn units(&self) -> usize {
        self.layers.len()
    }

    /// Neurons per unit.
    pub fn n_ff(&self) -> usize {
        self.n_ff
    }

    /// The budget's breakdown by region.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Neurons pinned whole per unit.
    pub fn hot_counts(&self) -> Vec<usize> {
        self.hot.iter().map(|h| h.n).collect()
    }

    /// Neurons whose gate row is pinned per unit (at least [`Offload::hot_counts`]).
    pub fn hot_gate_counts(&self) -> Vec<usize> {
        self.hot.iter().map(|h| h.n_gate).collect()
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

    /// Bytes of one token embedding row (what a lookup of a non-resident row reads).
    pub fn embedding_row_bytes(&self) -> usize {
        self.vocab.embedding_row_bytes()
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

    /// Puts back counts taken before passes that are not to be counted (drafts).
    pub(crate) fn restore_stats(&mut self, stats: OffloadStats) {
        self.stats = stats;
    }

    /// The read engine (`pread-direct`, ...) and why direct I/O is off, if it is.
    pub fn engine(&self) -> (&'static str, Option<&str>) {
        (self.reader.engine_name(), self.fallback.as_deref())
    }

    /// Reads the reader hands the engine at once.
    pub fn io_depth(&self) -> usize {
        self.reader.depth()
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl Offload {
    /// Account for a completion taken from the reader by whoever was waiting: a streamed
    /// read (attention, output rows, embedding rows) is no longer pending.
    pub(crate) fn received(&self, tag: Tag) {
        let pending = match tag {
            Tag::Attention => &self.attn_pending,
            Tag::Embedding => &self.vocab.embd_pending,
            Tag::Output(b) => &self.vocab.pending[b],
            Tag::Gate(_) | Tag::UpDown(_) | Tag::Stage => return,
        };
        pending.fetch_sub(1, AcqRel);
    }

    /// Receive completions (accounting for each) until `done`; the time blocked counts as
    /// I/O wait.
    fn wait_until(&mut self, done: impl Fn(&Offload) -> bool) -> Result<(), IoError> {
        let t0 = std::time::Instant::now();
        while !done(self) {
            match self.reader.recv().and_then(|c| c.result.map(|()| c.tag)) {
                Ok(tag) => self.received(Tag::decode(tag)),
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
}

/// Check what stays resident (mapped, never read again through the reader) against the
/// checksum table: every tensor but the neurons, a separate token embedding, the streamed
/// layers' attention and the streamed output rows, which the reader checks as they land.
fn verify_resident(
    model: &Model,
    sums: &[pi2_model::checksum::TensorSums],
    p: &layout::Layout,
    streamed_layers: usize,
    streamed_output_rows: usize,
) -> Result<(), EngineError> {
    let f = &model.file;
    let streamed_attn: Vec<u64> = p.attn[p.attn.len() - streamed_layers..]
        .iter()
        .flat_map(|a| a.mats.iter().map(|m| m.offset))
        .collect();
    let v = &p.vocab;
    pi2_model::checksum::verify_mapped(f, sums, |t| {
        let at = f.data_offset + t.offset;
        if pi2_model::bundle::is_neuron_tensor(&t.name)
            || streamed_attn.contains(&at)
            || (!v.tied && at == v.embd.offset)
        {
            0
        } else if at == v.output.offset {
            v.output.rows - streamed_output_rows
        } else {
            usize::MAX
        }
    })?;
    Ok(())
}

/// The reader's checksum table: every record of the converted file's tensors (at `path`, which
/// a mismatch names).
fn checksums(
    table: Vec<pi2_model::checksum::TensorSums>,
    path: &Path,
) -> Result<Arc<Checksums>, EngineError> {
    let regions = table
        .into_iter()
        .map(|t| SumRegion {
            name: t.name,
            offset: t.offset,
            record_len: t.record_len,
            sums: t.sums,
        })
        .collect();
    Ok(Arc::new(Checksums::new(regions)?.for_file(path)))
}

/// The configured read engine. An emulated device always reads through `pread` from the page
/// cache (its delays model the device one read at a time).
fn open_engine(path: &Path, cfg: &OffloadConfig) -> Result<OpenedEngine, EngineError> {
    Ok(match cfg.emulate {
        Some(_) => OpenedEngine::from_pread(PreadEngine::open_cached(path)?),
        None => cfg.engine.open(path, cfg.direct, cfg.reader.depth)?,
    })
}
