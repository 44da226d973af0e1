//! Core clusters from fake sysfs trees shaped like real phones.

use pi2_engine::topology::{ClusterKind, Topology};
use std::path::Path;

/// Writes `cpuN/cpufreq/cpuinfo_max_freq` for each (cpu, kHz) and an `online` list.
fn fake_tree(dir: &Path, freqs: &[(usize, u64)], online: Option<&str>) {
    for &(cpu, khz) in freqs {
        let d = dir.join(format!("cpu{cpu}/cpufreq"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpuinfo_max_freq"), format!("{khz}\n")).unwrap();
    }
    if let Some(o) = online {
        std::fs::write(dir.join("online"), format!("{o}\n")).unwrap();
    }
}

fn kinds(t: &Topology) -> Vec<(ClusterKind, Vec<usize>)> {
    t.clusters
        .iter()
        .map(|c| (c.kind, c.cpus.clone()))
        .collect()
}

#[test]
fn phone_with_one_prime_five_mid_two_little_cores() {
    let dir = tempfile::tempdir().unwrap();
    let mut freqs = vec![(0, 1_800_000), (1, 1_800_000)];
    freqs.extend((2..7).map(|c| (c, 2_400_000)));
    freqs.push((7, 3_200_000));
    fake_tree(dir.path(), &freqs, Some("0-7"));
    let t = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(
        kinds(&t),
        vec![
            (ClusterKind::Big, vec![7]),
            (ClusterKind::Mid, vec![2, 3, 4, 5, 6]),
            (ClusterKind::Little, vec![0, 1]),
        ]
    );
    assert_eq!(
        t.to_string(),
        "big 7 (1 core, 3.20 GHz), mid 2-6 (5 cores, 2.40 GHz), little 0-1 (2 cores, 1.80 GHz)"
    );
    assert_eq!(t.select("big,mid").unwrap(), vec![7, 2, 3, 4, 5, 6]);
    assert_eq!(t.select("little").unwrap(), vec![0, 1]);
    assert_eq!(t.select("0-1,7,0").unwrap(), vec![0, 1, 7]);
    assert_eq!(t.select("all").unwrap(), vec![7, 2, 3, 4, 5, 6, 0, 1]);
    let e = t.select("8").unwrap_err().to_string();
    assert!(e.contains("CPU 8 is not online"), "{e}");
    let e = t.select("huge").unwrap_err().to_string();
    assert!(e.contains("`huge` is not a CPU number"), "{e}");
}

#[test]
fn phone_with_four_big_four_little_cores() {
    let dir = tempfile::tempdir().unwrap();
    let freqs: Vec<_> = (0..8)
        .map(|c| (c, if c < 4 { 1_766_400 } else { 2_841_600 }))
        .collect();
    fake_tree(dir.path(), &freqs, Some("0-7"));
    let t = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(
        kinds(&t),
        vec![
            (ClusterKind::Big, vec![4, 5, 6, 7]),
            (ClusterKind::Little, vec![0, 1, 2, 3]),
        ]
    );
    let e = t.select("mid").unwrap_err().to_string();
    assert!(e.contains("no mid cores"), "{e}");
}

#[test]
fn offline_cores_are_left_out_and_missing_cpufreq_means_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let freqs: Vec<_> = (0..4).map(|c| (c, 2_000_000 + c as u64)).collect();
    fake_tree(dir.path(), &freqs, Some("0-1,3"));
    let t = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(t.cpus(), vec![3, 1, 0]);

    // No cpufreq and no capacity (many VMs): one uniform cluster, no ranking invented.
    let dir = tempfile::tempdir().unwrap();
    for c in 0..2 {
        std::fs::create_dir_all(dir.path().join(format!("cpu{c}"))).unwrap();
    }
    let t = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(kinds(&t), vec![(ClusterKind::Big, vec![0, 1])]);
    assert_eq!(t.to_string(), "big 0-1 (2 cores)");
}

#[test]
fn an_unreadable_tree_is_an_error_and_detect_never_fails() {
    let e = Topology::from_sysfs(Path::new("/nonexistent/cpu")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/cpu"), "{e}");
    assert!(!Topology::detect().cpus().is_empty());
}
