//! The FUSE operations.
//!
//! fuser calls these on its one session thread. Anything that may touch the network runs as
//! a task on the tokio runtime and replies from there, so the session thread never waits: a
//! slow GET for one reader does not hold up another reader's cache hit.
//!
//! Reads of one open file go, in the order the kernel sent them, to that handle's task,
//! which keeps an [`ObjectReader`] for sequential reads (read-ahead that grows while reads
//! stay contiguous). A read that is not part of a sequential run is served on its own, by a
//! ranged read of just the bytes asked for (or the cached block holding them), so random
//! small reads do not pull multi-megabyte parts, and they run concurrently.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use stoker_store::{escape_key, is_file_name, Error, Listing, ObjectInfo, ObjectReader, Store};
use tokio::sync::mpsc;

use crate::inode::{Inodes, Kind, Node, Owner, ROOT};

/// Block size reported in `st_blksize`: what `cat` and Python size their buffers from.
const BLKSIZE: u32 = 1 << 20;

/// Files of a directory fetched ahead of a reader that opens them in listing order.
const AHEAD_FILES: usize = 64;
/// ... and at most this many bytes of them.
const AHEAD_BYTES: u64 = 64 << 20;
/// Opens this close (in listing position) to the furthest one so far still count as "in
/// order": concurrent readers working through a directory interleave.
const SCAN_SLACK: usize = 64;

/// How the files of one directory are being opened.
#[derive(Debug, Default)]
struct DirScan {
    /// Furthest listing position opened in the current run.
    last: usize,
    /// Opens in a row that stayed in order.
    run: u32,
    /// Positions before this have been fetched ahead already.
    ahead_to: usize,
}

/// One read request waiting for its handle's task.
struct ReadReq {
    offset: u64,
    size: u32,
    reply: ReplyData,
}

/// What a name in a directory turned out to be.
enum Resolved {
    Dir,
    File(ObjectInfo),
}

/// One entry of an open directory.
#[derive(Debug)]
struct DirEnt {
    ino: u64,
    kind: FileType,
    name: String,
}

/// State shared by the session thread and the tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Store,
    pub inodes: Inodes,
    pub ttl: Duration,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
    /// One listing of a directory at a time: concurrent lookups in a directory whose
    /// listing expired wait for one LIST instead of each sending their own.
    dir_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per directory inode: the order its files are opened in.
    scans: Mutex<HashMap<u64, DirScan>>,
    /// Per directory prefix: lookups answered without a listing since the last one.
    probes: Mutex<HashMap<String, u32>>,
    /// Files of at least this many bytes are opened with direct I/O (`None`: none are).
    direct_io_min: Option<u64>,
    /// A local source: entries show their own modes and owners.
    local: bool,
    /// Whether the kernel lets direct-I/O files be memory-mapped (`FUSE_DIRECT_IO_ALLOW_MMAP`,
    /// Linux 6.6+), learnt at `init`: without it no file is opened with direct I/O, since
    /// `mmap` of such a file would fail.
    direct_io: AtomicBool,
}

/// Lookups without a listing in one directory before it is listed in the background.
const PROBES_BEFORE_LISTING: u32 = 8;

impl Shared {
    /// Records `node`'s local modes and owner (nothing for object stores).
    fn refresh_owner(&self, node: &Node) {
        if let Some(o) = owner_of(&self.store, &node.key) {
            *node.owner.lock() = Some(o);
        }
    }

    /// Whether a file of `size` bytes is opened with direct I/O: its reads go from the
    /// mount's buffers straight into the reader's, not through the kernel's page cache.
    fn direct_io_for(&self, size: u64) -> bool {
        self.direct_io.load(Ordering::Relaxed) && self.direct_io_min.is_some_and(|m| size >= m)
    }

    /// The directory `prefix`'s listing (the store caches it for the metadata TTL).
    async fn listing(&self, prefix: &str) -> Result<Arc<Listing>, Error> {
        let lock = Arc::clone(self.dir_locks.lock().entry(prefix.to_string()).or_default());
        let _one = lock.lock().await;
        self.store.list_dir(prefix).await
    }

    /// What the key `prefix + name` is: a directory (some key lies under
    /// `prefix + name + "/"`; it shadows an object of the same name, as in a listing), a
    /// file, or nothing. From the directory's listing when the store holds a fresh one; otherwise
    /// one HEAD and one single-page LIST sent together, so a lookup costs one round trip
    /// however many keys the directory has (a directory of 100,000 keys is not listed to
    /// find one name in it).
    async fn resolve(&self, prefix: &str, name: &str) -> Result<Option<Resolved>, Error> {
        let dir_key = format!("{prefix}{name}/");
        let key = format!("{prefix}{name}");
        if let Some(listing) = self.store.cached_dir(prefix) {
            if listing.prefixes.binary_search(&dir_key).is_ok() {
                return Ok(Some(Resolved::Dir));
            }
            return Ok(listing
                .objects
                .binary_search_by(|o| o.key.as_str().cmp(key.as_str()))
                .ok()
                .map(|i| Resolved::File(listing.objects[i].clone())));
        }
        self.probed(prefix);
        let (dir, head) = tokio::join!(self.store.dir_exists(&dir_key), self.store.head(&key));
        if dir? {
            return Ok(Some(Resolved::Dir));
        }
        match head {
            Ok(info) => Ok(Some(Resolved::File(info))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Counts a lookup that had no listing to go by; after [`PROBES_BEFORE_LISTING`] of them
    /// in one directory, lists it in the background, so a walk over many of its names
    /// (`stat` of every file after the listing expired) soon costs nothing per name.
    fn probed(&self, prefix: &str) {
        let list = {
            let mut probes = self.probes.lock();
            let n = probes.entry(prefix.to_string()).or_default();
            *n += 1;
            *n >= PROBES_BEFORE_LISTING && probes.remove(prefix).is_some()
        };
        if list {
            let lock = Arc::clone(self.dir_locks.lock().entry(prefix.to_string()).or_default());
            let (store, prefix) = (self.store.clone(), prefix.to_string());
            tokio::spawn(async move {
                let _one = lock.lock().await;
                if let Err(e) = store.list_dir(&prefix).await {
                    tracing::debug!(prefix = %escape_key(&prefix), error = %e, "background listing failed");
                }
            });
        }
    }

    /// The child `name` of `parent`: a directory shadows an object of the same name.
    async fn lookup(&self, parent: &Node, name: &str) -> Result<Arc<Node>, Errno> {
        if !is_file_name(name) {
            return Err(Errno::ENOENT);
        }
        let prefix = parent.dir_prefix();
        let node = match self
            .resolve(prefix, name)
            .await
            .map_err(|e| to_errno(&e, &format!("{prefix}{name}")))?
        {
            Some(Resolved::Dir) => self.inodes.child(parent, name, Kind::Dir, None),
            Some(Resolved::File(info)) => self.inodes.child(parent, name, Kind::File, Some(&info)),
            None => return Err(Errno::ENOENT),
        };
        self.refresh_owner(&node);
        Ok(node)
    }

    /// A file's metadata, asked for again when older than the TTL.
    async fn fresh_info(&self, node: &Node) -> Result<ObjectInfo, Errno> {
        let cached = node.file.lock().clone();
        if let Some(st) = cached {
            if st.checked.elapsed() < self.ttl {
                return Ok(st.info);
            }
        }
        let (prefix, name) = node.key.split_at(node.key.rfind('/').map_or(0, |i| i + 1));
        match self
            .resolve(prefix, name)
            .await
            .map_err(|e| to_errno(&e, &node.key))?
        {
            Some(Resolved::File(info)) => {
                node.set_info(&info);
                self.refresh_owner(node);
                Ok(info)
            }
            // Gone, or a directory now (which gets a new inode on the next lookup).
            _ => Err(Errno::ENOENT),
        }
    }

    /// Notes that `node` is being opened. When the files of its directory are being opened
    /// in listing order (`cat dir/*`, a sequential epoch, several readers splitting a
    /// directory), the next small files are brought into the cache ahead of their opens, so
    /// a reader stops paying one request latency per file. Random order fetches nothing.
    async fn opened_in_order(&self, node: &Node) {
        if !self.store.caches() {
            return;
        }
        let Some(parent) = self.inodes.get(node.parent) else {
            return;
        };
        let Ok(listing) = self.listing(parent.dir_prefix()).await else {
            return;
        };
        let objects = &listing.objects;
        let Ok(idx) = objects.binary_search_by(|o| o.key.as_str().cmp(node.key.as_str())) else {
            return;
        };
        let range = {
            let mut scans = self.scans.lock();
            let s = scans.entry(parent.ino).or_default();
            if idx.abs_diff(s.last) <= SCAN_SLACK {
                if idx != s.last {
                    s.run += 1;
                }
                s.last = s.last.max(idx);
            } else {
                *s = DirScan {
                    last: idx,
                    ..DirScan::default()
                };
            }
            if s.run < 2 {
                return;
            }
            let from = s.ahead_to.max(idx + 1);
            let to = (idx + 1 + AHEAD_FILES).min(objects.len());
            if from >= to {
                return;
            }
            s.ahead_to = to;
            from..to
        };
        tracing::debug!(dir = %escape_key(&parent.key), ?range, "fetching ahead");
        let part = self.store.options().part_size;
        let mut bytes = 0u64;
        for o in &objects[range] {
            // Large files get their own read-ahead once opened.
            if o.size > part {
                continue;
            }
            bytes += o.size;
            if bytes > AHEAD_BYTES {
                break;
            }
            let (store, info) = (self.store.clone(), o.clone());
            tokio::spawn(async move {
                if let Err(e) = store.prefetch(&info, 0).await {
                    tracing::debug!(key = %escape_key(&info.key), error = %e, "prefetch failed");
                }
            });
        }
    }

    /// A node's attributes. Object stores have no owners or modes: every file shows as
    /// `0444` and every directory `0555`, owned by the user who mounted. A local source
    /// shows each entry's own modes and owner.
    fn attr(&self, node: &Node) -> FileAttr {
        let owner = *node.owner.lock();
        let (kind, size, mtime, perm, nlink) = match node.kind {
            Kind::Dir => (FileType::Directory, 0, self.mounted_at, 0o555, 2),
            Kind::File => {
                let st = node.file.lock();
                let (size, mtime) = st.as_ref().map_or((0, self.mounted_at), |s| {
                    (s.info.size, time_of(s.info.last_modified_ms))
                });
                (FileType::RegularFile, size, mtime, 0o444, 1)
            }
        };
        let (perm, uid, gid) = match owner {
            Some(o) => (o.perm, o.uid, o.gid),
            None => (perm, self.uid, self.gid),
        };
        FileAttr {
            ino: INodeNo(node.ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    /// The entries of directory `node`, in name order, each with its inode.
    async fn entries(&self, node: &Node) -> Result<Vec<DirEnt>, Errno> {
        let listing = self
            .listing(node.dir_prefix())
            .await
            .map_err(|e| to_errno(&e, &node.key))?;
        let prefix = node.dir_prefix();
        let mut out: Vec<DirEnt> =
            Vec::with_capacity(listing.prefixes.len() + listing.objects.len());
        for p in &listing.prefixes {
            let Some(name) = p
                .strip_prefix(prefix)
                .and_then(|n| n.strip_suffix('/'))
                .filter(|n| is_file_name(n))
            else {
                continue;
            };
            let child = self.inodes.child(node, name, Kind::Dir, None);
            out.push(DirEnt {
                ino: child.ino,
                kind: FileType::Directory,
                name: name.to_string(),
            });
        }
        let dirs = out.len();
        for o in &listing.objects {
            let Some(name) = o.key.strip_prefix(prefix).filter(|n| is_file_name(n)) else {
                continue;
            };
            // A "directory" of the same name wins (it was listed first).
            if out[..dirs]
                .binary_search_by(|d| d.name.as_str().cmp(name))
                .is_ok()
            {
                continue;
            }
            let child = self.inodes.child(node, name, Kind::File, Some(o));
            out.push(DirEnt {
                ino: child.ino,
                kind: FileType::RegularFile,
                name: name.to_string(),
            });
        }
        out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        if self.local {
            // A local source: each entry's own modes and owner, one `stat` each, off the
            // runtime's threads.
            let nodes: Vec<Arc<Node>> = out.iter().filter_map(|e| self.inodes.get(e.ino)).collect();
            let store = self.store.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for n in nodes {
                    if let Some(o) = owner_of(&store, &n.key) {
                        *n.owner.lock() = Some(o);
                    }
                }
            })
            .await;
        }
        Ok(out)
    }
}

/// For a local source, `key`'s permission bits and owner as the source has them (what
/// `default_permissions` then lets the kernel check for every user); `None` for object
/// stores. Blocking (one `stat`, following symbolic links only inside the source, as reads
/// do). An entry that cannot be looked at shows as root's, mode 0.
fn owner_of(store: &Store, key: &str) -> Option<Owner> {
    use std::os::unix::fs::MetadataExt;
    Some(match store.local_metadata(key)? {
        Ok(m) => Owner {
            perm: (m.mode() & 0o7777) as u16,
            uid: m.uid(),
            gid: m.gid(),
        },
        Err(e) => {
            tracing::debug!(key = %escape_key(key), error = %e, "cannot stat a local entry");
            Owner::NOBODY
        }
    })
}

fn time_of(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        UNIX_EPOCH
    }
}

/// The errno for a store error, logged with the object it concerns.
fn to_errno(e: &Error, what: &str) -> Errno {
    let errno = match e {
        Error::NotFound { .. } => Errno::ENOENT,
        Error::Changed { .. } => Errno::ESTALE,
        Error::PermissionDenied { .. } => Errno::EACCES,
        Error::RangeOutOfBounds { .. } => Errno::EINVAL,
        _ => Errno::EIO,
    };
    if errno != Errno::ENOENT {
        tracing::warn!(key = %escape_key(what), error = %e, "request failed");
    }
    errno
}

/// The mount's [`Filesystem`].
#[derive(Debug)]
pub(crate) struct StokerFs {
    shared: Arc<Shared>,
    rt: tokio::runtime::Handle,
    files: Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<ReadReq>>>>,
    dirs: Arc<Mutex<HashMap<u64, Arc<Vec<DirEnt>>>>>,
    next_fh: AtomicU64,
}

impl std::fmt::Debug for ReadReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadReq")
            .field("offset", &self.offset)
            .field("size", &self.size)
            .finish()
    }
}

impl StokerFs {
    pub(crate) fn new(
        store: Store,
        rt: tokio::runtime::Handle,
        root_prefix: String,
        ttl: Duration,
        direct_io_min: Option<u64>,
    ) -> (Self, Arc<Shared>) {
        // SAFETY: geteuid and getegid only read the process's credentials.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let store_is_local = store.object_url("").starts_with("file://");
        let shared = Arc::new(Shared {
            store,
            inodes: Inodes::new(root_prefix),
            ttl,
            uid,
            gid,
            mounted_at: SystemTime::now(),
            dir_locks: Mutex::default(),
            probes: Mutex::default(),
            scans: Mutex::default(),
            direct_io_min,
            direct_io: AtomicBool::new(false),
            local: store_is_local,
        });
        if let Some(root) = shared.inodes.get(ROOT) {
            shared.refresh_owner(&root);
        }
        let fs = StokerFs {
            shared: Arc::clone(&shared),
            rt,
            files: Arc::default(),
            dirs: Arc::default(),
            next_fh: AtomicU64::new(1),
        };
        (fs, shared)
    }

    fn node(&self, ino: INodeNo) -> Option<Arc<Node>> {
        self.shared.inodes.get(ino.0)
    }

    fn fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }
}

/// A file read at random whose size is at most this fraction of the cache is fetched whole,
/// in the background, in parallel parts: random readers of a file that fits (an LMDB or
/// HDF5 file, a memory-mapped array) soon read from memory instead of paying a request per
/// read, and every later epoch does.
const WARM_FRACTION: u64 = 2;

/// Fetches every part of `info` into the cache, `concurrency` at a time.
async fn warm_whole(store: Store, info: ObjectInfo, concurrency: usize) {
    use futures::StreamExt;
    let parts = info.size.div_ceil(store.options().part_size.max(1));
    futures::stream::iter(0..parts)
        .map(|b| {
            let (store, info) = (&store, &info);
            async move { store.prefetch(info, b).await }
        })
        .buffer_unordered(concurrency.max(1))
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "warming a file failed");
            }
        })
        .await;
}

/// Serves the reads of one open file, in the order they were sent.
async fn serve_reads(store: Store, info: ObjectInfo, mut rx: mpsc::UnboundedReceiver<ReadReq>) {
    let mut reader: ObjectReader = store.reader_of(info.clone());
    let mut last_end = 0u64;
    let mut run = 0u32; // contiguous reads in a row
    let mut warming: Option<tokio::task::JoinHandle<()>> = None;
    let cache = store.cache().stats();
    let warm_limit = (cache.memory_capacity + cache.disk_capacity) / WARM_FRACTION;
    while let Some(req) = rx.recv().await {
        if req.offset >= info.size || req.size == 0 {
            req.reply.data(&[]);
            continue;
        }
        let end = (req.offset + u64::from(req.size)).min(info.size);
        run = if req.offset == last_end { run + 1 } else { 0 };
        last_end = end;
        let pos = reader.position();
        let in_window = req.offset >= pos && req.offset < pos + reader.window().max(1);
        if in_window || run >= 2 {
            // Sequential: the reader's read-ahead serves it (and keeps going).
            match reader
                .read_at(req.offset, (end - req.offset) as usize)
                .await
            {
                Ok(b) => req.reply.data(&b),
                Err(e) => req.reply.error(to_errno(&e, &info.key)),
            }
        } else {
            if warming.is_none()
                && store.caches()
                && info.size > store.options().part_size
                && info.size <= warm_limit
            {
                let concurrency = store.options().max_concurrency;
                warming = Some(tokio::spawn(warm_whole(
                    store.clone(),
                    info.clone(),
                    concurrency,
                )));
            }
            // On its own: just these bytes (or the cached part that holds them),
            // concurrently with whatever comes next.
            let (store, info) = (store.clone(), info.clone());
            tokio::spawn(async move {
                match store.get_range_of(&info, req.offset..end).await {
                    Ok(b) => req.reply.data(&b),
                    Err(e) => req.reply.error(to_errno(&e, &info.key)),
                }
            });
        }
    }
    // Closed: a warm-up still running stops (what it fetched stays cached).
    if let Some(w) = warming {
        w.abort();
    }
}

impl Filesystem for StokerFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Let the kernel keep more reads in flight (read-ahead of many readers) than its
        // default of 12.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        if self.shared.direct_io_min.is_some() {
            match config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
                Ok(()) => self.shared.direct_io.store(true, Ordering::Relaxed),
                Err(_) => tracing::info!(
                    "this kernel cannot memory-map direct-I/O files (FUSE_DIRECT_IO_ALLOW_MMAP, \
                     Linux 6.6+): every file goes through the page cache"
                ),
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(parent) = self.node(parent) else {
            return reply.error(Errno::ENOENT);
        };
        if parent.kind != Kind::Dir {
            return reply.error(Errno::ENOTDIR);
        }
        let Some(name) = name.to_str().map(str::to_string) else {
            return reply.error(Errno::ENOENT);
        };
        let shared = Arc::clone(&self.shared);
        self.rt.spawn(async move {
            match shared.lookup(&parent, &name).await {
                Ok(node) => {
                    shared.inodes.looked_up(&node);
                    reply.entry(&shared.ttl, &shared.attr(&node), Generation(0))
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if self.shared.inodes.forget(ino.0, nlookup) {
            self.shared.scans.lock().remove(&ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(node) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let stale = node
            .file
            .lock()
            .as_ref()
            .is_some_and(|s| s.checked.elapsed() >= self.shared.ttl);
        if !stale {
            return reply.attr(&self.shared.ttl, &self.shared.attr(&node));
        }
        let shared = Arc::clone(&self.shared);
        self.rt.spawn(async move {
            match shared.fresh_info(&node).await {
                Ok(_) => reply.attr(&shared.ttl, &shared.attr(&node)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        let Some(node) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if node.kind == Kind::Dir {
            return reply.error(Errno::EISDIR);
        }
        let fh = self.fh();
        let files = Arc::clone(&self.files);
        let shared = Arc::clone(&self.shared);
        self.rt.spawn(async move {
            let info = match shared.fresh_info(&node).await {
                Ok(i) => i,
                Err(e) => return reply.error(e),
            };
            // The same version as the last open: what the kernel cached is still right.
            let version = info.version_tag();
            let keep = {
                let mut st = node.file.lock();
                let st = st.as_mut().expect("fresh_info leaves state");
                let keep = st.opened_version.as_deref() == Some(version.as_str());
                st.opened_version = Some(version);
                keep
            };
            let mut flags = if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            };
            if shared.direct_io_for(info.size) {
                flags |= FopenFlags::FOPEN_DIRECT_IO;
            }
            // Registered only once the open succeeds: a failed open leaves nothing behind.
            let (tx, rx) = mpsc::unbounded_channel();
            files.lock().insert(fh, tx);
            tokio::spawn(serve_reads(shared.store.clone(), info, rx));
            reply.opened(FileHandle(fh), flags);
            shared.opened_in_order(&node).await;
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let tx = self.files.lock().get(&fh.0).cloned();
        let Some(tx) = tx else {
            return reply.error(Errno::EBADF);
        };
        if let Err(mpsc::error::SendError(req)) = tx.send(ReadReq {
            offset,
            size,
            reply,
        }) {
            req.reply.error(Errno::EIO);
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is ever written, so there is nothing to flush on close.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Dropping the sender ends the handle's task (after the reads already queued), which
        // drops its reader and cancels its read-ahead.
        self.files.lock().remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(node) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if node.kind != Kind::Dir {
            return reply.error(Errno::ENOTDIR);
        }
        let fh = self.fh();
        let shared = Arc::clone(&self.shared);
        let this_dirs = Arc::clone(&self.dirs);
        self.rt.spawn(async move {
            match shared.entries(&node).await {
                Ok(entries) => {
                    this_dirs.lock().insert(fh, Arc::new(entries));
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(entries) = self.dirs.lock().get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let parent = self.node(ino).map_or(ROOT, |n| n.parent);
        // Offsets: 0 is ".", 1 is "..", k + 2 is entries[k]; each entry carries the offset
        // of the one after it.
        let mut i = offset;
        loop {
            let full = match i {
                0 => reply.add(ino, 1, FileType::Directory, "."),
                1 => reply.add(INodeNo(parent), 2, FileType::Directory, ".."),
                k => match entries.get((k - 2) as usize) {
                    Some(e) => reply.add(INodeNo(e.ino), k + 1, e.kind, &e.name),
                    None => break,
                },
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        // Entries the kernel did not look up are dropped (another handle still listing
        // the same directory then shows their old numbers; a later lookup gives new ones).
        if let Some(entries) = self.dirs.lock().remove(&fh.0) {
            for e in entries.iter() {
                self.shared.inodes.prune(e.ino);
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // A bucket has no size; report a large, full, read-only file system.
        let blocks = 1u64 << 40;
        let files = self.shared.inodes.len() as u64;
        reply.statfs(blocks, 0, 0, files, 0, 4096, 1024, 4096);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    // Everything that would change the bucket: read-only. (The mount is also made with
    // `ro`, so the kernel answers most of these itself.)

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
}
