//! Dense where it fits: under a memory budget, a layer a plan names whose every row is pinned
//! runs the dense FFN from its pinned rows (no gate-row pipeline), computing the sparse step's
//! function (its threshold) in another order; a layer not wholly pinned runs the sparse step;
//! without a plan, or with `dense_resident: false`, every layer runs the sparse step (offloaded
//! decode equal to in-memory decode bit for bit, whatever the budget).

mod common;

use pi2_engine::{Engine, EngineConfig, Logits, Offload, OffloadConfig, SparseFfn};
use pi2_model::Model;

const PROMPT: [u32; 4] = [5, 17, 42, 3];
const DECODE: [u32; 8] = [99, 7, 64, 12, 8, 150, 33, 2];

fn run(e: &mut Engine<'_>) -> Vec<Vec<f32>> {
    e.truncate(0);
    let mut out = vec![e.forward_prompt(&PROMPT).unwrap().to_vec()];
    for &t in &DECODE {
        out.push(e.forward(&[t], Logits::Last).unwrap().to_vec());
    }
    out
}

/// Every layer named dense-where-pinned, as a plan would.
fn offloaded<'m>(
    m: &'m Model,
    sp: &'m SparseFfn<'m>,
    path: &std::path::Path,
    cfg: &EngineConfig,
    budget: u64,
) -> Engine<'m> {
    let every = Some(vec![true; m.config.n_layer]);
    offloaded_with(m, sp, path, cfg, budget, every)
}

fn offloaded_with<'m>(
    m: &'m Model,
    sp: &'m SparseFfn<'m>,
    path: &std::path::Path,
    cfg: &EngineConfig,
    budget: u64,
    dense_layers: Option<Vec<bool>>,
) -> Engine<'m> {
    let o = Offload::new(
        m,
        sp,
        path,
        pi2_engine::kv_bytes_full(m, cfg, 8) as u64,
        pi2_engine::scratch_bytes(m, cfg, 8) as u64,
        common::frequencies(m).as_deref(),
        &OffloadConfig {
            budget,
            hot_share: 1.0,
            dense_layers,
            ..Default::default()
        },
    )
    .unwrap();
    common::sparse_engine(m, cfg, sp, Some(o)).unwrap()
}

#[test]
fn wholly_pinned_layers_run_dense_and_the_rest_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let sparse_cfg = common::offload_cfg(64);
    let path = common::converted_model(dir.path(), &common::offload_spec(), &sparse_cfg, false);
    let m = Model::load(&path).unwrap();
    let (mut sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    sp.use_predictor = false;
    // Every neuron confirmed: the sparse step computes the whole FFN from the same rows.
    sp.set_thresholds(&vec![0.0; m.config.n_layer]).unwrap();
    let want = run(&mut common::sparse_engine(&m, &sparse_cfg, &sp, None).unwrap());
    let dense_cfg = EngineConfig {
        dense_resident: true,
        ..sparse_cfg.clone()
    };
    let roomy = 2 * m.file.file_size();
    let n_layer = m.config.n_layer as u64;

    let mut e = offloaded(&m, &sp, &path, &dense_cfg, roomy);
    assert!(e
        .offload()
        .unwrap()
        .hot_counts()
        .iter()
        .all(|&h| h == m.config.n_ff));
    let got = run(&mut e);
    assert_eq!(
        e.sparse_stats().dense_token_layers,
        DECODE.len() as u64 * n_layer
    );
    assert_eq!(
        e.sparse_stats().token_layers,
        0,
        "no layer ran the sparse step"
    );
    for (step, (w, g)) in want.iter().zip(&got).enumerate() {
        let diff = common::max_rel_diff(w, g);
        assert!(
            diff < 1e-3,
            "step {step}: dense from pinned rows differs by {diff}"
        );
    }

    // A plan that keeps the sparse step on layer 0 (slower dense there): only layer 1 dense.
    let plan = Some((0..n_layer).map(|l| l != 0).collect());
    let mut e = offloaded_with(&m, &sp, &path, &dense_cfg, roomy, plan);
    run(&mut e);
    assert_eq!(
        e.sparse_stats().dense_token_layers,
        DECODE.len() as u64 * (n_layer - 1)
    );
    assert_eq!(e.sparse_stats().token_layers, DECODE.len() as u64);

    // Asked for the sparse step everywhere, or no plan: in-memory decode's logits bit for bit.
    let mut e = offloaded(&m, &sp, &path, &sparse_cfg, roomy);
    common::assert_same_logits(&want, &run(&mut e), "sparse step under a roomy budget");
    assert_eq!(e.sparse_stats().dense_token_layers, 0);
    let mut e = offloaded_with(&m, &sp, &path, &dense_cfg, roomy, None);
    common::assert_same_logits(&want, &run(&mut e), "no plan under a roomy budget");
    assert_eq!(e.sparse_stats().dense_token_layers, 0);

    // With the file's thresholds the dense layers drop what the sparse step drops.
    let (mut file_sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    file_sp.use_predictor = false;
    let sparse_want = run(&mut common::sparse_engine(&m, &sparse_cfg, &file_sp, None).unwrap());
    let mut e = offloaded(&m, &file_sp, &path, &dense_cfg, roomy);
    let got = run(&mut e);
    assert_eq!(
        e.sparse_stats().dense_token_layers,
        DECODE.len() as u64 * n_layer
    );
    for (step, (w, g)) in sparse_want.iter().zip(&got).enumerate() {
        let diff = common::max_rel_diff(w, g);
        assert!(
            diff < 1e-3,
            "step {step}: thresholded dense differs by {diff}"
        );
    }
    let unthresholded = common::max_rel_diff(&sparse_want[4], &want[4]);
    assert!(
        unthresholded > 1e-2,
        "the thresholds dropped nothing ({unthresholded})"
    );

    // A budget that pins only part of a layer: that layer runs the sparse step.
    let (kv, scratch) = (
        pi2_engine::kv_bytes_full(&m, &sparse_cfg, 8) as u64,
        pi2_engine::scratch_bytes(&m, &sparse_cfg, 8) as u64,
    );
    let least = pi2_engine::min_budget(&m, &sp, kv, scratch).unwrap();
    let mut e = offloaded(&m, &sp, &path, &dense_cfg, least + m.file.file_size() / 8);
    let whole = (e.offload().unwrap().hot_counts().iter())
        .filter(|&&h| h == m.config.n_ff)
        .count() as u64;
    assert!(whole < n_layer, "the small budget pinned every layer");
    let got = run(&mut e);
    let st = e.sparse_stats();
    assert_eq!(st.dense_token_layers, DECODE.len() as u64 * whole);
    assert_eq!(st.token_layers, DECODE.len() as u64 * (n_layer - whole));
    for (step, (w, g)) in want.iter().zip(&got).enumerate() {
        let diff = common::max_rel_diff(w, g);
        assert!(
            diff < 1e-3,
            "step {step}: partly pinned decode differs by {diff}"
        );
    }
}
