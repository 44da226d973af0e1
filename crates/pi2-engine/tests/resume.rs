//! A pass resumed at a layer from a dense pass's residual stream computes what the whole pass
//! computes (the layers below are the same), leaves the context as it was, and refuses
//! streams and layers that do not fit the model.

use pi2_engine::{Engine, EngineConfig, EngineError, Logits};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model};
use pi2_sparse::FfnObserver;

fn model(arch: &str) -> Model {
    let spec = SynthSpec {
        arch: arch.into(),
        n_embd: 64,
        n_ff: 192,
        n_layer: 4,
        weight_type: QuantType::Q8_0,
        ..SynthSpec::default()
    };
    Model::from_file(GgufFile::from_bytes(&build(&spec).to_bytes()).unwrap()).unwrap()
}

fn engine(m: &Model) -> Engine<'_> {
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 64,
        ..EngineConfig::default()
    };
    Engine::new(m, &cfg).unwrap()
}

/// Keeps every layer's entering stream; drops neurons below `threshold` in layer `layer`.
struct Streams {
    streams: Vec<Vec<f32>>,
    layer: usize,
    threshold: Option<f32>,
}

impl FfnObserver for Streams {
    fn observe(&mut self, _layer: usize, _x: &[f32], _gate: &[f32]) {}

    fn observe_stream(&mut self, layer: usize, x: &[f32]) {
        self.streams.resize_with(layer + 1, Vec::new);
        self.streams[layer] = x.to_vec();
    }

    fn confirm_threshold(&self, layer: usize) -> Option<f32> {
        self.threshold.filter(|_| layer == self.layer)
    }
}

fn observer(layer: usize, threshold: Option<f32>) -> Streams {
    Streams {
        streams: Vec::new(),
        layer,
        threshold,
    }
}

#[test]
fn a_resumed_pass_is_the_whole_pass() {
    for arch in ["llama", "qwen2", "gemma3"] {
        let m = model(arch);
        let mut e = engine(&m);
        let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 256).collect();
        let mut dense = observer(0, None);
        e.forward_observed(&tokens, Logits::From(10), Some(&mut dense))
            .unwrap();
        e.truncate(0);
        assert_eq!(dense.streams.len(), 4, "{arch}: a stream per layer");
        for layer in 0..4 {
            // Layer `layer` alone made sparse, through the whole pass and resumed.
            let mut whole = observer(layer, Some(0.05));
            let want = e
                .forward_observed(&tokens, Logits::From(10), Some(&mut whole))
                .unwrap()
                .to_vec();
            e.truncate(0);
            let mut resumed = observer(layer, Some(0.05));
            let got = e
                .resume_observed(
                    layer,
                    &tokens,
                    &dense.streams[layer],
                    Logits::From(10),
                    Some(&mut resumed),
                )
                .unwrap()
                .to_vec();
            assert_eq!(e.n_past(), 0, "{arch}: a resumed pass extends nothing");
            let worst = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "{arch} layer {layer}: {worst}");
            // The threshold is seen: the sparse layer changed the logits.
            let dense_logits = e.forward(&tokens, Logits::From(10)).unwrap().to_vec();
            e.truncate(0);
            assert!(dense_logits != got, "{arch} layer {layer}: nothing dropped");
        }
    }
}

#[test]
fn a_resumed_pass_leaves_the_context_to_the_next() {
    for arch in ["llama", "gemma3"] {
        let m = model(arch);
        let mut e = engine(&m);
        let tokens: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % 256).collect();
        e.forward(&tokens[..6], Logits::Last).unwrap();
        let want = e.forward(&tokens[6..], Logits::Last).unwrap().to_vec();
        e.truncate(0);
        e.forward(&tokens[..6], Logits::Last).unwrap();
        // A resumed pass at the next positions, then the real continuation.
        let stream = vec![0.5f32; 6 * m.config.n_embd];
        e.resume_observed(2, &tokens[6..], &stream, Logits::Last, None)
            .unwrap();
        match e.n_past() {
            6 => {
                let got = e.forward(&tokens[6..], Logits::Last).unwrap().to_vec();
                assert_eq!(want, got, "{arch}");
            }
            // Gemma's 4-token windows: the pass wrote over what position 6 attends to, and
            // says so as truncate does.
            0 => assert_eq!(arch, "gemma3"),
            n => panic!("{arch}: {n} positions kept"),
        }
    }
}

#[test]
fn streams_and_layers_that_do_not_fit_are_refused() {
    let m = model("llama");
    let mut e = engine(&m);
    let d = m.config.n_embd;
    let bad_len = e
        .resume_observed(1, &[1], &vec![0.0; d + 1], Logits::Last, None)
        .map(|_| ());
    assert!(matches!(bad_len, Err(EngineError::Resume { .. })));
    let bad_layer = e
        .resume_observed(4, &[1], &vec![0.0; d], Logits::Last, None)
        .map(|_| ());
    assert!(matches!(bad_layer, Err(EngineError::Resume { .. })));
    let empty = e
        .resume_observed(1, &[], &[], Logits::Last, None)
        .map(|_| ());
    assert!(matches!(empty, Err(EngineError::Empty)));
    let too_long = e
        .resume_observed(1, &[1; 65], &vec![0.0; 65 * d], Logits::Last, None)
        .map(|_| ());
    assert!(matches!(too_long, Err(EngineError::ContextFull { .. })));
    let msg = bad_len.err().unwrap().to_string();
    assert!(msg.contains("n_embd 64"), "{msg}");
}
