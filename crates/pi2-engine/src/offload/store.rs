//! The offloaded model as the engine's [`Store`]: resident tensors from the file mapping (the
//! budget counts them), streamed attention layers and output rows through their buffers, a
//! unit's whole FFN staged from flash for dense batches, and decode's neuron rows through the
//! cluster pipeline with this offload as its residency.

use super::Offload;
use crate::error::EngineError;
use crate::weights::{output_rows, DenseDown, DenseFfn, FfnMats, SparseCall, Store, Table};
use pi2_kernels::{ActBuf, KernelSet, MatRef};
use pi2_model::{Model, TokenId};

/// An offload with the model whose mapping holds its resident tensors.
pub(crate) struct Offloaded<'m> {
    pub model: &'m Model,
    pub offload: Offload,
    /// Logits of one range for several rows, before they are scattered into place.
    tmp: Vec<f32>,
    /// Units whose every row is pinned run dense (see `EngineConfig::dense_resident`).
    dense: bool,
}

impl<'m> Offloaded<'m> {
    pub(crate) fn new(model: &'m Model, offload: Offload, dense: bool) -> Self {
        Self {
            model,
            offload,
            tmp: Vec::new(),
            dense,
        }
    }
}

impl Store for Offloaded<'_> {
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
        if table == Table::PerLayer || self.offload.streams_embedding() {
            return Ok(self.offload.embed(table, &embd, tokens, x)?);
        }
        for (t, &tok) in tokens.iter().enumerate() {
            embd.dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        Ok(())
    }

    fn attention(&mut self, li: usize) -> Result<[MatRef<'_>; 4], EngineError> {
        if self.offload.stream_attention(li)? {
            return Ok(self.offload.attention_mats(li));
        }
        let (f, l) = (&self.model.file, &self.model.weights.layers[li]);
        Ok([&l.wq, &l.wk, &l.wv, &l.wo].map(|w| w.mat(f)))
    }

    fn dense_ffn(&self, li: usize) -> Option<DenseFfn<'_>> {
        if !self.dense || self.model.config.n_expert > 0 {
            return None;
        }
        let [gate, up, down] = self.offload.pinned_mats(li, self.model.config.n_embd)?;
        Some(DenseFfn {
            gate,
            up,
            down: DenseDown::Transposed(down),
        })
    }

    fn ffn(&mut self, unit: usize, next: Option<usize>) -> Result<FfnMats<'_>, EngineError> {
        let b = self.offload.stage_unit(unit, next)?;
        let (gate, up, down) = self.offload.stage_mats(b, unit, self.model.config.n_embd);
        Ok(FfnMats {
            gate,
            up,
            down,
            down_transposed: true,
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
        let out = self.model.weights.output.mat(&self.model.file);
        if !self.offload.streams_output() {
            output_rows(ks, &out, acts, n, ranges, logits, &mut self.tmp);
            return Ok(0);
        }
        let before = self.offload.stats().out_bytes;
        if ranges == [(0, out.rows)] || n > 1 {
            // Every row, or several tokens' rows: the whole matrix, streamed in chunks.
            self.offload.lm_head(ks, &out, acts, n, logits)?;
        } else {
            self.offload.lm_head_rows(ks, &out, acts, ranges, logits)?;
        }
        Ok(self.offload.stats().out_bytes - before)
    }

    fn output_kind(&self) -> (pi2_kernels::ActKind, usize) {
        let out = self.model.weights.output.mat(&self.model.file);
        (out.ty.act_kind(), out.row_bytes())
    }

    fn output_resident_rows(&self) -> usize {
        self.offload.output_resident_rows()
    }

    fn sparse_token(&mut self, call: SparseCall<'_, '_>) -> Result<(), EngineError> {
        crate::pipeline::token(
            call.step,
            call.s,
            call.buffers,
            &mut self.offload,
            call.stats,
            call.record,
        )
    }

    fn charge_kv(&mut self, bytes: u64, positions: usize) -> Result<(), EngineError> {
        self.offload.charge_kv(bytes, positions)
    }

    fn offload(&self) -> Option<&Offload> {
        Some(&self.offload)
    }

    fn offload_mut(&mut self) -> Option<&mut Offload> {
        Some(&mut self.offload)
    }
}
