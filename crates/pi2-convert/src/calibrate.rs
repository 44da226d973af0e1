//! Calibration: what a dense run of the model over a text tells the converter (which neurons
//! fire how often, and (input, fired) pairs to fit predictors on).

use crate::ConvertError;
use pi2_engine::{Engine, EngineError, Logits};
use pi2_model::TokenId;
use pi2_sparse::{
    Activation, Calibration, FfnObserver, LayerSamples, ModelInfo, Profile, ProfileConfig, Profiler,
};

/// What a calibration run recorded: per layer (input, fired) pairs, and every token's final
/// hidden state (rows of `n_embd`: what the clustered output head is built from).
#[derive(Clone, Debug)]
pub struct Samples {
    pub layers: Vec<LayerSamples>,
    pub hidden: Vec<f32>,
}

/// Records (x, fired) pairs per layer during a dense calibration run.
struct SampleObserver<'a> {
    samples: Samples,
    thresholds: &'a [f32],
    act: Activation,
}

impl FfnObserver for SampleObserver<'_> {
    fn observe(&mut self, layer: usize, x: &[f32], gate: &[f32]) {
        self.samples.layers[layer].push_batch(x, gate, self.thresholds[layer], self.act);
    }

    fn observe_head(&mut self, h: &[f32]) {
        self.samples.hidden.extend_from_slice(h);
    }
}

/// Run the dense model over `tokens` in chunks of `chunk` (each from an empty cache) and record
/// every layer's (input, fired) pairs at `thresholds` and the final hidden states;
/// `progress(done)` after each chunk. Without `keep_inputs` only the fired bits are kept (no
/// predictor can be fitted on them; they take about a tenth of the memory).
pub fn collect_samples(
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    chunk: usize,
    thresholds: &[f32],
    keep_inputs: bool,
    mut progress: impl FnMut(usize),
) -> Result<Samples, EngineError> {
    let c = &engine.model().config;
    let mut obs = SampleObserver {
        samples: Samples {
            layers: (0..c.n_layer)
                .map(|_| match keep_inputs {
                    true => LayerSamples::new(c.n_embd, c.n_ff),
                    false => LayerSamples::fired_only(c.n_embd, c.n_ff),
                })
                .collect(),
            hidden: Vec::new(),
        },
        thresholds,
        act: pi2_engine::profile_activation(c.ffn_act),
    };
    let mut done = 0;
    for part in tokens.chunks(chunk.max(1)) {
        engine.truncate(0);
        engine.forward_observed(part, Logits::Last, Some(&mut obs))?;
        done += part.len();
        progress(done);
    }
    engine.truncate(0);
    Ok(obs.samples)
}

/// A profile, the per-layer thresholds for one sparsity, and predictor samples at those
/// thresholds: everything [`crate::convert`] needs.
pub struct Calibrated {
    pub profile: Profile,
    pub thresholds: Vec<f32>,
    pub samples: Samples,
}

/// Profiles the dense model over `tokens` (chunks of `chunk`, each from an empty cache), sets
/// each layer's threshold for `sparsity`, and records the predictor samples at those
/// thresholds: `pi2 profile` and the calibration of `pi2 convert` in one call, for programs
/// that convert without the CLI. `info` names the model in the profile.
pub fn calibrate(
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    chunk: usize,
    sparsity: f32,
    info: ModelInfo,
) -> Result<Calibrated, ConvertError> {
    let c = &engine.model().config;
    let mut profiler = Profiler::new(c.n_layer, c.n_ff, pi2_engine::profile_activation(c.ffn_act));
    for part in tokens.chunks(chunk.max(1)) {
        engine.truncate(0);
        engine.forward_observed(part, Logits::Last, Some(&mut profiler))?;
    }
    let calibration = Calibration {
        file: info.file_name.clone(),
        tokens: tokens.len(),
    };
    let (profile, _) = profiler.finish(info, calibration, &ProfileConfig::default())?;
    let thresholds = profile
        .layers
        .iter()
        .map(|l| l.threshold_for(sparsity))
        .collect::<Result<Vec<f32>, _>>()?;
    let samples = collect_samples(engine, tokens, chunk, &thresholds, true, |_| {})?;
    Ok(Calibrated {
        profile,
        thresholds,
        samples,
    })
}
