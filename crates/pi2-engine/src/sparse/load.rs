//! Reading the sparse weights of a converted file (`pi2_model::bundle`) or a PowerInfer sparse
//! file: thresholds, transposed down rows and predictors, borrowed from the mapping.

use super::{check_thresholds, Blob, PredictorWeights, SparseFfn, SparseLayer, Weight};
use crate::EngineError;
use pi2_kernels::QuantType;
use pi2_model::bundle::{self, Tensor};
use pi2_model::{GgufFile, Model, Value};
use pi2_sparse::{PredictorKind, Profile};

fn corrupt(msg: String) -> EngineError {
    EngineError::Model(pi2_model::ModelError::Corrupt(msg))
}

fn f32s_le(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
        .collect()
}

/// Per-layer float array from metadata.
fn f32_array(f: &GgufFile, key: &str, n: usize) -> Result<Vec<f32>, EngineError> {
    let a = f
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt(format!("`{key}` is missing or not an array")))?;
    let v: Option<Vec<f32>> = a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect();
    match v {
        Some(v) if v.len() == n => Ok(v),
        _ => Err(corrupt(format!("`{key}` must hold {n} numbers"))),
    }
}

fn weight<'a>(
    f: &'a GgufFile,
    name: &str,
    rows: Option<usize>,
    cols: Option<usize>,
) -> Result<Option<Weight<'a>>, EngineError> {
    let Some(t) = f.tensor(name) else {
        return Ok(None);
    };
    let ty = QuantType::from_ggml_id(t.ggml_type)
        .ok_or_else(|| corrupt(format!("{name}: unsupported type {}", t.type_name())))?;
    let (c, r) = match t.dims[..] {
        [c, r] => (c as usize, r as usize),
        _ => return Err(corrupt(format!("{name}: not a matrix"))),
    };
    if rows.is_some_and(|x| x != r) || cols.is_some_and(|x| x != c) {
        return Err(corrupt(format!(
            "{name} is {r}x{c}, expected {}x{}",
            rows.map_or("?".into(), |x| x.to_string()),
            cols.map_or("?".into(), |x| x.to_string())
        )));
    }
    Weight::new(ty, r, c, Blob::File(f.tensor_data(t)))
        .map(Some)
        .map_err(|e| corrupt(format!("{name}: {e}")))
}

/// Check every record of a converted model's file against its checksum table (nothing for a
/// file without one): for a model used from memory, whose bytes are not read again.
pub fn verify_checksums(model: &Model) -> Result<(), EngineError> {
    if let Some(sums) = pi2_model::checksum::table(&model.file)? {
        pi2_model::checksum::verify_mapped(&model.file, &sums, |_| usize::MAX)?;
    }
    Ok(())
}

/// The sparse weights of a converted model (and its profile), of a PowerInfer sparse GGUF file
/// (predictors `blk.N.fc1/fc2`, `ffn_down_t`; no profile), or `None` for a plain model.
pub fn load_sparse(model: &Model) -> Result<Option<(SparseFfn<'_>, Option<Profile>)>, EngineError> {
    let f = &model.file;
    let c = &model.config;
    let kind = bundle::kind(f);
    if kind == bundle::Kind::Plain {
        return Ok(None);
    }
    let pi2 = kind == bundle::Kind::Pi2;
    if c.n_expert > 0 {
        if !pi2 {
            c.require_dense_ffn("PowerInfer sparse files")?;
        }
        bundle::check_version(f)?;
        let t = f32_array(f, bundle::KEY_THRESHOLDS, c.n_layer)?;
        check_thresholds(&t, c.n_layer)?;
        return Ok(Some((load_moe(model, t)?, None)));
    }
    let (kind, thresholds, cuts) = if pi2 {
        bundle::check_version(f)?;
        let kind = match f.get(bundle::KEY_PREDICTOR_KIND).and_then(Value::as_str) {
            Some("none") => None,
            Some(k) => Some(
                PredictorKind::from_name(k)
                    .ok_or_else(|| corrupt(format!("unknown predictor kind `{k}`")))?,
            ),
            None => {
                return Err(corrupt(format!(
                    "`{}` is missing",
                    bundle::KEY_PREDICTOR_KIND
                )))
            }
        };
        let t = f32_array(f, bundle::KEY_THRESHOLDS, c.n_layer)?;
        check_thresholds(&t, c.n_layer)?;
        let cuts = match kind {
            Some(_) => f32_array(f, bundle::KEY_CUTS, c.n_layer)?,
            None => vec![0.0; c.n_layer],
        };
        (kind, t, cuts)
    } else {
        // PowerInfer: sigmoid(score) > sparse_threshold, i.e. the logit above its log-odds.
        let p = f
            .get(bundle::KEY_POWERINFER_THRESHOLD)
            .and_then(Value::as_f64)
            .unwrap_or(0.5);
        if !(p > 0.0 && p < 1.0) {
            return Err(corrupt(format!(
                "{} {p} is not in (0, 1)",
                bundle::KEY_POWERINFER_THRESHOLD
            )));
        }
        let cut = (p / (1.0 - p)).ln() as f32;
        (
            Some(PredictorKind::Trained),
            vec![0.0; c.n_layer],
            vec![cut; c.n_layer],
        )
    };
    let mut layers = Vec::with_capacity(c.n_layer);
    for (li, l) in model.weights.layers.iter().enumerate() {
        let down_t = if l.down_transposed {
            Weight::new(
                l.down.ty,
                c.n_ff,
                c.n_embd,
                Blob::File(l.down.mat(f).bytes()),
            )
            .map_err(|e| corrupt(e.to_string()))?
        } else {
            weight(f, &Tensor::DownT.name(li), Some(c.n_ff), Some(c.n_embd))?
                .ok_or_else(|| corrupt(format!("{} is missing", Tensor::DownT.name(li))))?
        };
        let predictor = match kind {
            None => None,
            Some(kind) => {
                let fc1 = weight(f, &Tensor::Fc1.name(li), None, Some(c.n_embd))?
                    .ok_or_else(|| corrupt(format!("{} is missing", Tensor::Fc1.name(li))))?;
                let fc2 = weight(f, &Tensor::Fc2.name(li), Some(c.n_ff), Some(fc1.rows))?
                    .ok_or_else(|| corrupt(format!("{} is missing", Tensor::Fc2.name(li))))?;
                let bias = match f.tensor(&Tensor::Fc2Bias.name(li)) {
                    None => None,
                    Some(t) if t.ggml_type == 0 && t.n_elements() == c.n_ff as u64 => {
                        Some(f32s_le(f.tensor_data(t)))
                    }
                    Some(_) => {
                        return Err(corrupt(format!(
                            "{} is not {} F32 values",
                            Tensor::Fc2Bias.name(li),
                            c.n_ff
                        )))
                    }
                };
                Some(PredictorWeights {
                    kind,
                    fc1,
                    fc2,
                    bias,
                    cut: cuts[li],
                })
            }
        };
        layers.push(SparseLayer {
            threshold: thresholds[li],
            down_t,
            predictor,
        });
    }
    let profile = match f.get(bundle::KEY_PROFILE).and_then(Value::as_str) {
        Some(text) => Some(
            Profile::from_json(text, bundle::KEY_PROFILE).map_err(|e| corrupt(e.to_string()))?,
        ),
        None => None,
    };
    let sp = SparseFfn {
        experts: 1,
        use_predictor: layers.iter().all(|l| l.predictor.is_some()),
        layers,
        batches_too: false,
    };
    Ok(Some((sp, profile)))
}

/// How often each neuron of each FFN unit (layer, or expert of a layer) fired on the
/// calibration text, in the file's neuron order: what pins hot neurons across units. `None` for
/// a model that is not converted or carries no profile.
pub fn unit_frequencies(model: &Model) -> Result<Option<Vec<Vec<f32>>>, EngineError> {
    let Some((_, profile)) = load_sparse(model)? else {
        return Ok(None);
    };
    if model.config.n_expert > 0 {
        return moe_frequencies(model).map(Some);
    }
    Ok(profile.map(|p| p.layers.iter().map(|l| l.frequency.clone()).collect()))
}

/// The sparse weights of a converted mixture-of-experts file (zero-copy).
fn load_moe(model: &Model, thresholds: Vec<f32>) -> Result<SparseFfn<'_>, EngineError> {
    let (f, c) = (&model.file, &model.config);
    if f.get(bundle::KEY_PREDICTOR_KIND).and_then(Value::as_str) != Some("none") {
        return Err(corrupt(
            "a converted mixture-of-experts file must have no predictors".into(),
        ));
    }
    let (ff, d) = (c.n_ff, c.n_embd);
    let mut layers = Vec::with_capacity(c.n_layer * c.n_expert);
    for (li, l) in model.weights.layers.iter().enumerate() {
        if !l.down_transposed {
            return Err(corrupt(format!(
                "{} is missing",
                Tensor::DownTExps.name(li)
            )));
        }
        let down = l.down.mat(f);
        for e in 0..c.n_expert {
            let bytes = down.rows(e * ff..(e + 1) * ff).bytes();
            let down_t = Weight::new(down.ty, ff, d, Blob::File(bytes))
                .map_err(|e| corrupt(format!("layer {li}: {e}")))?;
            layers.push(SparseLayer {
                threshold: thresholds[li],
                down_t,
                predictor: None,
            });
        }
    }
    Ok(SparseFfn {
        layers,
        experts: c.n_expert,
        use_predictor: false,
        batches_too: false,
    })
}

/// Per-unit firing frequencies of a converted mixture-of-experts file (`ffn_freq_exps`), in
/// file neuron order.
fn moe_frequencies(model: &Model) -> Result<Vec<Vec<f32>>, EngineError> {
    let (f, c) = (&model.file, &model.config);
    let mut out = Vec::with_capacity(c.n_layer * c.n_expert);
    for li in 0..c.n_layer {
        let n = Tensor::FreqExps.name(li);
        let t = f
            .tensor(&n)
            .ok_or_else(|| corrupt(format!("{n} is missing")))?;
        if t.ggml_type != 0 || t.n_elements() != (c.n_ff * c.n_expert) as u64 {
            return Err(corrupt(format!(
                "{n} is not {} F32 values",
                c.n_ff * c.n_expert
            )));
        }
        out.extend(
            f32s_le(f.tensor_data(t))
                .chunks_exact(c.n_ff)
                .map(<[f32]>::to_vec),
        );
    }
    Ok(out)
}
