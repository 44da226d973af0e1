//! Small deterministic GGUF models for tests: any supported architecture and weight type, random
//! weights, and a byte-level BPE vocabulary (256 byte tokens, a few merges, ChatML control tokens).

use crate::arch::{FfnAct, KEY_FFN_ACTIVATION};
use crate::gguf::Value;
pub use crate::rng::Rng;
use crate::writer::GgufWriter;
use pi2_kernels::QuantType;

/// Shape and types of a generated model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    /// `llama`, `qwen2` or `gemma3` (anything else produces a file pi2 must refuse). Gemma 3
    /// models get a 4-token sliding window on every other layer (layer 1 global) and heads
    /// twice the width / heads.
    pub arch: String,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Type of the attention and FFN matrices.
    pub weight_type: QuantType,
    /// Type of the token embedding (also the output when `tied`).
    pub embd_type: QuantType,
    pub tied: bool,
    pub seed: u64,
    pub ffn_act: FfnAct,
    /// Experts per layer (0: dense FFN) and experts per token.
    pub n_expert: usize,
    pub n_expert_used: usize,
}

impl Default for SynthSpec {
    fn default() -> Self {
        Self {
            arch: "llama".into(),
            n_embd: 256,
            n_layer: 2,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 2,
            weight_type: QuantType::F32,
            embd_type: QuantType::F32,
            tied: true,
            seed: 1,
            ffn_act: FfnAct::Silu,
            n_expert: 0,
            n_expert_used: 0,
        }
    }
}

/// Random row-major weights of `rows x cols` in `ty`, values of magnitude about `scale`.
pub fn random_tensor(
    ty: QuantType,
    rows: usize,
    cols: usize,
    scale: f32,
    rng: &mut Rng,
) -> Vec<u8> {
    let row_bytes = ty
        .row_bytes(cols)
        .expect("cols must be a whole number of blocks");
    let mut out = Vec::with_capacity(rows * row_bytes);
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    for _ in 0..rows {
        match ty {
            QuantType::F32 => (0..cols)
                .for_each(|_| out.extend_from_slice(&(rng.uniform() * scale).to_le_bytes())),
            QuantType::F16 => {
                (0..cols).for_each(|_| out.extend_from_slice(&f16(rng.uniform() * scale)))
            }
            QuantType::BF16
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0
            | QuantType::IQ4_NL
            | QuantType::IQ4_XS
            | QuantType::MXFP4 => {
                let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * scale).collect();
                out.extend(ty.quantize_row(&x).expect("these formats have a quantizer"));
            }
            QuantType::Q2_K | QuantType::Q3_K => {
                // Random quants and scales; super-scales chosen so values are ~scale. Q2_K:
                // w = d*sc*q - dmin*m, sc and m ~ U[0,15], q ~ U[0,3]: dmin = 1.5 d centres
                // them. Q3_K: w = d*(s-32)*q3, s ~ U[0,63], q3 ~ U[-4,3].
                for _ in 0..cols / 256 {
                    let mut b: Vec<u8> = (0..ty.block_bytes())
                        .map(|_| rng.next_u64() as u8)
                        .collect();
                    if ty == QuantType::Q2_K {
                        let d = scale / 12.0;
                        b[80..82].copy_from_slice(&f16(d));
                        b[82..84].copy_from_slice(&f16(1.5 * d));
                    } else {
                        b[108..110].copy_from_slice(&f16(scale / 40.0));
                    }
                    out.extend_from_slice(&b);
                }
            }
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => {
                // Random quants and sub-block scales, super-scales chosen so values are ~scale.
                for _ in 0..cols / 256 {
                    let mut b: Vec<u8> = (0..ty.block_bytes())
                        .map(|_| rng.next_u64() as u8)
                        .collect();
                    match ty {
                        QuantType::Q6_K => {
                            // int8 scales in [-32, 32), q in [-32, 32): d * 32 * 32 ~ scale
                            for s in &mut b[192..208] {
                                *s = ((*s as i8) / 4) as u8;
                            }
                            b[208..].copy_from_slice(&f16(scale / 1024.0));
                        }
                        _ => {
                            // w = d*sc*q - dmin*m with sc, m ~ U[0,63] and q ~ U[0,15] (Q4_K) or
                            // U[0,31] (Q5_K): dmin = d * mean(q) makes the weights zero-mean, so
                            // the generated model is as well-conditioned as the other types.
                            let (d, mean_q) = if ty == QuantType::Q4_K {
                                (scale / 250.0, 7.5)
                            } else {
                                (scale / 500.0, 15.5)
                            };
                            b[..2].copy_from_slice(&f16(d));
                            b[2..4].copy_from_slice(&f16(d * mean_q));
                        }
                    }
                    out.extend_from_slice(&b);
                }
            }
        }
    }
    out
}

/// The vocabulary: 256 byte tokens, merges of a few common pairs, then the control tokens.
pub fn vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let map = crate::tokenizer::byte_to_char();
    let mut tokens: Vec<String> = map.iter().map(|c| c.to_string()).collect();
    let sp = map[b' ' as usize];
    let pairs = [
        ("t", "h"),
        ("th", "e"),
        (&*sp.to_string(), "the"),
        ("i", "n"),
        ("e", "r"),
        ("a", "n"),
        (&*sp.to_string(), "a"),
    ];
    let mut merges = Vec::new();
    for (a, b) in pairs {
        merges.push(format!("{a} {b}"));
        tokens.push(format!("{a}{b}"));
    }
    let mut types = vec![1; tokens.len()];
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_string());
        types.push(3);
    }
    (tokens, types, merges)
}

/// The architecture's hyper-parameters and the tokenizer.
fn write_meta(w: &mut GgufWriter, spec: &SynthSpec, vocab: (Vec<String>, Vec<i32>, Vec<String>)) {
    let (tokens, types, merges) = vocab;
    let n_vocab = tokens.len();
    let a = spec.arch.as_str();
    w.meta("general.architecture", Value::String(a.into()));
    w.meta("general.name", Value::String(format!("synthetic {a}")));
    w.meta(&format!("{a}.context_length"), Value::U32(512));
    w.meta(
        &format!("{a}.embedding_length"),
        Value::U32(spec.n_embd as u32),
    );
    w.meta(&format!("{a}.block_count"), Value::U32(spec.n_layer as u32));
    w.meta(
        &format!("{a}.feed_forward_length"),
        Value::U32(spec.n_ff as u32),
    );
    w.meta(
        &format!("{a}.attention.head_count"),
        Value::U32(spec.n_head as u32),
    );
    w.meta(
        &format!("{a}.attention.head_count_kv"),
        Value::U32(spec.n_head_kv as u32),
    );
    if a == "gemma3" {
        // A global base unlike the sliding layers' 10000, so a mix-up shows.
        w.meta(&format!("{a}.rope.freq_base"), Value::F32(1e6));
        let hd = head_dim(spec) as u32;
        w.meta(&format!("{a}.attention.key_length"), Value::U32(hd));
        w.meta(&format!("{a}.attention.value_length"), Value::U32(hd));
        w.meta(&format!("{a}.attention.sliding_window"), Value::U32(4));
        w.meta(
            &format!("{a}.attention.sliding_window_pattern"),
            Value::U32(2),
        );
    } else {
        w.meta(&format!("{a}.rope.freq_base"), Value::F32(10000.0));
    }
    w.meta(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    if spec.ffn_act != FfnAct::Silu {
        w.meta(
            KEY_FFN_ACTIVATION,
            Value::String(spec.ffn_act.name().into()),
        );
    }
    if spec.n_expert > 0 {
        w.meta(
            &format!("{a}.expert_count"),
            Value::U32(spec.n_expert as u32),
        );
        w.meta(
            &format!("{a}.expert_used_count"),
            Value::U32(spec.n_expert_used as u32),
        );
    }
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.meta("tokenizer.ggml.pre", Value::String("smollm".into()));
    vocabulary_meta(w, tokens, types);
    w.meta(
        "tokenizer.ggml.merges",
        Value::Array(merges.into_iter().map(Value::String).collect()),
    );
    w.meta(
        "tokenizer.ggml.bos_token_id",
        Value::U32(n_vocab as u32 - 3),
    );
    w.meta(
        "tokenizer.ggml.eos_token_id",
        Value::U32(n_vocab as u32 - 1),
    );
    w.meta("tokenizer.ggml.add_bos_token", Value::Bool(false));
}

/// Head size: the width split over the heads, except for gemma3, whose heads are twice as
/// wide (so its Q/K/V widths differ from the residual stream's, as in Gemma 3).
fn head_dim(spec: &SynthSpec) -> usize {
    let hd = spec.n_embd / spec.n_head;
    if spec.arch == "gemma3" {
        2 * hd
    } else {
        hd
    }
}

/// Build the GGUF image of a generated model.
pub fn build(spec: &SynthSpec) -> GgufWriter<'static> {
    let mut rng = Rng::new(spec.seed);
    let (tokens, types, merges) = vocab();
    let n_vocab = tokens.len();
    let hd = head_dim(spec);
    let mut w = GgufWriter::new();
    write_meta(&mut w, spec, (tokens, types, merges));
    let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let t = |ty: QuantType| ty.ggml_id();
    let (d, ff, kvd) = (
        spec.n_embd as u64,
        spec.n_ff as u64,
        (spec.n_head_kv * hd) as u64,
    );
    w.tensor(
        "token_embd.weight",
        &[d, n_vocab as u64],
        t(spec.embd_type),
        random_tensor(spec.embd_type, n_vocab, spec.n_embd, 1.0, &mut rng),
    );
    w.tensor(
        "output_norm.weight",
        &[d],
        0,
        f32s((0..d).map(|_| 1.0 + 0.1 * rng.uniform()).collect()),
    );
    if !spec.tied {
        w.tensor(
            "output.weight",
            &[d, n_vocab as u64],
            t(spec.embd_type),
            random_tensor(spec.embd_type, n_vocab, spec.n_embd, 0.2, &mut rng),
        );
    }
    let ws = 1.0 / (spec.n_embd as f32).sqrt();
    for i in 0..spec.n_layer {
        // Stacked experts (`*_exps`, dims [cols, rows, experts]); one expert draws the same
        // numbers as a dense layer, so a 1-expert model equals its dense twin.
        let experts = spec.n_expert.max(1) as u64;
        let mut mat = |name: &str, rows: u64, cols: u64, scale: f32, w: &mut GgufWriter| {
            let ffn = name.starts_with("ffn_") && spec.n_expert > 0;
            let n = if ffn { rows * experts } else { rows };
            let data = random_tensor(spec.weight_type, n as usize, cols as usize, scale, &mut rng);
            let (name, dims) = match ffn {
                true => (
                    name.replace(".weight", "_exps.weight"),
                    vec![cols, rows, experts],
                ),
                false => (name.to_string(), vec![cols, rows]),
            };
            w.tensor(&format!("blk.{i}.{name}"), &dims, t(spec.weight_type), data);
        };
        let qd = (spec.n_head * hd) as u64;
        mat("attn_q.weight", qd, d, ws * 2.0, &mut w);
        mat("attn_k.weight", kvd, d, ws * 2.0, &mut w);
        mat("attn_v.weight", kvd, d, ws, &mut w);
        mat("attn_output.weight", d, qd, ws, &mut w);
        mat("ffn_gate.weight", ff, d, ws * 2.0, &mut w);
        mat("ffn_up.weight", ff, d, ws * 2.0, &mut w);
        mat("ffn_down.weight", d, ff, 1.0 / (ff as f32).sqrt(), &mut w);
        let mut norm = |name: &str, w: &mut GgufWriter| {
            let v: Vec<f32> = (0..d).map(|_| 1.0 + 0.2 * rng.uniform()).collect();
            w.tensor(&format!("blk.{i}.{name}"), &[d], 0, f32s(v));
        };
        if spec.n_expert > 0 {
            // The router from its own stream (see above), F32 as llama.cpp's converter writes it.
            let mut r = Rng::new(spec.seed ^ (0x5EED_0000 + i as u64));
            let router = random_tensor(QuantType::F32, spec.n_expert, spec.n_embd, 1.0, &mut r);
            w.tensor(
                &format!("blk.{i}.ffn_gate_inp.weight"),
                &[d, spec.n_expert as u64],
                0,
                router,
            );
        }
        norm("attn_norm.weight", &mut w);
        norm("ffn_norm.weight", &mut w);
        if spec.arch == "gemma3" {
            norm("post_attention_norm.weight", &mut w);
            norm("post_ffw_norm.weight", &mut w);
            for name in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                let v: Vec<f32> = (0..hd).map(|_| 1.0 + 0.2 * rng.uniform()).collect();
                w.tensor(&format!("blk.{i}.{name}"), &[hd as u64], 0, f32s(v));
            }
        }
        if spec.arch == "qwen2" {
            for (name, len) in [
                ("attn_q.bias", d),
                ("attn_k.bias", kvd),
                ("attn_v.bias", kvd),
            ] {
                let v: Vec<f32> = (0..len).map(|_| 0.5 * rng.uniform()).collect();
                w.tensor(&format!("blk.{i}.{name}"), &[len], 0, f32s(v));
            }
        }
    }
    w
}

/// A hand-made SentencePiece-style (`llama`) vocabulary, tokenizer metadata only: `<unk>`,
/// `<s>`, `</s>`, the 256 byte tokens, and pieces of "hello" and "world" scored by length (so
/// merges build whole words).
pub fn spm_vocabulary() -> GgufWriter<'static> {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for t in [
        "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "▁hel", "▁hell", "▁hello", "▁w",
        "▁wo", "▁wor", "▁worl", "▁world", "ll",
    ] {
        tokens.push(t.into());
        types.push(1);
    }
    // Longer pieces score higher, so merges build whole words.
    let scores: Vec<Value> = tokens
        .iter()
        .map(|t| Value::F32(t.chars().count() as f32))
        .collect();
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", Value::String("llama".into()));
    vocabulary_meta(&mut w, tokens, types);
    w.meta("tokenizer.ggml.scores", Value::Array(scores));
    w.meta("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.meta("tokenizer.ggml.eos_token_id", Value::U32(2));
    w
}

/// A vocabulary's token texts and types as GGUF metadata.
fn vocabulary_meta(w: &mut GgufWriter, tokens: Vec<String>, types: Vec<i32>) {
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
}
