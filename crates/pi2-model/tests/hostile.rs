//! Bad model files must give a clear error naming the problem, never a panic or a wrong answer.

use pi2_model::synth::{build, Rng, SynthSpec};
use pi2_model::writer::GgufWriter;
use pi2_model::{GgufFile, Model, ModelError, Value};
use std::path::PathBuf;

fn small() -> Vec<u8> {
    build(&SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        ..Default::default()
    })
    .to_bytes()
}

fn load(bytes: &[u8]) -> Result<Model, ModelError> {
    Model::from_file(GgufFile::from_bytes(bytes)?)
}

#[test]
fn generated_model_loads() {
    let m = load(&small()).unwrap();
    assert_eq!(m.config.n_layer, 2);
    assert!(m.weights.tied_output);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small();
    let header_end = GgufFile::from_bytes(&bytes).unwrap().data_offset as usize;
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((64..header_end).step_by(97));
    cuts.extend([
        header_end - 1,
        header_end,
        header_end + 1,
        bytes.len() / 2,
        bytes.len() - 1,
    ]);
    for cut in cuts {
        let err = load(&bytes[..cut])
            .err()
            .unwrap_or_else(|| panic!("truncated at {cut} loaded"));
        let msg = err.to_string();
        assert!(!msg.is_empty() && !msg.contains('\n'), "cut {cut}: {msg:?}");
        if cut > 24 {
            assert!(
                matches!(err, ModelError::Truncated { .. }),
                "cut {cut}: {err}"
            );
        }
    }
}

#[test]
fn header_fields_are_checked() {
    let bytes = small();
    let mut b = bytes.clone();
    b[0] = b'X';
    assert!(matches!(load(&b), Err(ModelError::NotGguf(_))));
    let mut b = bytes.clone();
    b[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert!(matches!(load(&b), Err(ModelError::UnsupportedVersion(7))));
    let mut b = bytes.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // tensor count
    assert!(matches!(
        load(&b),
        Err(ModelError::LimitExceeded {
            what: "tensor count",
            ..
        })
    ));
    let mut b = bytes.clone();
    b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes()); // metadata count
    assert!(matches!(
        load(&b),
        Err(ModelError::LimitExceeded {
            what: "metadata count",
            ..
        })
    ));
    let mut b = bytes;
    b[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes()); // first key's length
    assert!(matches!(
        load(&b),
        Err(ModelError::LimitExceeded {
            what: "string length",
            ..
        })
    ));
}

#[test]
fn random_byte_flips_never_panic() {
    let bytes = small();
    let header_end = GgufFile::from_bytes(&bytes).unwrap().data_offset as usize;
    let mut rng = Rng::new(99);
    for _ in 0..400 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.next_u64() % 4 {
            let i = (rng.next_u64() as usize) % header_end;
            b[i] ^= 1 << (rng.next_u64() % 8);
        }
        // Either a clean error or a model that passed every check; never a panic.
        if let Err(e) = load(&b) {
            assert!(!e.to_string().is_empty());
        }
    }
}

/// A model whose tensor list is edited by `f` before writing.
fn edited(f: impl Fn(&mut GgufWriter)) -> Vec<u8> {
    let mut w = build(&SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        ..Default::default()
    });
    f(&mut w);
    w.to_bytes()
}

#[test]
fn tensor_outside_the_file() {
    let bytes = small();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    // Point the last tensor's offset past the end: find its info record by name.
    let last = f.tensors.last().unwrap();
    let name = last.name.as_bytes();
    let pos = bytes.windows(name.len()).position(|w| w == name).unwrap();
    let off_pos = pos + name.len() + 4 + 8 * last.dims.len() + 4;
    let mut b = bytes.clone();
    b[off_pos..off_pos + 8]
        .copy_from_slice(&(bytes.len() as u64).next_multiple_of(32).to_le_bytes());
    let err = load(&b).unwrap_err();
    assert!(matches!(err, ModelError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains(&last.name), "{err}");
}

#[test]
fn a_tensor_type_changed_for_a_smaller_one_is_refused() {
    // A Q4_1 tensor (type 3: 20 bytes per 32 weights) relabelled Q4_0 (type 2: 18 bytes): it
    // reads the wrong bytes, and a gap is left before the next tensor.
    let bytes = edited(|w| {
        w.tensor("extra.weight", &[64, 8], 3, vec![7; 8 * 2 * 20]);
        w.tensor("after.weight", &[32], 0, vec![0; 128]);
    });
    assert!(load(&bytes).is_ok());
    let name = b"extra.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 4 + 2 * 8;
    assert_eq!(&bytes[at..at + 4], &3u32.to_le_bytes());
    let mut smaller = bytes.clone();
    smaller[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
    let err = load(&smaller).unwrap_err().to_string();
    assert!(
        err.contains("does not match the bytes written for it"),
        "{err}"
    );
}

#[test]
fn unknown_and_unsupported_types() {
    let b = edited(|w| {
        w.tensor("extra.weight", &[32], 99, vec![0; 64]);
    });
    let err = load(&b).unwrap_err();
    assert!(
        matches!(err, ModelError::Unsupported(_)) && err.to_string().contains("type id 99"),
        "{err}"
    );
    // MXFP4 (type 39, 17-byte blocks of 32) is a known type pi2 does not compute with: the file
    // parses, and a tensor of it is named as unsupported, not corrupt.
    let b = edited(|w| {
        w.tensor("extra.weight", &[64], 39, vec![0; 34]);
    });
    let f = GgufFile::from_bytes(&b).unwrap();
    assert_eq!(f.tensor("extra.weight").unwrap().type_name(), "MXFP4");

    // Q8_1 (a real GGML type pi2 does not compute with) on a tensor the engine needs.
    let mut w = build(&SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        tied: false,
        ..Default::default()
    });
    let mut replaced = GgufWriter::new();
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    for (k, v) in &f.metadata {
        replaced.meta(k, v.clone());
    }
    for t in &f.tensors {
        let data = f.tensor_data(t).to_vec();
        if t.name == "output.weight" {
            let blocks = t.n_elements() as usize / 32;
            replaced.tensor(&t.name, &t.dims, 9, vec![0; blocks * 36]);
        } else {
            replaced.tensor(&t.name, &t.dims, t.ggml_type, data);
        }
    }
    w = replaced;
    let err = load(&w.to_bytes()).unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedTensorType { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("Q8_1") && err.to_string().contains("output.weight"),
        "{err}"
    );
}

#[test]
fn unknown_architecture_and_missing_pieces() {
    let b = build(&SynthSpec {
        arch: "mamba".into(),
        n_embd: 64,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        ..Default::default()
    })
    .to_bytes();
    let err = load(&b).unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedArch(ref a) if a == "mamba"),
        "{err}"
    );

    // An extra layer in the metadata: its tensors are missing.
    let b = edited(|w| {
        w.set_meta("llama.block_count", Value::U32(3));
    });
    let err = load(&b).unwrap_err();
    assert!(
        matches!(err, ModelError::MissingTensor(ref t) if t == "blk.2.attn_norm.weight"),
        "{err}"
    );
    // Wrong shape: the metadata says 96 FFN neurons, the tensors hold 128.
    let b = edited(|w| {
        w.set_meta("llama.feed_forward_length", Value::U32(96));
    });
    let err = load(&b).unwrap_err();
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    assert!(err.to_string().contains("ffn_gate"), "{err}");
}

#[test]
fn expert_layouts_and_ffn_activations_are_checked() {
    // Experts announced, but the file holds a dense FFN: the stacked tensor is missing.
    let b = edited(|w| {
        w.set_meta("llama.expert_count", Value::U32(8));
        w.set_meta("llama.expert_used_count", Value::U32(2));
    });
    let err = load(&b).unwrap_err();
    assert!(
        matches!(err, ModelError::MissingTensor(ref t) if t == "blk.0.ffn_gate_exps.weight"),
        "{err}"
    );
    for used in [0, 9] {
        let b = edited(|w| {
            w.set_meta("llama.expert_count", Value::U32(8));
            w.set_meta("llama.expert_used_count", Value::U32(used));
        });
        let err = load(&b).unwrap_err();
        assert!(err.to_string().contains("expert layout"), "{err}");
    }
    let b = edited(|w| {
        w.set_meta(
            pi2_model::KEY_FFN_ACTIVATION,
            Value::String("swish2".into()),
        );
    });
    let err = load(&b).unwrap_err();
    assert!(err.to_string().contains("FFN activation"), "{err}");
    let b = edited(|w| {
        w.set_meta(
            pi2_model::KEY_FFN_ACTIVATION,
            Value::String("dreglu".into()),
        );
    });
    assert_eq!(load(&b).unwrap().config.ffn_act, pi2_model::FfnAct::DRelu);
}
#[test]
fn duplicate_keys_and_bad_alignment() {
    let b = edited(|w| {
        w.meta("general.name", Value::String("twice".into()));
    });
    assert!(load(&b)
        .unwrap_err()
        .to_string()
        .contains("duplicate metadata key"));
    let mut w = GgufWriter::new();
    w.meta("general.alignment", Value::U32(3));
    assert!(GgufFile::from_bytes(&w.to_bytes())
        .unwrap_err()
        .to_string()
        .contains("power of two"));
}

#[test]
fn real_model_truncated_and_flipped() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "test model missing at {}: run `cargo xtask fetch-model` first",
        path.display()
    );
    let bytes = std::fs::read(&path).unwrap();
    let header_end = GgufFile::from_bytes(&bytes).unwrap().data_offset as usize;
    for cut in [
        0,
        3,
        4,
        8,
        20,
        1000,
        100_000,
        header_end - 1,
        header_end + 4096,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let err = load(&bytes[..cut])
            .err()
            .unwrap_or_else(|| panic!("cut {cut} loaded"));
        assert!(!err.to_string().contains('\n'));
    }
    let mut b = bytes.clone();
    b[4] = 1; // version 1
    assert!(matches!(load(&b), Err(ModelError::UnsupportedVersion(1))));
}

/// A GGUF v3 header with `arrays` I8 metadata arrays of `n` elements each and no tensors.
fn array_file(arrays: usize, n: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((arrays as u64).to_le_bytes());
    for i in 0..arrays {
        let key = format!("junk.{i}");
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(9u32.to_le_bytes()); // array
        b.extend(1u32.to_le_bytes()); // of I8
        b.extend(n.to_le_bytes());
        b.resize(b.len() + n as usize, 7);
    }
    b
}

#[test]
fn metadata_cannot_cost_many_times_its_file_size() {
    // Each one-byte element would take a whole `Value` in memory: 3 x 6M elements of file
    // (18 MB) would need over 500 MiB. Refused once the parsed metadata passes the cap, before
    // the array that would pass it is allocated.
    let err = GgufFile::from_bytes(&array_file(3, 6 << 20)).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::LimitExceeded {
                what: "metadata size in memory",
                ..
            }
        ),
        "{err}"
    );
    // Well under the cap: parsed.
    assert!(GgufFile::from_bytes(&array_file(2, 1 << 20)).is_ok());
}

#[test]
fn hyper_parameters_and_layer_counts_are_checked() {
    let bad = [
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(f32::NAN),
        ),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(0.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(-1e-5)),
        ("llama.rope.freq_base", Value::F32(-10000.0)),
        ("llama.rope.freq_base", Value::F32(f32::INFINITY)),
        ("llama.rope.scale_linear", Value::F32(0.0)),
    ];
    for (key, v) in bad {
        let b = edited(|w| {
            w.set_meta(key, v.clone());
        });
        let err = load(&b).unwrap_err().to_string();
        assert!(err.contains("hyper-parameter"), "{key} = {v:?}: {err}");
    }
    // A required key missing: refused by name, never defaulted (llama.cpp requires it too).
    let b = edited(|w| {
        w.remove_meta("llama.attention.layer_norm_rms_epsilon");
    });
    let err = load(&b).unwrap_err().to_string();
    assert!(err.contains("layer_norm_rms_epsilon"), "{err}");
    // Fewer layers in the metadata than in the file: refused, not dropped.
    let b = edited(|w| {
        w.set_meta("llama.block_count", Value::U32(1));
    });
    let err = load(&b).unwrap_err().to_string();
    assert!(err.contains("tensors of layer 1"), "{err}");
}

#[test]
fn overlapping_tensors_are_refused() {
    let bytes = small();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    // Point the last tensor at the first one's data.
    let last = f.tensors.last().unwrap();
    let first_offset = f.tensors.iter().map(|t| t.offset).min().unwrap();
    let name = last.name.as_bytes();
    let pos = bytes.windows(name.len()).position(|w| w == name).unwrap();
    let off_pos = pos + name.len() + 4 + 8 * last.dims.len() + 4;
    let mut b = bytes.clone();
    b[off_pos..off_pos + 8].copy_from_slice(&first_offset.to_le_bytes());
    let err = load(&b).unwrap_err().to_string();
    assert!(err.contains("overlap"), "{err}");
}

#[test]
fn gemma3_needs_its_norms_and_a_valid_window() {
    let gemma = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = build(&SynthSpec {
            arch: "gemma3".into(),
            n_embd: 64,
            n_ff: 128,
            n_head: 2,
            n_head_kv: 1,
            ..Default::default()
        });
        f(&mut w);
        load(&w.to_bytes())
    };
    let m = gemma(&|_| {}).unwrap();
    assert_eq!(m.config.window(0), Some(4));
    assert_eq!(m.config.window(1), None);
    assert_eq!(m.config.ffn_act, pi2_model::FfnAct::Gelu);
    for (key, v) in [
        ("gemma3.attention.sliding_window", 0),
        ("gemma3.attention.sliding_window_pattern", 0),
        ("gemma3.attention.sliding_window_pattern", 1 << 31),
    ] {
        let err = gemma(&|w| {
            w.set_meta(key, Value::U32(v));
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("sliding window"),
            "{key} {v}: {err}"
        );
    }
    // A llama file relabelled gemma3 lacks the per-head norms.
    let err = load(&edited(|w| {
        w.set_meta("general.architecture", Value::String("gemma3".into()));
        for (k, v) in [
            ("context_length", 512),
            ("embedding_length", 64),
            ("block_count", 2),
            ("feed_forward_length", 128),
            ("attention.head_count", 2),
            ("attention.head_count_kv", 1),
            ("attention.sliding_window", 4),
        ] {
            w.meta(&format!("gemma3.{k}"), Value::U32(v));
        }
        w.meta("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    }))
    .unwrap_err();
    assert!(
        matches!(err, ModelError::MissingTensor(ref t) if t == "blk.0.attn_q_norm.weight"),
        "{err}"
    );
}

/// A vocabulary whose control token is 4 MB long (repeated and varied bytes): the model loads
/// and a text holding the token encodes in time linear in the token bytes (the special-token
/// matcher's build once grew about quadratically: 16 KB took 101 s).
#[test]
fn a_huge_special_token_loads_in_linear_time() {
    let f = GgufFile::from_bytes(&small()).unwrap();
    let Some(Value::Strings(read)) = f.get("tokenizer.ggml.tokens") else {
        panic!("the synthetic model has tokens");
    };
    let tokens: Vec<Value> = read.iter().map(|t| Value::String(t.into())).collect();
    let eos = match f.get("tokenizer.ggml.eos_token_id") {
        Some(Value::U32(e)) => *e as usize,
        _ => panic!("the synthetic model has an end token"),
    };
    for long in [
        "a".repeat(4 << 20),
        (0..4u32 << 20)
            .map(|i| char::from(b'!' + (i.wrapping_mul(2654435761) >> 26) as u8))
            .collect::<String>(),
    ] {
        let mut tokens = tokens.clone();
        tokens[eos] = Value::String(long.clone());
        let b = edited(|w| {
            w.set_meta("tokenizer.ggml.tokens", Value::Array(tokens.clone()));
        });
        let t0 = std::time::Instant::now();
        let m = load(&b).unwrap();
        let ids = m.tokenizer.encode(&format!("x{long}y"), false, true);
        assert!(ids.contains(&(eos as u32)), "{}", ids.len());
        assert!(t0.elapsed().as_secs() < 60, "{:?}", t0.elapsed());
    }
}

/// A checksummed file's header is sealed: a flipped metadata scalar or a tensor's type swapped
/// for another of the same size (which no tensor checksum sees) is refused by name.
#[test]
fn a_sealed_header_refuses_changed_metadata_and_types() {
    let mut w = build(&SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        weight_type: pi2_kernels::QuantType::Q4_0,
        ..Default::default()
    });
    w.set_meta("pi2.head.ucb", Value::F32(1.5));
    w.with_checksums();
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    assert!(pi2_model::checksum::table(&f).unwrap().is_some());
    let find = |needle: &[u8]| {
        bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    };
    // The scalar: its key, its type (F32: 6), then its value.
    let key = b"pi2.head.ucb";
    let mut flipped = bytes.clone();
    flipped[find(key) + key.len() + 4 + 3] ^= 0x40;
    let err = pi2_model::checksum::table(&GgufFile::from_bytes(&flipped).unwrap()).unwrap_err();
    assert!(err.to_string().contains("does not match its seal"), "{err}");
    // A Q4_0 tensor (type 2) relabelled IQ4_NL (type 20): the same 18 bytes per 32 weights.
    let name = b"blk.0.ffn_gate.weight";
    let at = find(name) + name.len() + 4 + 2 * 8;
    assert_eq!(&bytes[at..at + 4], &2u32.to_le_bytes());
    let mut swapped = bytes.clone();
    swapped[at..at + 4].copy_from_slice(&20u32.to_le_bytes());
    let err = pi2_model::checksum::table(&GgufFile::from_bytes(&swapped).unwrap()).unwrap_err();
    assert!(err.to_string().contains("seal"), "{err}");
}
