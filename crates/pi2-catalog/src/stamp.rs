//! Checksums remembered per file stamp.

use crate::{CatalogError, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// The SHA-256 of `path` (hex), remembered in the JSON file `stamps_path` with the file's size,
/// modification time, inode and change time: an unchanged file is not read again, a changed one always is.
pub fn sha256_stamped(path: &Path, stamps_path: &Path) -> Result<String> {
    let io = |e: std::io::Error| CatalogError::io(path, "cannot read", e);
    let meta = std::fs::metadata(path).map_err(io)?;
    let canonical = path.canonicalize().map_err(io)?;
    let stamp = Stamp::of(&meta);
    let mut stamps: serde_json::Map<String, serde_json::Value> = std::fs::read(stamps_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let key = canonical.display().to_string();
    if let Some(sha) = stamps.get(&key).and_then(|v| stamp.matches(v)) {
        return Ok(sha);
    }
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let sha: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    stamps.insert(key, stamp.with(&sha));
    // Remembering is an optimisation: a cache folder that cannot be written costs a re-read.
    if let Some(dir) = stamps_path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = stamps_path.with_extension(format!("json.{}", std::process::id()));
    if std::fs::write(&tmp, serde_json::to_vec(&stamps).unwrap_or_default()).is_ok() {
        let _ = std::fs::rename(&tmp, stamps_path);
    }
    Ok(sha)
}

/// What identifies a file's contents without reading them: size, modification time, inode and
/// change time (which no user can set back, so a rewrite that restores the modification time
/// is still seen).
struct Stamp {
    size: u64,
    mtime_ns: i128,
    inode: u64,
    ctime_ns: i128,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        #[cfg(unix)]
        let (inode, ctime_ns) = {
            use std::os::unix::fs::MetadataExt;
            (
                meta.ino(),
                meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
            )
        };
        #[cfg(not(unix))]
        let (inode, ctime_ns) = (0, 0);
        Self {
            size: meta.len(),
            mtime_ns,
            inode,
            ctime_ns,
        }
    }

    fn with(&self, sha: &str) -> serde_json::Value {
        serde_json::json!({
            "size": self.size,
            "mtime_ns": self.mtime_ns.to_string(),
            "inode": self.inode,
            "ctime_ns": self.ctime_ns.to_string(),
            "sha256": sha,
        })
    }

    /// The remembered SHA-256 if `v` was recorded for this very stamp.
    fn matches(&self, v: &serde_json::Value) -> Option<String> {
        let same = v.get("size")?.as_u64()? == self.size
            && v.get("mtime_ns")?.as_str()? == self.mtime_ns.to_string()
            && v.get("inode")?.as_u64()? == self.inode
            && v.get("ctime_ns")?.as_str()? == self.ctime_ns.to_string();
        same.then(|| v.get("sha256")?.as_str().map(String::from))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn a_rewrite_that_keeps_size_and_mtime_is_still_seen() {
        let dir = tempfile::tempdir().unwrap();
        let (file, stamps) = (dir.path().join("m.gguf"), dir.path().join("s.json"));
        std::fs::write(&file, vec![7u8; 1 << 16]).unwrap();
        let first = sha256_stamped(&file, &stamps).unwrap();
        assert_eq!(first, crate::sha256_file(&file).unwrap());
        // Remembered: the same answer without reading (the stamp matches).
        assert_eq!(sha256_stamped(&file, &stamps).unwrap(), first);
        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.seek(SeekFrom::Start(100)).unwrap();
        f.write_all(&[1; 16]).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let second = sha256_stamped(&file, &stamps).unwrap();
        assert_ne!(second, first);
        assert_eq!(second, crate::sha256_file(&file).unwrap());
    }
}
