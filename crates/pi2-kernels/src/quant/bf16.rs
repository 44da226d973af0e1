//! BF16 weights (the top half of an f32: 8 exponent bits, 7 mantissa bits): dot with f32
//! activations, accumulated in f32. Expanding is exact (a shift), so SIMD paths differ from
//! the reference only in summation order.

/// The f32 a BF16 value stands for.
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The nearest BF16 value (ties to even; NaN stays NaN), as converters write them.
pub fn f32_to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7FFF + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// Scalar reference: `sum(w[i] as f32 * x[i])`.
pub fn vec_dot_ref(w: &[u16], x: &[f32]) -> f32 {
    super::half_ref::dot(w, x, bf16_to_f32)
}

/// Scalar reference: `y[i] += a * x[i]`.
pub fn axpy_ref(a: f32, x: &[u16], y: &mut [f32]) {
    super::half_ref::axpy(a, x, y, bf16_to_f32)
}

/// Expand BF16 bits to f32.
pub fn dequantize(w: &[u16], out: &mut [f32]) {
    super::half_ref::dequantize(w, out, bf16_to_f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_values() {
        let w = [0x3F80u16, 0xC000, 0x3F00]; // 1.0, -2.0, 0.5
        assert_eq!(vec_dot_ref(&w, &[1.0, 2.0, 4.0]), 1.0 - 4.0 + 2.0);
        let mut out = [0.0; 3];
        dequantize(&w, &mut out);
        assert_eq!(out, [1.0, -2.0, 0.5]);
        let mut y = [1.0, 1.0, 1.0];
        axpy_ref(2.0, &w, &mut y);
        assert_eq!(y, [3.0, -3.0, 2.0]);
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 lies halfway between 1.0 and the next BF16 value: ties go to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3F80);
        // Just above halfway rounds up.
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 0x3F81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(f32_to_bf16(-3.5)), -3.5);
        assert_eq!(bf16_to_f32(f32_to_bf16(f32::INFINITY)), f32::INFINITY);
    }
}
