//! The committed header is what cbindgen makes from the source now: CI fails on a stale one.
//! `PI2_BLESS=1 cargo test -p pi2-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn the_committed_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut made);
    let path = crate_dir.join("include/pi2.h");
    if std::env::var_os("PI2_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == made,
        "{} is stale: regenerate it with `PI2_BLESS=1 cargo test -p pi2-capi --test header` and commit it",
        path.display()
    );
}
