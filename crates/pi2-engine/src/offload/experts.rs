//! Whole experts of a plain mixture-of-experts GGUF streamed from flash through an owned cache,
//! with no conversion: an expert's slice of each stacked tensor (`ffn_gate_exps`, `ffn_up_exps`,
//! `ffn_down_exps`) is already one contiguous run of the file, so an expert is read as three
//! large reads into one slot of a [`SlotCache`] (key `layer * n_expert + expert`). Every
//! other tensor stays resident: attention and the output matrix as the engine's own copies
//! (outside the page cache), norms, routers and the embedding rows from the mapping.
//!
//! A layer's chosen experts are gathered in waves ([`ExpertStream::gather`]): every one of a wave
//! not cached is put in flight at once (several reads in flight, in the reader's queue), and the
//! layer computes them in its own order as they land. A wave is as many experts as the cache
//! can hold at once, so a prefill batch that routes to more experts than there are slots runs in
//! several waves, each chosen expert read once per batch. What is computed never depends on
//! where an expert came from: the same bytes, the same order, the same sums as in memory.

use super::routing_memory::RoutingMemory;
use super::{open_engine, OffloadConfig};
use crate::weights::{FfnCopies, FfnMats, Resident, SparseCall, Store, Table};
use crate::EngineError;
use pi2_cache::{Budget, EvictionPolicy, Lru, Region, Slot, SlotCache};
use pi2_io::{Reader, Request};
use pi2_kernels::{ActBuf, KernelSet, MatRef};
use pi2_model::{Model, TensorView, TokenId};
use std::path::Path;

/// One stacked tensor of an expert layer: where it starts in the file, one expert's bytes.
#[derive(Clone, Copy, Debug)]
struct Stack {
    offset: u64,
    expert_bytes: usize,
}

/// Gate, up and down of one layer's experts, or `None` for a layer without experts.
type ExpertLayer = Option<[Stack; 3]>;

/// What streamed experts did since the last reset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertStats {
    /// Chosen experts found in the cache, and read from flash.
    pub hits: u64,
    pub reads: u64,
    /// Bytes of experts read from flash.
    pub bytes: u64,
    /// Time computation waited for reads, in nanoseconds.
    pub io_wait_ns: u64,
    /// Waves of a layer's experts (one per layer and batch unless the cache is smaller than
    /// what the batch chose).
    pub waves: u64,
    /// Experts read ahead on a guess of the next layer's choice, and those of them the layer
    /// then chose (counted in neither `hits` nor `reads`).
    pub prefetched: u64,
    pub prefetch_used: u64,
}

impl ExpertStats {
    /// Share of chosen experts served from memory (a prefetched one counts as read).
    pub fn hit_rate(&self) -> f64 {
        let reads = self.reads + self.prefetch_used;
        self.hits as f64 / (self.hits + reads).max(1) as f64
    }

    /// Share of experts read ahead that the next layer chose.
    pub fn prefetch_accuracy(&self) -> f64 {
        self.prefetch_used as f64 / self.prefetched.max(1) as f64
    }
}

/// Bytes a budget holds for an expert stream, by part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertBudget {
    /// Every tensor but the experts.
    pub resident: u64,
    /// One expert's gate, up and down (the largest layer's).
    pub expert: u64,
    /// What one more expert in the cache takes (its bytes, aligned, and its entry).
    pub slot: u64,
    /// The least: resident tensors, KV cache, buffers, process, and one token's experts.
    pub minimum: u64,
}

/// Bytes of the budget for `model`: its resident part, one expert, and the least budget with
/// `fixed` more bytes (KV cache, buffers, this process) beside the experts of one token.
pub fn expert_budget(model: &Model, fixed: u64) -> ExpertBudget {
    let layers = expert_layers(model);
    let expert = layers
        .iter()
        .flatten()
        .map(|s| s.iter().map(|p| p.expert_bytes as u64).sum::<u64>())
        .max()
        .unwrap_or(0);
    let stacked: u64 = model
        .weights
        .layers
        .iter()
        .filter(|l| l.router.is_some())
        .map(|l| {
            [&l.gate, &l.up, &l.down]
                .map(|t| t.bytes(&model.file))
                .iter()
                .sum::<u64>()
        })
        .sum();
    let resident = model.file.file_size() - stacked;
    let slot = slot_cost(expert as usize);
    let keys = KEY_COST * (model.config.n_layer * model.config.n_expert) as u64;
    ExpertBudget {
        resident,
        expert,
        slot,
        minimum: resident + fixed + keys + slot * model.config.n_expert_used.max(1) as u64,
    }
}

/// Bytes of the expert cache per key: the cache's slot table and the policy's count.
const KEY_COST: u64 = 4 + 4;

/// Bytes of the expert cache per slot: the expert, the cache's tables, and the policy's key
/// and time of the slot.
fn slot_cost(expert: usize) -> u64 {
    SlotCache::<Lru>::bytes_for(expert, 1, 0) + 4 + 8
}

fn expert_layers(model: &Model) -> Vec<ExpertLayer> {
    let (f, ne) = (&model.file, model.config.n_expert.max(1));
    let stack = |t: &TensorView| Stack {
        offset: t.file_offset(f),
        expert_bytes: (t.bytes(f) / ne as u64) as usize,
    };
    model
        .weights
        .layers
        .iter()
        .map(|l| {
            l.router
                .as_ref()
                .map(|_| [stack(&l.gate), stack(&l.up), stack(&l.down)])
        })
        .collect()
}

/// The streamed experts of one plain model: reader, cache, what is in flight.
pub struct ExpertStream {
    reader: Reader,
    layers: Vec<ExpertLayer>,
    n_expert: usize,
    cache: SlotCache<Box<dyn EvictionPolicy>>,
    /// Per slot: reads of the slot's expert still in flight.
    landing: Vec<u8>,
    /// Units put in flight by the current wave, and read ahead for the next one.
    wave: Vec<u32>,
    ahead: Vec<u32>,
    budget: Budget,
    /// Slots the KV cache may never take back: one token's experts.
    least_slots: usize,
    kv_charged: u64,
    stats: ExpertStats,
    direct: bool,
    fallback: Option<String>,
    prefetch: bool,
    /// How often each unit was computed this run, and the routing kept between runs.
    chosen: Vec<u32>,
    memory: Option<RoutingMemory>,
}

impl ExpertStream {
    /// Opens `path` (the file `model` was loaded from) to stream `model`'s experts under
    /// `cfg.budget`, beside `kv_bytes` of KV cache and `scratch` bytes of working buffers.
    pub fn new(
        model: &Model,
        path: &Path,
        kv_bytes: u64,
        scratch: u64,
        cfg: &OffloadConfig,
    ) -> Result<ExpertStream, EngineError> {
        let c = &model.config;
        if c.n_expert == 0 {
            return Err(EngineError::Offload(
                "streaming experts needs a mixture-of-experts model".into(),
            ));
        }
        let fixed = kv_bytes + scratch + cfg.process;
        let need = expert_budget(model, fixed);
        let mut budget = Budget::new(cfg.budget);
        let over = |_: pi2_cache::CacheError| pi2_cache::CacheError::OverBudget {
            what: "the resident tensors, the KV cache and one token's experts".into(),
            need: need.minimum,
            left: cfg.budget,
            limit: cfg.budget,
            minimum: need.minimum,
        };
        budget
            .reserve(Region::Process, cfg.process, "this process")
            .and_then(|()| budget.reserve(Region::Fixed, need.resident + kv_bytes, "resident"))
            .and_then(|()| budget.reserve(Region::Scratch, scratch, "buffers"))
            .map_err(over)?;
        let keys = c.n_layer * c.n_expert;
        let per_slot = slot_cost(need.expert as usize);
        let slots = (budget.left().saturating_sub(KEY_COST * keys as u64) / per_slot) as usize;
        let slots = slots.min(keys);
        if slots < c.n_expert_used.max(1) {
            return Err(over(pi2_cache::CacheError::Empty).into());
        }
        let memory = (cfg.routing_memory.as_deref())
            .map(|p| RoutingMemory::open(p, model.file.file_size(), keys));
        let cache = SlotCache::new(
            keys,
            c.n_expert,
            need.expert as usize,
            slots,
            cfg.expert_cache
                .policy(memory.as_ref().and_then(RoutingMemory::seed)),
        )?;
        let cold = per_slot * slots as u64 + KEY_COST * keys as u64;
        budget
            .reserve(Region::Cold, cold, "expert cache")
            .map_err(over)?;
        let opened = open_engine(path, cfg)?;
        if opened.engine.size() != model.file.file_size() {
            return Err(EngineError::Offload(format!(
                "{} is not the file the model was loaded from",
                path.display()
            )));
        }
        let reader = match cfg.faults.as_ref().or(cfg.emulate.as_ref()) {
            Some(plan) => Reader::new(
                pi2_io::FaultEngine::new(opened.engine, plan.clone()),
                cfg.reader.clone(),
            )?,
            None => Reader::new(opened.engine, cfg.reader.clone())?,
        };
        Ok(ExpertStream {
            reader,
            layers: expert_layers(model),
            n_expert: c.n_expert,
            landing: vec![0; slots],
            wave: Vec::new(),
            ahead: Vec::new(),
            cache,
            budget,
            least_slots: c.n_expert_used.max(1),
            kv_charged: kv_bytes,
            stats: ExpertStats::default(),
            direct: opened.direct,
            fallback: opened.fallback,
            prefetch: cfg.prefetch_experts,
            chosen: vec![0; keys],
            memory,
        })
    }

    /// Whether the cache started from a routing kept by an earlier run.
    pub fn remembers_routing(&self) -> bool {
        self.memory.as_ref().is_some_and(RoutingMemory::has_counts)
    }

    pub fn stats(&self) -> &ExpertStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = ExpertStats::default();
    }

    /// Whether the next layer's likely experts are read ahead.
    pub fn prefetches(&self) -> bool {
        self.prefetch
    }

    /// The reader's counters since it started.
    pub fn reader_stats(&self) -> pi2_io::ReaderStats {
        self.reader.stats()
    }

    /// Experts the cache holds at once.
    pub fn slots(&self) -> usize {
        self.cache.n_slots()
    }

    /// Which experts the full cache keeps (its eviction policy's name).
    pub fn cache_policy(&self) -> &'static str {
        self.cache.policy_name()
    }

    /// Bytes of one expert (a slot).
    pub fn expert_bytes(&self) -> usize {
        self.cache.slot_bytes()
    }

    /// The budget's split: (region, bytes).
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The reader's engine name and reads in flight.
    pub fn engine(&self) -> (&'static str, usize) {
        (self.reader.engine_name(), self.reader.depth())
    }

    /// Whether reads bypass the page cache, and why not when they do not.
    pub fn direct(&self) -> (bool, Option<&str>) {
        (self.direct, self.fallback.as_deref())
    }

    /// Starts a wave: the longest prefix of `units` (experts of one layer, each once) the cache
    /// holds at once, every one not cached put in flight. Returns the prefix's length (at least
    /// one). Nothing may be in flight from an earlier wave.
    pub(crate) fn gather(&mut self, units: &[usize]) -> Result<usize, EngineError> {
        // What was read ahead lands first: no slot may change hands with a read in flight.
        self.drain()?;
        self.cache.begin_step();
        self.stats.waves += 1;
        let mut reqs = Vec::with_capacity(3 * units.len());
        self.wave.clear();
        let ahead = std::mem::take(&mut self.ahead);
        let mut taken = 0;
        for &unit in units {
            if self.cache.lookup(unit as u32).is_some() {
                match ahead.contains(&(unit as u32)) {
                    true => self.stats.prefetch_used += 1,
                    false => self.stats.hits += 1,
                }
                taken += 1;
                continue;
            }
            let Some(slot) = self.cache.insert(unit as u32) else {
                break;
            };
            self.wave.push(unit as u32);
            if let Err(e) = self.reads_for(unit, slot, &mut reqs) {
                self.forget();
                return Err(e);
            }
            self.stats.reads += 1;
            taken += 1;
        }
        // SAFETY: every destination is a slot of this wave, which no one reads until its
        // reads have landed (`wait`) and no later insert evicts within the wave.
        if let Err(e) = unsafe { self.reader.submit(&reqs) } {
            self.forget();
            return Err(e.into());
        }
        Ok(taken.max(1).min(units.len()))
    }

    /// Puts in flight the reads of `units` not cached (a guess of the next wave), as far as
    /// slots not used by the current wave allow. A wrong guess costs reads, never an answer.
    pub(crate) fn prefetch(&mut self, units: &[usize]) -> Result<(), EngineError> {
        let mut reqs = Vec::with_capacity(3 * units.len());
        for &unit in units {
            if self.cache.peek(unit as u32).is_some() {
                continue;
            }
            let Some(slot) = self.cache.insert(unit as u32) else {
                break;
            };
            self.ahead.push(unit as u32);
            self.wave.push(unit as u32);
            if let Err(e) = self.reads_for(unit, slot, &mut reqs) {
                self.forget();
                return Err(e);
            }
            self.stats.prefetched += 1;
        }
        // SAFETY: as in `gather`: the slots are this step's, never evicted before the next
        // `gather`, which waits for every read in flight first.
        if let Err(e) = unsafe { self.reader.submit(&reqs) } {
            self.forget();
            return Err(e.into());
        }
        Ok(())
    }

    /// Waits for every read in flight.
    fn drain(&mut self) -> Result<(), EngineError> {
        self.land_until(|x| x.reader.outstanding() == 0)
    }

    /// Receives completed reads until `done`, counting the time as I/O wait; a failed read
    /// forgets the wave.
    fn land_until(&mut self, done: impl Fn(&Self) -> bool) -> Result<(), EngineError> {
        if done(self) {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        while !done(self) {
            match self.reader.recv().and_then(|c| c.result.map(|()| c.tag)) {
                Ok(tag) => self.landing[tag as usize] -= 1,
                Err(e) => {
                    self.forget();
                    return Err(e.into());
                }
            }
        }
        self.stats.io_wait_ns += t0.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// The three reads of `unit` into `slot`.
    fn reads_for(
        &mut self,
        unit: usize,
        slot: Slot,
        reqs: &mut Vec<Request>,
    ) -> Result<(), EngineError> {
        let (li, e) = (unit / self.n_expert, unit % self.n_expert);
        let Some(stacks) = self.layers.get(li).copied().flatten() else {
            return Err(EngineError::Offload(format!("layer {li} has no experts")));
        };
        let base = self.cache.slot_ptr(slot);
        let mut at = 0;
        for s in stacks {
            reqs.push(Request {
                offset: s.offset + (e * s.expert_bytes) as u64,
                len: s.expert_bytes,
                // SAFETY (of the pointer arithmetic): the slot holds the three parts.
                dst: unsafe { base.add(at) },
                tag: slot.0 as u64,
            });
            at += s.expert_bytes;
            self.stats.bytes += s.expert_bytes as u64;
        }
        self.landing[slot.0 as usize] = 3;
        Ok(())
    }

    /// After a failed submission or read: what is in flight lands (or fails) before anything
    /// else, and nothing of the wave stays cached half-read.
    fn forget(&mut self) {
        while self.reader.outstanding() > 0 && self.reader.recv().is_ok() {}
        self.landing.fill(0);
        for &unit in &self.wave {
            self.cache.remove(unit);
        }
        self.wave.clear();
        self.ahead.clear();
    }

    /// Unit `unit`'s gate, up and down, waiting for its reads. It must be in the current wave.
    pub(crate) fn mats<'a>(
        &'a mut self,
        unit: usize,
        shapes: [(pi2_kernels::QuantType, usize, usize); 3],
    ) -> Result<[MatRef<'a>; 3], EngineError> {
        let slot = self
            .cache
            .peek(unit as u32)
            .ok_or_else(|| EngineError::Offload(format!("expert unit {unit} was not gathered")))?;
        self.wait(slot)?;
        // SAFETY: the slot's reads have all landed and nothing writes it within the wave.
        let bytes = unsafe { self.cache.slot(slot) };
        let mut at = 0;
        let mut part = |(ty, rows, cols): (pi2_kernels::QuantType, usize, usize)| {
            let len = ty.row_bytes(cols).unwrap_or(0) * rows;
            let m = MatRef::new(ty, rows, cols, &bytes[at..at + len]);
            at += len;
            m.map_err(|e| EngineError::Offload(format!("expert unit {unit}: {e}")))
        };
        Ok([part(shapes[0])?, part(shapes[1])?, part(shapes[2])?])
    }

    fn wait(&mut self, slot: Slot) -> Result<(), EngineError> {
        self.land_until(|x| x.landing[slot.0 as usize] == 0)
    }

    /// The KV cache will take `kv` bytes once `positions` are written: expert slots above one
    /// token's are given back to make room.
    pub(crate) fn charge_kv(&mut self, kv: u64, positions: usize) -> Result<(), EngineError> {
        if kv <= self.kv_charged {
            return Ok(());
        }
        let mut need = kv - self.kv_charged;
        let slack = need.min(self.budget.left());
        self.budget.reserve(Region::Fixed, slack, "KV cache")?;
        need -= slack;
        self.kv_charged += slack;
        let per_slot = slot_cost(self.cache.slot_bytes());
        while need > 0 && self.cache.n_slots() > self.least_slots {
            let spare = (self.cache.n_slots() - self.least_slots) as u64;
            let give = need.div_ceil(per_slot).clamp(1, spare) as usize;
            self.cache.set_limit(self.cache.n_slots() - give);
            let freed = per_slot * give as u64;
            self.budget.release(Region::Cold, freed);
            let took = need.min(self.budget.left());
            self.budget.reserve(Region::Fixed, took, "KV cache")?;
            need -= took;
            self.kv_charged += took;
        }
        if need > 0 {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return Err(EngineError::MemoryFull(format!(
                "the context has reached {positions} tokens, whose KV cache ({:.1} MiB) no longer \
                 fits the memory budget of {:.1} MiB beside one token's experts: raise \
                 --mem-budget (by about {:.1} MiB per 1000 tokens more) or start a new conversation",
                mib(kv),
                mib(self.budget.limit()),
                mib(kv) * 1000.0 / positions.max(1) as f64,
            )));
        }
        Ok(())
    }
}

impl Drop for ExpertStream {
    /// Keeps this run's routing for the next one (a cache file: a failure to write it only
    /// loses the head start).
    fn drop(&mut self) {
        if let Some(m) = self
            .memory
            .as_ref()
            .filter(|_| self.chosen.iter().any(|&c| c > 0))
        {
            let _ = m.save(&self.chosen);
        }
    }
}

/// A plain model whose experts stream: everything else from the resident store.
pub(crate) struct Streamed<'m> {
    model: &'m Model,
    resident: Resident<'m>,
    stream: ExpertStream,
}

impl<'m> Streamed<'m> {
    /// `repack`: the attention and output matrices as the resident store's own copies (where
    /// the kernel tier has them), so they hold no page cache.
    pub(crate) fn new(model: &'m Model, stream: ExpertStream, repack: bool) -> Self {
        Self {
            model,
            resident: Resident::new(model, repack, FfnCopies::Mapped, false),
            stream,
        }
    }
}

impl Store for Streamed<'_> {
    fn prepare(&mut self, ks: &KernelSet, pool: &rayon::ThreadPool) {
        self.resident.prepare(ks, pool)
    }

    fn embed(
        &mut self,
        table: Table,
        tokens: &[TokenId],
        x: &mut [f32],
    ) -> Result<(), EngineError> {
        self.resident.embed(table, tokens, x)
    }

    fn attention(&mut self, li: usize) -> Result<[MatRef<'_>; 4], EngineError> {
        self.resident.attention(li)
    }

    fn gather(&mut self, units: &[usize]) -> Result<usize, EngineError> {
        self.stream.gather(units)
    }

    fn prefetch(&mut self, units: &[usize]) -> Result<(), EngineError> {
        self.stream.prefetch(units)
    }

    fn ffn(&mut self, unit: usize, next: Option<usize>) -> Result<FfnMats<'_>, EngineError> {
        let (m, ne) = (self.model, self.model.config.n_expert.max(1));
        let l = &m.weights.layers[unit / ne];
        if l.router.is_none() {
            return self.resident.ffn(unit, next);
        }
        let (ff, d) = (m.config.n_ff, m.config.n_embd);
        let down_rows = if l.down_transposed { ff } else { d };
        let shapes = [
            (l.gate.ty, ff, l.gate.cols),
            (l.up.ty, ff, l.up.cols),
            (l.down.ty, down_rows, l.down.cols),
        ];
        let count = &mut self.stream.chosen[unit];
        *count = count.saturating_add(1);
        let [gate, up, down] = self.stream.mats(unit, shapes)?;
        Ok(FfnMats {
            gate,
            up,
            down,
            down_transposed: l.down_transposed,
        })
    }

    fn output(
        &mut self,
        ks: &KernelSet,
        acts: &ActBuf,
        n: usize,
        ranges: &[(usize, usize)],
        logits: &mut [f32],
    ) -> Result<u64, EngineError> {
        self.resident.output(ks, acts, n, ranges, logits)
    }

    fn output_kind(&self) -> (pi2_kernels::ActKind, usize) {
        self.resident.output_kind()
    }

    fn sparse_token(&mut self, _call: SparseCall<'_, '_>) -> Result<(), EngineError> {
        Err(EngineError::Offload(
            "streamed experts run without a sparse FFN".into(),
        ))
    }

    fn charge_kv(&mut self, bytes: u64, positions: usize) -> Result<(), EngineError> {
        self.stream.charge_kv(bytes, positions)
    }

    fn copied_bytes(&self) -> usize {
        self.resident.copied_bytes()
    }

    fn experts(&self) -> Option<&ExpertStream> {
        Some(&self.stream)
    }

    fn experts_mut(&mut self) -> Option<&mut ExpertStream> {
        Some(&mut self.stream)
    }
}
