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
//!
//! # Size limit
//!
//! A tier may be given a byte limit (`cache(dir, size)`). The directory's files (entries,
//! entries being written, and the small bookkeeping file) never add up to more than it.
//! Nothing is evicted: an entry that would not fit is simply not written, and its shard is
//! read from the source each epoch, while the entries already complete stay and keep being
//! used. Entries are immutable and named by their content's identity, so evicting an old
//! one to make room for a new one would only trade which shards are read again, at the
//! cost of a write; and several runs sharing a directory would evict each other's working
//! sets. To reclaim the space of entries nobody reads any more, remove the directory (or its
//! files) while no run uses it.
//!
//! The bytes in the directory are kept in a bookkeeping file, `usage` (a decimal number),
//! which is also the lock that writers of any process take (an exclusive `flock`) to
//! reserve room: under it a writer checks that the entry's exact encoded size fits, creates
//! its temporary file at that size (so the reservation is visible on disk to anyone who
//! measures the directory), and updates the count; it writes the data outside the lock, then
//! takes it again to rename the file into place (or to remove it and give the room back).
//! Each run recounts the directory under the lock when it opens it (files removed by hand,
//! a count left torn by a crash), dropping temporary files whose process is gone. A crash
//! between reservation and rename leaves the count too high until the next recount, never
//! too low, so the limit holds in every case.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The bookkeeping file: the bytes of the entries and of the writes in progress (decimal),
/// and the lock of the directory.
const USAGE: &str = "usage";

/// Room kept for the bookkeeping file itself (a u64 in decimal is at most 20 bytes).
const USAGE_ROOM: u64 = 32;

/// What [`DiskTier::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// The entry was written: this many bytes.
    Written(u64),
    /// An entry for this identity was there already (another run wrote it).
    Present,
    /// The entry (this many bytes) would take the directory over its limit: not written.
    OverLimit(u64),
}

/// Shard files under one directory, optionally within a byte limit.
#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: PathBuf,
    limit: Option<u64>,
    /// Bytes in the directory at the last look (under the lock).
    used: AtomicU64,
}

/// The directory's lock, held while alive, with the count it guards.
struct Usage {
    file: File,
}

impl Usage {
    fn read(&mut self) -> Option<u64> {
        let mut s = String::new();
        self.file.seek(SeekFrom::Start(0)).ok()?;
        self.file.read_to_string(&mut s).ok()?;
        s.trim().parse().ok()
    }

    fn write(&mut self, bytes: u64) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(bytes.to_string().as_bytes())
    }
}

impl Drop for Usage {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// Temporary names: `<entry>.tmp<pid>-<n>`, unique within and across processes.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The process that writes a temporary file of this extension, if it is one.
fn tmp_writer(ext: &str) -> Option<u32> {
    let rest = ext.strip_prefix("tmp")?;
    rest.split('-').next()?.parse().ok()
}

/// Whether process `pid` may still be writing (true where this cannot be known).
fn alive(pid: u32) -> bool {
    if pid == std::process::id() || !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new("/proc").join(pid.to_string()).exists()
}

impl DiskTier {
    /// Uses (and creates) `dir`; with `limit`, its files never exceed that many bytes.
    pub(crate) fn new(dir: &Path, limit: Option<u64>) -> Result<DiskTier, Error> {
        // A storage error with the `io::Error` as its cause: a directory the process may not
        // write is a refusal (`PermissionError` in Python), a full disk an `OSError`.
        let fail = |e: std::io::Error| {
            let mut err = Error::from(e);
            err.message = format!(
                "cache: cannot use the cache directory {}: {}",
                dir.display(),
                err.message
            );
            err
        };
        if let Some(l) = limit {
            if l <= USAGE_ROOM {
                return Err(Error::invalid(format!(
                    "cache: a size of {l} bytes leaves no room for entries"
                )));
            }
        }
        std::fs::create_dir_all(dir).map_err(fail)?;
        let tier = DiskTier {
            dir: dir.to_path_buf(),
            limit,
            used: AtomicU64::new(0),
        };
        let mut usage = tier.lock().map_err(fail)?;
        let used = tier.recount().map_err(fail)?;
        usage.write(used).map_err(fail)?;
        tier.used.store(used, Ordering::Relaxed);
        Ok(tier)
    }

    /// Takes the directory's lock.
    fn lock(&self) -> std::io::Result<Usage> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(USAGE))?;
        file.lock()?;
        Ok(Usage { file })
    }

    /// The bytes of the directory's files (but the bookkeeping file), removing temporary
    /// files of processes that are gone. Call under the lock.
    fn recount(&self) -> std::io::Result<u64> {
        let mut total = 0;
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let path = e.path();
            if e.file_name() == USAGE {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
            if let Some(pid) = tmp_writer(ext) {
                if !alive(pid) && std::fs::remove_file(&path).is_ok() {
                    continue;
                }
            }
            total += meta.len();
        }
        Ok(total)
    }

    /// The count under the lock (recounted when torn or missing).
    fn current(&self, usage: &mut Usage) -> std::io::Result<u64> {
        match usage.read() {
            Some(n) => Ok(n),
            None => {
                let n = self.recount()?;
                usage.write(n)?;
                Ok(n)
            }
        }
    }

    /// Bytes in the directory at the last look.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The byte limit, if any.
    pub(crate) fn limit(&self) -> Option<u64> {
        self.limit
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
                self.remove(&path);
                None
            }
        }
    }

    /// Removes an entry (an unreadable one), giving its room back.
    fn remove(&self, path: &Path) {
        let Ok(mut usage) = self.lock() else {
            // Without the lock the count cannot be kept: leave the file (a later run's
            // recount or the next read removes it).
            return;
        };
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if std::fs::remove_file(path).is_ok() {
            if let Ok(n) = self.current(&mut usage) {
                let n = n.saturating_sub(meta.len());
                if usage.write(n).is_ok() {
                    self.used.store(n, Ordering::Relaxed);
                }
            }
        }
    }

    /// Stores `samples` for `identity`, if they fit within the limit: reserves room under
    /// the lock, writes a temporary file, renames it into place (see the module docs).
    pub(crate) fn put(&self, identity: &str, samples: &[Sample]) -> std::io::Result<Put> {
        let path = self.path(identity);
        let size = encoded_len(samples)?;
        let tmp = path.with_extension(format!(
            "tmp{}-{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        // Reserve.
        let file = {
            let mut usage = self.lock()?;
            if path.is_file() {
                return Ok(Put::Present);
            }
            let used = self.current(&mut usage)?;
            self.used.store(used, Ordering::Relaxed);
            if self.limit.is_some_and(|l| used + size + USAGE_ROOM > l) {
                return Ok(Put::OverLimit(size));
            }
            let file = File::create(&tmp)?;
            if let Err(e) = file.set_len(size).and_then(|_| usage.write(used + size)) {
                drop(file);
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            self.used.store(used + size, Ordering::Relaxed);
            file
        };
        // Write (outside the lock), then publish or give the room back.
        let mut out = std::io::BufWriter::new(file);
        let r = encode(samples, &mut out).and_then(|_| out.flush());
        drop(out);
        let r = r.and_then(|_| {
            let len = std::fs::metadata(&tmp)?.len();
            if len == size {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "cache entry is {len} bytes, {size} were reserved"
                )))
            }
        });
        let mut usage = self.lock()?;
        // Another run may have published the same entry meanwhile: keep that one (renaming
        // over it would leave its bytes counted twice).
        let r = r.and_then(|_| {
            if path.is_file() {
                Ok(Put::Present)
            } else {
                std::fs::rename(&tmp, &path).map(|_| Put::Written(size))
            }
        });
        if !matches!(r, Ok(Put::Written(_))) {
            let _ = std::fs::remove_file(&tmp);
            let n = self.current(&mut usage)?.saturating_sub(size);
            usage.write(n)?;
            self.used.store(n, Ordering::Relaxed);
        }
        r
    }
}

/// The bytes [`encode`] writes for `samples`.
pub(crate) fn encoded_len(samples: &[Sample]) -> std::io::Result<u64> {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    encode(samples, &mut c)?;
    Ok(c.0)
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
        let tier = DiskTier::new(dir.path(), None).unwrap();
        let mut s = Sample::new();
        s.insert("x", Value::Int(7));
        assert!(!tier.contains("a"));
        assert!(matches!(
            tier.put("a", std::slice::from_ref(&s)).unwrap(),
            Put::Written(_)
        ));
        assert_eq!(
            tier.put("a", std::slice::from_ref(&s)).unwrap(),
            Put::Present
        );
        assert!(tier.contains("a"));
        assert!(!tier.contains("b"));
        assert_eq!(tier.get("a").unwrap(), vec![s]);
        std::fs::write(tier.path("a"), b"garbage").unwrap();
        assert!(tier.get("a").is_none());
        assert!(!tier.contains("a"), "an unreadable file is removed");
    }

    /// The bytes of every file in `dir` (the bookkeeping file included).
    fn dir_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    fn samples(n: usize, len: usize) -> Vec<Sample> {
        (0..n)
            .map(|i| {
                let mut s = Sample::new();
                s.insert("x", Value::Bytes(vec![i as u8; len].into()));
                s
            })
            .collect()
    }

    #[test]
    fn a_limited_tier_writes_what_fits_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let one = encoded_len(&samples(4, 1000)).unwrap();
        assert_eq!(one, {
            let mut b = Vec::new();
            encode(&samples(4, 1000), &mut b).unwrap();
            b.len() as u64
        });
        // Room for two entries and the bookkeeping, not three.
        let limit = 2 * one + USAGE_ROOM + one / 2;
        let tier = DiskTier::new(dir.path(), Some(limit)).unwrap();
        let mut outcomes = Vec::new();
        for k in ["a", "b", "c", "d"] {
            outcomes.push(tier.put(k, &samples(4, 1000)).unwrap());
            assert!(dir_bytes(dir.path()) <= limit);
        }
        assert_eq!(
            outcomes,
            [
                Put::Written(one),
                Put::Written(one),
                Put::OverLimit(one),
                Put::OverLimit(one)
            ]
        );
        assert_eq!(tier.used(), 2 * one);
        assert_eq!(tier.get("a").unwrap(), samples(4, 1000));
        assert!(tier.get("c").is_none());
        // A smaller entry still fits in what is left.
        assert_eq!(
            tier.put("e", &samples(1, 10)).unwrap(),
            Put::Written(encoded_len(&samples(1, 10)).unwrap())
        );
        assert!(dir_bytes(dir.path()) <= limit);
        // Another tier over the same directory (another run) sees the same count.
        let again = DiskTier::new(dir.path(), Some(limit)).unwrap();
        assert_eq!(again.used(), tier.used());
        assert_eq!(
            again.put("c", &samples(4, 1000)).unwrap(),
            Put::OverLimit(one)
        );
        assert_eq!(again.put("a", &samples(4, 1000)).unwrap(), Put::Present);
    }

    #[test]
    fn opening_recounts_and_drops_writes_of_dead_processes() {
        let dir = tempfile::tempdir().unwrap();
        let one = encoded_len(&samples(2, 100)).unwrap();
        let tier = DiskTier::new(dir.path(), None).unwrap();
        tier.put("a", &samples(2, 100)).unwrap();
        tier.put("b", &samples(2, 100)).unwrap();
        assert_eq!(tier.used(), 2 * one);
        // Removed by hand; a temporary file left by a process that is gone (no pid is
        // that large on Linux) and one of a live process (this one); a torn count.
        std::fs::remove_file(tier.path("a")).unwrap();
        let dead = tier.path("z").with_extension("tmp4294967295-0");
        std::fs::write(&dead, [0u8; 500]).unwrap();
        let live = tier
            .path("y")
            .with_extension(format!("tmp{}-999999", std::process::id()));
        std::fs::write(&live, [0u8; 300]).unwrap();
        std::fs::write(dir.path().join(USAGE), b"garb").unwrap();
        let tier = DiskTier::new(dir.path(), Some(1 << 20)).unwrap();
        assert_eq!(tier.used(), one + 300);
        assert!(!dead.exists());
        assert!(live.exists());
        // A torn count is recounted by a writer too.
        std::fs::write(dir.path().join(USAGE), b"").unwrap();
        tier.put("c", &samples(2, 100)).unwrap();
        assert_eq!(tier.used(), 2 * one + 300);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(USAGE)).unwrap(),
            (2 * one + 300).to_string()
        );
    }

    #[test]
    fn a_removed_bad_entry_gives_its_room_back() {
        let dir = tempfile::tempdir().unwrap();
        let tier = DiskTier::new(dir.path(), Some(1 << 20)).unwrap();
        tier.put("a", &samples(2, 100)).unwrap();
        // Damaged in place (same length: the count knows the file's size).
        let n = std::fs::metadata(tier.path("a")).unwrap().len() as usize;
        std::fs::write(tier.path("a"), vec![b'x'; n]).unwrap();
        assert!(tier.get("a").is_none());
        assert_eq!(tier.used(), 0);
        assert_eq!(dir_bytes(dir.path()), 1, "only the count, \"0\"");
    }

    #[test]
    fn concurrent_writers_share_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let one = encoded_len(&samples(8, 4000)).unwrap();
        let limit = 10 * one + USAGE_ROOM;
        std::thread::scope(|s| {
            for t in 0..4 {
                let path = dir.path().to_path_buf();
                s.spawn(move || {
                    // Each thread its own tier (like separate runs); overlapping keys.
                    let tier = DiskTier::new(&path, Some(limit)).unwrap();
                    for k in 0..12 {
                        let key = format!("k{}", (k + t * 3) % 20);
                        tier.put(&key, &samples(8, 4000)).unwrap();
                    }
                });
            }
        });
        assert!(dir_bytes(dir.path()) <= limit);
        let tier = DiskTier::new(dir.path(), Some(limit)).unwrap();
        let mut whole = 0;
        for k in 0..20 {
            if let Some(got) = tier.get(&format!("k{k}")) {
                assert_eq!(got, samples(8, 4000));
                whole += 1;
            }
        }
        // Two writers of one key both hold room until one of them publishes, so a third
        // key may find the directory full for a moment: at most 10 entries, not exactly.
        assert!((1..=10).contains(&whole), "{whole}");
        assert_eq!(tier.used(), whole * one);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| n == USAGE || n.ends_with(".samples")),
            "no temporary file left: {names:?}"
        );
        assert_eq!(names.len() as u64, whole + 1);
    }
}
