//! What a conversion will write, known before it runs: the tensors [`crate::convert`] adds to a
//! dense model or writes in place of the source's, by name, shape and size. The one-command
//! flow checks a memory budget against the converted model's floor with it
//! (`pi2_engine::planned_min_budget`) before spending minutes on calibration.

use crate::ConvertError;
use crate::{down_type, head, predictor_type, refuse_unstorable, storable, ConvertConfig};
use pi2_engine::PlannedConversion;
use pi2_model::bundle::{
    Tensor, HEAD_CENTROIDS, HEAD_COEF, HEAD_DIRECTIONS, HEAD_FREQUENCY, HEAD_ORDER, HEAD_SPREAD,
};
use pi2_model::Model;

/// The conversion of the dense `model` under `cfg`, its predictors (if `cfg` fits any) of rank
/// `predictor_rank` (the fit chooses the rank: give the smallest it may choose for a lower
/// bound, `cfg.fit.rank_step`).
pub fn planned(
    model: &Model,
    cfg: &ConvertConfig,
    predictor_rank: usize,
) -> Result<PlannedConversion, ConvertError> {
    let c = &model.config;
    if c.n_expert > 0 {
        return Err(ConvertError::Refused(
            "a conversion plan is made for dense models (mixtures of experts stream as they are)"
                .into(),
        ));
    }
    let (d, ff) = (c.n_embd, c.n_ff);
    let bytes = |ty: pi2_kernels::QuantType, cols: usize, rows: usize| {
        ty.row_bytes(cols)
            .map(|b| (b * rows) as u64)
            .ok_or_else(|| refuse_unstorable("a planned tensor", ty, cols))
    };
    let mut tensors = Vec::new();
    let mut add = |name: String, dims: Vec<u64>, size: u64| tensors.push((name, dims, size));
    let mut down = None;
    for (li, l) in model.weights.layers.iter().enumerate() {
        let dt = down_type(cfg.down_type, l.down.ty, d)?;
        down.get_or_insert(dt);
        add(
            Tensor::DownT.name(li),
            vec![d as u64, ff as u64],
            bytes(dt, d, ff)?,
        );
        add(Tensor::Perm.name(li), vec![ff as u64], 4 * ff as u64);
        if cfg.predictor.is_some() {
            let r = predictor_rank;
            let (t1, t2) = (predictor_type(d), predictor_type(r));
            add(
                Tensor::Fc1.name(li),
                vec![d as u64, r as u64],
                bytes(t1, d, r)?,
            );
            add(
                Tensor::Fc2.name(li),
                vec![r as u64, ff as u64],
                bytes(t2, r, ff)?,
            );
            add(Tensor::Fc2Bias.name(li), vec![ff as u64], 4 * ff as u64);
        }
    }
    let down_type = down.ok_or_else(|| ConvertError::Refused("a model with no layers".into()))?;
    let head_cluster = match &cfg.head {
        None => None,
        Some(h) => {
            let out = &model.weights.output;
            let (vocab, k) = (out.rows, out.rows.div_ceil(h.cluster));
            let ty = h.row_type.unwrap_or(out.ty);
            if !storable(ty, d) {
                return Err(refuse_unstorable("head", ty, d));
            }
            let name = match model.weights.tied_output {
                true => "output.weight".to_string(),
                false => out.name.clone(),
            };
            let (v, k64) = (vocab as u64, k as u64);
            add(name, vec![d as u64, v], bytes(ty, d, vocab)?);
            add(HEAD_ORDER.into(), vec![v], 4 * v);
            let cty = head::centroid_type(d);
            add(
                HEAD_CENTROIDS.into(),
                vec![d as u64, k64],
                bytes(cty, d, k)?,
            );
            add(
                HEAD_DIRECTIONS.into(),
                vec![d as u64, k64],
                bytes(cty, d, k)?,
            );
            add(HEAD_SPREAD.into(), vec![k64], 4 * k64);
            add(HEAD_COEF.into(), vec![v], 4 * v);
            add(HEAD_FREQUENCY.into(), vec![k64], 4 * k64);
            Some(h.cluster)
        }
    };
    Ok(PlannedConversion {
        tensors,
        down_type,
        head_cluster,
    })
}
