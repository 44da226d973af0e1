//! F32 weights: plain dot product, summed in the canonical order of [`super::float_order`].

/// Scalar reference: `sum(w[i] * x[i])`.
pub fn vec_dot_ref(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    super::float_order::dot(n, |i| w[i], x)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hand_built_values() {
        assert_eq!(
            super::vec_dot_ref(&[1.0, 2.0, 3.0], &[4.0, -5.0, 0.5]),
            4.0 - 10.0 + 1.5
        );
    }
}
