//! F32 weights: plain dot product (reference order, left to right).

/// Scalar reference: `sum(w[i] * x[i])`.
pub fn vec_dot_ref(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a * b).sum()
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
