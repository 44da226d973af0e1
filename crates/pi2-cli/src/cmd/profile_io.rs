//! `pi2 profile-io PATH`: random-read throughput and latency of the device holding PATH, against
//! read size, queue depth (concurrent submitters) and the span of the file the reads fall in.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ProfileIoArgs {
    /// File to read (a model file on the device to profile)
    pub path: PathBuf,
    /// Read sizes (bytes, K/M suffix)
    #[arg(long, value_delimiter = ',', default_value = "4K,16K,64K,256K,1M")]
    pub sizes: Vec<String>,
    /// Queue depths (threads submitting at once)
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub depths: Vec<usize>,
    /// Spans of the file the reads fall in (bytes, K/M/G suffix, or % of the file)
    #[arg(long, value_delimiter = ',', default_value = "100%,10%")]
    pub spans: Vec<String>,
    /// Milliseconds per point
    #[arg(long, default_value_t = 300)]
    pub ms: u64,
    /// Print JSON (for the planner) instead of a table
    #[arg(long)]
    pub json: bool,
    /// Measure what the reader's default is chosen from (`pread`, and io_uring at depths 1 to
    /// 64, 16 KiB random reads), print the choice and cache it for this device
    #[arg(long, conflicts_with_all = ["sizes", "depths", "spans", "ms"])]
    pub reader: bool,
}

pub fn run(a: ProfileIoArgs) -> Result<()> {
    let size = std::fs::metadata(&a.path)
        .with_context(|| format!("cannot read {}", a.path.display()))?
        .len();
    if size == 0 {
        bail!("{} is empty", a.path.display());
    }
    if a.reader {
        return reader(&a);
    }
    let parse = |s: &String| pi2_runtime::options::parse_size("--sizes", s, size);
    let sizes = a.sizes.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
    let spans = a.spans.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
    if a.depths.contains(&0) {
        bail!("queue depths must be at least 1");
    }
    let mut points = Vec::new();
    if !a.json {
        println!("{}", pi2_io::measure::IoPoint::MARKDOWN_HEADER);
    }
    for &span in &spans {
        for &rs in &sizes {
            for &depth in &a.depths {
                let p = pi2_io::measure::measure(
                    &a.path,
                    rs as usize,
                    depth,
                    span,
                    Duration::from_millis(a.ms),
                )
                .with_context(|| format!("profiling {}", a.path.display()))?;
                if !a.json {
                    println!("{p}");
                }
                points.push(serde_json::json!({
                    "read_size": p.read_size, "depth": p.depth, "span": p.span,
                    "reads": p.reads, "bytes_per_sec": p.bytes_per_sec,
                    "lat_p50_us": p.lat_p50_us, "lat_p99_us": p.lat_p99_us, "engine": p.engine,
                }));
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&points)?);
    }
    Ok(())
}

/// `--reader`: the device's reader choice, measured again and cached.
fn reader(a: &ProfileIoArgs) -> Result<()> {
    let c = pi2_runtime::io_choice::remeasure(&a.path)
        .with_context(|| format!("profiling {}", a.path.display()))?;
    let engine = match c.engine {
        pi2_io::IoEngine::Pread => "pread",
        pi2_io::IoEngine::Uring => "uring",
    };
    if a.json {
        let points: Vec<_> = c
            .points
            .iter()
            .map(|p| serde_json::json!({"engine": p.engine, "depth": p.depth, "read_size": p.read_size, "bytes_per_sec": p.bytes_per_sec}))
            .collect();
        let out = serde_json::json!({"engine": engine, "depth": c.depth, "uring_depth": c.uring_depth, "points": points});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("{}", pi2_io::measure::IoPoint::MARKDOWN_HEADER);
    for p in &c.points {
        println!("{p}");
    }
    println!(
        "reader default for this device: --io-engine {engine} --io-depth {} (cached)",
        c.depth
    );
    Ok(())
}
