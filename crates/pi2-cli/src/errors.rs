//! How an error reaches the user: one line.

/// The error and its causes on one line, each cause once: a library error that already
/// prints its source is not followed by that source again.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// When `e` says a file pi2 made in its own cache (a one-command conversion) is damaged, that
/// file is removed, so the next run makes it again: the line to add to the error, if so. A
/// file the user gave is never touched.
pub fn forget_damaged_conversion(e: &anyhow::Error, cache_dir: &std::path::Path) -> Option<String> {
    let damaged = e.chain().find_map(|cause| {
        if let Some(pi2_io::IoError::Checksum { file: Some(f), .. }) = cause.downcast_ref() {
            return Some(f.clone());
        }
        match cause.downcast_ref() {
            Some(pi2_runtime::RuntimeError::Damaged { path, .. }) => Some(path.clone()),
            _ => None,
        }
    })?;
    let cache = cache_dir.join("converted");
    let (file, cache) = (damaged.canonicalize().ok()?, cache.canonicalize().ok()?);
    if !file.starts_with(&cache) {
        return None;
    }
    Some(match std::fs::remove_file(&file) {
        Ok(()) => format!(
            "pi2 removed its damaged conversion {}; the next run makes it again",
            file.display()
        ),
        Err(why) => format!("delete {} to have it made again ({why})", file.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_conversion_in_the_cache_is_removed_and_no_other_file() {
        let dir = tempfile::tempdir().unwrap();
        let converted = dir.path().join("converted");
        std::fs::create_dir_all(&converted).unwrap();
        let ours = converted.join("m-v3.gguf");
        let theirs = dir.path().join("model.gguf");
        for f in [&ours, &theirs] {
            std::fs::write(f, b"GGUF").unwrap();
        }
        let damaged = |path: &std::path::Path| {
            anyhow::Error::from(pi2_runtime::RuntimeError::Damaged {
                path: path.to_path_buf(),
                why: "record 3 does not match its checksum".into(),
            })
        };
        assert_eq!(
            forget_damaged_conversion(&damaged(&theirs), dir.path()),
            None
        );
        assert!(theirs.exists());
        let said = forget_damaged_conversion(&damaged(&ours), dir.path()).unwrap();
        assert!(said.contains("makes it again"), "{said}");
        assert!(!ours.exists());
        // Read through the engine: the reader's checksum error names the file.
        std::fs::write(&ours, b"GGUF").unwrap();
        let io = pi2_io::IoError::Checksum {
            file: Some(ours.clone()),
            region: "blk.0.ffn_gate".into(),
            offset: 4096,
            len: 64,
        };
        let e = anyhow::Error::from(pi2_runtime::RuntimeError::from(
            pi2_engine::EngineError::from(io),
        ));
        assert!(
            one_line(&e).contains(&ours.display().to_string()),
            "{}",
            one_line(&e)
        );
        assert!(forget_damaged_conversion(&e, dir.path()).is_some());
        assert!(!ours.exists());
    }
}
