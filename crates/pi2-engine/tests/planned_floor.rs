//! A conversion's memory floor known before converting: `planned_min_budget` on the plain model
//! and `pi2_convert::plan::planned` gives what `min_budget` finds in the converted file, byte
//! for byte, with and without a clustered head or predictors, tied or separate output.

mod common;

use pi2_convert::{self as convert, ConvertConfig};
use pi2_engine::EngineConfig;
use pi2_model::Model;

fn floors(spec: &pi2_model::synth::SynthSpec, cc: &ConvertConfig) -> (u64, u64) {
    let cfg = EngineConfig {
        n_ctx: 64,
        threads: 2,
        ..Default::default()
    };
    let bytes = pi2_model::synth::build(spec).to_bytes();
    let plain = Model::from_file(pi2_model::GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let (profile, th, samples) = common::profile_and_samples(&plain, &cfg, 0.4, 50);
    let (w, report) = convert::convert(&plain, &profile, &th, samples, cc).unwrap();
    let converted =
        Model::from_file(pi2_model::GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&converted).unwrap().unwrap();
    let (kv, scratch) = (
        pi2_engine::kv_bytes_full(&plain, &cfg, 8) as u64,
        pi2_engine::scratch_bytes(&plain, &cfg, 8) as u64,
    );
    let found = pi2_engine::min_budget(&converted, &sp, kv, scratch).unwrap();
    // The fit chose the predictors' rank; the plan is given it (one rank for every layer here).
    let rank = report.layers.iter().map(|l| l.rank).max().unwrap_or(0);
    assert!(report.layers.iter().all(|l| l.rank == rank));
    let plan = convert::plan::planned(&plain, cc, rank).unwrap();
    let planned = pi2_engine::planned_min_budget(&plain, &plan, kv, scratch).unwrap();
    (found, planned)
}

#[test]
fn a_conversions_floor_is_known_before_converting() {
    let head = convert::head::HeadConfig {
        cluster: 8,
        share: 0.25,
        ..Default::default()
    };
    for tied in [false, true] {
        let spec = pi2_model::synth::SynthSpec {
            tied,
            ..common::offload_spec()
        };
        for (with_head, predictor) in [
            (false, None),
            (true, None),
            (true, Some(32)),
            (false, Some(32)),
        ] {
            let cc = ConvertConfig {
                sparsity: 0.4,
                predictor: predictor.map(|_| pi2_sparse::PredictorKind::Lowrank),
                down_type: Some(pi2_kernels::QuantType::Q8_0),
                head: with_head.then_some(head),
                fit: pi2_sparse::FitConfig {
                    rank_step: 32,
                    max_rank: predictor.unwrap_or(32),
                    ..Default::default()
                },
                ..ConvertConfig::default()
            };
            let (found, planned) = floors(&spec, &cc);
            assert_eq!(
                planned, found,
                "tied {tied}, head {with_head}, predictor {predictor:?}"
            );
        }
    }
}
