//! Peak resident set size of this process, as the kernel counts it.

pub use pi2_runtime::report::peak_rss_bytes;

/// Human-readable size (MiB with one decimal, or GiB).
pub fn human(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if bytes < 1 << 20 {
        format!("{bytes} bytes")
    } else if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}
