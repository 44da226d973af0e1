//! The offloaded FFN as the decode pipeline's [`StepRows`]: a candidate's rows are pinned (the
//! first `hot.n` neurons of its unit, in hot-first file order; the gate rows of the first
//! `hot.n_gate`), in a cold slot of the LRU cache (claimed for the step), or read from flash
//! into that slot. A slot records which parts
//! (gate, up+down) it holds, so a neuron confirmed in an earlier step keeps its up/down rows.

use super::{Offload, GATE, UPDOWN};
use crate::error::EngineError;
use crate::residency::{NeuronRows, StepCounts, StepRows, Tag, UpDown};
use pi2_cache::Slot;
use pi2_io::{Completion, IoError, Request};
use pi2_kernels::QuantType;

impl StepRows for Offload {
    fn formats(&self, u: usize) -> [(QuantType, usize); 3] {
        let l = &self.layers[u];
        [l.gate, l.up, l.down].map(|p| (p.ty, p.row_bytes))
    }

    fn begin_step(&mut self) {
        self.cache.begin_step();
    }

    fn resident(&self, u: usize, i: usize) -> bool {
        let hot = &self.hot[u];
        if i < hot.n {
            return true;
        }
        let need = match i < hot.n_gate {
            true => UPDOWN,
            false => GATE | UPDOWN,
        };
        let key = (u * self.n_ff + i) as u32;
        self.cache
            .peek(key)
            .is_some_and(|slot| self.cache.parts(slot) & need == need)
    }

    fn locate(
        &mut self,
        u: usize,
        i: usize,
        k: usize,
        reqs: &mut Vec<Request>,
    ) -> Result<NeuronRows, EngineError> {
        let (lay, hot) = (&self.layers[u], &self.hot[u]);
        if i < hot.n {
            let base = hot.buf.as_ptr() as usize;
            self.stats.gate_hot += 1;
            return Ok(NeuronRows {
                gate: base + i * lay.gate.row_bytes,
                up: base + hot.up_at + i * lay.up.row_bytes,
                down: base + hot.down_at + i * lay.down.row_bytes,
                gate_missing: false,
                slot: NeuronRows::PINNED,
            });
        }
        let key = (u * self.n_ff + i) as u32;
        let slot = match self.cache.lookup(key) {
            Some(slot) => slot,
            None => self
                .cache
                .insert(key)
                .ok_or_else(|| EngineError::Offload("the neuron cache has no free slot".into()))?,
        };
        let base = self.cache.slot_ptr(slot) as usize;
        // A pinned gate row: the slot is for the up and down rows only.
        let gate_pinned = i < hot.n_gate;
        let gate_missing = !gate_pinned && self.cache.parts(slot) & GATE == 0;
        let rows = NeuronRows {
            gate: match gate_pinned {
                true => hot.buf.as_ptr() as usize + i * lay.gate.row_bytes,
                false => base + lay.gate.slot_at,
            },
            up: base + lay.up.slot_at,
            down: base + lay.down.slot_at,
            gate_missing,
            slot: slot.0,
        };
        if gate_missing {
            reqs.push(Request {
                offset: lay.gate.row_offset(i),
                len: lay.gate.row_bytes,
                dst: rows.gate as *mut u8,
                tag: Tag::Gate(k).encode(),
            });
            self.stats.gate_reads += 1;
            self.stats.decode_bytes += lay.gate.row_bytes as u64;
        } else if gate_pinned {
            self.stats.gate_hot += 1;
        } else {
            self.stats.gate_hits += 1;
        }
        Ok(rows)
    }

    fn after_gate(
        &self,
        u: usize,
        i: usize,
        k: usize,
        rows: &NeuronRows,
        confirmed: bool,
        reqs: &mut Vec<Request>,
    ) -> UpDown {
        if rows.slot == NeuronRows::PINNED {
            return UpDown::Resident;
        }
        let slot = Slot(rows.slot);
        self.cache.add_parts(slot, GATE);
        if !confirmed {
            return UpDown::Resident;
        }
        if self.cache.parts(slot) & UPDOWN != 0 {
            return UpDown::Cached;
        }
        let lay = &self.layers[u];
        let tag = Tag::UpDown(k).encode();
        reqs.push(Request {
            offset: lay.up.row_offset(i),
            len: lay.up.row_bytes,
            dst: rows.up as *mut u8,
            tag,
        });
        reqs.push(Request {
            offset: lay.down.row_offset(i),
            len: lay.down.row_bytes,
            dst: rows.down as *mut u8,
            tag,
        });
        UpDown::Queued
    }

    fn after_updown(&self, rows: &NeuronRows) {
        if rows.slot != NeuronRows::PINNED {
            self.cache.add_parts(Slot(rows.slot), UPDOWN);
        }
    }

    unsafe fn submit(&self, reqs: &[Request]) -> Result<(), IoError> {
        // SAFETY: the caller's contract: the destinations are slots claimed for this step, not
        // read before their completions arrive.
        unsafe { self.reader.submit(reqs) }
    }

    fn poll(&self) -> Result<Option<Completion>, IoError> {
        self.reader.try_recv()
    }

    fn wait(&self) -> Result<Completion, IoError> {
        self.reader.recv()
    }

    fn outstanding(&self) -> u64 {
        self.reader.outstanding()
    }

    fn received(&self, tag: Tag) {
        Offload::received(self, tag)
    }

    fn fail(&mut self) {
        Offload::fail(self)
    }

    fn end_step(&mut self, c: &StepCounts) {
        let st = &mut self.stats;
        st.token_layers += 1;
        st.io_wait_ns += c.io_wait.as_nanos() as u64;
        st.updown_reads += c.updown_reads as u64;
        st.decode_bytes += (c.updown_reads * c.updown_row_bytes) as u64;
        st.updown_hits += c.updown_cached as u64;
        st.updown_hot += (c.confirmed - c.updown_reads - c.updown_cached) as u64;
    }
}
