//! Random-weight model files from a recipe (feature `synth`): the metadata and tensors that
//! `testdata/families/make.py` gave llama.cpp, rebuilt here with pi2's writer, so tests compare
//! pi2 with llama.cpp on the same function without committing any weights.
//!
//! A recipe is JSON: `meta`, a list of `[key, type, value]` (`str`, `u32`, `f32`, `bool`,
//! `arr_str`, `arr_f32`, `arr_i32`, `arr_bool`), and `tensors`, each `{name, shape, seed, scale,
//! offset, crc32}` with `shape` rows first (numpy's order; GGML's dims are its reverse). A
//! tensor's F32 values are `offset + scale * u`, `u` in [-1, 1) from SplitMix64 seeded with
//! `seed`, computed in f64 as numpy does, or its `values` where the recipe lists them; the CRC-32
//! of the values' bytes must match the recorded one.

use crate::gguf::Value;
use crate::writer::GgufWriter;

/// `n` values in [-1, 1): the top 53 bits of SplitMix64's outputs for `seed`.
pub fn splitmix_uniform(seed: u64, n: usize) -> impl Iterator<Item = f64> {
    (1..=n as u64).map(move |i| {
        let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    })
}

/// The GGUF file of `recipe`, or what in the recipe is wrong.
pub fn build(recipe: &serde_json::Value) -> Result<GgufWriter<'static>, String> {
    let mut w = GgufWriter::new();
    let meta = recipe["meta"].as_array().ok_or("no `meta` list")?;
    for m in meta {
        let (key, ty, v) = (
            m[0].as_str().ok_or("a key is not a string")?,
            m[1].as_str().ok_or("a type is not a string")?,
            &m[2],
        );
        let list = || v.as_array().ok_or(format!("`{key}` is not a list"));
        let value = match ty {
            "str" => Value::String(v.as_str().ok_or(format!("`{key}`"))?.into()),
            "u32" => Value::U32(v.as_u64().ok_or(format!("`{key}`"))? as u32),
            "f32" => Value::F32(v.as_f64().ok_or(format!("`{key}`"))? as f32),
            "bool" => Value::Bool(v.as_bool().ok_or(format!("`{key}`"))?),
            "arr_str" => Value::Array(
                list()?
                    .iter()
                    .map(|s| Value::String(s.as_str().unwrap_or_default().into()))
                    .collect(),
            ),
            "arr_f32" => Value::Array(
                list()?
                    .iter()
                    .map(|x| Value::F32(x.as_f64().unwrap_or(0.0) as f32))
                    .collect(),
            ),
            "arr_i32" => Value::Array(
                list()?
                    .iter()
                    .map(|x| Value::I32(x.as_i64().unwrap_or(0) as i32))
                    .collect(),
            ),
            "arr_bool" => Value::Array(
                list()?
                    .iter()
                    .map(|x| Value::Bool(x.as_bool().unwrap_or(false)))
                    .collect(),
            ),
            other => return Err(format!("`{key}` has unknown type `{other}`")),
        };
        w.meta(key, value);
    }
    for t in recipe["tensors"].as_array().ok_or("no `tensors` list")? {
        let name = t["name"].as_str().ok_or("a tensor without a name")?;
        let shape: Vec<u64> = t["shape"]
            .as_array()
            .ok_or(format!("`{name}` has no shape"))?
            .iter()
            .map(|d| d.as_u64().unwrap_or(0))
            .collect();
        let n = shape.iter().product::<u64>() as usize;
        let (seed, scale, offset) = (
            t["seed"].as_u64().ok_or(format!("`{name}` has no seed"))?,
            t["scale"]
                .as_f64()
                .ok_or(format!("`{name}` has no scale"))?,
            t["offset"].as_f64().unwrap_or(0.0),
        );
        // Values given as they are (RoPE divisors), else drawn.
        let values: Vec<f32> = match t["values"].as_array() {
            Some(given) if given.len() == n => given
                .iter()
                .map(|v| v.as_f64().unwrap_or(0.0) as f32)
                .collect(),
            Some(_) => return Err(format!("`{name}`: its values do not fill its shape")),
            None => splitmix_uniform(seed, n)
                .map(|u| (offset + scale * u) as f32)
                .collect(),
        };
        // F32, or a type pi2 quantizes as llama.cpp's `gguf` package does (MXFP4).
        let ty = match t["type"].as_str() {
            None | Some("f32") => pi2_kernels::QuantType::F32,
            Some("mxfp4") => pi2_kernels::QuantType::MXFP4,
            Some(other) => return Err(format!("`{name}`: tensor type `{other}`")),
        };
        let bytes = ty
            .quantize_row(&values)
            .ok_or(format!("`{name}`: cannot quantize its rows as {ty}"))?;
        let want = t["crc32"]
            .as_u64()
            .ok_or(format!("`{name}` has no crc32"))?;
        let got = crc32fast::hash(&bytes);
        if u64::from(got) != want {
            return Err(format!(
                "`{name}`: values CRC-32 {got:08x}, the recipe recorded {want:08x}"
            ));
        }
        let dims: Vec<u64> = shape.iter().rev().copied().collect();
        w.tensor(name, &dims, ty.ggml_id(), bytes);
    }
    Ok(w)
}
