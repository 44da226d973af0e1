//! Where the engine's weights live, behind one interface. Model code (attention, the FFN,
//! experts, the head, the embedding) asks a [`Store`] for what a stage multiplies and never
//! asks where it is: [`Resident`] answers from the file mapping or the row-interleaved copies
//! (`packed.rs`); an offloaded model (`offload/store.rs`) from pinned rows, staging buffers,
//! its neuron cache and flash. Neuron rows of a sparse step go through the same store, which
//! runs the cluster pipeline with its own [`crate::residency::StepRows`].

use crate::error::EngineError;
use crate::offload::{ExpertStream, Offload};
use crate::packed::PackedWeights;
use crate::pipeline::{Step, StepBuffers};
use crate::residency::Mapped;
use crate::scratch::Scratch;
use crate::sparse::{SparseFfn, SparseStats};
use crate::NeuronStep;
use pi2_kernels::{matmul, ActBuf, KernelSet, MatRef};
use pi2_model::{Model, TokenId};

/// A unit's whole FFN matrices for a dense pass: gate and up (rows of `n_ff`), and down,
/// either as the model stores it (`n_embd` rows of `n_ff`) or transposed (a row per neuron).
pub(crate) struct FfnMats<'a> {
    pub gate: MatRef<'a>,
    pub up: MatRef<'a>,
    pub down: MatRef<'a>,
    pub down_transposed: bool,
}

/// A converted layer run dense: gate and up in the file's neuron order, then the down
/// projection either from the source's down matrix (the coefficients put back in the source's
/// order first) or from the file's transposed down rows (an offload's pinned layer).
pub(crate) struct DenseFfn<'a> {
    pub gate: MatRef<'a>,
    pub up: MatRef<'a>,
    pub down: DenseDown<'a>,
}

/// Where a dense converted layer's down projection comes from.
pub(crate) enum DenseDown<'a> {
    /// The source's down matrix and the file's permutation (file neuron `j` is source neuron
    /// `perm[j]`).
    Source { down: MatRef<'a>, perm: &'a [u32] },
    /// The file's transposed down rows, one per neuron in file order.
    Transposed(MatRef<'a>),
}

/// What one sparse decode step of a unit list needs from the store, besides the rows.
pub(crate) struct SparseCall<'a, 'm> {
    pub step: &'a Step<'a>,
    pub s: &'a mut Scratch,
    pub buffers: &'a mut StepBuffers,
    pub stats: &'a mut SparseStats,
    pub record: Option<&'a mut Vec<NeuronStep>>,
    pub sparse: &'m SparseFfn<'m>,
}

/// A table of rows looked up per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    /// The token embedding.
    Embedding,
    /// Per-layer token embeddings (Gemma 4): under a budget, never resident.
    PerLayer,
}

impl Table {
    /// The table's tensor in `w`, where the model has it.
    pub(crate) fn view(self, w: &pi2_model::Weights) -> Option<&pi2_model::TensorView> {
        match self {
            Table::Embedding => Some(&w.token_embd),
            Table::PerLayer => w.per_layer.as_ref().map(|p| &p.token_embd),
        }
    }
}

/// Where the weights are. Every method may read from flash (an offloaded store), so all can
/// fail with the read's error; a resident store never fails.
pub(crate) trait Store: Send {
    /// Start-up work that belongs to loading (the resident store's copies), on the engine's
    /// pool. Called before the first pass.
    fn prepare(&mut self, _ks: &KernelSet, _pool: &rayon::ThreadPool) {}

    /// Rows of `table` for `tokens` into `x` (rows of the table's width; a model without the
    /// table writes nothing).
    fn embed(&mut self, table: Table, tokens: &[TokenId], x: &mut [f32])
        -> Result<(), EngineError>;

    /// Layer `li`'s q, k, v and output projections.
    fn attention(&mut self, li: usize) -> Result<[MatRef<'_>; 4], EngineError>;

    /// Starts a wave of `units` (experts of one layer, each once, in the order the pass computes
    /// them): returns how many of them, from the first, [`Store::ffn`] may be asked for before
    /// the next wave (at least one). A store that streams experts puts the wave's reads in flight
    /// at once; one that holds every unit takes them all.
    fn gather(&mut self, units: &[usize]) -> Result<usize, EngineError> {
        Ok(units.len())
    }

    /// A guess of the units the next wave will ask for: a store that streams experts may start
    /// reading them (after the current wave's reads). Never changes what is computed.
    fn prefetch(&mut self, _units: &[usize]) -> Result<(), EngineError> {
        Ok(())
    }

    /// Unit `unit`'s whole FFN (a layer, or one expert `layer * n_expert + e`) for a dense
    /// pass; `next` is the unit the pass needs after it, which a store may start reading.
    fn ffn(&mut self, unit: usize, next: Option<usize>) -> Result<FfnMats<'_>, EngineError>;

    /// Logits of the output rows in `ranges` (sorted, disjoint, starting at multiples of 8)
    /// for the `n` token rows quantized in `acts` (for the output matrix's activation format),
    /// into `logits` (`n` rows of the whole vocabulary; rows outside the ranges untouched).
    /// Returns the bytes of output rows read from flash.
    fn output(
        &mut self,
        ks: &KernelSet,
        acts: &ActBuf,
        n: usize,
        ranges: &[(usize, usize)],
        logits: &mut [f32],
    ) -> Result<u64, EngineError>;

    /// The output matrix's activation format and row bytes.
    fn output_kind(&self) -> (pi2_kernels::ActKind, usize);

    /// Output rows (from the first, in stored order) that [`Store::output`] computes without
    /// reading from flash.
    fn output_resident_rows(&self) -> usize {
        usize::MAX
    }

    /// Layer `li` of a converted model when this store holds its whole FFN and runs it dense
    /// (faster than the sparse step where every gate row is computed anyway).
    fn dense_ffn(&self, _li: usize) -> Option<DenseFfn<'_>> {
        None
    }

    /// One sparse decode step (`call.step`'s units), rows served by this store.
    fn sparse_token(&mut self, call: SparseCall<'_, '_>) -> Result<(), EngineError>;

    /// The KV cache will hold `bytes` once positions up to `positions` are written: a
    /// budgeted store makes room for it.
    fn charge_kv(&mut self, _bytes: u64, _positions: usize) -> Result<(), EngineError> {
        Ok(())
    }

    /// Bytes of copies this store made of the weights (the resident store's packed matrices).
    fn copied_bytes(&self) -> usize {
        0
    }

    /// The offloaded FFN and its statistics, if this store reads from flash.
    fn offload(&self) -> Option<&Offload> {
        None
    }

    fn offload_mut(&mut self) -> Option<&mut Offload> {
        None
    }

    /// The streamed experts and their statistics, if this store streams a plain model's experts.
    fn experts(&self) -> Option<&ExpertStream> {
        None
    }

    fn experts_mut(&mut self) -> Option<&mut ExpertStream> {
        None
    }
}

/// Weights in memory: the file mapping, and row-interleaved copies of the matrices multiplied
/// whole when the configuration asks for them (made by [`Store::prepare`]).
pub(crate) struct Resident<'m> {
    model: &'m Model,
    repack: bool,
    /// Whether the FFN is multiplied whole (a dense FFN of plain tensors): packed too.
    pack_ffn: bool,
    /// A converted model's layers run dense: their permutations (empty: none).
    dense: Vec<&'m [u32]>,
    packed: Option<PackedWeights>,
}

/// Which FFN matrices a resident store copies into the interleaved layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FfnCopies {
    /// None: the FFN is computed neuron by neuron (a sparse model), or its experts stream from
    /// the file and only the rest is resident.
    Mapped,
    /// The matrices the model multiplies whole: dense layers and stacked experts.
    Whole,
}

impl<'m> Resident<'m> {
    /// `repack`: make the interleaved copies (only where the kernel tier has them); `ffn`:
    /// whether the FFN's matrices are among them; `dense`: a converted model's layers run dense
    /// from the source's down matrix (where the file keeps it).
    pub(crate) fn new(model: &'m Model, repack: bool, ffn: FfnCopies, dense: bool) -> Self {
        // Stacked experts pack too: an expert's rows are whole groups of the interleaved copy
        // (checked per layer where the copies are made), and its products are the same bit for
        // bit in either layout.
        let plain = model.weights.layers.iter().all(|l| !l.down_transposed);
        let dense = match dense {
            true => dense_layers(model).unwrap_or_default(),
            false => Vec::new(),
        };
        Self {
            model,
            repack,
            pack_ffn: (ffn == FfnCopies::Whole && plain) || !dense.is_empty(),
            dense,
            packed: None,
        }
    }
}

/// Every layer's permutation when every layer of a converted model keeps the source's down
/// matrix (`None` otherwise: the model runs as converted).
fn dense_layers(model: &Model) -> Option<Vec<&[u32]>> {
    let (f, c) = (&model.file, &model.config);
    model
        .weights
        .layers
        .iter()
        .enumerate()
        .map(|(li, l)| {
            l.down_dense.as_ref()?;
            let t = f.tensor(&pi2_model::bundle::Tensor::Perm.name(li))?;
            let perm: &[u32] = bytemuck::try_cast_slice(f.tensor_data(t)).ok()?;
            // A permutation of the layer's neurons, or the layer is not run dense.
            let mut seen = vec![false; c.n_ff];
            let ok = perm.len() == c.n_ff
                && perm.iter().all(|&p| {
                    (p as usize) < c.n_ff && !std::mem::replace(&mut seen[p as usize], true)
                });
            ok.then_some(perm)
        })
        .collect()
}

impl Store for Resident<'_> {
    fn prepare(&mut self, ks: &KernelSet, pool: &rayon::ThreadPool) {
        // Only where the tier has SIMD kernels for the interleaved layout.
        if self.repack && ks.x8.fast && self.packed.is_none() {
            let (m, ffn) = (self.model, self.pack_ffn);
            self.packed = Some(pool.install(|| PackedWeights::build(m, ffn)));
        }
    }

    fn dense_ffn(&self, li: usize) -> Option<DenseFfn<'_>> {
        let perm = *self.dense.get(li)?;
        let (f, l) = (&self.model.file, &self.model.weights.layers[li]);
        let down = l.down_dense.as_ref()?;
        let [gate, up, down] = match &self.packed {
            Some(p) => p.ffn(li, [&l.gate, &l.up, down], f),
            None => [&l.gate, &l.up, down].map(|t| t.mat(f)),
        };
        Some(DenseFfn {
            gate,
            up,
            down: DenseDown::Source { down, perm },
        })
    }

    fn embed(
        &mut self,
        table: Table,
        tokens: &[TokenId],
        x: &mut [f32],
    ) -> Result<(), EngineError> {
        let m = self.model;
        let Some(embd) = table.view(&m.weights).map(|t| t.mat(&m.file)) else {
            return Ok(());
        };
        let d = embd.cols;
        for (t, &tok) in tokens.iter().enumerate() {
            embd.dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        Ok(())
    }

    fn attention(&mut self, li: usize) -> Result<[MatRef<'_>; 4], EngineError> {
        let (f, l) = (&self.model.file, &self.model.weights.layers[li]);
        let tvs = [&l.wq, &l.wk, &l.wv, &l.wo];
        Ok(match &self.packed {
            Some(p) => p.attn(li, tvs, f),
            None => tvs.map(|w| w.mat(f)),
        })
    }

    fn ffn(&mut self, unit: usize, _next: Option<usize>) -> Result<FfnMats<'_>, EngineError> {
        let (c, f) = (&self.model.config, &self.model.file);
        let ne = c.n_expert.max(1);
        let (li, e) = (unit / ne, unit % ne);
        let l = &self.model.weights.layers[li];
        let [gate, up, mut down] = match &self.packed {
            Some(p) => p.ffn(li, [&l.gate, &l.up, &l.down], f),
            None => [&l.gate, &l.up, &l.down].map(|t| t.mat(f)),
        };
        if l.router.is_some() {
            // One expert's rows of the stacked tensors (whole groups of a packed copy).
            let (ff, d) = (c.n_ff, c.n_embd);
            let down_rows = match l.down_transposed {
                true => e * ff..(e + 1) * ff,
                false => e * d..(e + 1) * d,
            };
            return Ok(FfnMats {
                gate: gate.rows(e * ff..(e + 1) * ff),
                up: up.rows(e * ff..(e + 1) * ff),
                down: down.rows(down_rows),
                down_transposed: l.down_transposed,
            });
        }
        if l.down_dense.is_some() {
            // The packed down of a converted layer is the source's matrix (its dense path's);
            // a batch asking for the FFN's matrices gets the file's transposed rows.
            down = l.down.mat(f);
        }
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
        let (w, f) = (&self.model.weights, &self.model.file);
        let out = match &self.packed {
            Some(p) => p.output(&w.output, f),
            None => w.output.mat(f),
        };
        output_rows(ks, &out, acts, n, ranges, logits, &mut Vec::new());
        Ok(0)
    }

    fn output_kind(&self) -> (pi2_kernels::ActKind, usize) {
        let out = self.model.weights.output.mat(&self.model.file);
        (out.ty.act_kind(), out.row_bytes())
    }

    fn sparse_token(&mut self, call: SparseCall<'_, '_>) -> Result<(), EngineError> {
        let m = self.model;
        let l = &m.weights.layers[call.step.layer];
        let mut mapped = Mapped::new(&m.file, l, call.sparse, m.config.n_ff);
        crate::pipeline::token(
            call.step,
            call.s,
            call.buffers,
            &mut mapped,
            call.stats,
            call.record,
        )
    }

    fn copied_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, PackedWeights::bytes)
    }
}

/// Logits of `ranges` of `out`'s rows for `n` token rows into `logits` (`n` rows of
/// `out.rows`): one product per range, scattered through `tmp` when `n > 1` and the range is
/// not the whole matrix.
pub(crate) fn output_rows(
    ks: &KernelSet,
    out: &MatRef<'_>,
    acts: &ActBuf,
    n: usize,
    ranges: &[(usize, usize)],
    logits: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    let vocab = out.rows;
    if n == 1 {
        // One parallel region for every range (a clustered head's clusters are many and small).
        let blocks: Vec<_> = ranges.iter().map(|&(a, b)| (out.rows(a..b), a)).collect();
        pi2_kernels::matvec_blocks(ks, acts, &blocks, &mut logits[..vocab]);
        return;
    }
    for &(a, b) in ranges {
        if (a, b) == (0, vocab) {
            matmul(ks, out, acts, &mut logits[..n * vocab]);
        } else {
            tmp.resize(n * (b - a), 0.0);
            matmul(ks, &out.rows(a..b), acts, tmp);
            for (t, part) in tmp.chunks_exact(b - a).enumerate() {
                logits[t * vocab + a..t * vocab + b].copy_from_slice(part);
            }
        }
    }
}
