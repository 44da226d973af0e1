//! Zero-copy GGUF (v2/v3) reader over a memory map.
//!
//! The header is parsed eagerly with explicit caps (string length, array length, counts, dims) so
//! a hostile file cannot make the reader allocate unbounded memory; every tensor's byte range is
//! checked against the file before any view is handed out. Tensor data is never copied.

use crate::error::{ModelError, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

/// Longest string accepted (converted files embed their activation profile as JSON, 16 MiB for
/// a 7B model; chat templates are a few KiB).
pub const MAX_STRING_LEN: u64 = 1 << 26;
/// Most elements accepted in one metadata array (vocabularies are ~2^18).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Most memory the parsed metadata may take (every value and string byte counted): a value
/// takes tens of bytes in memory for one byte of file, so a huge array would otherwise cost
/// many times the file's size. Real vocabularies (262k tokens with scores and types, 300k
/// merges) take well under 100 MiB.
pub const MAX_METADATA_BYTES: u64 = 512 << 20;
/// Most tensors / metadata entries accepted.
pub const MAX_TENSORS: u64 = 1 << 16;
pub const MAX_KV: u64 = 1 << 16;
/// Most tensor dimensions (GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;
/// Largest tensor data alignment accepted.
pub const MAX_ALIGNMENT: u64 = 1 << 16;

const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// PowerInfer's sparse model files: GGUF with its own magic (and predictor tensors).
pub const POWERINFER_MAGIC: [u8; 4] = *b"PWRI";

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    /// An array of strings, as the reader keeps them: one buffer (a vocabulary's tokens and
    /// merges as `Array` items would take about 60 bytes of heap per string).
    Strings(Strings),
}

/// Strings in one buffer with their end offsets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Strings {
    text: String,
    ends: Vec<usize>,
}

impl Strings {
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl<'a> FromIterator<&'a str> for Strings {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let mut s = Strings::default();
        iter.into_iter().for_each(|x| s.push(x));
        s
    }
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) | Value::Strings(_) => "array",
        }
    }

    /// The value as a non-negative integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The items of an array of values (not of [`Value::Strings`]: see [`Value::strings`]).
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The items of an array of strings, however it is held (`None` if any is not a string).
    pub fn strings(&self) -> Option<Vec<&str>> {
        match self {
            Value::Strings(s) => Some(s.iter().collect()),
            Value::Array(a) => a.iter().map(Value::as_str).collect(),
            _ => None,
        }
    }

    /// Items of an array of any kind.
    pub fn array_len(&self) -> Option<usize> {
        match self {
            Value::Array(a) => Some(a.len()),
            Value::Strings(s) => Some(s.len()),
            _ => None,
        }
    }
}

/// GGML's I32 type id (neuron permutations, checksum tables).
pub const GGML_I32: u32 = 26;

/// GGML tensor types known to the format: (name, elements per block, bytes per block).
/// pi2 computes with a subset (see `pi2_kernels::QuantType`); the rest are still sized so that
/// a file holding them can be validated and listed.
pub fn ggml_type_info(id: u32) -> Option<(&'static str, u64, u64)> {
    Some(match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        _ => return None,
    })
}

/// One tensor's description from the header. `dims[0]` is the contiguous (row) dimension.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    pub fn type_name(&self) -> &'static str {
        ggml_type_info(self.ggml_type).map(|t| t.0).unwrap_or("?")
    }

    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file: metadata, tensor directory and the mapping holding the data.
pub struct GgufFile {
    mmap: Mmap,
    /// The mapping is of a file (not an anonymous copy), so dropped pages come back from it.
    file_backed: bool,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Memory the metadata parsed so far takes (see [`MAX_METADATA_BYTES`]).
    meta_bytes: u64,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let end = (self.pos as u64)
            .checked_add(n)
            .filter(|&e| e <= self.buf.len() as u64);
        let Some(end) = end else {
            return Err(ModelError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                len: self.buf.len() as u64,
            });
        };
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        self.string_ref(what).map(str::to_string)
    }

    /// A string, borrowed from the buffer (charged as if copied).
    fn string_ref(&mut self, what: &str) -> Result<&'a str> {
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(ModelError::LimitExceeded {
                what: "string length",
                value: len,
                limit: MAX_STRING_LEN,
            });
        }
        let bytes = self.take(len, what)?;
        self.charge(len)?;
        std::str::from_utf8(bytes)
            .map_err(|_| ModelError::Corrupt(format!("{what} is not valid UTF-8")))
    }

    /// Counts `bytes` of parsed metadata against [`MAX_METADATA_BYTES`].
    fn charge(&mut self, bytes: u64) -> Result<()> {
        self.meta_bytes += bytes;
        if self.meta_bytes > MAX_METADATA_BYTES {
            return Err(ModelError::LimitExceeded {
                what: "metadata size in memory",
                value: self.meta_bytes,
                limit: MAX_METADATA_BYTES,
            });
        }
        Ok(())
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<Value> {
        // An array's elements are charged with the array, before it allocates them.
        if depth == 0 {
            self.charge(std::mem::size_of::<Value>() as u64)?;
        }
        Ok(match ty {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(self.u16(what)?),
            3 => Value::I16(self.u16(what)? as i16),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(ModelError::Corrupt(format!("{what}: bool byte {b}"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth > 1 {
                    return Err(ModelError::Corrupt(format!(
                        "{what}: arrays nested too deeply"
                    )));
                }
                let elem_ty = self.u32(what)?;
                let n = self.u64(what)?;
                if n > MAX_ARRAY_LEN {
                    return Err(ModelError::LimitExceeded {
                        what: "array length",
                        value: n,
                        limit: MAX_ARRAY_LEN,
                    });
                }
                // Every element takes at least one byte: reject counts the file cannot hold before
                // allocating for them.
                if n > self.remaining() {
                    return Err(ModelError::Truncated {
                        what: what.to_string(),
                        offset: self.pos as u64,
                        len: self.buf.len() as u64,
                    });
                }
                if elem_ty == 8 {
                    // Strings: their bytes are charged as read, their offsets here.
                    self.charge(n * std::mem::size_of::<usize>() as u64)?;
                    let mut items = Strings::default();
                    items.ends.reserve(n as usize);
                    for _ in 0..n {
                        let s = self.string_ref(what)?;
                        items.push(s);
                    }
                    return Ok(Value::Strings(items));
                }
                self.charge(n * std::mem::size_of::<Value>() as u64)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_ty, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            t => {
                return Err(ModelError::Corrupt(format!(
                    "{what}: unknown metadata value type {t}"
                )))
            }
        })
    }
}

impl GgufFile {
    /// Map and parse `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Checked before opening: opening a FIFO would wait for a writer forever.
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            let what = if meta.is_dir() {
                "is a directory"
            } else {
                "not a regular file (a pipe or device cannot be mapped)"
            };
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                what,
            )));
        }
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only; pi2 never writes model files it reads, and a file
        // truncated underneath a running process is outside what any mmap reader can defend.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let mut f = Self::parse(mmap)?;
        f.file_backed = true;
        Ok(f)
    }

    fn parse(mmap: Mmap) -> Result<Self> {
        let buf: &[u8] = &mmap;
        let mut c = Cursor {
            buf,
            pos: 0,
            meta_bytes: 0,
        };
        let magic: [u8; 4] = match buf.get(..4) {
            Some(m) => m.try_into().unwrap(),
            None => {
                let mut m = [0u8; 4];
                m[..buf.len()].copy_from_slice(buf);
                return Err(ModelError::NotGguf(m));
            }
        };
        if magic != GGUF_MAGIC && magic != POWERINFER_MAGIC {
            return Err(ModelError::NotGguf(magic));
        }
        c.pos = 4;
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        if n_tensors > MAX_TENSORS {
            return Err(ModelError::LimitExceeded {
                what: "tensor count",
                value: n_tensors,
                limit: MAX_TENSORS,
            });
        }
        if n_kv > MAX_KV {
            return Err(ModelError::LimitExceeded {
                what: "metadata count",
                value: n_kv,
                limit: MAX_KV,
            });
        }

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::new();
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key #{i}"))?;
            let ty = c.u32(&format!("type of `{key}`"))?;
            let value = c.value(ty, &format!("value of `{key}`"), 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(ModelError::Corrupt(format!(
                    "duplicate metadata key `{key}`"
                )));
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => 32,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| ModelError::Corrupt("general.alignment is not an integer".into()))?,
        };
        if alignment == 0 || !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
            return Err(ModelError::Corrupt(format!(
                "general.alignment {alignment} is not a power of two <= {MAX_ALIGNMENT}"
            )));
        }

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::new();
        for i in 0..n_tensors {
            let name = c.string(&format!("tensor name #{i}"))?;
            let n_dims = c.u32(&format!("dims of `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(ModelError::Corrupt(format!(
                    "tensor `{name}` has {n_dims} dimensions (1..={MAX_DIMS} allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&format!("dims of `{name}`"))?);
            }
            let ggml_type = c.u32(&format!("type of `{name}`"))?;
            let offset = c.u64(&format!("offset of `{name}`"))?;
            let (tname, blck, bytes) = ggml_type_info(ggml_type).ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "tensor `{name}` has GGML type id {ggml_type}, which this pi2 does not know (a newer llama.cpp type?)"
                ))
            })?;
            let n_el = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n > 0 && n < (1u64 << 50))
                .ok_or_else(|| {
                    ModelError::Corrupt(format!("tensor `{name}` has invalid dimensions {dims:?}"))
                })?;
            if dims[0] % blck != 0 {
                return Err(ModelError::Corrupt(format!(
                    "tensor `{name}` row length {} is not a multiple of the {tname} block size {blck}",
                    dims[0]
                )));
            }
            let size = n_el / blck * bytes;
            if offset % alignment != 0 {
                return Err(ModelError::Corrupt(format!(
                    "tensor `{name}` offset {offset} is not aligned to {alignment}"
                )));
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(ModelError::Corrupt(format!("duplicate tensor `{name}`")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size,
            });
        }

        let data_offset = (c.pos as u64).next_multiple_of(alignment);
        check_spans(&tensors, data_offset, buf.len() as u64, alignment)?;
        Ok(Self {
            mmap,
            file_backed: false,
            version,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A tensor's description by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_position(name).map(|i| &self.tensors[i])
    }

    /// A tensor's index in [`GgufFile::tensors`] by name.
    pub fn tensor_position(&self, name: &str) -> Option<usize> {
        self.tensor_index.get(name).copied()
    }

    /// The bytes of a tensor (validated against the file at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.mmap[start..start + t.size as usize]
    }

    /// Tell the kernel that the mapping is read at random (no read-ahead): with the FFN read
    /// from flash separately, faults on the resident tensors must not pull neighbouring FFN
    /// pages into memory (read-around fills a window of the device's read-ahead size, 8 MiB on
    /// some disks, and later faults map whatever of it is cached). Call it before the first
    /// access to tensor data.
    pub fn advise_random(&self) {
        // Advisory: failing only keeps the default read-ahead.
        #[cfg(unix)]
        let _ = self.mmap.advise(memmap2::Advice::Random);
    }

    /// Reads the whole file into memory now and maps it, as llama.cpp's `MAP_POPULATE` does, so
    /// that a model run in memory never waits for the device in its first tokens. Only when
    /// the file fits in the memory available now (`/proc/meminfo`); elsewhere, and for an
    /// in-memory image, nothing happens. Returns whether it populated.
    pub fn populate(&self) -> bool {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let available = std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|m| {
                    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
                    line.split_whitespace().nth(1)?.parse::<u64>().ok()
                })
                .map_or(0, |kib| kib * 1024);
            if !self.file_backed || self.file_size() >= available / 10 * 9 {
                return false;
            }
            #[cfg(target_os = "linux")]
            if self.mmap.advise(memmap2::Advice::PopulateRead).is_ok() {
                return true;
            }
            // Older kernels: touch one byte of every page.
            let mut x = 0u8;
            for i in (0..self.mmap.len()).step_by(4096) {
                x ^= self.mmap[i];
            }
            std::hint::black_box(x);
            true
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        false
    }

    /// Drop this process's resident pages of bytes `range` of tensor `t` (after copying them
    /// elsewhere, e.g. into a row-interleaved copy): they leave the process's RSS, stay in the
    /// page cache, and come back from the file if touched again. Only whole pages inside the
    /// range are released; an in-memory image (`from_bytes`) is left alone, as its pages have
    /// no file behind them.
    pub fn release(&self, t: &TensorInfo, range: std::ops::Range<usize>) {
        if !self.file_backed || range.end > t.size as usize || range.start >= range.end {
            return;
        }
        let page = 4096;
        let start = (self.data_offset + t.offset) as usize;
        let first = (start + range.start).next_multiple_of(page);
        let end = (start + range.end) / page * page;
        if end > first {
            // SAFETY: the mapping is a read-only map of a file, so dropping its pages loses no
            // data: later accesses fault them back in from the file.
            #[cfg(unix)]
            let _ = unsafe {
                self.mmap.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    first,
                    end - first,
                )
            };
        }
    }

    /// Size of the whole file in bytes.
    /// The file's header and tensor directory: bytes `0..data_offset`.
    pub fn header_bytes(&self) -> &[u8] {
        &self.mmap[..self.data_offset as usize]
    }

    pub fn file_size(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// Total bytes of tensor data.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }

    /// Parse a GGUF image held in memory (tests, tools).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut anon =
            memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|source| ModelError::Io {
                path: "<memory>".into(),
                source,
            })?;
        anon[..bytes.len()].copy_from_slice(bytes);
        let mmap = anon.make_read_only().map_err(|source| ModelError::Io {
            path: "<memory>".into(),
            source,
        })?;
        if bytes.is_empty() {
            return Err(ModelError::NotGguf([0; 4]));
        }
        Self::parse(mmap)
    }
}

/// Every tensor's data lies inside the file, no two overlap (a byte of one tensor changed
/// through another would be a silent wrong answer), and they are packed as writers pack them,
/// as llama.cpp requires: each starts where the one before ends, rounded up to the alignment.
/// A gap means a tensor's type or shape describes fewer bytes than were written for it (a type
/// changed for a smaller one, say), which would read the wrong bytes.
fn check_spans(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_len: u64,
    alignment: u64,
) -> Result<()> {
    for t in tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size));
        if end.is_none_or(|e| e > file_len) {
            return Err(ModelError::Truncated {
                what: format!(
                    "data of tensor `{}` ({} bytes at data offset {})",
                    t.name, t.size, t.offset
                ),
                offset: data_offset.saturating_add(t.offset),
                len: file_len,
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    if let Some(w) = by_offset
        .windows(2)
        .find(|w| w[0].offset + w[0].size > w[1].offset)
    {
        return Err(ModelError::Corrupt(format!(
            "tensors `{}` and `{}` overlap in the file",
            w[0].name, w[1].name
        )));
    }
    let mut end = 0u64;
    for t in by_offset {
        if t.offset != end.next_multiple_of(alignment) {
            return Err(ModelError::Corrupt(format!(
                "tensor `{}` starts at data offset {} where the tensors before it end at {end}: \
                 a tensor's type or shape does not match the bytes written for it",
                t.name, t.offset
            )));
        }
        end = t.offset + t.size;
    }
    Ok(())
}
