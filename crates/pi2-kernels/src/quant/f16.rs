//! F16 weights: dot with f32 activations, accumulated in f32.

/// Scalar reference: `sum(w[i] as f32 * x[i])`.
pub fn vec_dot_ref(w: &[u16], x: &[f32]) -> f32 {
    super::half_ref::dot(w, x, super::f16_to_f32)
}

/// Scalar reference: `y[i] += a * x[i]`.
pub fn axpy_ref(a: f32, x: &[u16], y: &mut [f32]) {
    super::half_ref::axpy(a, x, y, super::f16_to_f32)
}

/// Expand f16 bits to f32.
pub fn dequantize(w: &[u16], out: &mut [f32]) {
    super::half_ref::dequantize(w, out, super::f16_to_f32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hand_built_values() {
        let w = [0x3C00u16, 0xC000, 0x3800]; // 1.0, -2.0, 0.5
        assert_eq!(super::vec_dot_ref(&w, &[1.0, 2.0, 4.0]), 1.0 - 4.0 + 2.0);
        let mut out = [0.0; 3];
        super::dequantize(&w, &mut out);
        assert_eq!(out, [1.0, -2.0, 0.5]);
        let mut y = [1.0, 1.0, 1.0];
        super::axpy_ref(2.0, &w, &mut y);
        assert_eq!(y, [3.0, -3.0, 2.0]);
    }
}
