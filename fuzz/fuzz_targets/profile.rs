//! Any text as a profile file: parsed and checked, or refused; a profile that passes the checks
//! can be renumbered and used for thresholds without a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_sparse::Profile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = Profile::from_json(text, "fuzz.json") {
        let perm: Vec<Vec<u32>> = p
            .layers
            .iter()
            .map(|l| (0..l.frequency.len() as u32).rev().collect())
            .collect();
        let q = p.permuted(&perm);
        for l in &q.layers {
            let _ = l.threshold_for(0.5);
        }
    }
});
