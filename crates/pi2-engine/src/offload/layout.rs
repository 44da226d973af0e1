//! Where an offloaded model's pieces lie and how a budget splits over them: the FFN bundle
//! parts of every unit, every layer's attention projections, the vocabulary matrices, the
//! fixed region, and the choice of what streams from flash when the budget is short (the mix
//! that reads the fewest bytes per token). Nothing here allocates buffers or reads.

use crate::sparse::SparseFfn;
use crate::EngineError;
use pi2_cache::{Budget, Lru, Region, SlotCache};
use pi2_io::AlignedBuf;
use pi2_kernels::QuantType;
use pi2_model::{bundle, Model};

/// Token rows a streamed embedding reads per lookup round (its buffer is fixed memory).
pub(crate) const EMBD_BATCH: usize = 64;

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
    pub fn bytes(&self, n_ff: usize) -> usize {
        n_ff * (self.gate.row_bytes + self.up.row_bytes + self.down.row_bytes)
    }
}

/// The pinned rows of one unit, in hot-first file order: the gate rows of the first `n_gate`
/// neurons and the up and down rows of the first `n` (`n <= n_gate`), each block padded to 64
/// bytes.
pub(crate) struct HotLayer {
    pub n: usize,
    pub n_gate: usize,
    pub buf: AlignedBuf,
    pub up_at: usize,
    pub down_at: usize,
}

pub(crate) const PAD: usize = 64;
pub(crate) fn pad(n: usize) -> usize {
    n.div_ceil(PAD) * PAD
}

/// One attention projection of a layer: where it lies in the file and in a layer buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnMat {
    pub offset: u64,
    pub len: usize,
    pub at: usize,
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
}

/// A layer's q, k, v and output projections (what a streamed layer reads).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnLayout {
    pub mats: [AttnMat; 4],
    /// Bytes of a buffer holding all four (each padded).
    pub size: usize,
}

/// Non-FFN resident bytes, the working buffers and what one decode step needs at least.
pub(crate) struct Layout {
    pub ffn: Vec<FfnLayout>,
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

impl Layout {
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
        if v.head.is_some() {
            // A clustered head's rows are pinned by how often they are chosen, beside the
            // neurons (`regions`): here they all stream, and only attention layers are chosen.
            return (0..=n)
                .map(|k| Streaming {
                    attn_layers: k,
                    out_rows: v.output.rows,
                })
                .find(|&s| self.fixed_streaming(s) + rest <= budget)
                .unwrap_or(all);
        }
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
#[derive(Clone, Debug)]
pub(crate) struct VocabLayout {
    pub embd: VocabMat,
    /// Per-layer token embeddings (Gemma 4), read a row per token like a separate embedding.
    pub per_layer: Option<VocabMat>,
    pub output: VocabMat,
    pub tied: bool,
    /// A clustered head's rows per cluster and each cluster's selection frequency (hottest
    /// first, the file's order): its output rows are read only when their cluster is chosen.
    pub head: Option<(usize, Vec<f32>)>,
}

/// Most bytes of one read of streamed output rows.
const OUT_CHUNK_BYTES: usize = 1 << 20;

impl VocabLayout {
    /// The widest row a lookup reads.
    pub fn lookup_row_bytes(&self) -> usize {
        (self.per_layer.map_or(0, |p| p.row_bytes)).max(self.embd.row_bytes)
    }

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
pub(crate) fn layout(
    model: &Model,
    sparse: &SparseFfn<'_>,
    kv_bytes: u64,
    scratch: u64,
) -> Result<Layout, EngineError> {
    let f = &model.file;
    let c = &model.config;
    if !model.weights.layers.iter().all(|l| l.down_transposed) {
        return Err(EngineError::Offload(
            "offloading reads neuron bundles: convert the model first (`pi2 convert`)".into(),
        ));
    }
    let experts = c.n_expert.max(1);
    if sparse.layers.len() != c.n_layer * experts {
        return Err(EngineError::Offload(format!(
            "{} sparse units for {} layers of {experts}",
            sparse.layers.len(),
            c.n_layer
        )));
    }
    let mut layout = Vec::with_capacity(c.n_layer * experts);
    let mut attn = Vec::with_capacity(c.n_layer);
    for l in &model.weights.layers {
        for e in 0..experts {
            // Each part's rows in the file (`pi2_model::bundle`), and where it sits in a slot.
            let [g, u, d] = bundle::neuron_parts(f, l, c.n_ff, experts, e)
                .map_err(|err| EngineError::Offload(err.to_string()))?;
            let part = |p: bundle::NeuronPart, slot_at| Part {
                offset: p.offset,
                ty: p.ty,
                row_bytes: p.row_bytes,
                slot_at,
            };
            let gate = part(g, 0);
            let up = part(u, pad(gate.row_bytes));
            let down = part(d, up.slot_at + pad(up.row_bytes));
            let u = layout.len();
            if sparse.layers[u].down_t.rows != c.n_ff {
                return Err(EngineError::Offload(format!(
                    "unit {u}: transposed down shape"
                )));
            }
            layout.push(FfnLayout { gate, up, down });
        }
        let mut at = 0;
        let mats = [&l.wq, &l.wk, &l.wv, &l.wo].map(|w| {
            let m = AttnMat {
                offset: w.file_offset(f),
                len: w.bytes(f) as usize,
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
    let head =
        crate::ClusteredHead::load(model, false)?.map(|h| (h.cluster(), h.frequency().to_vec()));
    let vocab = VocabLayout {
        embd: vocab_mat(&w.token_embd),
        per_layer: w.per_layer.as_ref().map(|p| vocab_mat(&p.token_embd)),
        output: vocab_mat(&w.output),
        tied: w.tied_output,
        head,
    };
    let tensors = f.tensors.iter().map(|t| (t.name.as_str(), t.size));
    let fixed = fixed_bytes(tensors, &vocab, kv_bytes, scratch);
    Ok(Layout::new(layout, attn, vocab, fixed, c.n_ff))
}

/// Bytes of the fixed region with everything resident: every tensor but the neuron bundles
/// (`tensors` as name and size; the checksum table's size stands for the reader's copy), less
/// a separate token embedding and per-layer embeddings (read a row per token, never resident),
/// plus the KV cache, buffers and a round of lookup rows.
fn fixed_bytes<'n>(
    tensors: impl Iterator<Item = (&'n str, u64)>,
    vocab: &VocabLayout,
    kv_bytes: u64,
    scratch: u64,
) -> u64 {
    let embd_bytes = match vocab.tied {
        true => 0,
        false => (vocab.embd.rows * vocab.embd.row_bytes) as u64,
    } + vocab.per_layer.map_or(0, |p| (p.rows * p.row_bytes) as u64);
    tensors
        .filter(|(name, _)| !bundle::is_neuron_tensor(name))
        .map(|(_, size)| size)
        .sum::<u64>()
        - embd_bytes
        + kv_bytes
        + scratch
        + pad(EMBD_BATCH * vocab.lookup_row_bytes()) as u64
}

impl Layout {
    fn new(
        ffn: Vec<FfnLayout>,
        attn: Vec<AttnLayout>,
        vocab: VocabLayout,
        fixed: u64,
        n_ff: usize,
    ) -> Layout {
        let stage = ffn
            .iter()
            .map(|l| l.bytes(n_ff) + 3 * PAD)
            .max()
            .unwrap_or(0);
        let bundle = ffn
            .iter()
            .map(|l| l.down.slot_at + pad(l.down.row_bytes))
            .max()
            .unwrap_or(0);
        Layout {
            ffn,
            attn,
            vocab,
            fixed,
            stage,
            bundle,
        }
    }
}

/// A conversion not made yet, as [`planned_min_budget`] needs it: the tensors it writes
/// besides or instead of the source's (a tensor of a source's name replaces it), with the
/// transposed down rows among them, and the clustered head's rows per cluster, if any.
#[derive(Clone, Debug)]
pub struct PlannedConversion {
    /// Name, GGML dims and bytes of every tensor the conversion writes that the source does
    /// not hold as it is (not the checksum table: it is counted here).
    pub tensors: Vec<(String, Vec<u64>, u64)>,
    /// Type of the transposed down rows.
    pub down_type: QuantType,
    /// Rows per head cluster (a clustered head writes the output matrix in its own order).
    pub head_cluster: Option<usize>,
}

/// The smallest budget [`Offload::new`] would accept for the conversion `plan` of the plain
/// dense `model`, computed before converting (so that a budget too small costs no
/// conversion): the same regions [`min_budget`] finds in the converted file.
pub fn planned_min_budget(
    model: &Model,
    plan: &PlannedConversion,
    kv_bytes: u64,
    scratch: u64,
) -> Result<u64, EngineError> {
    let f = &model.file;
    let c = &model.config;
    let planned = |name: &str| plan.tensors.iter().find(|t| t.0 == name);
    let ty_of = |v: &pi2_model::TensorView| v.ty;
    let mut ffn = Vec::with_capacity(c.n_layer);
    let mut attn = Vec::with_capacity(c.n_layer);
    for l in &model.weights.layers {
        let row = |ty: QuantType| {
            ty.row_bytes(c.n_embd)
                .ok_or_else(|| EngineError::Offload(format!("{ty:?} rows of {}", c.n_embd)))
        };
        let part = |ty: QuantType, slot_at| -> Result<Part, EngineError> {
            Ok(Part {
                offset: 0,
                ty,
                row_bytes: row(ty)?,
                slot_at,
            })
        };
        let gate = part(ty_of(&l.gate), 0)?;
        let up = part(ty_of(&l.up), pad(gate.row_bytes))?;
        let down = part(plan.down_type, up.slot_at + pad(up.row_bytes))?;
        ffn.push(FfnLayout { gate, up, down });
        let mut at = 0;
        let mats = [&l.wq, &l.wk, &l.wv, &l.wo].map(|w| {
            let len = w.bytes(f) as usize;
            let m = AttnMat {
                offset: 0,
                len,
                at,
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
            };
            at += pad(len);
            m
        });
        attn.push(AttnLayout { mats, size: at });
    }
    let w = &model.weights;
    let vocab_mat = |v: &pi2_model::TensorView| {
        let size =
            planned(&v.name).map_or_else(|| f.tensor(&v.name).map_or(0, |t| t.size), |t| t.2);
        VocabMat {
            offset: 0,
            ty: v.ty,
            rows: v.rows,
            cols: v.cols,
            row_bytes: size as usize / v.rows.max(1),
        }
    };
    // A clustered head gets an output matrix of its own, so a tied embedding is no longer the
    // output; the output's type is the plan's.
    let head = plan.head_cluster.map(|k| (k, Vec::new()));
    let tied = w.tied_output && head.is_none();
    let mut output = vocab_mat(&w.output);
    if let Some(t) = planned("output.weight") {
        output.row_bytes = t.2 as usize / output.rows.max(1);
    }
    let vocab = VocabLayout {
        embd: vocab_mat(&w.token_embd),
        per_layer: w.per_layer.as_ref().map(|p| vocab_mat(&p.token_embd)),
        output,
        tied,
        head,
    };
    // The converted file's directory: the source's tensors, the plan's in place of those of
    // the same name, and the checksum table of them all.
    let kept = f
        .tensors
        .iter()
        .filter(|t| planned(&t.name).is_none())
        .map(|t| (t.name.as_str(), &t.dims[..], t.size));
    let added = plan.tensors.iter().map(|t| (t.0.as_str(), &t.1[..], t.2));
    let all: Vec<(&str, &[u64], u64)> = kept.chain(added).collect();
    let table = 4 * pi2_model::checksum::count(all.iter().map(|t| (t.1, t.2)));
    let tensors = all
        .iter()
        .map(|t| (t.0, t.2))
        .chain([(pi2_model::checksum::TENSOR, table)]);
    let fixed = fixed_bytes(tensors, &vocab, kv_bytes, scratch);
    let p = Layout::new(ffn, attn, vocab, fixed, c.n_ff);
    let (stage, min_cold) = least_regions(&p, c);
    Ok(p.fixed_streaming(p.streaming(0, u64::MAX)) + stage + min_cold)
}

/// How a budget splits: regions, pinned neurons per layer and cold cache slots.
pub struct Regions {
    pub(crate) layout: Layout,
    /// The budget's regions (fixed, scratch, hot, cold).
    pub budget: Budget,
    /// Neurons pinned whole per unit (the first of each in the hot-first file order).
    pub hot_counts: Vec<usize>,
    /// Neurons whose gate row is pinned per unit (the first ones; at least `hot_counts`).
    pub hot_gate_counts: Vec<usize>,
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
        self.layout.bundle
    }

    /// Rows per read of streamed output rows.
    pub fn output_chunk_rows(&self) -> usize {
        self.layout.vocab.chunk_rows()
    }

    /// Bytes of the embedding row a token reads from flash: 0 if the embedding is resident
    /// (tied weights with no streamed rows; with some, only tokens among them read).
    pub fn embedding_row_bytes(&self) -> usize {
        let v = &self.layout.vocab;
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
) -> Result<u64, EngineError> {
    let p = layout(model, sparse, kv_bytes, scratch)?;
    let (stage, min_cold) = least_regions(&p, &model.config);
    Ok(p.fixed_streaming(p.streaming(0, u64::MAX)) + stage + min_cold)
}

/// Prefill staging (two units) and the least neuron cache (the neurons of one decode step: a
/// layer, or the experts a token uses).
fn least_regions(p: &Layout, c: &pi2_model::ModelConfig) -> (u64, u64) {
    let min_cold = SlotCache::<Lru>::bytes_for(p.bundle, step_neurons(c), p.ffn.len() * c.n_ff);
    (2 * pad(p.stage) as u64, min_cold)
}

/// Room for the KV cache's growth left unreserved by [`regions`] (up to this much; the rest
/// of the growth is lent to the neuron memory).
const KV_SLACK: u64 = 1 << 20;

/// The fewest cold slots a cache of `slots` may keep when it gives room back: one decode
/// step's neurons (or all it has, if fewer).
pub(crate) fn least_cold_slots(c: &pi2_model::ModelConfig, slots: usize) -> usize {
    step_neurons(c).min(slots).max(1)
}

/// Neurons one decode step may touch.
fn step_neurons(c: &pi2_model::ModelConfig) -> usize {
    c.n_ff * c.n_expert_used.max(1)
}

/// How [`Offload::new`] would split `budget` (no allocation, no I/O): planners size plans with
/// it. `kv_bytes` is the KV cache charged now, `kv_growth` what it may grow by later (kept
/// free of resident attention and output rows; see [`OffloadConfig::kv_growth`]). `process` is
/// what the process holds outside the regions (charged first, see [`OffloadConfig::process`]).
/// Errors name the minimum budget when it is too small.
#[allow(clippy::too_many_arguments)]
pub fn regions(
    model: &Model,
    sparse: &SparseFfn<'_>,
    kv_bytes: u64,
    kv_growth: u64,
    scratch: u64,
    frequency: Option<&[Vec<f32>]>,
    budget: u64,
    hot_share: f64,
    process: u64,
) -> Result<Regions, EngineError> {
    let c = &model.config;
    let n_ff = c.n_ff;
    let p = layout(model, sparse, kv_bytes, scratch)?;
    let n_units = p.ffn.len();
    let mut budget = Budget::new(budget);
    let (stage_bytes, min_cold) = least_regions(&p, c);
    let least_fixed = p.fixed_streaming(p.streaming(0, u64::MAX));
    budget.reserve_with_minimum(
        Region::Process,
        process,
        "this process's own memory (code, tokenizer, metadata)",
        least_fixed + stage_bytes + min_cold,
    )?;
    // Room for the KV cache to grow into comes before resident attention or output rows (it
    // is taken from the neuron memory as the context grows).
    let streaming = p.streaming(budget.left(), stage_bytes + min_cold + kv_growth);
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
    // The KV cache's first growth stays unreserved: neuron memory goes back in whole pages
    // only, which a small growth may not free.
    let keep = kv_growth.min(KV_SLACK);
    let neuron_bytes = budget
        .left()
        .saturating_sub(keep)
        .max(min_cold.min(budget.left()));
    if neuron_bytes < min_cold {
        budget.reserve_with_minimum(
            Region::Cold,
            min_cold,
            "the neuron cache (one decode step of bundles)",
            0,
        )?;
    }
    // Pinned rows: those that save the most reading per byte (file order is hot-first per
    // unit). Without a predictor every gate row is read every token.
    let hot_budget = ((neuron_bytes - min_cold) as f64 * hot_share.clamp(0.0, 1.0)) as u64;
    let every_gate = !sparse.use_predictor;
    let head = p.vocab.head.as_ref().map(|(cluster, freq)| HeadRows {
        frequency: freq,
        cluster_bytes: cluster * p.vocab.output.row_bytes,
    });
    let Pinned {
        gates: hot_gate_counts,
        pairs: hot_counts,
        head_clusters,
    } = hot_counts(&p.ffn, n_ff, hot_budget, frequency, every_gate, head);
    let head_rows = p.vocab.head.as_ref().map_or(0, |(cluster, _)| {
        (head_clusters * cluster).min(p.vocab.output.rows)
    });
    let hot_bytes: u64 = (0..n_units)
        .map(|u| hot_block(&p.ffn[u], hot_gate_counts[u], hot_counts[u]).2 as u64)
        .sum::<u64>()
        + (head_rows * p.vocab.output.row_bytes) as u64;
    budget.reserve(
        Region::Hot,
        hot_bytes,
        "pinned hot neurons and head clusters",
    )?;
    // The rest is the LRU cache, never more slots than neurons outside the pinned set.
    let unpinned = n_units * n_ff - hot_counts.iter().sum::<usize>();
    let slots = SlotCache::<Lru>::slots_in(
        budget.left() - keep.min(budget.left()),
        p.bundle,
        n_units * n_ff,
    )
    .min(unpinned)
    .max(step_neurons(c).min(unpinned).max(1));
    let cold_bytes = SlotCache::<Lru>::bytes_for(p.bundle, slots, n_units * n_ff);
    budget.reserve(Region::Cold, cold_bytes, "the neuron cache")?;
    Ok(Regions {
        layout: p,
        budget,
        hot_counts,
        hot_gate_counts,
        cold_slots: slots,
        streamed_layers: streaming.attn_layers,
        streamed_output_rows: streaming.out_rows - head_rows,
    })
}

/// Offsets of the up and down blocks and the total size of a hot block: `g` gate rows, `h` up
/// and down rows.
pub(crate) fn hot_block(l: &FfnLayout, g: usize, h: usize) -> (usize, usize, usize) {
    let up_at = pad(g * l.gate.row_bytes);
    let down_at = up_at + pad(h * l.up.row_bytes);
    (up_at, down_at, down_at + pad(h * l.down.row_bytes))
}

/// A clustered head's output rows as candidates for pinning: each cluster's selection
/// frequency (hottest first) and bytes.
pub(crate) struct HeadRows<'a> {
    pub frequency: &'a [f32],
    pub cluster_bytes: usize,
}

/// What [`hot_counts`] pins: gate rows and up+down rows per unit (first neurons of each), and
/// the first clusters of a clustered head.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pinned {
    pub gates: Vec<usize>,
    pub pairs: Vec<usize>,
    pub head_clusters: usize,
}

/// What to pin with `bytes`. Rows are taken by the reading they save per byte pinned: a gate
/// row saves its bytes every token it is read (every token when `every_gate`, there being no
/// predictor; else about as often as its neuron fires), an up+down pair as often as its neuron
/// fires (the profile's frequency), a head cluster as often as it is chosen. Without
/// frequencies, the same number of whole neurons per unit and no head clusters.
pub(crate) fn hot_counts(
    layout: &[FfnLayout],
    n_ff: usize,
    bytes: u64,
    frequency: Option<&[Vec<f32>]>,
    every_gate: bool,
    head: Option<HeadRows<'_>>,
) -> Pinned {
    // Each unit's three blocks are padded.
    let bytes = bytes.saturating_sub((3 * PAD * layout.len()) as u64);
    let mut pin = Pinned {
        gates: vec![0; layout.len()],
        pairs: vec![0; layout.len()],
        head_clusters: 0,
    };
    let Some(freq) =
        frequency.filter(|f| f.len() == layout.len() && f.iter().all(|f| f.len() == n_ff))
    else {
        let per = |l: &FfnLayout| (l.gate.row_bytes + l.up.row_bytes + l.down.row_bytes) as u64;
        let total: u64 = layout.iter().map(per).sum::<u64>().max(1);
        let h = ((bytes / total) as usize).min(n_ff);
        pin.gates.iter_mut().for_each(|c| *c = h);
        pin.pairs.iter_mut().for_each(|c| *c = h);
        return pin;
    };
    // (saved per byte, what): gate before pair on ties (a pair needs its gate).
    #[derive(Clone, Copy)]
    enum Item {
        Gate(usize),
        Pair(usize),
        Cluster,
    }
    let mut all: Vec<(f32, Item)> = freq
        .iter()
        .enumerate()
        .flat_map(|(u, f)| {
            f.iter().flat_map(move |&v| {
                let gate = if every_gate { 1.0 } else { v };
                [(gate, Item::Gate(u)), (v, Item::Pair(u))]
            })
        })
        .collect();
    if let Some(h) = &head {
        all.extend(h.frequency.iter().map(|&f| (f, Item::Cluster)));
    }
    let rank = |i: &Item| match i {
        Item::Gate(_) => 0,
        Item::Pair(_) => 1,
        Item::Cluster => 2,
    };
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(rank(&a.1).cmp(&rank(&b.1))));
    let mut left = bytes;
    for (_, item) in all {
        // Counts are prefixes: a pair only with its gate, never more than n_ff; clusters in
        // the file's hottest-first order.
        let (cost, n, max) = match item {
            Item::Gate(u) => (layout[u].gate.row_bytes, &mut pin.gates[u], n_ff),
            Item::Pair(u) if pin.pairs[u] < pin.gates[u] => (
                layout[u].up.row_bytes + layout[u].down.row_bytes,
                &mut pin.pairs[u],
                n_ff,
            ),
            Item::Pair(_) => continue,
            Item::Cluster => {
                let h = head.as_ref().expect("clusters only with a head");
                (h.cluster_bytes, &mut pin.head_clusters, h.frequency.len())
            }
        };
        if *n < max && left >= cost as u64 {
            left -= cost as u64;
            *n += 1;
        }
    }
    pin
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight layers of 10,000 attention bytes (buffers of 10,240) and a 1000-row output
    /// matrix of 64-byte rows (chunks of 56 rows, two buffers of 7168 bytes), in a fixed region
    /// of 200,000 bytes.
    fn layout() -> Layout {
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
        Layout {
            ffn: Vec::new(),
            attn: vec![
                AttnLayout {
                    mats: [mat(0), mat(2560), mat(5120), mat(7680)],
                    size: 10240,
                };
                8
            ],
            vocab: VocabLayout {
                embd: out,
                per_layer: None,
                output: out,
                tied: true,
                head: None,
            },
            fixed: 200_000,
            stage: 0,
            bundle: 0,
        }
    }

    #[test]
    fn streaming_reads_the_least_that_fits() {
        let p = layout();
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

    #[test]
    fn head_clusters_are_pinned_by_how_often_they_are_chosen() {
        let part = |row_bytes| Part {
            offset: 0,
            ty: QuantType::Q8_0,
            row_bytes,
            slot_at: 0,
        };
        let unit = FfnLayout {
            gate: part(10),
            up: part(10),
            down: part(10),
        };
        // Two neurons firing 0.9 and 0.2; clusters chosen 0.5, 0.4, 0.1 of the time.
        let freq = vec![vec![0.9f32, 0.2]];
        let clusters = [0.5f32, 0.4, 0.1];
        let head = |f: &'static [f32]| HeadRows {
            frequency: f,
            cluster_bytes: 30,
        };
        let pin = |bytes: u64| {
            let clusters: &'static [f32] = Box::leak(clusters.to_vec().into_boxed_slice());
            hot_counts(
                &[unit],
                2,
                bytes + 3 * PAD as u64,
                Some(&freq),
                true,
                Some(head(clusters)),
            )
        };
        let want = |gates: usize, pairs: usize, head_clusters: usize| Pinned {
            gates: vec![gates],
            pairs: vec![pairs],
            head_clusters,
        };
        // Every gate row is read every token: they go first (20 bytes).
        assert_eq!(pin(20), want(2, 0, 0));
        // Then the 0.9 pair (20), then clusters 0.5 and 0.4 (30 each), then the 0.2 pair.
        assert_eq!(pin(40), want(2, 1, 0));
        assert_eq!(pin(70), want(2, 1, 1));
        assert_eq!(pin(100), want(2, 1, 2));
        assert_eq!(pin(120), want(2, 2, 2));
        assert_eq!(pin(1000), want(2, 2, 3));
    }
}
