//! GGUF writer: metadata and tensors into a valid v3 file image (used by tests and converters).

use crate::checksum::{self, RecordSums};
use crate::gguf::Value;
use std::io::{self, Write};

/// Accumulates metadata and tensors, then writes a GGUF v3 file. A tensor's data is either
/// held ([`tensor`](Self::tensor)) or produced while the file is written
/// ([`tensor_with`](Self::tensor_with)), so a file larger than memory can be described first and
/// written after.
#[derive(Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, u32, Data<'a>)>,
    alignment: u64,
    magic: Option<[u8; 4]>,
    checksums: bool,
}

/// Writes a tensor's data (exactly its size) when the file is written.
pub type Produce<'a> = Box<dyn Fn(&mut dyn Write) -> io::Result<()> + 'a>;

enum Data<'a> {
    Held(Vec<u8>),
    Produced { bytes: u64, produce: Produce<'a> },
}

impl Default for Data<'_> {
    fn default() -> Self {
        Data::Held(Vec::new())
    }
}

impl Data<'_> {
    fn len(&self) -> u64 {
        match self {
            Data::Held(v) => v.len() as u64,
            Data::Produced { bytes, .. } => *bytes,
        }
    }
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        Self {
            alignment: 32,
            ..Default::default()
        }
    }

    /// End the file with the checksum table of every tensor's records ([`checksum`]).
    pub fn with_checksums(&mut self) -> &mut Self {
        self.checksums = true;
        self
    }

    /// Write another magic than `GGUF` (PowerInfer's `PWRI` files, in tests).
    pub fn magic(&mut self, magic: [u8; 4]) -> &mut Self {
        self.magic = Some(magic);
        self
    }

    pub fn meta(&mut self, key: &str, value: Value) -> &mut Self {
        if let Value::U32(a) = value {
            if key == "general.alignment" {
                self.alignment = a as u64;
            }
        }
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Set `key`, replacing an earlier value of the same key (`meta` appends, even duplicates).
    pub fn set_meta(&mut self, key: &str, value: Value) -> &mut Self {
        match self.metadata.iter().position(|(k, _)| k == key) {
            Some(i) => self.metadata[i].1 = value,
            None => {
                self.meta(key, value);
            }
        }
        self
    }

    /// Remove `key` (every value of it), if present.
    pub fn remove_meta(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Add a tensor with GGML dims (`dims[0]` contiguous), type id and raw data.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ggml_type, Data::Held(data)));
        self
    }

    /// Add a tensor of `bytes` bytes whose data `produce` writes when the file is written (it
    /// may run more than once; a size that differs is an error of the write).
    pub fn tensor_with(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: u32,
        bytes: u64,
        produce: impl Fn(&mut dyn Write) -> io::Result<()> + 'a,
    ) -> &mut Self {
        let data = Data::Produced {
            bytes,
            produce: Box::new(produce),
        };
        self.tensors
            .push((name.to_string(), dims.to_vec(), ggml_type, data));
        self
    }

    fn write_str(out: &mut impl Write, s: &str) -> io::Result<()> {
        out.write_all(&(s.len() as u64).to_le_bytes())?;
        out.write_all(s.as_bytes())
    }

    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) | Value::Strings(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    fn write_value(out: &mut impl Write, v: &Value) -> io::Result<()> {
        match v {
            Value::U8(x) => out.write_all(&[*x]),
            Value::I8(x) => out.write_all(&[*x as u8]),
            Value::U16(x) => out.write_all(&x.to_le_bytes()),
            Value::I16(x) => out.write_all(&x.to_le_bytes()),
            Value::U32(x) => out.write_all(&x.to_le_bytes()),
            Value::I32(x) => out.write_all(&x.to_le_bytes()),
            Value::F32(x) => out.write_all(&x.to_le_bytes()),
            Value::Bool(x) => out.write_all(&[*x as u8]),
            Value::String(s) => Self::write_str(out, s),
            Value::Array(items) => {
                let elem = items.first().map(Self::type_id).unwrap_or(0);
                out.write_all(&elem.to_le_bytes())?;
                out.write_all(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|i| Self::write_value(out, i))
            }
            Value::Strings(items) => {
                out.write_all(&8u32.to_le_bytes())?;
                out.write_all(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|s| Self::write_str(out, s))
            }
            Value::U64(x) => out.write_all(&x.to_le_bytes()),
            Value::I64(x) => out.write_all(&x.to_le_bytes()),
            Value::F64(x) => out.write_all(&x.to_le_bytes()),
        }
    }

    /// The complete file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out).expect("writing to a Vec cannot fail");
        out
    }

    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut layout: Vec<TensorLayout> = self
            .tensors
            .iter()
            .map(|(name, dims, ty, data)| TensorLayout {
                name: name.clone(),
                dims: dims.clone(),
                ggml_type: *ty,
                bytes: data.len(),
            })
            .collect();
        if self.checksums {
            layout.push(checksum_layout(
                layout.iter().map(|t| (&t.dims[..], t.bytes)),
            ));
        }
        let magic = self.magic.unwrap_or(*b"GGUF");
        write_streamed(
            out,
            magic,
            &self.metadata,
            self.alignment,
            &layout,
            |i, out| match &self.tensors[i].3 {
                Data::Held(v) => out.write_all(v),
                Data::Produced { produce, .. } => produce(out),
            },
        )
    }
}

/// A tensor's entry in the file directory, its data supplied later.
#[derive(Clone, Debug)]
pub struct TensorLayout {
    pub name: String,
    /// GGML dims (`dims[0]` contiguous).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub bytes: u64,
}

/// The checksum table's directory entry ([`checksum::TENSOR`]) for a file whose other tensors
/// are `tensors` (`(dims, bytes)`); it must come last.
pub fn checksum_layout<'a>(tensors: impl Iterator<Item = (&'a [u64], u64)>) -> TensorLayout {
    let n = checksum::count(tensors);
    TensorLayout {
        name: checksum::TENSOR.into(),
        dims: vec![n],
        ggml_type: crate::gguf::GGML_I32,
        bytes: 4 * n,
    }
}

/// Bytes of the whole file: header, directory, and each tensor padded to `alignment`.
pub fn streamed_size(
    metadata: &[(String, Value)],
    alignment: u64,
    tensors: &[TensorLayout],
) -> u64 {
    let mut counter = Counter(0);
    write_header(&mut counter, *b"GGUF", metadata, alignment, tensors).expect("counting");
    counter.0
        + tensors
            .iter()
            .map(|t| t.bytes.next_multiple_of(alignment))
            .sum::<u64>()
}

struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn write_header(
    out: &mut impl Write,
    magic: [u8; 4],
    metadata: &[(String, Value)],
    alignment: u64,
    tensors: &[TensorLayout],
) -> io::Result<()> {
    // A file with a checksum table also seals its header: everything that shapes the output
    // (metadata scalars, tensor types and shapes) is covered, not only the tensors' bytes.
    let sealed = tensors.last().is_some_and(|t| t.name == checksum::TENSOR);
    let mut head = Vec::new();
    head.extend_from_slice(&magic);
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&((metadata.len() + usize::from(sealed)) as u64).to_le_bytes());
    for (k, v) in metadata {
        GgufWriter::write_str(&mut head, k)?;
        head.extend_from_slice(&GgufWriter::type_id(v).to_le_bytes());
        GgufWriter::write_value(&mut head, v)?;
    }
    let seal_at = sealed.then(|| {
        let _ = GgufWriter::write_str(&mut head, checksum::HEADER_KEY);
        head.extend_from_slice(&GgufWriter::type_id(&Value::U32(0)).to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        head.len() - 4
    });
    let mut offset = 0u64;
    for t in tensors {
        GgufWriter::write_str(&mut head, &t.name)?;
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        t.dims
            .iter()
            .for_each(|d| head.extend_from_slice(&d.to_le_bytes()));
        head.extend_from_slice(&t.ggml_type.to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + t.bytes).next_multiple_of(alignment);
    }
    head.resize((head.len() as u64).next_multiple_of(alignment) as usize, 0);
    if let Some(at) = seal_at {
        // The seal is the CRC-32 of the header with its own four bytes zero.
        let crc = checksum::crc32(&head);
        head[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    out.write_all(&head)
}

/// Write a GGUF v3 file whose tensor data is produced in order by `data(i, out)` (which must
/// write exactly `tensors[i].bytes` bytes), so files larger than memory can be made. A last
/// tensor named [`checksum::TENSOR`] (from [`checksum_layout`]) is filled here with the
/// checksums of what `data` wrote.
pub fn write_streamed<W: Write>(
    out: &mut W,
    magic: [u8; 4],
    metadata: &[(String, Value)],
    alignment: u64,
    tensors: &[TensorLayout],
    mut data: impl FnMut(usize, &mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let sums_at = tensors.iter().position(|t| t.name == checksum::TENSOR);
    if sums_at.is_some_and(|i| i + 1 != tensors.len()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the checksum table must be the last tensor",
        ));
    }
    write_header(out, magic, metadata, alignment, tensors)?;
    let mut sums = RecordSums::new();
    for (i, t) in tensors.iter().enumerate() {
        let mut tee = Tee {
            out: &mut *out,
            sums: sums_at.map(|_| &mut sums),
            written: 0,
        };
        if sums_at == Some(i) {
            let table: Vec<u8> = tee
                .sums
                .take()
                .into_iter()
                .flat_map(|s| s.sums.iter())
                .flat_map(|s| s.to_le_bytes())
                .collect();
            tee.write_all(&table)?;
        } else {
            if let Some(s) = tee.sums.as_mut() {
                s.start(checksum::records(&t.dims, t.bytes).0);
            }
            data(i, &mut tee)?;
        }
        if tee.written != t.bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "tensor `{}`: {} bytes written for {}",
                    t.name, tee.written, t.bytes
                ),
            ));
        }
        let pad = t.bytes.next_multiple_of(alignment) - t.bytes;
        out.write_all(&vec![0u8; pad as usize])?;
    }
    Ok(())
}

/// Passes tensor data through, counting it and (when a checksum table is written) hashing it.
struct Tee<'a, W> {
    out: &'a mut W,
    sums: Option<&'a mut RecordSums>,
    written: u64,
}

impl<W: Write> Write for Tee<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        if let Some(s) = self.sums.as_mut() {
            s.update(&buf[..n]);
        }
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A written table matches the file; a changed byte is found in the record holding it; a
    /// table that does not fit the directory is refused.
    #[test]
    fn written_tables_check_their_file() {
        let mut w = GgufWriter::new();
        w.tensor("a", &[4, 3], 0, (0..48).collect())
            .tensor("b", &[5], 0, vec![7; 20])
            .with_checksums();
        let bytes = w.to_bytes();
        let f = GgufFile::from_bytes(&bytes).unwrap();
        let t = checksum::table(&f).unwrap().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].record_len, t[0].sums.len()), (16, 3));
        assert_eq!(
            t[0].sums[1],
            checksum::crc32(&(16..32).collect::<Vec<u8>>())
        );
        assert_eq!((t[1].record_len, t[1].sums.len()), (20, 1));
        checksum::verify_mapped(&f, &t, |_| usize::MAX).unwrap();
        let mut changed = bytes.clone();
        changed[(f.data_offset + f.tensors[0].offset) as usize + 40] ^= 4;
        let g = GgufFile::from_bytes(&changed).unwrap();
        let err = checksum::verify_mapped(&g, &t, |_| usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(err.contains("record 2 of `a`"), "{err}");
        checksum::verify_mapped(&g, &t, |t| if t.name == "a" { 2 } else { 1 }).unwrap();
        // A table for other tensors (written under another name of the same length, renamed).
        let mut w = GgufWriter::new();
        w.tensor("a", &[4, 3], 0, (0..48).collect());
        w.tensor("pi2.checksumZ", &[2], crate::gguf::GGML_I32, vec![0; 8]);
        let mut bytes = w.to_bytes();
        let at = bytes
            .windows(13)
            .position(|x| x == b"pi2.checksumZ")
            .unwrap();
        bytes[at..at + 13].copy_from_slice(checksum::TENSOR.as_bytes());
        let f = GgufFile::from_bytes(&bytes).unwrap();
        assert!(checksum::table(&f)
            .unwrap_err()
            .to_string()
            .contains("not the checksum table"));
        // Data that is not the size the directory says.
        let mut out = Vec::new();
        let lay = [TensorLayout {
            name: "a".into(),
            dims: vec![4],
            ggml_type: 0,
            bytes: 16,
        }];
        let err = write_streamed(&mut out, *b"GGUF", &[], 32, &lay, |_, o| {
            o.write_all(&[0; 12])
        });
        assert!(err.is_err());
    }

    use crate::gguf::{GgufFile, Strings};

    #[test]
    fn produced_tensors_write_what_held_ones_do_and_a_wrong_size_is_an_error() {
        let data: Vec<u8> = (0..96u8).collect();
        let mut held = GgufWriter::new();
        held.tensor("a", &[8, 3], 0, data.clone()).with_checksums();
        let mut produced = GgufWriter::new();
        produced
            .tensor_with("a", &[8, 3], 0, 96, |out| {
                data.chunks(7).try_for_each(|c| out.write_all(c))
            })
            .with_checksums();
        assert_eq!(held.to_bytes(), produced.to_bytes());
        let mut short = GgufWriter::new();
        short.tensor_with("a", &[8, 3], 0, 96, |out| out.write_all(&data[..95]));
        let err = short.write(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("95 bytes written for 96"), "{err}");
    }

    #[test]
    fn string_arrays_read_back_compact_whichever_way_they_were_written() {
        let texts = ["a", "", "\u{2581}the", "<|im_end|>"];
        let mut w = GgufWriter::new();
        w.meta(
            "as.items",
            Value::Array(texts.map(|t| Value::String(t.into())).to_vec()),
        );
        w.meta(
            "as.strings",
            Value::Strings(texts.into_iter().collect::<Strings>()),
        );
        w.meta("numbers", Value::Array(vec![Value::I32(1), Value::I32(-2)]));
        let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
        for key in ["as.items", "as.strings"] {
            let v = f.get(key).unwrap();
            assert!(matches!(v, Value::Strings(_)), "{key}: {v:?}");
            assert_eq!(v.strings().unwrap(), texts);
            assert_eq!(v.array_len(), Some(4));
        }
        let n = f.get("numbers").unwrap();
        assert_eq!(n.as_array().unwrap().len(), 2);
        assert_eq!(n.strings(), None);
    }
}
