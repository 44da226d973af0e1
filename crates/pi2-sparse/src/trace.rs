//! Activation traces: which neurons of each layer were active for each profiled token, one bit
//! each. Cache policies are replayed on them (pi2-cache's hit-ratio bench, the hit-rate curves).
//!
//! File layout (little-endian): magic `PI2TRACE`, then u32 version, n_layer, n_ff, n_tokens,
//! then for each layer, for each token, `ceil(n_ff / 64)` u64 words (bit `i % 64` of word
//! `i / 64` = neuron `i` active).

use crate::SparseError;
use std::io::{Read, Write};
use std::path::Path;

pub const TRACE_MAGIC: &[u8; 8] = b"PI2TRACE";
pub const TRACE_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_tokens: usize,
    /// `[layer][token][word]`, flattened.
    bits: Vec<u64>,
}

impl Trace {
    pub fn new(n_layer: usize, n_ff: usize, n_tokens: usize) -> Trace {
        Trace {
            n_layer,
            n_ff,
            n_tokens,
            bits: vec![0; n_layer * n_tokens * n_ff.div_ceil(64)],
        }
    }

    fn words(&self) -> usize {
        self.n_ff.div_ceil(64)
    }

    /// The bit row of one (layer, token).
    pub fn row(&self, layer: usize, token: usize) -> &[u64] {
        let w = self.words();
        let at = (layer * self.n_tokens + token) * w;
        &self.bits[at..at + w]
    }

    pub fn set(&mut self, layer: usize, token: usize, neuron: usize) {
        let w = self.words();
        self.bits[(layer * self.n_tokens + token) * w + neuron / 64] |= 1 << (neuron % 64);
    }

    /// Active neurons of one (layer, token), ascending.
    pub fn active(&self, layer: usize, token: usize) -> impl Iterator<Item = usize> + '_ {
        self.row(layer, token)
            .iter()
            .enumerate()
            .flat_map(|(wi, &word)| {
                let mut w = word;
                std::iter::from_fn(move || {
                    if w == 0 {
                        return None;
                    }
                    let b = w.trailing_zeros() as usize;
                    w &= w - 1;
                    Some(wi * 64 + b)
                })
            })
    }

    pub fn write(&self, path: &Path) -> Result<(), SparseError> {
        let io = |source| SparseError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        f.write_all(TRACE_MAGIC).map_err(io)?;
        for v in [
            TRACE_VERSION,
            self.n_layer as u32,
            self.n_ff as u32,
            self.n_tokens as u32,
        ] {
            f.write_all(&v.to_le_bytes()).map_err(io)?;
        }
        for w in &self.bits {
            f.write_all(&w.to_le_bytes()).map_err(io)?;
        }
        f.flush().map_err(io)
    }

    pub fn read(path: &Path) -> Result<Trace, SparseError> {
        let p = path.display().to_string();
        let bad = |msg: String| SparseError::BadTrace {
            path: p.clone(),
            msg,
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|source| SparseError::Io {
                path: p.clone(),
                source,
            })?;
        if bytes.len() < 24 || &bytes[..8] != TRACE_MAGIC {
            return Err(bad("wrong magic".into()));
        }
        let u = |i: usize| u32::from_le_bytes(bytes[8 + 4 * i..12 + 4 * i].try_into().unwrap());
        if u(0) != TRACE_VERSION {
            return Err(bad(format!(
                "version {} (this pi2 reads {TRACE_VERSION})",
                u(0)
            )));
        }
        let (n_layer, n_ff, n_tokens) = (u(1) as usize, u(2) as usize, u(3) as usize);
        let words = (n_layer as u128) * (n_tokens as u128) * (n_ff.div_ceil(64) as u128);
        let body = &bytes[24..];
        if words * 8 != body.len() as u128 {
            return Err(bad(format!(
                "{n_layer} layers x {n_tokens} tokens x {n_ff} neurons need {} bytes, the file has {}",
                words * 8,
                body.len()
            )));
        }
        let bits = body
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(Trace {
            n_layer,
            n_ff,
            n_tokens,
            bits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_round_trip_and_truncated_files_are_refused() {
        let mut t = Trace::new(2, 70, 3);
        t.set(1, 2, 69);
        t.set(1, 2, 3);
        t.set(0, 0, 64);
        assert_eq!(t.active(1, 2).collect::<Vec<_>>(), vec![3, 69]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.trace");
        t.write(&p).unwrap();
        assert_eq!(Trace::read(&p).unwrap(), t);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 8]).unwrap();
        let e = Trace::read(&p).unwrap_err().to_string();
        assert!(e.contains("need") && e.contains("the file has"), "{e}");
        std::fs::write(&p, b"PI2TRACX0000000000000000").unwrap();
        assert!(Trace::read(&p)
            .unwrap_err()
            .to_string()
            .contains("wrong magic"));
    }
}
