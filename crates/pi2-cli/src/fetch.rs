//! Catalogue models for the command line: pi2-catalog's fetches shown as a progress bar and
//! one-line notices.

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use pi2_catalog::{CatalogModel, Event};
use std::path::{Path, PathBuf};

/// The model file `-m` names (see [`pi2_catalog::resolve`]), fetched with a progress bar when
/// a catalogue name is not in the models folder yet.
pub fn resolve(spec: Option<&Path>) -> Result<PathBuf> {
    let stamps = pi2_runtime::convert_cache::stamps_path();
    Ok(pi2_catalog::resolve(
        spec,
        &stamps,
        &mut Shown::default().events(),
    )?)
}

/// Fetches `m` into `dir` with a progress bar.
pub fn fetch(m: &CatalogModel, dir: &Path, force: bool) -> Result<PathBuf> {
    Ok(pi2_catalog::fetch(
        m,
        dir,
        force,
        &mut Shown::default().events(),
    )?)
}

/// The progress bar of one fetch.
#[derive(Default)]
struct Shown {
    bar: Option<ProgressBar>,
}

impl Shown {
    fn events(&mut self) -> impl FnMut(Event) + '_ {
        move |e| match e {
            Event::Start { name, bytes } => {
                let pb = ProgressBar::new(bytes);
                pb.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                    )
                    .expect("static template")
                    .progress_chars("=> "),
                );
                pb.set_message(name.to_string());
                self.bar = Some(pb);
            }
            Event::Part { name, index, of } => {
                if let Some(pb) = &self.bar {
                    pb.set_message(format!("{name} {}/{of}", index + 1));
                }
            }
            Event::Bytes(n) => {
                if let Some(pb) = &self.bar {
                    pb.inc(n);
                }
            }
            Event::Finished => {
                if let Some(pb) = self.bar.take() {
                    pb.finish_and_clear();
                }
            }
            other => {
                if let Some(line) = other.line() {
                    eprintln!("{line}");
                }
            }
        }
    }
}
