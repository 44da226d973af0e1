//! Writing an output file so that it either appears complete and checked, or not at all: the
//! data goes to a file with no name (Linux's `O_TMPFILE`) in the output's folder, is synced
//! and checked through `/proc/self/fd`, and only then gets its name. A run killed at any
//! point (even by `SIGKILL`) leaves nothing behind, and a failed check leaves an earlier file of
//! that name untouched. Where unnamed files are not supported, an exclusive temporary file of an
//! unpredictable name is used instead (removed on failure; a killed run can leave it).

use crate::ConvertError;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// Write `out` with `write`, run `check` on the complete file (given a path it can be opened
/// by), then put it in place. Refuses to write over any of `inputs` (links resolved), and over
/// an existing file unless `force`.
pub fn write_atomic(
    out: &Path,
    inputs: &[&Path],
    force: bool,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
    check: impl FnOnce(&Path) -> Result<(), ConvertError>,
) -> Result<(), ConvertError> {
    let io = |path: &Path| {
        let p = path.display().to_string();
        move |source| ConvertError::Io { path: p, source }
    };
    for input in inputs {
        if let (Ok(a), Ok(b)) = (out.canonicalize(), input.canonicalize()) {
            if a == b {
                return Err(ConvertError::Refused(format!(
                    "{} is an input of this command; choose another output file",
                    out.display()
                )));
            }
        }
    }
    if out.exists() && !force {
        return Err(ConvertError::Refused(format!(
            "{} exists; pass --force to replace it",
            out.display()
        )));
    }
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = Partial::create(dir).map_err(io(dir))?;
    let shown = tmp.path();
    let mut file = BufWriter::with_capacity(1 << 20, tmp.file.try_clone().map_err(io(&shown))?);
    write(&mut file).map_err(io(&shown))?;
    file.into_inner()
        .map_err(|e| io(&shown)(e.into_error()))?
        .sync_all()
        .map_err(io(&shown))?;
    check(&shown)?;
    tmp.persist(dir, out).map_err(io(out))
}

/// The file being written: unnamed where the system allows, else a named temporary file.
struct Partial {
    file: File,
    named: Option<tempfile::TempPath>,
}

impl Partial {
    fn create(dir: &Path) -> std::io::Result<Self> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(file) = unnamed(dir) {
            return Ok(Self { file, named: None });
        }
        let (file, path) = named(dir)?.into_parts();
        Ok(Self {
            file,
            named: Some(path),
        })
    }

    /// A path the complete file can be opened by.
    fn path(&self) -> PathBuf {
        match &self.named {
            Some(p) => p.to_path_buf(),
            None => PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&self.file)
            )),
        }
    }

    fn persist(self, dir: &Path, out: &Path) -> std::io::Result<()> {
        let path = match self.named {
            Some(p) => p,
            None => {
                // Give the unnamed file a fresh exclusive name, then move it over `out` (a
                // link cannot replace an existing file).
                let name = named(dir)?.into_temp_path();
                std::fs::remove_file(&name)?;
                let from =
                    std::ffi::CString::new(self.path().into_os_string().into_encoded_bytes())?;
                let to = std::ffi::CString::new(
                    name.to_path_buf().into_os_string().into_encoded_bytes(),
                )?;
                // SAFETY: two valid C strings; linkat does not keep them.
                let r = unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        from.as_ptr(),
                        libc::AT_FDCWD,
                        to.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                };
                if r != 0 {
                    let e = std::io::Error::last_os_error();
                    // The name is gone already; nothing to clean.
                    let _ = name.keep();
                    return Err(e);
                }
                name
            }
        };
        path.persist(out).map_err(|e| e.error)
    }
}

/// A new exclusive file of an unpredictable name in `dir` (mode 0666 before the umask, as a
/// plain create would give, not tempfile's 0600).
fn named(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".pi2-partial-")
        .suffix(".tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
}

/// An unnamed file in `dir`, if its file system supports them.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn unnamed(dir: &Path) -> Option<File> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a valid C string; the returned descriptor is owned by the File.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o666,
        )
    };
    // SAFETY: a fresh descriptor no one else owns.
    (fd >= 0).then(|| unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".pi2-partial-"))
            .collect()
    }

    #[test]
    fn outputs_appear_checked_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let (input, out) = (dir.path().join("in"), dir.path().join("out"));
        std::fs::write(&input, b"source").unwrap();
        let w = |bytes: &'static [u8]| {
            move |f: &mut BufWriter<File>| std::io::Write::write_all(f, bytes)
        };
        let ok = |p: &Path| {
            assert_eq!(std::fs::read(p).unwrap(), b"new");
            Ok(())
        };
        write_atomic(&out, &[&input], false, w(b"new"), ok).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        // Exists: refused without --force.
        assert!(write_atomic(&out, &[&input], false, w(b"x"), |_| Ok(())).is_err());
        // A failed check leaves the earlier file as it was, and nothing else.
        let bad = |_: &Path| Err(ConvertError::Verify("no".into()));
        assert!(write_atomic(&out, &[&input], true, w(b"other"), bad).is_err());
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        // An input is never an output, even through a link.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let err = write_atomic(&link, &[&input], true, w(b"x"), |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("is an input"), "{err}");
        assert_eq!(std::fs::read(&input).unwrap(), b"source");
        // Replacing works with --force.
        write_atomic(&out, &[&input], true, w(b"newer"), |_| Ok(())).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"newer");
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }
}
