//! Parsed records on local disk (`Pipeline::cache_on_disk`): one file per shard, read back
//! without parsing the format again.
//!
//! A file holds a shard's samples in a small tagged encoding of [`Value`]s (below); reading
//! it back maps the file, and bytes and tensors become zero-copy slices of the mapping
//! (page cache the kernel can reclaim, not heap). A file is written whole to a temporary name and renamed into place,
//! so a reader (another epoch, another run, another process) sees a complete file or none.
//! Its name is a hash of what decides its contents: the format (with its options), the
//! object's URL, size and version (ETag, version id or modification time); a changed object
//! gets a new file, never a stale one.
//!
//! Encoding (little-endian): magic `STKC1\0\0\0`, u64 sample count, then per sample a u32
//! field count and per field a u16 name length, the name, and the value: tag u8 then
//! `0` bytes (u64 length, data), `1` tensor (u8 dtype, u8 rank, u64 per dimension, u64
//! length, data), `2` text (u64 length, UTF-8), `3` int (i64), `4` float (f64), `5` list
//! (u64 count, values), `6` null. A file that does not decode is treated as absent (and
//! replaced), never as data.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use stoker_core::{DType, Error, Sample, Tensor, Value};

const MAGIC: &[u8; 8] = b"STKC1\0\0\0";

const DTYPES: [DType; 8] = [
    DType::U8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

/// Shard files under one directory.
#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: PathBuf,
}

impl DiskTier {
    /// Uses (and creates) `dir`.
    pub(crate) fn new(dir: &Path) -> Result<DiskTier, Error> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::invalid(format!(
                "cache: cannot create the cache directory {}: {e}",
                dir.display()
            ))
        })?;
        Ok(DiskTier {
            dir: dir.to_path_buf(),
        })
    }

    /// The file for a shard identified by `identity` (format, URL, size, version).
    pub(crate) fn path(&self, identity: &str) -> PathBuf {
        let h = crate::rng::hash(
            &identity
                .as_bytes()
                .chunks(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(w)
                })
                .chain([identity.len() as u64])
                .collect::<Vec<_>>(),
        );
        // A second, differently seeded hash makes accidental collisions negligible.
        let h2 = crate::rng::hash(&[h, 0x5eed, identity.len() as u64]);
        self.dir.join(format!("{h:016x}{h2:016x}.samples"))
    }

    /// Whether a file for `identity` exists.
    pub(crate) fn contains(&self, identity: &str) -> bool {
        self.path(identity).is_file()
    }

    /// The samples stored for `identity`, if a whole, valid file is there.
    pub(crate) fn get(&self, identity: &str) -> Option<Vec<Sample>> {
        let path = self.path(identity);
        let file = std::fs::File::open(&path).ok()?;
        // SAFETY: cache files are never changed in place: they are written under another
        // name and renamed over (or removed), which leaves an existing mapping intact. The
        // pages are the file's own (page cache, reclaimable), not the process's heap.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let data = Bytes::from_owner(map);
        match decode(&data) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cache file unreadable; ignored");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores `samples` for `identity` (write to a temporary name, then rename).
    pub(crate) fn put(&self, identity: &str, samples: &[Sample]) -> std::io::Result<()> {
        let path = self.path(identity);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        let r = encode(samples, &mut out).and_then(|_| out.flush());
        drop(out);
        match r {
            Ok(()) => std::fs::rename(&tmp, &path),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// Writes `samples` in the encoding above.
pub(crate) fn encode(samples: &[Sample], w: &mut impl Write) -> std::io::Result<()> {
    w.write_all(MAGIC)?;
    w.write_all(&(samples.len() as u64).to_le_bytes())?;
    for s in samples {
        w.write_all(&(s.len() as u32).to_le_bytes())?;
        for (name, v) in s.iter() {
            let n = name.as_bytes();
            let len = u16::try_from(n.len()).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "field name too long")
            })?;
            w.write_all(&len.to_le_bytes())?;
            w.write_all(n)?;
            encode_value(v, w)?;
        }
    }
    Ok(())
}

fn encode_value(v: &Value, w: &mut impl Write) -> std::io::Result<()> {
    match v {
        Value::Bytes(b) => {
            w.write_all(&[0])?;
            w.write_all(&(b.len() as u64).to_le_bytes())?;
            w.write_all(b)
        }
        Value::Tensor(t) => {
            let tag = DTYPES.iter().position(|d| *d == t.dtype()).expect("known") as u8;
            w.write_all(&[1, tag, t.shape().len() as u8])?;
            for d in t.shape() {
                w.write_all(&(*d as u64).to_le_bytes())?;
            }
            let data = t.data();
            w.write_all(&(data.len() as u64).to_le_bytes())?;
            w.write_all(data)
        }
        Value::Str(s) => {
            w.write_all(&[2])?;
            w.write_all(&(s.len() as u64).to_le_bytes())?;
            w.write_all(s.as_bytes())
        }
        Value::Int(i) => {
            w.write_all(&[3])?;
            w.write_all(&i.to_le_bytes())
        }
        Value::Float(x) => {
            w.write_all(&[4])?;
            w.write_all(&x.to_le_bytes())
        }
        Value::List(l) => {
            w.write_all(&[5])?;
            w.write_all(&(l.len() as u64).to_le_bytes())?;
            for x in l {
                encode_value(x, w)?;
            }
            Ok(())
        }
        Value::Null => w.write_all(&[6]),
    }
}

struct Cur<'a> {
    data: &'a Bytes,
    at: usize,
}

impl Cur<'_> {
    fn take(&mut self, n: usize) -> Result<Bytes, Error> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| Error::record(format!("cache file truncated at byte {}", self.at)))?;
        let b = self.data.slice(self.at..end);
        self.at = end;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.take(8)?[..].try_into().expect("8")))
    }

    fn len(&mut self) -> Result<usize, Error> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.data.len())
            .ok_or_else(|| Error::record(format!("cache file: bad length {n} at {}", self.at)))
    }
}

/// Reads what [`encode`] wrote; slices of `data` become the values' buffers.
pub(crate) fn decode(data: &Bytes) -> Result<Vec<Sample>, Error> {
    let mut c = Cur { data, at: 0 };
    if c.take(8)?[..] != MAGIC[..] {
        return Err(Error::record("cache file: not a stoker cache file"));
    }
    let n = c.len()?;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let fields = u32::from_le_bytes(c.take(4)?[..].try_into().expect("4"));
        let mut s = Sample::with_capacity(fields as usize);
        for _ in 0..fields {
            let nl = u16::from_le_bytes(c.take(2)?[..].try_into().expect("2"));
            let name = c.take(nl as usize)?;
            let name = std::str::from_utf8(&name)
                .map_err(|_| Error::record("cache file: field name not UTF-8"))?;
            let name: Arc<str> = Arc::from(name);
            s.insert(name, decode_value(&mut c, 0)?);
        }
        out.push(s);
    }
    if c.at != data.len() {
        return Err(Error::record("cache file: trailing bytes"));
    }
    Ok(out)
}

fn decode_value(c: &mut Cur<'_>, depth: usize) -> Result<Value, Error> {
    if depth > 64 {
        return Err(Error::record("cache file: lists nested too deep"));
    }
    Ok(match c.u8()? {
        0 => {
            let n = c.len()?;
            Value::Bytes(c.take(n)?)
        }
        1 => {
            let dtype = *DTYPES
                .get(c.u8()? as usize)
                .ok_or_else(|| Error::record("cache file: bad dtype"))?;
            let rank = c.u8()? as usize;
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(c.len()?);
            }
            let n = c.len()?;
            Value::Tensor(Tensor::new(dtype, shape, c.take(n)?)?)
        }
        2 => {
            let n = c.len()?;
            let b = c.take(n)?;
            let s = std::str::from_utf8(&b).map_err(|_| Error::record("cache file: bad text"))?;
            Value::Str(Arc::from(s))
        }
        3 => Value::Int(c.u64()? as i64),
        4 => Value::Float(f64::from_bits(c.u64()?)),
        5 => {
            let n = c.len()?;
            let mut l = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                l.push(decode_value(c, depth + 1)?);
            }
            Value::List(l)
        }
        6 => Value::Null,
        t => return Err(Error::record(format!("cache file: unknown tag {t}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| Value::Bytes(v.into())),
            ".{0,12}".prop_map(|s| Value::Str(Arc::from(s.as_str()))),
            any::<i64>().prop_map(Value::Int),
            any::<f64>()
                .prop_filter("NaN compares unequal", |x| !x.is_nan())
                .prop_map(Value::Float),
            Just(Value::Null),
            proptest::collection::vec(any::<f32>(), 0..12).prop_map(|v| {
                let n = v.len();
                Value::Tensor(Tensor::from_slice(vec![n], &v).unwrap())
            }),
            proptest::collection::vec(any::<i16>(), 6)
                .prop_map(|v| { Value::Tensor(Tensor::from_slice(vec![2, 3], &v).unwrap()) }),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            proptest::collection::vec(inner, 0..4).prop_map(Value::List)
        })
    }

    fn sample() -> impl Strategy<Value = Sample> {
        proptest::collection::vec(("[a-z]{1,6}", value()), 0..5).prop_map(|fields| {
            let mut s = Sample::new();
            for (k, v) in fields {
                s.insert(k.as_str(), v);
            }
            s
        })
    }

    proptest! {
        #[test]
        fn round_trip(samples in proptest::collection::vec(sample(), 0..8)) {
            let mut buf = Vec::new();
            encode(&samples, &mut buf).unwrap();
            let back = decode(&Bytes::from(buf)).unwrap();
            // Floats compare bitwise through their encoding; NaN-free here, so == works.
            prop_assert_eq!(back, samples);
        }

        #[test]
        fn truncated_files_are_errors(samples in proptest::collection::vec(sample(), 1..4), cut in 1usize..64) {
            let mut buf = Vec::new();
            encode(&samples, &mut buf).unwrap();
            let keep = buf.len().saturating_sub(cut);
            prop_assert!(decode(&Bytes::copy_from_slice(&buf[..keep])).is_err());
        }
    }

    #[test]
    fn files_round_trip_and_bad_files_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let tier = DiskTier::new(dir.path()).unwrap();
        let mut s = Sample::new();
        s.insert("x", Value::Int(7));
        assert!(!tier.contains("a"));
        tier.put("a", std::slice::from_ref(&s)).unwrap();
        assert!(tier.contains("a"));
        assert!(!tier.contains("b"));
        assert_eq!(tier.get("a").unwrap(), vec![s]);
        std::fs::write(tier.path("a"), b"garbage").unwrap();
        assert!(tier.get("a").is_none());
        assert!(!tier.contains("a"), "an unreadable file is removed");
    }
}
