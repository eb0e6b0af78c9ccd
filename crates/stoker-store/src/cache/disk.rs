//! The disk tier: one file per block under `<dir>/stoker-blocks-v1/<xx>/<hash>.blk`, where
//! `<hash>` is a stable 64-bit hash of the key and `<xx>` its top byte (256 subdirectories).
//!
//! File format (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `STKBLK\0\x01` |
//! | 4 | object URL length `o` |
//! | 4 | version length `v` |
//! | 8 | block index |
//! | 8 | data length `n` |
//! | 4 | CRC-32C of the data |
//! | 4 | CRC-32C of everything above plus the object and version bytes |
//! | o | object URL |
//! | v | version |
//! | n | data |
//!
//! A reader verifies the header checksum, that the file length matches, that the key is the
//! one asked for (another key with the same hash is a miss, not an error) and the data
//! checksum. A file that fails a check is deleted and counted as corrupt; the read is a miss.
//!
//! Writers never expose partial files: a block is written to a uniquely named temporary file in
//! the same directory and renamed over the final name, which is atomic. So several processes
//! may share a directory: a reader sees either no file, the old complete file or the new one.
//! Files deleted by another process (its eviction) read as a miss.
//!
//! The index (hash -> size, access order) is this process's view: rebuilt at startup by
//! scanning the directory (sizes and mtimes only; keys are verified on read), extended by the
//! files it writes and the files of other processes it reads. Eviction removes the least
//! recently used files it knows until the known bytes are within the budget.
//!
//! Writes are done by one background thread fed through a queue bounded in bytes; when the
//! queue is full the write is dropped (counted), so the read path never waits on the disk.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::BlockKey;

const MAGIC: [u8; 8] = *b"STKBLK\x00\x01";
const FIXED_HEADER: usize = 40;
/// Sanity bound on the key lengths a header may claim.
const MAX_KEY_BYTES: usize = 64 << 10;
/// Bytes of block data the write queue may hold before it drops writes.
pub(crate) const MAX_PENDING_WRITE_BYTES: u64 = 64 << 20;
/// Temporary files older than this found at startup are debris of a crashed writer.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);
/// Name of the directory (inside the configured one) holding the blocks; versioned so that a
/// future format change does not misread old files.
const ROOT_NAME: &str = "stoker-blocks-v1";

/// Disk tier counters.
#[derive(Debug, Default)]
pub(crate) struct DiskCounters {
    pub writes: AtomicU64,
    pub write_drops: AtomicU64,
    pub evictions: AtomicU64,
    pub corrupt: AtomicU64,
    pub errors: AtomicU64,
}

#[derive(Debug, Default)]
struct Index {
    /// hash -> (file bytes, access tick).
    entries: HashMap<u64, (u64, u64)>,
    /// access tick -> hash, oldest first.
    order: BTreeMap<u64, u64>,
    bytes: u64,
    tick: u64,
}

impl Index {
    /// Records `hash` as present with `size` bytes and most recently used.
    fn touch(&mut self, hash: u64, size: u64) {
        self.remove(hash);
        self.tick += 1;
        self.entries.insert(hash, (size, self.tick));
        self.order.insert(self.tick, hash);
        self.bytes += size;
    }

    fn remove(&mut self, hash: u64) {
        if let Some((size, tick)) = self.entries.remove(&hash) {
            self.order.remove(&tick);
            self.bytes -= size;
        }
    }

    /// Takes the least recently used entries out until at most `capacity` bytes are known,
    /// sparing `keep`; returns the hashes whose files are to be deleted.
    fn evict_to(&mut self, capacity: u64, keep: Option<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        let mut spared = None;
        while self.bytes > capacity {
            let Some((tick, hash)) = self.order.pop_first() else {
                break;
            };
            if Some(hash) == keep {
                spared = Some((tick, hash));
                continue;
            }
            let (size, _) = self
                .entries
                .remove(&hash)
                .expect("ordered entry is indexed");
            self.bytes -= size;
            out.push(hash);
        }
        if let Some((tick, hash)) = spared {
            self.order.insert(tick, hash);
        }
        out
    }
}

enum Job {
    Write {
        key: BlockKey,
        hash: u64,
        data: Bytes,
    },
    Flush(tokio::sync::oneshot::Sender<()>),
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    pending_bytes: u64,
    shutdown: bool,
}

struct Shared {
    root: PathBuf,
    capacity: u64,
    index: Mutex<Index>,
    queue: Mutex<Queue>,
    wake: Condvar,
    counters: DiskCounters,
}

/// The disk tier. Dropping it stops the writer thread once the queued writes are done.
pub(crate) struct DiskTier {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("root", &self.shared.root)
            .field("capacity", &self.shared.capacity)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.wake.notify_all();
    }
}

impl DiskTier {
    /// Opens (creating if needed) the tier under `dir`, scanning what earlier runs left.
    pub fn open(dir: &Path, capacity: u64) -> io::Result<DiskTier> {
        let root = dir.join(ROOT_NAME);
        fs::create_dir_all(&root)?;
        let shared = Arc::new(Shared {
            root,
            capacity,
            index: Mutex::new(Index::default()),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            counters: DiskCounters::default(),
        });
        shared.scan()?;
        let doomed = shared.index.lock().evict_to(capacity, None);
        shared.delete(doomed);
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("stoker-cache-writer".into())
            .spawn(move || worker.run_writer())?;
        Ok(DiskTier { shared })
    }

    pub fn capacity(&self) -> u64 {
        self.shared.capacity
    }

    /// Bytes of the files this process knows of.
    pub fn bytes(&self) -> u64 {
        self.shared.index.lock().bytes
    }

    /// Number of files this process knows of.
    pub fn entries(&self) -> usize {
        self.shared.index.lock().entries.len()
    }

    pub fn counters(&self) -> &DiskCounters {
        &self.shared.counters
    }

    /// Reads and verifies the block of `key` (blocking I/O).
    pub fn read(&self, key: &BlockKey, hash: u64) -> Option<Bytes> {
        self.shared.read(key, hash)
    }

    /// Queues a write of `data` under `key`; drops it (returning false) when the queue is
    /// full or the block can never fit.
    pub fn enqueue(&self, key: BlockKey, hash: u64, data: Bytes) -> bool {
        let size = file_size(&key, data.len());
        let c = &self.shared.counters;
        if size > self.shared.capacity {
            return false;
        }
        let mut q = self.shared.queue.lock();
        let len = data.len() as u64;
        if q.shutdown || (!q.jobs.is_empty() && q.pending_bytes + len > MAX_PENDING_WRITE_BYTES) {
            c.write_drops.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.pending_bytes += len;
        q.jobs.push_back(Job::Write { key, hash, data });
        drop(q);
        self.shared.wake.notify_one();
        true
    }

    /// A receiver that completes once every write queued before this call is done.
    pub fn flush(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.shared.queue.lock().jobs.push_back(Job::Flush(tx));
        self.shared.wake.notify_one();
        rx
    }

    /// The path of the file for `hash` (tests poke at files).
    #[cfg(test)]
    pub fn path_for(&self, hash: u64) -> PathBuf {
        self.shared.path_for(hash)
    }
}

impl Shared {
    fn path_for(&self, hash: u64) -> PathBuf {
        self.root
            .join(format!("{:02x}", hash >> 56))
            .join(format!("{hash:016x}.blk"))
    }

    /// Rebuilds the index from the files present, oldest (by mtime) first in LRU order, and
    /// removes temporary files left by crashed writers.
    fn scan(&self) -> io::Result<()> {
        let mut found: Vec<(SystemTime, u64, u64)> = Vec::new();
        let now = SystemTime::now();
        for sub in fs::read_dir(&self.root)? {
            let Ok(sub) = sub else { continue };
            let name = sub.file_name();
            let name = name.to_string_lossy();
            if name.len() != 2 || !sub.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(files) = fs::read_dir(sub.path()) else {
                continue;
            };
            for file in files {
                let Ok(file) = file else { continue };
                let Ok(meta) = file.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                let name = file.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(".tmp-") {
                    if now
                        .duration_since(mtime)
                        .is_ok_and(|age| age > STALE_TEMP_AGE)
                    {
                        let _ = fs::remove_file(file.path());
                    }
                    continue;
                }
                let Some(hash) = name
                    .strip_suffix(".blk")
                    .filter(|h| h.len() == 16)
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                else {
                    continue;
                };
                found.push((mtime, hash, meta.len()));
            }
        }
        found.sort();
        let mut index = self.index.lock();
        for (_, hash, size) in found {
            index.touch(hash, size);
        }
        Ok(())
    }

    fn read(&self, key: &BlockKey, hash: u64) -> Option<Bytes> {
        let path = self.path_for(hash);
        let buf = match fs::read(&path) {
            Ok(buf) => buf,
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(path = %path.display(), error = %e, "disk cache read failed");
                }
                self.index.lock().remove(hash);
                return None;
            }
        };
        match decode(&buf, key) {
            Decoded::Data(range) => {
                let size = buf.len() as u64;
                let doomed = {
                    let mut index = self.index.lock();
                    index.touch(hash, size);
                    index.evict_to(self.capacity, Some(hash))
                };
                self.delete(doomed);
                Some(Bytes::from(buf).slice(range))
            }
            Decoded::OtherKey => None,
            Decoded::Corrupt(why) => {
                tracing::warn!(path = %path.display(), why, "corrupt disk cache file removed");
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                let _ = fs::remove_file(&path);
                self.index.lock().remove(hash);
                None
            }
        }
    }

    fn run_writer(&self) {
        loop {
            let job = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(job) = q.jobs.pop_front() {
                        if let Job::Write { data, .. } = &job {
                            q.pending_bytes -= data.len() as u64;
                        }
                        break job;
                    }
                    if q.shutdown {
                        return;
                    }
                    self.wake.wait(&mut q);
                }
            };
            match job {
                Job::Write { key, hash, data } => {
                    // A panic here must not stop the writer (flushes would wait forever).
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.write(&key, hash, &data)
                    }));
                    if !matches!(result, Ok(Ok(()))) {
                        self.counters.errors.fetch_add(1, Ordering::Relaxed);
                        if let Ok(Err(e)) = result {
                            tracing::debug!(error = %e, "disk cache write failed");
                        }
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    fn write(&self, key: &BlockKey, hash: u64, data: &[u8]) -> io::Result<()> {
        if self.index.lock().entries.contains_key(&hash) {
            return Ok(()); // already on disk (blocks of one key and version never change)
        }
        let path = self.path_for(hash);
        if let Ok(meta) = fs::metadata(&path) {
            // Written by another process (or an earlier run since our scan).
            if meta.is_file() {
                let doomed = {
                    let mut index = self.index.lock();
                    index.touch(hash, meta.len());
                    index.evict_to(self.capacity, Some(hash))
                };
                self.delete(doomed);
                return Ok(());
            }
        }
        let dir = path.parent().expect("block path has a parent");
        fs::create_dir_all(dir)?;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".tmp-{hash:016x}-{}-{}-{:08x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        ));
        let header = encode_header(key, data);
        let result = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&header)?;
            f.write_all(data)?;
            drop(f);
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let size = (header.len() + data.len()) as u64;
        let doomed = {
            let mut index = self.index.lock();
            index.touch(hash, size);
            index.evict_to(self.capacity, Some(hash))
        };
        self.delete(doomed);
        Ok(())
    }

    /// Deletes the files of evicted hashes (already out of the index); a file another process
    /// deleted first is fine.
    fn delete(&self, hashes: Vec<u64>) {
        for hash in hashes {
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            match fs::remove_file(self.path_for(hash)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "disk cache eviction failed");
                }
            }
        }
    }
}

/// Bytes a block's file takes.
fn file_size(key: &BlockKey, data_len: usize) -> u64 {
    (FIXED_HEADER + key.object.len() + key.version.len() + data_len) as u64
}

fn encode_header(key: &BlockKey, data: &[u8]) -> Vec<u8> {
    let (o, v) = (key.object.as_bytes(), key.version.as_bytes());
    let mut h = Vec::with_capacity(FIXED_HEADER + o.len() + v.len());
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&(o.len() as u32).to_le_bytes());
    h.extend_from_slice(&(v.len() as u32).to_le_bytes());
    h.extend_from_slice(&key.block.to_le_bytes());
    h.extend_from_slice(&(data.len() as u64).to_le_bytes());
    h.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
    let header_crc = crc32c::crc32c_append(crc32c::crc32c(&h), o);
    let header_crc = crc32c::crc32c_append(header_crc, v);
    h.extend_from_slice(&header_crc.to_le_bytes());
    h.extend_from_slice(o);
    h.extend_from_slice(v);
    h
}

#[derive(Debug, PartialEq, Eq)]
enum Decoded {
    /// The file holds `key`'s block, at this range of the buffer.
    Data(std::ops::Range<usize>),
    /// A valid file of another key (hash collision).
    OtherKey,
    /// Damaged: truncated, wrong magic, bad checksum.
    Corrupt(&'static str),
}

fn decode(buf: &[u8], key: &BlockKey) -> Decoded {
    if buf.len() < FIXED_HEADER {
        return Decoded::Corrupt("truncated header");
    }
    if buf[..8] != MAGIC {
        return Decoded::Corrupt("bad magic");
    }
    let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
    let (olen, vlen) = (u32_at(8) as usize, u32_at(12) as usize);
    let (block, dlen) = (u64_at(16), u64_at(24));
    let (data_crc, header_crc) = (u32_at(32), u32_at(36));
    if olen > MAX_KEY_BYTES || vlen > MAX_KEY_BYTES {
        return Decoded::Corrupt("implausible key length");
    }
    let data_start = FIXED_HEADER + olen + vlen;
    if buf.len() < data_start || (buf.len() - data_start) as u64 != dlen {
        return Decoded::Corrupt("length mismatch");
    }
    let crc = crc32c::crc32c(&buf[..36]);
    let crc = crc32c::crc32c_append(crc, &buf[FIXED_HEADER..data_start]);
    if crc != header_crc {
        return Decoded::Corrupt("header checksum mismatch");
    }
    let object = &buf[FIXED_HEADER..FIXED_HEADER + olen];
    let version = &buf[FIXED_HEADER + olen..data_start];
    if object != key.object.as_bytes() || version != key.version.as_bytes() || block != key.block {
        return Decoded::OtherKey;
    }
    if crc32c::crc32c(&buf[data_start..]) != data_crc {
        return Decoded::Corrupt("data checksum mismatch");
    }
    Decoded::Data(data_start..buf.len())
}

#[cfg(test)]
mod tests {
    use super::super::key_hash;
    use super::*;

    fn key(b: u64) -> BlockKey {
        BlockKey::new("s3://bucket/dir/object.bin", "etag-1", b)
    }

    fn data(b: u64, n: usize) -> Bytes {
        Bytes::from(
            (0..n)
                .map(|i| (i as u64 * 31 + b) as u8)
                .collect::<Vec<_>>(),
        )
    }

    fn flush(d: &DiskTier) {
        d.flush().blocking_recv().unwrap();
    }

    fn files_bytes(root: &Path) -> u64 {
        let mut total = 0;
        for sub in fs::read_dir(root.join(ROOT_NAME)).unwrap() {
            for f in fs::read_dir(sub.unwrap().path()).unwrap() {
                total += f.unwrap().metadata().unwrap().len();
            }
        }
        total
    }

    #[test]
    fn format_round_trip_and_checks() {
        let k = key(3);
        let d = data(3, 1000);
        let mut file = encode_header(&k, &d);
        file.extend_from_slice(&d);
        let Decoded::Data(r) = decode(&file, &k) else {
            panic!("valid file must decode")
        };
        assert_eq!(&file[r], &d[..]);
        assert_eq!(decode(&file, &key(4)), Decoded::OtherKey);
        assert_eq!(
            decode(
                &file,
                &BlockKey::new("s3://bucket/dir/object.bin", "etag-2", 3)
            ),
            Decoded::OtherKey
        );
        let mut bad = file.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(matches!(decode(&bad, &k), Decoded::Corrupt(_)));
        let mut bad = file.clone();
        bad[20] ^= 1; // block index in the header
        assert!(matches!(decode(&bad, &k), Decoded::Corrupt(_)));
        assert!(matches!(
            decode(&file[..file.len() - 1], &k),
            Decoded::Corrupt(_)
        ));
        assert!(matches!(decode(&file[..10], &k), Decoded::Corrupt(_)));
    }

    #[test]
    fn restart_finds_blocks_and_corruption_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        {
            let d = DiskTier::open(dir.path(), 1 << 20).unwrap();
            for b in 0..10 {
                assert!(d.enqueue(key(b), key_hash(&key(b)), data(b, 5000)));
            }
            flush(&d);
            assert_eq!(d.entries(), 10);
        }
        let d = DiskTier::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(d.entries(), 10);
        assert_eq!(d.bytes(), files_bytes(dir.path()));
        for b in 0..10 {
            assert_eq!(d.read(&key(b), key_hash(&key(b))).unwrap(), data(b, 5000));
        }
        // Flip one data byte of block 4's file.
        let path = d.path_for(key_hash(&key(4)));
        let mut raw = fs::read(&path).unwrap();
        let n = raw.len();
        raw[n - 10] ^= 0x40;
        fs::write(&path, raw).unwrap();
        assert_eq!(d.read(&key(4), key_hash(&key(4))), None);
        assert!(!path.exists(), "corrupt file is removed");
        assert_eq!(d.counters().corrupt.load(Ordering::Relaxed), 1);
        assert_eq!(d.entries(), 9);
        // A file deleted behind our back is a miss.
        fs::remove_file(d.path_for(key_hash(&key(5)))).unwrap();
        assert_eq!(d.read(&key(5), key_hash(&key(5))), None);
        assert_eq!(d.entries(), 8);
        // Another key landing on the same file name is a miss, not its data.
        fs::copy(d.path_for(key_hash(&key(6))), d.path_for(key_hash(&key(7)))).unwrap();
        assert_eq!(d.read(&key(7), key_hash(&key(7))), None);
    }

    #[test]
    fn budget_is_respected_and_lru_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let per_file = file_size(&key(0), 10_000);
        let d = DiskTier::open(dir.path(), per_file * 5).unwrap();
        for b in 0..5 {
            d.enqueue(key(b), key_hash(&key(b)), data(b, 10_000));
        }
        flush(&d);
        // Touch block 0 so block 1 is the oldest.
        assert!(d.read(&key(0), key_hash(&key(0))).is_some());
        for b in 5..8 {
            d.enqueue(key(b), key_hash(&key(b)), data(b, 10_000));
        }
        flush(&d);
        assert!(d.bytes() <= per_file * 5);
        assert_eq!(files_bytes(dir.path()), d.bytes());
        assert!(d.read(&key(0), key_hash(&key(0))).is_some());
        assert!(d.read(&key(1), key_hash(&key(1))).is_none());
        assert!(d.read(&key(7), key_hash(&key(7))).is_some());
        // A restart with a smaller budget trims to it.
        drop(d);
        let d = DiskTier::open(dir.path(), per_file * 2).unwrap();
        assert!(d.bytes() <= per_file * 2);
        assert_eq!(files_bytes(dir.path()), d.bytes());
        // A block larger than the whole tier is not written.
        assert!(!d.enqueue(key(100), key_hash(&key(100)), data(100, 100_000)));
    }

    #[test]
    fn stale_temp_files_are_cleaned_and_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join(ROOT_NAME).join("ab");
        fs::create_dir_all(&sub).unwrap();
        let old = sub.join(".tmp-old");
        let new = sub.join(".tmp-new");
        fs::write(&old, b"x").unwrap();
        fs::write(&new, b"x").unwrap();
        let f = fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(7200))
            .unwrap();
        drop(f);
        let d = DiskTier::open(dir.path(), 1 << 20).unwrap();
        assert!(!old.exists());
        assert!(new.exists());
        assert_eq!(d.entries(), 0);
    }
}
