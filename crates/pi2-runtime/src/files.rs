//! Files a command writes for the user: checked before any work, so that nothing the user gave
//! is replaced.

use crate::error::{Result, RuntimeError};
use std::path::{Path, PathBuf};

/// Refuses outputs that would replace a file the command reads (whatever `force` says: paths
/// compared after resolving links), an existing file without `force`, or a file in a folder
/// that does not exist (never created: a mistyped folder is the user's to fix).
pub fn check_outputs(outputs: &[&Path], inputs: &[&Path], force: bool) -> Result<()> {
    let refuse = |out: &Path, msg: String| {
        Err(RuntimeError::Io {
            path: out.display().to_string(),
            msg,
        })
    };
    let resolved: Vec<PathBuf> = inputs
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    for out in outputs {
        if let Ok(o) = out.canonicalize() {
            if let Some((input, _)) = inputs.iter().zip(&resolved).find(|(_, r)| **r == o) {
                let what = match *input == *out {
                    true => "a file".to_string(),
                    false => format!("{} (a file)", input.display()),
                };
                return refuse(
                    out,
                    format!("{what} this command reads; choose another output file"),
                );
            }
        }
        if out.exists() && !force {
            return refuse(out, "exists; pass --force to replace it".into());
        }
        let dir = out.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir.filter(|d| !d.is_dir()) {
            return refuse(
                out,
                format!(
                    "cannot write it: the folder {} does not exist (create it, or choose another output)",
                    dir.display()
                ),
            );
        }
    }
    Ok(())
}

/// The UTF-8 text of `source` (a file, or standard input for `-`), at most `limit` bytes:
/// refused in one line naming `what` (`the prompt`, `the grammar`) when it cannot be read, is
/// not a regular file, is larger, or is not UTF-8.
pub fn read_text(source: &Path, what: &str, limit: u64) -> Result<String> {
    use std::io::Read;
    let fail = |msg: String| Err(RuntimeError::Input(msg));
    let (name, reader): (String, Box<dyn Read>) = match source.as_os_str() == "-" {
        true => ("standard input".into(), Box::new(std::io::stdin().lock())),
        false => {
            let shown = source.display().to_string();
            // Checked before opening: opening a FIFO with no writer would wait forever.
            if std::fs::metadata(source).is_ok_and(|m| !m.is_file()) {
                return fail(format!(
                    "{shown} is not a regular file (use - for standard input)"
                ));
            }
            let file = match std::fs::File::open(source) {
                Ok(f) => f,
                Err(e) => return fail(format!("cannot read {what} file {shown}: {e}")),
            };
            if !file.metadata().is_ok_and(|m| m.is_file()) {
                return fail(format!(
                    "{shown} is not a regular file (use - for standard input)"
                ));
            }
            (shown, Box::new(file))
        }
    };
    let mut bytes = Vec::new();
    if let Err(e) = reader.take(limit + 1).read_to_end(&mut bytes) {
        return fail(format!("cannot read {what} from {name}: {e}"));
    }
    if bytes.len() as u64 > limit {
        return fail(format!("{what} in {name} is over {} MiB", limit >> 20));
    }
    String::from_utf8(bytes).or_else(|e| {
        let at = e.utf8_error().valid_up_to();
        fail(format!("{what} in {name} is not UTF-8 (byte {at})"))
    })
}
