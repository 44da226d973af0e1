//! Block layouts against llama.cpp's own Python reader: random blocks of Q2_K, Q3_K, IQ4_NL,
//! IQ4_XS and MXFP4 (`testdata/dequant/*.blocks`) dequantize to exactly the values PyPI `gguf`'s
//! `quants.dequantize` gave (`*.f32`; see `meta.json`). The SIMD kernels are checked against
//! the same scalar definitions in `simd_vs_ref.rs`.

use pi2_kernels::QuantType;
use std::path::PathBuf;

#[test]
fn blocks_dequantize_as_ggml_does() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dequant");
    for ty in [
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
        QuantType::MXFP4,
    ] {
        let blocks = std::fs::read(dir.join(format!("{ty}.blocks"))).unwrap();
        let want: Vec<f32> = std::fs::read(dir.join(format!("{ty}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(blocks.len() / ty.block_bytes() * ty.block_len(), want.len());
        let mut got = vec![0.0; want.len()];
        ty.dequantize_row(&blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: {g} vs {w}");
        }
    }
}

/// MXFP4's quantizer (the one ggml and `gguf` share) gives `gguf`'s bytes, so files pi2 writes
/// in MXFP4 are the ones llama.cpp's tools would write.
#[test]
fn mxfp4_quantizes_as_gguf_does() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dequant");
    let x: Vec<f32> = std::fs::read(dir.join("MXFP4.quant.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want = std::fs::read(dir.join("MXFP4.quant.blocks")).unwrap();
    assert_eq!(QuantType::MXFP4.quantize_row(&x).unwrap(), want);
}
