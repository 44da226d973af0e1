//! llama.cpp's tokenizer test files (`models/ggml-vocab-NAME.gguf` with `.inp` inputs and
//! `.out` expected ids) and its collection of 70 chat templates (`models/templates/*.jinja`),
//! taken from the `llama-cpp-python` source distribution on PyPI (it vendors llama.cpp's tree)
//! into `models/llama-vocab/` (templates in its `templates/`), for `crates/pi2-model/tests/
//! llama_vocab.rs`. Only the vocabularies that come with test cases are kept.

use crate::{workspace_root, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

const PACKAGE: &str = "llama-cpp-python";
/// The llama.cpp of `bench/` and `testdata/golden` (0.3.36), pinned by the index's digest.
const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const MEMBER_DIR: &str = "vendor/llama.cpp/models/";
const TEMPLATES: &str = "templates/";
/// Written last: its presence (with the digest) means the folder is complete.
const STAMP: &str = "SOURCE";

/// Fill `models/llama-vocab/` unless it already holds this sdist's files.
pub fn fetch(force: bool) -> Result<()> {
    let dir = workspace_root().join("models/llama-vocab");
    let stamp = dir.join(STAMP);
    let want_stamp = format!("{SDIST} sha256 {SDIST_SHA256}, vocabularies and templates\n");
    if !force && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&want_stamp) {
        eprintln!("xtask: {} is present", dir.display());
        return Ok(());
    }
    eprintln!("xtask: fetching llama.cpp's tokenizer tests from PyPI ({SDIST}, about 75 MB)");
    let bytes = download()?;
    let got = hex(&Sha256::digest(&bytes));
    if got != SDIST_SHA256 {
        return Err(format!("{SDIST} has sha256 {got}, expected {SDIST_SHA256}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let n = extract(&bytes, &dir)?;
    std::fs::write(&stamp, want_stamp).map_err(|e| format!("cannot write the stamp: {e}"))?;
    eprintln!("xtask: {n} files in {}", dir.display());
    Ok(())
}

fn download() -> Result<Vec<u8>> {
    let index: serde_json::Value = ureq::get(&format!("https://pypi.org/simple/{PACKAGE}/"))
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| format!("cannot reach the PyPI index for {PACKAGE}: {e}"))?
        .into_json()
        .map_err(|e| format!("the PyPI index answer is not JSON: {e}"))?;
    let url = index["files"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["filename"] == SDIST))
        .and_then(|f| f["url"].as_str())
        .ok_or_else(|| format!("the PyPI index does not list {SDIST}"))?
        .to_string();
    let mut bytes = Vec::new();
    ureq::get(&url)
        .call()
        .map_err(|e| format!("cannot download {SDIST}: {e}"))?
        .into_reader()
        .take(200 << 20)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("download of {SDIST} interrupted: {e}"))?;
    Ok(bytes)
}

/// Copies the `ggml-vocab-*` files that have test cases into `dir`; returns how many.
fn extract(sdist: &[u8], dir: &Path) -> Result<usize> {
    let mut files = Vec::new();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(sdist));
    let entries = archive
        .entries()
        .map_err(|e| format!("{SDIST} is not a tar.gz: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("{SDIST} is corrupt: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("bad name in {SDIST}: {e}"))?;
        let path = path.to_string_lossy().into_owned();
        let Some(name) = path.split_once(MEMBER_DIR).map(|(_, n)| n.to_string()) else {
            continue;
        };
        let template = name
            .strip_prefix(TEMPLATES)
            .is_some_and(|t| t.ends_with(".jinja") && !t.contains('/'));
        let vocab = name.starts_with("ggml-vocab-") && !name.contains('/');
        if !template && !vocab {
            continue;
        }
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .map_err(|e| format!("cannot read {name} from {SDIST}: {e}"))?;
        files.push((name, data));
    }
    let has = |n: &str| files.iter().any(|(f, _)| f == n);
    let keep: Vec<&(String, Vec<u8>)> = files
        .iter()
        .filter(|(n, _)| {
            let base = n.trim_end_matches(".inp").trim_end_matches(".out");
            n.starts_with(TEMPLATES) || has(&format!("{base}.inp")) && has(&format!("{base}.out"))
        })
        .collect();
    std::fs::create_dir_all(dir.join(TEMPLATES))
        .map_err(|e| format!("cannot create templates/: {e}"))?;
    for (name, data) in &keep {
        std::fs::write(dir.join(name), data).map_err(|e| format!("cannot write {name}: {e}"))?;
    }
    Ok(keep.len())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
