//! Where a sparse step's neuron rows live, and how missing ones arrive: the interface between
//! the cluster pipeline (`pipeline.rs`) and what holds the FFN. [`Mapped`] is the file
//! mapping (every row resident, nothing to read); the offloaded cache (`offload/residency.rs`)
//! pins hot rows, caches cold ones in slots and reads the rest through its reader.
//!
//! Every read the engine issues carries a [`Tag`]; one type owns their encoding on the
//! reader's `u64` tags, so neuron reads and streamed reads cannot collide.

use crate::error::EngineError;
use crate::sparse::SparseFfn;
use pi2_io::{Completion, IoError, Request};
use pi2_kernels::{MatRef, QuantType};
use pi2_model::{GgufFile, LayerWeights};

/// What a completed read was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    /// Candidate `k`'s gate row (decode).
    Gate(usize),
    /// Candidate `k`'s up or down row (decode).
    UpDown(usize),
    /// A unit's whole FFN for a dense batch (prefill staging).
    Stage,
    /// A streamed layer's attention projections.
    Attention,
    /// A chunk of streamed output rows into buffer 0 or 1.
    Output(usize),
    /// Token embedding rows.
    Embedding,
}

impl Tag {
    const STAGE: u64 = u64::MAX;
    const ATTENTION: u64 = u64::MAX - 1;
    const OUTPUT: [u64; 2] = [u64::MAX - 2, u64::MAX - 3];
    const EMBEDDING: u64 = u64::MAX - 4;

    /// The reader's tag.
    pub fn encode(self) -> u64 {
        match self {
            Tag::Gate(k) => (k as u64) << 1,
            Tag::UpDown(k) => (k as u64) << 1 | 1,
            Tag::Stage => Self::STAGE,
            Tag::Attention => Self::ATTENTION,
            Tag::Output(b) => Self::OUTPUT[b],
            Tag::Embedding => Self::EMBEDDING,
        }
    }

    pub fn decode(t: u64) -> Tag {
        match t {
            Self::STAGE => Tag::Stage,
            Self::ATTENTION => Tag::Attention,
            t if t == Self::OUTPUT[0] => Tag::Output(0),
            t if t == Self::OUTPUT[1] => Tag::Output(1),
            Self::EMBEDDING => Tag::Embedding,
            t if t & 1 == 0 => Tag::Gate((t >> 1) as usize),
            t => Tag::UpDown((t >> 1) as usize),
        }
    }
}

/// The rows of one candidate neuron for the current step, by address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NeuronRows {
    pub gate: usize,
    pub up: usize,
    pub down: usize,
    /// Whether the gate row must be read before use (its read was queued).
    pub gate_missing: bool,
    /// The residency's handle of the rows (a cache slot), [`NeuronRows::PINNED`] if none.
    pub slot: u32,
}

impl NeuronRows {
    /// Rows that need no handle: mapped or pinned.
    pub const PINNED: u32 = u32::MAX;
}

/// A confirmed neuron's up and down rows, after its gate phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UpDown {
    /// Pinned or mapped.
    Resident,
    /// In its cache slot already.
    Cached,
    /// Reads queued.
    Queued,
}

/// Counts of one step that the residency records.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StepCounts {
    pub updown_reads: usize,
    pub updown_cached: usize,
    pub confirmed: usize,
    /// Bytes of one neuron's up and down rows.
    pub updown_row_bytes: usize,
    pub io_wait: std::time::Duration,
}

/// Where the rows of a sparse step are. `locate` runs on the driver (it claims rows);
/// `after_gate` and `after_updown` run on the compute tasks, concurrently.
pub(crate) trait StepRows: Sync {
    /// Every row is always resident (nothing is read or tracked): the pipeline skips the
    /// per-neuron `after_gate` / `after_updown` calls.
    const ALWAYS_RESIDENT: bool = false;
    /// Formats and row bytes of unit `u`'s gate, up and (transposed) down rows.
    fn formats(&self, u: usize) -> [(QuantType, usize); 3];
    /// Starts a step: rows claimed by `locate` stay valid until the next `begin_step`.
    fn begin_step(&mut self) {}
    /// Whether all of neuron `i` of unit `u` (gate, up and down rows) is in memory now, so a
    /// step may use it without reading (a draft from what is resident).
    fn resident(&self, _u: usize, _i: usize) -> bool {
        true
    }
    /// Candidate `k` of the step: neuron `i` of unit `u`. A gate row not resident gets its read
    /// queued in `reqs`.
    fn locate(
        &mut self,
        u: usize,
        i: usize,
        k: usize,
        reqs: &mut Vec<Request>,
    ) -> Result<NeuronRows, EngineError>;
    /// Candidate `k`'s gate row was used; if it fired (`confirmed`), queue the reads of its
    /// up and down rows that are not resident.
    fn after_gate(
        &self,
        u: usize,
        i: usize,
        k: usize,
        rows: &NeuronRows,
        confirmed: bool,
        reqs: &mut Vec<Request>,
    ) -> UpDown;
    /// A confirmed candidate's up and down rows were used.
    fn after_updown(&self, rows: &NeuronRows);
    /// Issues reads queued by `locate` or `after_gate`.
    ///
    /// # Safety
    /// Every request must come from this residency's `locate` or `after_gate` in the current
    /// step (their destinations are rows it claimed and nothing reads before completion).
    unsafe fn submit(&self, reqs: &[Request]) -> Result<(), IoError>;
    /// A completion if one is ready.
    fn poll(&self) -> Result<Option<Completion>, IoError>;
    /// Waits for a completion (only while reads are outstanding).
    fn wait(&self) -> Result<Completion, IoError>;
    /// Reads issued and not yet completed.
    fn outstanding(&self) -> u64;
    /// A completion that is not the pipeline's own (a streamed read issued earlier).
    fn received(&self, tag: Tag);
    /// The step failed: wait out reads still in flight, forget what they were for.
    fn fail(&mut self) {}
    /// The step is over.
    fn end_step(&mut self, _counts: &StepCounts) {}
}

/// Every row in the file mapping: the in-memory case.
pub(crate) struct Mapped<'a> {
    gate: MatRef<'a>,
    up: MatRef<'a>,
    sparse: &'a SparseFfn<'a>,
    n_ff: usize,
    /// The last unit's down rows (a step's candidates come unit by unit).
    down: Option<(usize, MatRef<'a>)>,
}

impl<'a> Mapped<'a> {
    /// Layer `l`'s gate and up rows (experts stacked) and the sparse weights' down rows.
    pub fn new(f: &'a GgufFile, l: &LayerWeights, sparse: &'a SparseFfn<'a>, n_ff: usize) -> Self {
        Self {
            gate: l.gate.mat(f),
            up: l.up.mat(f),
            sparse,
            n_ff,
            down: None,
        }
    }

    /// Layer `li`'s rows in matrices already in memory (a layer streamed whole for a batch):
    /// gate and up rows in file order and the transposed down rows.
    pub fn with_rows(
        [gate, up, down_t]: [MatRef<'a>; 3],
        li: usize,
        sparse: &'a SparseFfn<'a>,
        n_ff: usize,
    ) -> Self {
        Self {
            gate,
            up,
            sparse,
            n_ff,
            down: Some((li, down_t)),
        }
    }

    /// Neuron `i` of unit `u` within the stacked gate and up tensors.
    fn row(&self, u: usize, i: usize) -> usize {
        (u % self.sparse.experts) * self.n_ff + i
    }
}

impl StepRows for Mapped<'_> {
    const ALWAYS_RESIDENT: bool = true;

    fn formats(&self, u: usize) -> [(QuantType, usize); 3] {
        let down = match self.down {
            Some((at, m)) if at == u => m,
            _ => self.sparse.layers[u].down_t.mat(),
        };
        [
            (self.gate.ty, self.gate.row_bytes()),
            (self.up.ty, self.up.row_bytes()),
            (down.ty, down.row_bytes()),
        ]
    }

    #[inline]
    fn locate(
        &mut self,
        u: usize,
        i: usize,
        _k: usize,
        _reqs: &mut Vec<Request>,
    ) -> Result<NeuronRows, EngineError> {
        let r = self.row(u, i);
        let down = match self.down {
            Some((at, m)) if at == u => m,
            _ => {
                let m = self.sparse.layers[u].down_t.mat();
                self.down = Some((u, m));
                m
            }
        };
        Ok(NeuronRows {
            gate: self.gate.row(r).as_ptr() as usize,
            up: self.up.row(r).as_ptr() as usize,
            down: down.row(i).as_ptr() as usize,
            gate_missing: false,
            slot: NeuronRows::PINNED,
        })
    }

    fn after_gate(
        &self,
        _u: usize,
        _i: usize,
        _k: usize,
        _rows: &NeuronRows,
        _confirmed: bool,
        _reqs: &mut Vec<Request>,
    ) -> UpDown {
        UpDown::Resident
    }

    fn after_updown(&self, _rows: &NeuronRows) {}

    unsafe fn submit(&self, reqs: &[Request]) -> Result<(), IoError> {
        debug_assert!(reqs.is_empty(), "mapped rows are never read");
        Ok(())
    }

    fn poll(&self) -> Result<Option<Completion>, IoError> {
        Ok(None)
    }

    fn wait(&self) -> Result<Completion, IoError> {
        unreachable!("mapped rows leave nothing outstanding")
    }

    fn outstanding(&self) -> u64 {
        0
    }

    fn received(&self, _tag: Tag) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_stay_apart() {
        let all = [
            Tag::Gate(0),
            Tag::Gate(12345),
            Tag::UpDown(0),
            Tag::UpDown(999_999),
            Tag::Stage,
            Tag::Attention,
            Tag::Output(0),
            Tag::Output(1),
            Tag::Embedding,
        ];
        for t in all {
            assert_eq!(Tag::decode(t.encode()), t, "{t:?}");
        }
        let codes: std::collections::HashSet<u64> = all.iter().map(|t| t.encode()).collect();
        assert_eq!(codes.len(), all.len());
    }
}
