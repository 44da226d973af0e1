//! The engine against a naive f64 forward pass written from the architecture definitions, on
//! generated llama, qwen2 and gemma3 models, for every weight type, in one batch and token by
//! token.

use pi2_engine::{Engine, EngineConfig, Logits};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{Arch, FfnAct, GgufFile, Model, RopeKind};

fn dequant(m: &Model, v: &pi2_model::TensorView) -> Vec<Vec<f64>> {
    let mat = v.mat(&m.file);
    (0..mat.rows)
        .map(|r| {
            let mut row = vec![0.0f32; mat.cols];
            mat.dequantize_row(r, &mut row);
            row.into_iter().map(f64::from).collect()
        })
        .collect()
}

fn matvec(w: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
    w.iter()
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    x.iter()
        .zip(w)
        .map(|(v, &g)| v / (ms + eps).sqrt() * g as f64)
        .collect()
}

/// Logits of every position of `tokens`, computed directly from the definitions.
fn reference(m: &Model, tokens: &[u32]) -> Vec<Vec<f64>> {
    let c = &m.config;
    let f = &m.file;
    let (hd, group) = (c.head_dim, c.n_head / c.n_head_kv);
    let embd = dequant(m, &m.weights.token_embd);
    let gemma = c.arch == Arch::Gemma3;
    // Gemma scales the embeddings by sqrt(width).
    let embd_scale = if gemma { (c.n_embd as f64).sqrt() } else { 1.0 };
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embd[t as usize].iter().map(|v| v * embd_scale).collect())
        .collect();
    let norm_opt = |v: Vec<f64>, w: &Option<pi2_model::TensorView>| match w {
        Some(w) => rms(&v, w.f32s(f), c.rms_eps as f64),
        None => v,
    };
    for (li, l) in m.weights.layers.iter().enumerate() {
        // Gemma 3: sliding layers see the last `len` positions and use RoPE base 10000.
        let window = c
            .sliding_window
            .filter(|w| !w.global.is_some_and(|g| g.has(li)))
            .map(|w| w.len);
        let base = if window.is_some() {
            10000.0
        } else {
            c.rope_base as f64
        };
        let (wq, wk, wv, wo) = (
            dequant(m, &l.wq),
            dequant(m, &l.wk),
            dequant(m, &l.wv),
            dequant(m, &l.wo),
        );
        let (wg, wu, wd) = (dequant(m, &l.gate), dequant(m, &l.up), dequant(m, &l.down));
        let bias = |b: &Option<pi2_model::TensorView>, v: Vec<f64>| match b {
            Some(b) => v
                .iter()
                .zip(b.f32s(f))
                .map(|(a, &b)| a + b as f64)
                .collect(),
            None => v,
        };
        let rope = |v: &mut [f64], pos: usize| {
            for h in v.chunks_mut(hd) {
                for i in 0..c.n_rot / 2 {
                    let theta = pos as f64 * base.powf(-2.0 * i as f64 / c.n_rot as f64);
                    let (a, b) = match c.rope_kind {
                        RopeKind::Norm => (2 * i, 2 * i + 1),
                        RopeKind::Neox => (i, i + c.n_rot / 2),
                    };
                    let (x0, x1) = (h[a], h[b]);
                    h[a] = x0 * theta.cos() - x1 * theta.sin();
                    h[b] = x0 * theta.sin() + x1 * theta.cos();
                }
            }
        };
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let xn = rms(x, l.attn_norm.f32s(f), c.rms_eps as f64);
            let per_head = |v: Vec<f64>, w: &Option<pi2_model::TensorView>| match w {
                Some(w) => v
                    .chunks(hd)
                    .flat_map(|h| rms(h, w.f32s(f), c.rms_eps as f64))
                    .collect(),
                None => v,
            };
            let mut q = per_head(bias(&l.bq, matvec(&wq, &xn)), &l.q_norm);
            let mut k = per_head(bias(&l.bk, matvec(&wk, &xn)), &l.k_norm);
            rope(&mut q, pos);
            rope(&mut k, pos);
            qs.push(q);
            ks.push(k);
            vs.push(bias(&l.bv, matvec(&wv, &xn)));
        }
        for (t, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0.0; c.q_dim(0)];
            for h in 0..c.n_head {
                let kh = h / group;
                let first = window.map_or(0, |w| (t + 1).saturating_sub(w));
                let scores: Vec<f64> = (first..=t)
                    .map(|p| {
                        (0..hd)
                            .map(|i| qs[t][h * hd + i] * ks[p][kh * hd + i])
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (p, w) in (first..).zip(&e) {
                    for i in 0..hd {
                        att[h * hd + i] += w / sum * vs[p][kh * hd + i];
                    }
                }
            }
            let o = norm_opt(matvec(&wo, &att), &l.post_attn_norm);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let xn = rms(x, l.ffn_norm.f32s(f), c.rms_eps as f64);
            // Dense: one expert of weight 1. MoE: the top-k router logits, softmax over them.
            let experts: Vec<(usize, f64)> = match &l.router {
                None => vec![(0, 1.0)],
                Some(r) => {
                    let logits = matvec(&dequant(m, r), &xn);
                    let mut order: Vec<usize> = (0..logits.len()).collect();
                    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
                    let top = &order[..c.n_expert_used];
                    let z: f64 = top
                        .iter()
                        .map(|&e| (logits[e] - logits[top[0]]).exp())
                        .sum();
                    top.iter()
                        .map(|&e| (e, (logits[e] - logits[top[0]]).exp() / z))
                        .collect()
                }
            };
            let mut ffn_out = vec![0.0; c.n_embd];
            for (e, weight) in experts {
                let (ff, d) = (c.n_ff, c.n_embd);
                let g = matvec(&wg[e * ff..(e + 1) * ff], &xn);
                let u = matvec(&wu[e * ff..(e + 1) * ff], &xn);
                let h: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| match c.ffn_act {
                        FfnAct::Silu => g / (1.0 + (-g).exp()) * u,
                        FfnAct::Relu => g.max(0.0) * u,
                        FfnAct::DRelu => g.max(0.0) * u.max(0.0),
                        FfnAct::Gelu => {
                            let inner =
                                (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3));
                            0.5 * g * (1.0 + inner.tanh()) * u
                        }
                        FfnAct::SwigluOai => {
                            let g = g.min(7.0);
                            g / (1.0 + (-1.702 * g).exp()) * (u.clamp(-7.0, 7.0) + 1.0)
                        }
                    })
                    .collect();
                let y = matvec(&wd[e * d..(e + 1) * d], &h);
                ffn_out
                    .iter_mut()
                    .zip(&y)
                    .for_each(|(a, b)| *a += weight * b);
            }
            let y = norm_opt(ffn_out, &l.post_ffn_norm);
            x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        }
    }
    let out = dequant(m, &m.weights.output);
    xs.iter()
        .map(|x| {
            matvec(
                &out,
                &rms(x, m.weights.output_norm.f32s(f), c.rms_eps as f64),
            )
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn check(spec: SynthSpec, min_cosine: f64) {
    let bytes = build(&spec).to_bytes();
    let m = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let tokens: Vec<u32> = (0..12)
        .map(|i| (i * 37 + 5) % m.config.n_vocab as u32)
        .collect();
    let want = reference(&m, &tokens);
    let n_vocab = m.config.n_vocab;
    // Row-interleaved copies (the default) and the file's row layout.
    for (threads, repack) in [(1, true), (2, true), (2, false)] {
        let cfg = EngineConfig {
            threads,
            n_ctx: 64,
            tier: None,
            repack,
            ..Default::default()
        };
        let mut e = Engine::new(&m, &cfg).unwrap();
        let batch = e.forward(&tokens, Logits::From(0)).unwrap().to_vec();
        let mut e2 = Engine::new(&m, &cfg).unwrap();
        for (t, w) in want.iter().enumerate() {
            let step = e2
                .forward(&tokens[t..t + 1], Logits::Last)
                .unwrap()
                .to_vec();
            let row = &batch[t * n_vocab..(t + 1) * n_vocab];
            let (cb, cs) = (cosine(row, w), cosine(&step, w));
            assert!(
                cb >= min_cosine && cs >= min_cosine,
                "{} {:?} repack {repack} pos {t}: batch {cb:.6}, step {cs:.6}",
                spec.arch,
                spec.weight_type
            );
        }
    }
}

#[test]
fn llama_f32_matches_reference() {
    check(SynthSpec::default(), 0.9999);
}

#[test]
fn qwen2_f32_matches_reference() {
    check(
        SynthSpec {
            arch: "qwen2".into(),
            tied: false,
            ..Default::default()
        },
        0.9999,
    );
}

#[test]
fn gemma3_matches_reference() {
    // 12 tokens through a 4-token window: the sliding layer forgets, the global one does not.
    for (ty, bound) in [(QuantType::F32, 0.9999), (QuantType::Q5_0, 0.998)] {
        check(
            SynthSpec {
                arch: "gemma3".into(),
                weight_type: ty,
                embd_type: QuantType::Q8_0,
                seed: 3,
                ..Default::default()
            },
            bound,
        );
    }
}

#[test]
fn every_weight_type_matches_reference() {
    for ty in QuantType::ALL {
        // Quantized weights also quantize the activations (int8 dot products): looser bound.
        let bound = if matches!(ty, QuantType::F32 | QuantType::F16 | QuantType::BF16) {
            0.9999
        } else {
            0.998
        };
        check(
            SynthSpec {
                weight_type: ty,
                embd_type: QuantType::Q8_0,
                tied: false,
                seed: ty.ggml_id() as u64,
                ..Default::default()
            },
            bound,
        );
    }
}

#[test]
fn relu_family_ffns_match_reference() {
    for act in [FfnAct::Relu, FfnAct::DRelu] {
        for (ty, bound) in [(QuantType::F32, 0.9999), (QuantType::Q4_0, 0.998)] {
            check(
                SynthSpec {
                    ffn_act: act,
                    weight_type: ty,
                    embd_type: QuantType::Q8_0,
                    seed: 7,
                    ..Default::default()
                },
                bound,
            );
        }
    }
}

#[test]
fn mixture_of_experts_matches_reference() {
    for (ty, act) in [
        (QuantType::F32, FfnAct::Silu),
        (QuantType::Q4_0, FfnAct::Silu),
        (QuantType::Q8_0, FfnAct::DRelu),
    ] {
        // Quantized weights perturb the router's input, so a near-tie between two experts may
        // go the other way than in the f64 reference: a looser bound than for dense models.
        let bound = if ty == QuantType::F32 { 0.9999 } else { 0.995 };
        check(
            SynthSpec {
                n_expert: 4,
                n_expert_used: 2,
                n_ff: 256,
                ffn_act: act,
                weight_type: ty,
                seed: 11,
                ..Default::default()
            },
            bound,
        );
    }
}

/// A mixture of one expert (router weight exactly 1) is the dense model, to the bit.
#[test]
fn one_expert_moe_equals_its_dense_twin() {
    let logits = |spec: SynthSpec| {
        let bytes = build(&spec).to_bytes();
        let m = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
        let cfg = EngineConfig {
            threads: 2,
            n_ctx: 32,
            // Stacked experts keep the row layout; so must the dense twin's FFN to compare bits.
            repack: false,
            ..Default::default()
        };
        let mut e = Engine::new(&m, &cfg).unwrap();
        let mut out = e
            .forward(&[5, 9, 200, 17], Logits::From(0))
            .unwrap()
            .to_vec();
        out.extend_from_slice(e.forward(&[42], Logits::Last).unwrap());
        out
    };
    let spec = SynthSpec {
        weight_type: QuantType::Q4_1,
        ..Default::default()
    };
    let moe = SynthSpec {
        n_expert: 1,
        n_expert_used: 1,
        ..spec.clone()
    };
    assert_eq!(logits(spec), logits(moe));
}

/// Sliding-window layers keep a ring of positions: going back a few tokens (a chat turn
/// re-rendered) reuses the cache and gives the logits of a fresh run; going back past what the
/// ring still holds keeps nothing rather than attending to overwritten keys.
#[test]
fn sliding_window_cache_rolls_back_or_keeps_nothing() {
    let spec = SynthSpec {
        arch: "gemma3".into(),
        seed: 5,
        ..Default::default()
    };
    let bytes = build(&spec).to_bytes();
    let m = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 64,
        repack: false,
        ..Default::default()
    };
    let tokens: Vec<u32> = (0..20).map(|i| (i * 29 + 3) % 200).collect();
    let fresh = |upto: usize| {
        let mut e = Engine::new(&m, &cfg).unwrap();
        e.forward(&tokens[..upto], Logits::Last).unwrap().to_vec()
    };
    let mut e = Engine::new(&m, &cfg).unwrap();
    e.forward(&tokens[..3], Logits::Last).unwrap(); // ring of window - 1 + 3 = 6 positions
    for t in 3..12 {
        e.forward(&tokens[t..t + 1], Logits::Last).unwrap();
    }
    // Back 2 positions: the ring still holds what position 10 attends to.
    assert_eq!(e.truncate(10), 10);
    let again = e.forward(&tokens[10..11], Logits::Last).unwrap().to_vec();
    assert_eq!(again, fresh(11));
    // Back to position 2: positions 0..2 were overwritten in the ring.
    assert_eq!(e.truncate(2), 0);
    assert_eq!(e.n_past(), 0);
}
