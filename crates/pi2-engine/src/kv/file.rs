//! A KV cache written to a file and read back (llama-server's slot save and restore): every
//! layer's cells as they are laid out, its recurrent states, and how far it was written. Reading
//! checks each layer against the model's shape and every length against the context before it
//! allocates, so a changed or hostile file is an error, never a panic or a huge allocation.

use super::KvCache;
use crate::states::Snapshots;
use half::f16;
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"PI2KV001";

/// Why a saved cache cannot be read for this model.
pub(crate) type ReadError = String;

pub(crate) fn put(w: &mut dyn Write, v: usize) -> std::io::Result<()> {
    w.write_all(&(v as u64).to_le_bytes())
}

pub(crate) fn get(r: &mut dyn Read) -> Result<usize, ReadError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)
        .map_err(|e| format!("truncated ({e})"))?;
    usize::try_from(u64::from_le_bytes(b)).map_err(|_| "a length out of range".into())
}

/// `n` values of 2 or 4 bytes each, read after checking `n` against `most`.
pub(crate) fn get_bytes(
    r: &mut dyn Read,
    n: usize,
    most: usize,
    what: &str,
) -> Result<Vec<u8>, ReadError> {
    if n > most {
        return Err(format!("{what}: {n} values where at most {most} fit"));
    }
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)
        .map_err(|e| format!("{what} truncated ({e})"))?;
    Ok(b)
}

impl KvCache {
    /// Writes the cache: positions held, every layer's cells and recurrent states.
    pub fn write(&self, w: &mut dyn Write) -> std::io::Result<()> {
        w.write_all(MAGIC)?;
        for v in [self.n_ctx, self.len, self.high, self.layers.len()] {
            put(w, v)?;
        }
        for l in &self.layers {
            put(w, l.ring)?;
            put(w, l.k.len())?;
            put(w, l.v.len())?;
            w.write_all(bytemuck::cast_slice(&l.k))?;
            w.write_all(bytemuck::cast_slice(&l.v))?;
            match &l.states {
                Some(s) => {
                    w.write_all(&[1])?;
                    s.write(w)?;
                }
                None => w.write_all(&[0])?,
            }
        }
        Ok(())
    }

    /// Replaces this cache's contents with a cache [`KvCache::write`] wrote for a model of the
    /// same layers and context; returns the positions it holds.
    pub fn read(&mut self, r: &mut dyn Read) -> Result<usize, ReadError> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)
            .map_err(|e| format!("truncated ({e})"))?;
        if &magic != MAGIC {
            return Err("not a pi2 KV cache file".into());
        }
        let (n_ctx, len, high, n_layers) = (get(r)?, get(r)?, get(r)?, get(r)?);
        if n_ctx != self.n_ctx || n_layers != self.layers.len() {
            return Err(format!(
                "saved for {n_layers} layers and a context of {n_ctx}, this model has {} layers and a context of {}",
                self.layers.len(),
                self.n_ctx
            ));
        }
        if len > n_ctx || high > n_ctx {
            return Err(format!("{len} positions held of a context of {n_ctx}"));
        }
        let mut layers = Vec::with_capacity(n_layers);
        for (li, l) in self.layers.iter().enumerate() {
            let at = |e: ReadError| format!("layer {li}: {e}");
            let (ring, k_len, v_len) = (
                get(r).map_err(at)?,
                get(r).map_err(at)?,
                get(r).map_err(at)?,
            );
            let (kw, vw) = l.cells.widths();
            let ring_ok = match l.window {
                Some(w) => (w.min(n_ctx)..=n_ctx).contains(&ring),
                None => ring == n_ctx,
            };
            let positions = k_len.checked_div(kw).unwrap_or(0);
            if !ring_ok || positions > ring || k_len % kw.max(1) != 0 || v_len != positions * vw {
                return Err(at(format!(
                    "{k_len} key and {v_len} value cells in a ring of {ring} do not fit its shape"
                )));
            }
            let k = get_bytes(r, 2 * k_len, 2 * ring * kw, "keys").map_err(at)?;
            let v = get_bytes(r, 2 * v_len, 2 * ring * vw, "values").map_err(at)?;
            let mut has = [0u8];
            r.read_exact(&mut has)
                .map_err(|e| at(format!("truncated ({e})")))?;
            let states = match (has[0], &l.states) {
                (0, None) => None,
                (1, Some(s)) => Some(Snapshots::read(s.state_len(), r).map_err(at)?),
                _ => {
                    return Err(at(
                        "recurrent states where the model has none, or none where it has".into(),
                    ))
                }
            };
            layers.push((ring, halves(&k), halves(&v), states));
        }
        for (l, (ring, k, v, states)) in self.layers.iter_mut().zip(layers) {
            (l.ring, l.k, l.v, l.states) = (ring, k, v, states);
        }
        (self.len, self.high) = (len, high);
        Ok(len)
    }
}

fn halves(b: &[u8]) -> Vec<f16> {
    b.chunks_exact(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{Cells, KvCache, LayerShape};

    fn cache() -> KvCache {
        let shape = |window, cells| LayerShape {
            window,
            cells,
            state: 0,
        };
        KvCache::with_layers(
            [
                shape(None, Cells::KeyValue(4)),
                shape(Some(3), Cells::KeyValue(2)),
                shape(None, Cells::KeyValue(0)),
            ],
            16,
        )
    }

    #[test]
    fn a_written_cache_reads_back_and_a_changed_one_is_refused() {
        let mut kv = cache();
        let rows = |n: usize, w: usize| (0..n * w).map(|i| i as f32 * 0.5).collect::<Vec<_>>();
        kv.append(0, 0, &rows(5, 4), &rows(5, 4), 4);
        kv.append(1, 0, &rows(5, 2), &rows(5, 2), 2);
        kv.len = 5;
        let mut bytes = Vec::new();
        kv.write(&mut bytes).unwrap();
        let mut back = cache();
        assert_eq!(back.read(&mut bytes.as_slice()).unwrap(), 5);
        let mut again = Vec::new();
        back.write(&mut again).unwrap();
        assert_eq!(again, bytes, "the same cache");
        // Cut short, or a length changed to something huge: an error, never a panic.
        for cut in [0, 8, 40, bytes.len() - 1] {
            assert!(cache().read(&mut &bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = bytes.clone();
        huge[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(cache().read(&mut huge.as_slice()).is_err());
        // Another context.
        let mut other = KvCache::with_layers([], 16);
        assert!(other
            .read(&mut bytes.as_slice())
            .unwrap_err()
            .contains("layers"));
    }
}
