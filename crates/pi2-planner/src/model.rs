//! The model profile: shapes and types of what decode computes, where each FFN neuron's rows lie
//! in the file, and a recording of real decode steps (which neurons were candidates and which
//! were confirmed). Replaying that recording through pi2's own cache ([`pi2_cache::SlotCache`])
//! gives, for any split of memory into pinned neurons and cache slots, exactly which rows decode
//! would read: the hit rate as a function of cache size, per plan, measured rather than assumed.

use crate::PlanError;
use pi2_cache::{Lru, SlotCache};
use serde::{Deserialize, Serialize};

/// A dense matrix computed once per token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatShape {
    pub ty: String,
    pub rows: usize,
    pub row_bytes: usize,
}

impl MatShape {
    pub fn bytes(&self) -> u64 {
        (self.rows * self.row_bytes) as u64
    }
}

/// Where one FFN part's rows lie in the file (row `i` at `offset + i * row_bytes`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowPart {
    pub ty: String,
    pub offset: u64,
    pub row_bytes: usize,
}

/// A layer's neuron rows: gate, up, and (transposed) down.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FfnLayer {
    pub gate: RowPart,
    pub up: RowPart,
    pub down: RowPart,
}

impl FfnLayer {
    pub fn neuron_bytes(&self) -> usize {
        self.gate.row_bytes + self.up.row_bytes + self.down.row_bytes
    }
}

/// One recorded token-layer of sparse decode (file-order neuron indices, ascending).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub layer: u32,
    pub candidates: Vec<u32>,
    pub confirmed: Vec<u32>,
}

/// A clustered output head: per token the centroids and directions are scored, then the rows
/// of the best clusters (`share` of the rows) computed; a cluster not resident is read when
/// chosen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadShape {
    /// Share of the output rows computed per token.
    pub share: f64,
    /// Rows per cluster.
    pub cluster: usize,
    /// Per cluster in stored order (hottest first: the resident ones first), the share of
    /// tokens that choose it.
    pub frequency: Vec<f32>,
    /// The centroid and direction matrices, scored every token.
    pub probes: Vec<MatShape>,
}

impl HeadShape {
    /// Expected clusters chosen per token among the last `rows` stored output rows (those not
    /// resident).
    pub fn chosen_among_last(&self, rows: usize) -> f64 {
        let k = self.frequency.len();
        let last = rows.div_ceil(self.cluster.max(1)).min(k);
        self.frequency[k - last..].iter().map(|&f| f as f64).sum()
    }
}

/// What the planner knows about a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelProfile {
    pub name: String,
    /// Identity of the model file (see the CLI: a digest of its header and tensor table).
    pub digest: String,
    pub file_bytes: u64,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_embd: usize,
    /// Key + value bytes one position adds to the KV cache, all layers.
    pub kv_bytes_per_pos: u64,
    /// Per layer: the attention projections (q, k, v, o), computed densely every token.
    pub attention: Vec<Vec<MatShape>>,
    /// Per layer: the predictor's matrices (empty when there is none).
    pub predictor: Vec<Vec<MatShape>>,
    pub output: MatShape,
    /// A converted model's clustered output head (absent: every output row is computed).
    #[serde(default)]
    pub head: Option<HeadShape>,
    pub ffn: Vec<FfnLayer>,
    /// Recorded decode steps, token-major (every layer of token 0, then token 1, ...).
    pub steps: Vec<Step>,
}

impl ModelProfile {
    /// Tokens in the recording.
    pub fn tokens(&self) -> usize {
        self.steps.len() / self.n_layer.max(1)
    }

    /// Checks the profile is internally consistent (a corrupt or foreign recording is refused).
    pub fn validate(&self) -> Result<(), PlanError> {
        self.check().map_err(PlanError::Model)
    }

    fn check(&self) -> Result<(), String> {
        let n = self.n_layer;
        if n == 0 || self.n_ff == 0 {
            return Err("no layers".into());
        }
        if self.attention.len() != n || self.predictor.len() != n || self.ffn.len() != n {
            return Err(format!("expected {n} layers of shapes"));
        }
        if self.steps.is_empty() || !self.steps.len().is_multiple_of(n) {
            return Err(format!(
                "the decode recording has {} steps, not a whole number of tokens of {n} layers",
                self.steps.len()
            ));
        }
        for (k, s) in self.steps.iter().enumerate() {
            if s.layer as usize != k % n {
                return Err(format!(
                    "step {k} is for layer {}, expected {}",
                    s.layer,
                    k % n
                ));
            }
            let sorted = |v: &[u32]| v.windows(2).all(|w| w[0] < w[1]);
            if !sorted(&s.candidates) || !sorted(&s.confirmed) {
                return Err(format!("step {k}: neuron lists must be ascending"));
            }
            if s.candidates
                .last()
                .is_some_and(|&i| i as usize >= self.n_ff)
            {
                return Err(format!("step {k}: neuron index beyond {}", self.n_ff));
            }
            let mut c = s.candidates.iter().peekable();
            for &i in &s.confirmed {
                while c.next_if(|&&x| x < i).is_some() {}
                if c.next_if(|&&x| x == i).is_none() {
                    return Err(format!("step {k}: confirmed neuron {i} is not a candidate"));
                }
            }
        }
        Ok(())
    }
}

/// How the engine splits a memory budget (engine-specific, so the engine provides it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResidencySplit {
    /// Neurons pinned per layer: the first `hot_counts[l]` of layer `l` (hot-first file order).
    pub hot_counts: Vec<usize>,
    /// Neurons whose gate row is pinned per layer (the first ones); layers not listed, or
    /// listed lower, pin the gate rows of `hot_counts` only.
    pub hot_gate_counts: Vec<usize>,
    /// Cold cache slots (one neuron each).
    pub cold_slots: usize,
    /// Weights read from flash every token because they do not fit.
    pub streamed: StreamedWeights,
}

/// Weights outside the FFN that a split reads from flash every token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamedWeights {
    /// The last layers whose attention projections are read every time they run.
    pub attn_layers: usize,
    /// The last rows of the output matrix, read in chunks of `output_chunk_rows`.
    pub output_rows: usize,
    pub output_chunk_rows: usize,
    /// Bytes of the embedding row each token reads (0 when the embedding is resident).
    pub embedding_row_bytes: usize,
}

/// The engine's memory accounting.
pub trait Residency {
    /// How `budget` bytes split with `hot_share` of the neuron memory pinned; `Err` names
    /// why the budget cannot work (e.g. the minimum it needs).
    fn split(&self, budget: u64, hot_share: f64) -> Result<ResidencySplit, PlanError>;
    /// The smallest budget offloading accepts.
    fn min_budget(&self) -> u64;
    /// Resident bytes with the whole model in memory (file + KV cache + buffers).
    fn in_memory_bytes(&self) -> u64;
}

/// The rows one recorded step misses under a split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepMisses {
    /// Gate rows to read: (position among the step's candidates, neuron index).
    pub gate: Vec<(u32, u32)>,
    /// Up+down rows to read: (position among the step's candidates, neuron index).
    pub updown: Vec<(u32, u32)>,
}

/// A replay's result: per step, what was read; and the totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub steps: Vec<StepMisses>,
    /// Rows (gate rows + up/down pairs) found resident and read.
    pub rows_resident: u64,
    pub rows_read: u64,
    /// What the split streams every token.
    pub streamed: StreamedWeights,
    /// Per layer: every row pinned (without a predictor the engine runs such a layer dense).
    pub whole_layers: Vec<bool>,
}

impl Replay {
    /// Share of needed rows found in memory (pinned or cached): the engine's `hit_rate`.
    pub fn hit_rate(&self) -> f64 {
        self.rows_resident as f64 / (self.rows_resident + self.rows_read).max(1) as f64
    }
}

const GATE: u8 = 1;
const UPDOWN: u8 = 2;

/// Replays the recorded steps through an LRU [`SlotCache`] the way the engine's decode uses it:
/// per step, every unpinned candidate takes a slot (gate row read if neither pinned nor
/// present), then every unpinned confirmed neuron's up/down rows are read if absent.
pub fn replay(m: &ModelProfile, split: &ResidencySplit) -> Result<Replay, PlanError> {
    let (n_layer, n_ff) = (m.n_layer, m.n_ff);
    let slots = split.cold_slots.max(1);
    // The replay needs the cache's bookkeeping, not its bytes: one-byte slots.
    let mut cache = SlotCache::new(n_layer * n_ff, n_ff, 1, slots, Lru::default())
        .map_err(|e| PlanError::Unrunnable(e.to_string()))?;
    let whole_layers = (0..n_layer)
        .map(|li| {
            let hot = split.hot_counts.get(li).copied().unwrap_or(0);
            let gate = split.hot_gate_counts.get(li).copied().unwrap_or(0);
            hot >= n_ff && gate.max(hot) >= n_ff
        })
        .collect();
    let mut out = Replay {
        steps: Vec::with_capacity(m.steps.len()),
        streamed: split.streamed,
        whole_layers,
        ..Default::default()
    };
    let mut slot_of = Vec::new();
    for s in &m.steps {
        let li = s.layer as usize;
        let hot = split.hot_counts.get(li).copied().unwrap_or(0);
        let hot_gate = split.hot_gate_counts.get(li).copied().unwrap_or(0).max(hot);
        let mut miss = StepMisses::default();
        cache.begin_step();
        slot_of.clear();
        for (k, &i) in s.candidates.iter().enumerate() {
            if (i as usize) < hot {
                slot_of.push(None);
                out.rows_resident += 1;
                continue;
            }
            let key = (li * n_ff + i as usize) as u32;
            let slot = match cache.lookup(key) {
                Some(slot) => slot,
                None => cache.insert(key).ok_or_else(|| {
                    PlanError::Unrunnable(
                        "the neuron cache has no free slot (fewer slots than one layer)".into(),
                    )
                })?,
            };
            if (i as usize) < hot_gate {
                out.rows_resident += 1;
            } else if cache.parts(slot) & GATE == 0 {
                miss.gate.push((k as u32, i));
                out.rows_read += 1;
            } else {
                out.rows_resident += 1;
            }
            slot_of.push(Some(slot));
        }
        for &slot in slot_of.iter().flatten() {
            cache.add_parts(slot, GATE);
        }
        let mut conf = s.confirmed.iter().peekable();
        for (k, &i) in s.candidates.iter().enumerate() {
            if conf.next_if(|&&c| c == i).is_none() {
                continue;
            }
            match slot_of[k] {
                None => out.rows_resident += 1,
                Some(slot) if cache.parts(slot) & UPDOWN != 0 => out.rows_resident += 1,
                Some(slot) => {
                    miss.updown.push((k as u32, i));
                    out.rows_read += 1;
                    cache.add_parts(slot, UPDOWN);
                }
            }
        }
        out.steps.push(miss);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::synthetic::toy_model as toy;

    #[test]
    fn everything_pinned_reads_nothing() {
        let m = toy(2, 64, 4);
        m.validate().unwrap();
        let r = replay(
            &m,
            &ResidencySplit {
                hot_counts: vec![64, 64],
                hot_gate_counts: Vec::new(),
                cold_slots: 1,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.rows_read, 0);
        assert_eq!(r.hit_rate(), 1.0);
    }

    #[test]
    fn a_cache_holding_every_neuron_reads_each_row_once() {
        let m = toy(2, 64, 6);
        let r = replay(
            &m,
            &ResidencySplit {
                hot_counts: vec![0, 0],
                hot_gate_counts: Vec::new(),
                cold_slots: 128,
                ..Default::default()
            },
        )
        .unwrap();
        let mut gate = std::collections::HashSet::new();
        let mut updown = std::collections::HashSet::new();
        for s in &m.steps {
            gate.extend(s.candidates.iter().map(|&i| (s.layer, i)));
            updown.extend(s.confirmed.iter().map(|&i| (s.layer, i)));
        }
        assert_eq!(r.rows_read as usize, gate.len() + updown.len());
        // Fewer slots never read less (LRU is a stack algorithm).
        let mut last = r.rows_read;
        for slots in [96, 80, 64] {
            let s = replay(
                &m,
                &ResidencySplit {
                    hot_counts: vec![0, 0],
                    hot_gate_counts: Vec::new(),
                    cold_slots: slots,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(s.rows_read >= last, "{slots} slots");
            last = s.rows_read;
        }
    }

    #[test]
    fn corrupt_recordings_are_refused() {
        let mut m = toy(2, 64, 2);
        // Token 0, layer 1: neuron 1 is not a candidate ((1 * 7 + 1) % 5 = 3).
        m.steps[1].confirmed = vec![1];
        assert!(m
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not a candidate"));
        let mut m = toy(2, 64, 2);
        m.steps.pop();
        assert!(m
            .validate()
            .unwrap_err()
            .to_string()
            .contains("whole number"));
        let mut m = toy(2, 64, 2);
        m.steps[0].candidates = vec![70];
        m.steps[0].confirmed.clear();
        assert!(m.validate().unwrap_err().to_string().contains("beyond"));
    }
}
