//! An exact discrete solver: depth-first branch and bound over a product of axes.
//!
//! The caller gives each axis's size, the cost of a full assignment (`None`: infeasible) and a
//! lower bound for a partial one (an assignment of the first axes) that no completion beats.
//! With an admissible bound the result equals exhaustive search, including ties: both return
//! the first best assignment in lexicographic order (property-tested against [`brute_force`]).

/// The best full assignment and its cost.
pub fn branch_and_bound(
    axes: &[usize],
    cost: &mut dyn FnMut(&[usize]) -> Option<f64>,
    bound: &mut dyn FnMut(&[usize]) -> f64,
) -> Option<(Vec<usize>, f64)> {
    let mut best: Option<(Vec<usize>, f64)> = None;
    let mut at = Vec::with_capacity(axes.len());
    descend(axes, &mut at, cost, bound, &mut best);
    best
}

fn descend(
    axes: &[usize],
    at: &mut Vec<usize>,
    cost: &mut dyn FnMut(&[usize]) -> Option<f64>,
    bound: &mut dyn FnMut(&[usize]) -> f64,
    best: &mut Option<(Vec<usize>, f64)>,
) {
    if at.len() == axes.len() {
        if let Some(c) = cost(at) {
            if best.as_ref().is_none_or(|b| c < b.1) {
                *best = Some((at.clone(), c));
            }
        }
        return;
    }
    for v in 0..axes[at.len()] {
        at.push(v);
        // Only strictly better plans can replace the incumbent, so an equal bound prunes.
        if best.as_ref().is_none_or(|b| bound(at) < b.1) {
            descend(axes, at, cost, bound, best);
        }
        at.pop();
    }
}

/// Every assignment, in lexicographic order: the reference for [`branch_and_bound`].
pub fn brute_force(
    axes: &[usize],
    cost: &mut dyn FnMut(&[usize]) -> Option<f64>,
) -> Option<(Vec<usize>, f64)> {
    let mut best: Option<(Vec<usize>, f64)> = None;
    if axes.contains(&0) {
        return None;
    }
    let mut at = vec![0usize; axes.len()];
    loop {
        if let Some(c) = cost(&at) {
            if best.as_ref().is_none_or(|b| c < b.1) {
                best = Some((at.clone(), c));
            }
        }
        // Next assignment: increment the last axis, carrying left.
        let mut i = axes.len();
        loop {
            if i == 0 {
                return best;
            }
            i -= 1;
            at[i] += 1;
            if at[i] < axes[i] {
                break;
            }
            at[i] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A cost table over up to 4 axes of up to 4 values, with `None` for infeasible.
    fn table() -> impl Strategy<Value = (Vec<usize>, Vec<Option<u8>>, Vec<u8>)> {
        prop::collection::vec(1usize..=4, 1..=4).prop_flat_map(|axes| {
            let n: usize = axes.iter().product();
            (
                Just(axes),
                prop::collection::vec(prop::option::weighted(0.8, 0u8..20), n),
                // How loose each partial bound is (subtracted from the true best completion).
                prop::collection::vec(0u8..5, 64),
            )
        })
    }

    fn index(axes: &[usize], at: &[usize]) -> usize {
        at.iter().zip(axes).fold(0, |i, (&v, &n)| i * n + v)
    }

    proptest! {
        #[test]
        fn equals_brute_force((axes, costs, slack) in table()) {
            let mut cost = |at: &[usize]| costs[index(&axes, at)].map(f64::from);
            let want = brute_force(&axes, &mut cost);
            // An admissible bound: the true best completion minus some slack.
            let mut bound = |at: &[usize]| {
                let mut best = f64::INFINITY;
                let rest: Vec<usize> = axes[at.len()..].to_vec();
                let mut sub = |tail: &[usize]| {
                    let full: Vec<usize> = at.iter().chain(tail).copied().collect();
                    costs[index(&axes, &full)].map(f64::from)
                };
                if let Some((_, c)) = brute_force(&rest, &mut sub) {
                    best = c;
                }
                best - f64::from(slack[at.len() * 13 % 64])
            };
            let got = branch_and_bound(&axes, &mut cost, &mut bound);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn pruning_skips_work() {
        let axes = [10usize, 10, 10];
        let mut calls = 0;
        let mut cost = |at: &[usize]| {
            calls += 1;
            Some((at[0] * 100 + at[1] * 10 + at[2]) as f64)
        };
        let mut bound = |at: &[usize]| {
            (at[0] * 100) as f64
                + if at.len() > 1 {
                    (at[1] * 10) as f64
                } else {
                    0.0
                }
        };
        let got = branch_and_bound(&axes, &mut cost, &mut bound).unwrap();
        assert_eq!(got, (vec![0, 0, 0], 0.0));
        assert!(calls < 20, "{calls} evaluations of 1000");
    }

    #[test]
    fn infeasible_everywhere_gives_none() {
        let mut cost = |_: &[usize]| None;
        let mut bound = |_: &[usize]| 0.0;
        assert_eq!(branch_and_bound(&[3, 3], &mut cost, &mut bound), None);
        assert_eq!(brute_force(&[3, 3], &mut cost), None);
    }
}
