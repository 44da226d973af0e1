//! A stand-in's metadata and tensor table: names, shapes, types, and how each tensor's rows
//! are generated.

use super::{Kind, StandInSpec, EPS, KEY_ALPHA, KEY_RATE, KEY_SEED, KEY_SHAPE};
use crate::arch::{FfnAct, KEY_FFN_ACTIVATION};
use crate::gguf::Value;
use crate::writer::TensorLayout;
use pi2_kernels::QuantType;

/// The stand-in's llama metadata and its own `pi2.synth.*` keys (the tokenizer's come after).
pub(super) fn metadata(spec: &StandInSpec, n_vocab: usize) -> Vec<(String, Value)> {
    let (s, q) = (spec.shape, spec.quant);
    let a = s.arch;
    let name = format!("pi2 stand-in {} {} {}", s.name, spec.ffn_act.name(), q);
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String(name)),
        ("general.alignment".into(), Value::U32(32)),
    ];
    let u = |v: usize| Value::U32(v as u32);
    for (k, v) in [
        ("context_length", u(s.n_ctx)),
        ("embedding_length", u(s.n_embd)),
        ("block_count", u(s.n_layer)),
        ("feed_forward_length", u(s.n_ff)),
        ("attention.head_count", u(s.n_head)),
        ("attention.head_count_kv", u(s.n_head_kv)),
        ("rope.dimension_count", u(s.head_dim())),
        ("attention.key_length", u(s.head_dim())),
        ("attention.value_length", u(s.head_dim())),
        ("rope.freq_base", Value::F32(s.rope_base)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("vocab_size", u(n_vocab)),
    ] {
        meta.push((format!("{a}.{k}"), v));
    }
    if s.n_expert > 0 {
        meta.push((format!("{a}.expert_count"), u(s.n_expert)));
        meta.push((format!("{a}.expert_used_count"), u(s.n_expert_used)));
        if a != "llama" {
            meta.push((format!("{a}.expert_feed_forward_length"), u(s.n_ff)));
        }
    }
    if a == "gpt-oss" {
        // gpt-oss-20b's: 128-token windows on every other layer, YaRN from 4096 tokens x32.
        meta.extend([
            (format!("{a}.attention.sliding_window"), u(128)),
            (
                format!("{a}.rope.scaling.type"),
                Value::String("yarn".into()),
            ),
            (format!("{a}.rope.scaling.factor"), Value::F32(32.0)),
            (format!("{a}.rope.scaling.original_context_length"), u(4096)),
        ]);
    }
    // gpt-oss computes its own clamped SwiGLU whatever the stand-in planted for.
    let act = match a {
        "gpt-oss" => FfnAct::SwigluOai,
        _ => spec.ffn_act,
    };
    meta.extend([
        (KEY_FFN_ACTIVATION.into(), Value::String(act.name().into())),
        (KEY_SHAPE.into(), Value::String(s.name.into())),
        (KEY_RATE.into(), Value::F32(spec.rate)),
        (KEY_ALPHA.into(), Value::F32(spec.alpha)),
        (KEY_SEED.into(), Value::U64(spec.seed)),
    ]);
    meta
}

/// The tensor table of a stand-in: layouts, how each is generated, and its geometry.
#[derive(Default)]
pub(super) struct Table {
    pub tensors: Vec<TensorLayout>,
    pub kinds: Vec<Kind>,
    pub geometry: Vec<(usize, usize)>,
}

impl Table {
    fn add(&mut self, name: String, dims: Vec<u64>, ty: QuantType, kind: Kind) {
        let cols = dims[0] as usize;
        let rows = dims[1..].iter().product::<u64>() as usize;
        let bytes = (ty.row_bytes(cols).expect("checked block multiple") * rows) as u64;
        self.tensors.push(TensorLayout {
            name,
            dims,
            ggml_type: ty.ggml_id(),
            bytes,
        });
        self.kinds.push(kind);
        self.geometry.push((rows, cols));
    }

    pub fn new(spec: &StandInSpec, n_vocab: usize, sigma_x: f32) -> Table {
        let (s, q) = (spec.shape, spec.quant);
        let (d, ff, hd) = (s.n_embd, s.n_ff, s.head_dim());
        let (qd, kvd) = (s.n_head * hd, s.n_head_kv * hd);
        let experts = s.n_expert.max(1);
        let w_in = (6.0 / d as f32).sqrt();
        let firing = match spec.ffn_act {
            FfnAct::Silu => 0.5,
            _ => spec.rate,
        };
        let w_down = EPS * sigma_x * (3.0 / (ff as f32 * firing * experts.min(2) as f32)).sqrt();
        let w_o = EPS * sigma_x * (3.0 / qd as f32).sqrt();
        let uni = |scale, zero_row0| Kind::Uniform { scale, zero_row0 };
        let mut t = Table::default();
        let (d64, ff64, e64, v64) = (d as u64, ff as u64, s.n_expert as u64, n_vocab as u64);
        t.add(
            "token_embd.weight".into(),
            vec![d64, v64],
            q,
            Kind::Embedding,
        );
        t.add(
            "output_norm.weight".into(),
            vec![d64],
            QuantType::F32,
            Kind::Ones,
        );
        t.add("output.weight".into(), vec![d64, v64], q, uni(w_in, false));
        let (ffn, ffn_dims, down_dims) = match s.n_expert > 0 {
            true => ("_exps", vec![d64, ff64, e64], vec![ff64, d64, e64]),
            false => ("", vec![d64, ff64], vec![ff64, d64]),
        };
        for l in 0..s.n_layer {
            let n = |t: &str| format!("blk.{l}.{t}");
            t.add(n("attn_norm.weight"), vec![d64], QuantType::F32, Kind::Ones);
            t.add(
                n("attn_q.weight"),
                vec![d64, qd as u64],
                q,
                uni(w_in, false),
            );
            t.add(
                n("attn_k.weight"),
                vec![d64, kvd as u64],
                q,
                uni(w_in, false),
            );
            t.add(
                n("attn_v.weight"),
                vec![d64, kvd as u64],
                q,
                uni(w_in, false),
            );
            if s.arch == "qwen3moe" {
                for k in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                    t.add(n(k), vec![hd as u64], QuantType::F32, Kind::Ones);
                }
            }
            t.add(
                n("attn_output.weight"),
                vec![qd as u64, d64],
                q,
                uni(w_o, true),
            );
            // gpt-oss: zero biases everywhere (the planted statistics hold), sinks at 0.
            let oss = s.arch == "gpt-oss";
            let zeros = |t: &mut Table, name: String, dims: Vec<u64>| {
                t.add(name, dims, QuantType::F32, Kind::Zeros)
            };
            if oss {
                for (b, len) in [("q", qd), ("k", kvd), ("v", kvd)] {
                    zeros(&mut t, n(&format!("attn_{b}.bias")), vec![len as u64]);
                }
                zeros(&mut t, n("attn_output.bias"), vec![d64]);
                zeros(&mut t, n("attn_sinks.weight"), vec![s.n_head as u64]);
            }
            let ffn_norm = if oss {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            };
            t.add(n(ffn_norm), vec![d64], QuantType::F32, Kind::Ones);
            if s.n_expert > 0 {
                let router = Kind::Router { scale: w_in };
                t.add(
                    n("ffn_gate_inp.weight"),
                    vec![d64, e64],
                    QuantType::F32,
                    router,
                );
            }
            if oss {
                zeros(&mut t, n("ffn_gate_inp.bias"), vec![e64]);
                for (p, len) in [("gate", ff64), ("up", ff64), ("down", d64)] {
                    zeros(&mut t, n(&format!("ffn_{p}_exps.bias")), vec![len, e64]);
                }
            }
            // The experts' own type where the shape has one (gpt-oss: MXFP4).
            let q = match s.n_expert > 0 {
                true => s.expert_quant.unwrap_or(q),
                false => q,
            };
            let gate = Kind::Gate {
                layer: l,
                scale: w_in,
            };
            t.add(
                n(&format!("ffn_gate{ffn}.weight")),
                ffn_dims.clone(),
                q,
                gate,
            );
            t.add(
                n(&format!("ffn_up{ffn}.weight")),
                ffn_dims.clone(),
                q,
                uni(w_in, false),
            );
            t.add(
                n(&format!("ffn_down{ffn}.weight")),
                down_dims.clone(),
                q,
                uni(w_down, true),
            );
        }
        t
    }
}
