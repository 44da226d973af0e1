//! The clustered output head against a brute-force reference written from its definition: for
//! every decoded token, the clusters scoring highest by `c.h + ucb * spread * |g.h|` (ties: the
//! lower index) until they hold the share of rows asked for are computed exactly, every other
//! row gets `c.h + a * g.h` (kept below the best exact logit), and the result comes back in
//! vocabulary order.

mod common;

use pi2_convert::{self as convert, ConvertConfig};
use pi2_engine::{Engine, EngineConfig, EngineParts, Logits, SparseFfn};
use pi2_kernels::{ActBuf, MatRef, QuantType};
use pi2_model::bundle::{
    HEAD_CENTROIDS, HEAD_COEF, HEAD_DIRECTIONS, HEAD_ORDER, HEAD_SPREAD, KEY_HEAD_CLUSTER,
    KEY_HEAD_UCB,
};
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model};
use pi2_sparse::FfnObserver;
use std::path::Path;

fn spec(embd: QuantType) -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::Q8_0,
        embd_type: embd,
        tied: false,
        ..SynthSpec::default()
    }
}

fn cfg(share: Option<f32>) -> EngineConfig {
    EngineConfig {
        threads: 2,
        n_ctx: 64,
        repack: false,
        head_share: share,
        ..EngineConfig::default()
    }
}

/// A converted model with a clustered head of clusters of 8 rows (stored as `row_type`, or as
/// the source's rows).
fn converted(dir: &Path, embd: QuantType, row_type: Option<QuantType>) -> Model {
    let bytes = build(&spec(embd)).to_bytes();
    let m = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let (profile, th, samples) = common::profile_and_samples(&m, &cfg(None), 0.3, 50);
    let cc = ConvertConfig {
        sparsity: 0.3,
        predictor: None,
        down_type: Some(QuantType::Q8_0),
        head: Some(convert::head::HeadConfig {
            cluster: 8,
            share: 0.2,
            row_type,
            ..Default::default()
        }),
        ..ConvertConfig::default()
    };
    let (w, report) = convert::convert(&m, &profile, &th, samples, &cc).unwrap();
    let h = report.head.unwrap();
    assert_eq!((h.cluster, h.clusters), (8, m.config.n_vocab.div_ceil(8)));
    let (input, out) = (dir.join("in.gguf"), dir.join("head.gguf"));
    std::fs::write(&input, &bytes).unwrap();
    convert::write_file(&w, &out, &input, false).unwrap();
    let m = Model::load(&out).unwrap();
    assert_eq!(m.weights.output.ty, row_type.unwrap_or(embd));
    m
}

/// Keeps the final normalized hidden states the head multiplies.
struct Hidden(Vec<f32>);
impl FfnObserver for Hidden {
    fn observe(&mut self, _: usize, _: &[f32], _: &[f32]) {}
    fn observe_head(&mut self, h: &[f32]) {
        self.0.clear();
        self.0.extend_from_slice(h);
    }
}

/// `w . a` in f64 for `a` quantized as `w`'s kernels quantize it.
fn exact_dot(w: &MatRef<'_>, r: usize, h: &[f32]) -> f64 {
    let d = h.len();
    let mut acts = ActBuf::new();
    acts.quantize(w.ty.act_kind(), h, d);
    let mut a = vec![0f64; d];
    acts.dequantize_row(0, &mut a);
    let mut row = vec![0f32; d];
    w.dequantize_row(r, &mut row);
    row.iter().zip(&a).map(|(&x, &y)| x as f64 * y).sum()
}

/// The reference logits of one token (vocabulary order), and whether the cluster choice was a
/// near tie (the engine's f32 sums may order it otherwise).
fn reference(m: &Model, h: &[f32], share: f32) -> (Vec<f64>, bool) {
    let f = &m.file;
    let vocab = m.config.n_vocab;
    let cluster = f.get(KEY_HEAD_CLUSTER).unwrap().as_u64().unwrap() as usize;
    let ucb = f.get(KEY_HEAD_UCB).unwrap().as_f64().unwrap();
    let k = vocab.div_ceil(cluster);
    let mat = |name: &str| {
        let t = f.tensor(name).unwrap();
        let ty = QuantType::from_ggml_id(t.ggml_type).unwrap();
        MatRef::new(ty, k, h.len(), f.tensor_data(t)).unwrap()
    };
    let floats = |name: &str| -> Vec<f64> {
        f.tensor_data(f.tensor(name).unwrap())
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect()
    };
    let (cent, dirs) = (mat(HEAD_CENTROIDS), mat(HEAD_DIRECTIONS));
    let (spread, coef) = (floats(HEAD_SPREAD), floats(HEAD_COEF));
    let order: Vec<u32> = f
        .tensor_data(f.tensor(HEAD_ORDER).unwrap())
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let out = m.weights.output.mat(f);
    let mean: Vec<f64> = (0..k).map(|c| exact_dot(&cent, c, h)).collect();
    let reach: Vec<f64> = (0..k).map(|c| exact_dot(&dirs, c, h)).collect();
    let scores: Vec<f64> = (0..k)
        .map(|c| mean[c] + ucb * spread[c] * reach[c].abs())
        .collect();
    let mut rank: Vec<usize> = (0..k).collect();
    rank.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let picks = ((share as f64 * vocab as f64 / cluster as f64).ceil() as usize).clamp(1, k);
    let near_tie = picks < k && (scores[rank[picks - 1]] - scores[rank[picks]]).abs() < 1e-3;
    let span = |c: usize| c * cluster..((c + 1) * cluster).min(vocab);
    let best = rank[..picks]
        .iter()
        .flat_map(|&c| span(c).map(|j| exact_dot(&out, j, h)))
        .fold(f64::NEG_INFINITY, f64::max);
    let mut logits = vec![0f64; vocab];
    for (pos, &c) in rank.iter().enumerate() {
        for j in span(c) {
            logits[order[j] as usize] = match pos < picks {
                true => exact_dot(&out, j, h),
                false => (mean[c] + coef[j] * reach[c]).min(best),
            };
        }
    }
    (logits, near_tie)
}

fn head_matches_reference(embd: QuantType, row_type: Option<QuantType>) {
    let dir = tempfile::tempdir().unwrap();
    let m = converted(dir.path(), embd, row_type);
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let sp: &SparseFfn<'_> = &sp;
    for share in [0.2f32, 0.05, 0.5] {
        let parts = EngineParts {
            sparse: Some(sp),
            ..Default::default()
        };
        let mut e = Engine::with_parts(&m, &cfg(Some(share)), parts).unwrap();
        let mut obs = Hidden(Vec::new());
        let (mut checked, mut ties) = (0, 0);
        for (i, &tok) in [5u32, 17, 42, 3, 99, 7, 64, 12, 8, 150].iter().enumerate() {
            let got = e
                .forward_observed(&[tok], Logits::Last, Some(&mut obs))
                .unwrap()
                .to_vec();
            let (want, near_tie) = reference(&m, &obs.0, share);
            if near_tie {
                ties += 1;
                continue;
            }
            let scale = want.iter().fold(1e-3f64, |a, v| a.max(v.abs()));
            for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    ((*g as f64) - w).abs() <= 1e-3 * scale,
                    "{embd} share {share} token {i} row {r}: {g} vs {w}"
                );
            }
            checked += 1;
        }
        assert!(checked >= 8, "{embd} share {share}: {ties} near ties");
        let st = e.head_stats();
        let rows = st.rows as f64 / st.steps as f64;
        let cluster = 8.0;
        let want_rows = (share as f64 * m.config.n_vocab as f64 / cluster).ceil() * cluster;
        assert!(
            rows <= want_rows && rows > want_rows - cluster,
            "{rows} {want_rows}"
        );
    }
}

#[test]
fn clustered_head_selects_and_computes_as_the_brute_force_reference() {
    // F32 output rows (acts unquantized) and Q8_0 ones (acts in Q8 blocks).
    head_matches_reference(QuantType::F32, None);
    head_matches_reference(QuantType::Q8_0, None);
    // Rows stored again in a smaller type (`convert --head-type`).
    head_matches_reference(QuantType::Q8_0, Some(QuantType::Q4_0));
}

#[test]
fn a_head_share_outside_0_1_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = converted(dir.path(), QuantType::F32, None);
    for bad in [0.0f32, -1.0, 1.5, f32::NAN] {
        let err = Engine::with_parts(&m, &cfg(Some(bad)), EngineParts::default())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("head share"), "{err}");
    }
    // A model without a head refuses one given.
    let plain =
        Model::from_file(GgufFile::from_bytes(&build(&spec(QuantType::F32)).to_bytes()).unwrap())
            .unwrap();
    let head = pi2_engine::ClusteredHead::load(&m, false).unwrap().unwrap();
    let parts = EngineParts {
        head: Some(&head),
        ..Default::default()
    };
    assert!(Engine::with_parts(&plain, &cfg(None), parts).is_err());
}

/// A converted model held in memory runs its layers dense from the source's down matrix (no
/// predictor: the sparse step would compute every gate row anyway): through the whole output
/// matrix it gives the source model's logits bit for bit, and it never takes a sparse step.
#[test]
fn converted_layers_held_in_memory_run_dense_as_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let m = converted(dir.path(), QuantType::F32, None);
    let src = Model::load(dir.path().join("in.gguf")).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    assert!(!sp.use_predictor);
    let tokens = [5u32, 17, 42, 3, 99, 7];
    let decode = |e: &mut Engine<'_>| -> Vec<Vec<f32>> {
        let mut out = vec![e.forward(&tokens[..3], Logits::Last).unwrap().to_vec()];
        for &t in &tokens[3..] {
            out.push(e.forward(&[t], Logits::Last).unwrap().to_vec());
        }
        out
    };
    let want = decode(&mut Engine::new(&src, &cfg(None)).unwrap());
    let parts = EngineParts {
        sparse: Some(&sp),
        ..Default::default()
    };
    let mut dense = Engine::with_parts(&m, &cfg(Some(1.0)), parts).unwrap();
    assert_eq!(decode(&mut dense), want);
    assert_eq!(dense.sparse_stats().token_layers, 0);
    // Asked not to, it takes the sparse step.
    let sparse_cfg = EngineConfig {
        dense_resident: false,
        ..cfg(Some(1.0))
    };
    let parts = EngineParts {
        sparse: Some(&sp),
        ..Default::default()
    };
    let mut sparse = Engine::with_parts(&m, &sparse_cfg, parts).unwrap();
    decode(&mut sparse);
    assert!(sparse.sparse_stats().token_layers > 0);
}
