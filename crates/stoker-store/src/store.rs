//! [`Store`]: one opened bucket (or directory), with its cache, budget, metadata cache and
//! metrics. Cheap to clone; every clone shares all of them.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use crate::pool::BufferPool;
use futures::stream::{self, BoxStream, StreamExt};
use futures::FutureExt;
use object_store::path::Path;
use object_store::{GetOptions, ObjectMeta, ObjectStore, ObjectStoreExt};
use serde::Serialize;
use stoker_core::MemoryBudget;

use crate::body::Body;
use crate::cache::{BlockCache, BlockKey, CacheOptions};
use crate::error::{Error, Result};
use crate::list::MetaCache;
use crate::location::{Scheme, StoreUrl};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::options::StoreOptions;
use crate::ordered::InOrder;

/// Metadata of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectInfo {
    /// The key, relative to the store's bucket.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag as the server sent it, if any.
    pub etag: Option<String>,
    /// Version id, if the backend versions objects.
    pub version: Option<String>,
    /// Last modification, milliseconds since the Unix epoch.
    pub last_modified_ms: i64,
}

/// An ETag in HTTP's form, quoted (`"abc"`, or `W/"abc"` when weak): S3's listings and
/// GETs give it so, but a WebDAV server's `getetag` may be bare (`abc`) while its GET's
/// `ETag` header is quoted, and the two must compare equal (and `If-Match` wants the
/// quoted form).
pub(crate) fn entity_tag(tag: &str) -> String {
    let t = tag.trim();
    if t.starts_with('"') || t.starts_with("W/\"") {
        t.to_string()
    } else {
        format!("\"{t}\"")
    }
}

impl ObjectInfo {
    pub(crate) fn from_meta(meta: &ObjectMeta) -> Self {
        ObjectInfo {
            key: meta.location.to_string(),
            size: meta.size,
            etag: meta.e_tag.as_deref().map(entity_tag),
            version: meta.version.clone(),
            last_modified_ms: meta.last_modified.timestamp_millis(),
        }
    }

    /// The identity of this version of the object, used in cache keys: the ETag, else the
    /// version id, else size and modification time.
    pub fn version_tag(&self) -> String {
        if let Some(e) = &self.etag {
            return e.clone();
        }
        if let Some(v) = &self.version {
            return format!("v:{v}");
        }
        format!("{}@{}", self.size, self.last_modified_ms)
    }
}

/// How many bytes of each part behind the oldest an uncached stream reads ahead before
/// leaving the rest in the socket (see [`InOrder`]). Measured on the 1 GiB benchmark object
/// (16 parts of 8 MiB): 0.5-2 MiB gave the same throughput as reading whole parts with a
/// fifth of the page faults; 8 MiB (whole parts) cost 10-20% more CPU.
const PART_READ_AHEAD: u64 = 2 << 20;

/// A handle to one bucket, container or directory. See the crate docs.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) url: StoreUrl,
    pub(crate) backend: Arc<dyn ObjectStore>,
    pub(crate) opts: StoreOptions,
    pub(crate) budget: MemoryBudget,
    pub(crate) cache: BlockCache,
    pub(crate) meta: MetaCache,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) pool: Arc<BufferPool>,
    /// False when the cache can keep nothing (no memory, no disk): streams then skip it.
    pub(crate) cache_enabled: bool,
    /// For local files, the backend itself: the store lists directories through it.
    pub(crate) local: Option<Arc<crate::local::LocalFiles>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.inner.url.object_url(""))
            .field("part_size", &self.inner.opts.part_size)
            .field("budget", &self.inner.budget)
            .finish()
    }
}

/// Converts a key to an `object_store` path, keeping keys that are already canonical as they
/// are and encoding the rest.
pub(crate) fn to_path(key: &str) -> Path {
    Path::parse(key).unwrap_or_else(|_| Path::from(key))
}

impl Store {
    /// Opens the bucket (or directory) that `url` points into, with a memory budget of its
    /// own. The key part of the URL is available as [`Store::url_key`].
    pub fn open(url: &str, options: StoreOptions) -> Result<Store> {
        let budget = match options.memory_limit {
            Some(limit) => MemoryBudget::new(limit),
            None => MemoryBudget::from_system(),
        };
        Self::open_with_budget(url, options, budget)
    }

    /// Opens `url` drawing on an existing memory budget (shared with other stores or with a
    /// pipeline's queues).
    pub fn open_with_budget(
        url: &str,
        options: StoreOptions,
        budget: MemoryBudget,
    ) -> Result<Store> {
        let parsed = StoreUrl::parse(url)?;
        let metrics = Arc::new(Metrics::default());
        let local = (parsed.scheme == Scheme::File)
            .then(|| crate::local::open(&parsed.key, options.follow_symlinks));
        let backend: Arc<dyn ObjectStore> = match &local {
            Some(l) => l.clone(),
            None => crate::backend::build(&parsed, url, &options, &metrics)?,
        };
        // Local files sit in the kernel's page cache already: a copy in the block cache would
        // cost memory and a copy per byte for nothing (an ImageNet-style pipeline over 2,000
        // local JPEGs: 464 MiB peak RSS with it, 195 MiB without, and faster).
        let default_cache = match parsed.scheme {
            Scheme::File => 0,
            _ => budget.limit() / 2,
        };
        let cache_memory = options.cache_memory.unwrap_or(default_cache);
        let mut cache_opts = CacheOptions::default().with_memory_bytes(cache_memory);
        if let Some(dir) = &options.cache_dir {
            cache_opts = cache_opts.with_disk(dir.clone(), options.cache_disk_bytes);
        }
        let cache = BlockCache::new(cache_opts, budget.clone()).map_err(|e| Error::Io {
            path: options
                .cache_dir
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            source: Arc::new(e),
        })?;
        let meta = MetaCache::new(options.metadata_ttl);
        let cache_enabled = cache_memory > 0 || options.cache_dir.is_some();
        let pool = BufferPool::new(
            options.part_size as usize,
            options.max_concurrency + 4,
            budget.clone(),
        );
        Ok(Store {
            inner: Arc::new(Inner {
                url: parsed,
                backend,
                opts: options,
                budget,
                cache,
                meta,
                metrics,
                pool,
                cache_enabled,
                local,
            }),
        })
    }

    /// The key or prefix part of the URL this store was opened with.
    pub fn url_key(&self) -> &str {
        &self.inner.url.key
    }

    /// The full URL of `key`, as used in messages and cache keys.
    pub fn object_url(&self, key: &str) -> String {
        self.inner.url.object_url(key)
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }

    /// Whether `other` is a handle to this very store (its cache, budget and connections),
    /// not just one opened alike.
    pub fn same_as(&self, other: &Store) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The shared memory budget.
    pub fn budget(&self) -> &MemoryBudget {
        &self.inner.budget
    }

    /// The shared block cache.
    pub fn cache(&self) -> &BlockCache {
        &self.inner.cache
    }

    /// The underlying `object_store` backend (for writes in tests and tools; reads should go
    /// through the `Store` so they are cached, retried and counted).
    pub fn backend(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.backend
    }

    /// For a store over local files, the metadata of the file or directory `key` names
    /// (following symbolic links only inside the store's root, as reads do); `None` for
    /// other stores. The mount shows local files with their own modes and owners.
    pub fn local_metadata(&self, key: &str) -> Option<std::io::Result<std::fs::Metadata>> {
        self.inner.local.as_ref().map(|l| l.metadata(key))
    }

    /// A snapshot of the request, cache and memory metrics.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner
            .metrics
            .snapshot(self.inner.cache.stats(), &self.inner.budget)
    }

    /// Metadata of `key`, from the metadata cache while it is fresh, else by a HEAD request.
    pub async fn head(&self, key: &str) -> Result<ObjectInfo> {
        if let Some(info) = self.inner.meta.get(key) {
            return Ok(info);
        }
        self.head_uncached(key).await
    }

    /// Metadata of `key` by a HEAD request, refreshing the metadata cache.
    pub async fn head_uncached(&self, key: &str) -> Result<ObjectInfo> {
        let m = &self.inner.metrics;
        m.head_requests.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let meta = self
            .inner
            .backend
            .head(&to_path(key))
            .await
            .map_err(|e| Error::from_backend("head", &self.object_url(key), e))?;
        m.op_latency.record(start.elapsed());
        if stoker_core::trace::enabled() {
            let name = format!("HEAD {}", self.object_url(key));
            let track = "store".into();
            stoker_core::trace::record("store", name.into(), track, start, Instant::now());
        }
        let info = ObjectInfo {
            key: key.to_string(),
            ..ObjectInfo::from_meta(&meta)
        };
        self.remember(&info);
        Ok(info)
    }

    /// Records fresh metadata, dropping cached blocks of any other version of the object.
    pub(crate) fn remember(&self, info: &ObjectInfo) {
        let previous = self.inner.meta.insert(info.clone());
        if let Some(prev) = previous {
            if prev.version_tag() != info.version_tag() {
                self.inner
                    .cache
                    .invalidate_other_versions(&self.object_url(&info.key), &info.version_tag());
            }
        }
    }

    /// The whole object. One GET for objects up to the part size (no HEAD first); larger
    /// objects are read as concurrent ranged GETs of one part each. Served from the block cache
    /// when the object's current version is cached.
    pub async fn get(&self, key: &str) -> Result<Bytes> {
        let out = match self.inner.meta.get_any(key) {
            Some((info, true)) => self.get_known(&info).await,
            Some((info, false)) => self.get_revalidated(&info).await,
            None => self.get_unknown(key).await,
        }?;
        self.inner
            .metrics
            .objects_fetched
            .fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    async fn get_known(&self, info: &ObjectInfo) -> Result<Bytes> {
        if info.size <= self.inner.opts.part_size {
            return self.block(info, 0).await;
        }
        self.collect_range(info, 0..info.size).await
    }

    /// A read after the metadata TTL of an object whose first block is cached: one
    /// conditional GET (`If-None-Match`) answers both "is the cache still right?" (304: serve
    /// it) and, when the object changed, "what is it now?" (200 with the new bytes).
    async fn get_revalidated(&self, stale: &ObjectInfo) -> Result<Bytes> {
        let (Some(etag), true) = (&stale.etag, self.inner.opts.part_size > 0) else {
            return self.get_unknown(&stale.key).await;
        };
        let block0 = self.block_key(&stale.key, &stale.version_tag(), 0);
        if self.inner.cache.get_memory(&block0).is_none() {
            return self.get_unknown(&stale.key).await;
        }
        let m = &self.inner.metrics;
        m.head_requests.fetch_add(1, Ordering::Relaxed);
        let opts = GetOptions {
            if_none_match: Some(etag.clone()),
            head: true,
            ..Default::default()
        };
        match self
            .inner
            .backend
            .get_opts(&to_path(&stale.key), opts)
            .await
        {
            Err(object_store::Error::NotModified { .. }) => {
                self.inner.meta.insert(stale.clone());
                self.get_known(stale).await
            }
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound {
                url: self.object_url(&stale.key),
            }),
            // Changed, or a server that ignores If-None-Match: start over.
            _ => self.get_unknown(&stale.key).await,
        }
    }

    /// First read of an object whose size and version are unknown: a ranged GET of the first
    /// part tells both, so small objects cost exactly one request.
    async fn get_unknown(&self, key: &str) -> Result<Bytes> {
        let ps = self.inner.opts.part_size;
        let (info, first) = match self.fetch(key, 0..ps, None, true).await {
            Ok(v) => v,
            Err(e @ Error::NotFound { .. }) => return Err(e),
            Err(e) => {
                // A ranged GET of an empty object is answered 416 by S3; ask for its size.
                match self.head_uncached(key).await {
                    Ok(info) if info.size == 0 => {
                        // Not a failure after all.
                        let m = &self.inner.metrics;
                        m.failed_reads.fetch_sub(1, Ordering::Relaxed);
                        return Ok(Bytes::new());
                    }
                    _ => return Err(e),
                }
            }
        };
        let info = info.expect("fetch with want_meta returns metadata");
        self.remember(&info);
        let tag = info.version_tag();
        if info.size <= ps {
            self.inner
                .cache
                .insert(self.block_key(&info.key, &tag, 0), first.clone());
            return Ok(first);
        }
        self.inner
            .cache
            .insert(self.block_key(&info.key, &tag, 0), first.clone());
        self.collect_range(&info, 0..info.size).await
    }

    /// Bytes `range` of `key`. Checks the range against the object's size (a range past the
    /// end is an error that names the object and its size).
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let info = self.head(key).await?;
        self.get_range_of(&info, range).await
    }

    /// Like [`Store::get_range`] with metadata the caller already has.
    pub async fn get_range_of(&self, info: &ObjectInfo, range: Range<u64>) -> Result<Bytes> {
        if range.start > range.end || range.end > info.size {
            return Err(Error::RangeOutOfBounds {
                url: self.object_url(&info.key),
                range,
                size: info.size,
            });
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let ps = self.inner.opts.part_size;
        let first = range.start / ps;
        let last = (range.end - 1) / ps;
        if first == last {
            let base = first * ps;
            let key = self.block_key(&info.key, &info.version_tag(), first);
            if let Some(b) = self.inner.cache.get_memory(&key) {
                return Ok(b.slice((range.start - base) as usize..(range.end - base) as usize));
            }
            // A small read of an uncached block fetches just the bytes asked for, so random
            // small reads do not pull whole parts each time.
            if range.end - range.start < ps / 4 {
                let etag = info.etag.clone();
                return Ok(self.fetch(&info.key, range, etag, false).await?.1);
            }
            let b = self.block(info, first).await?;
            return Ok(b.slice((range.start - base) as usize..(range.end - base) as usize));
        }
        self.collect_range(info, range).await
    }

    async fn collect_range(&self, info: &ObjectInfo, range: Range<u64>) -> Result<Bytes> {
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        let mut parts = self.stream_range_of(info.clone(), range.clone());
        while let Some(part) = parts.next().await {
            out.extend_from_slice(&part?);
        }
        if out.len() as u64 != range.end - range.start {
            return Err(Error::ShortRead {
                url: self.object_url(&info.key),
                expected: range.end - range.start,
                got: out.len() as u64,
                range,
                attempts: 1,
            });
        }
        Ok(out.freeze())
    }

    /// Streams bytes `range` of `key` (all of it when `None`) as parts in order: up to
    /// `max_concurrency` ranged GETs of `part_size` in flight, each part yielded as soon as it
    /// and every part before it have arrived, so the first bytes come after one part's latency,
    /// not the whole window's. In-flight parts hold memory budget (backpressure).
    pub async fn read_stream(
        &self,
        key: &str,
        range: Option<Range<u64>>,
    ) -> Result<BoxStream<'static, Result<Bytes>>> {
        let info = self.head(key).await?;
        let range = range.unwrap_or(0..info.size);
        if range.start > range.end || range.end > info.size {
            return Err(Error::RangeOutOfBounds {
                url: self.object_url(key),
                range,
                size: info.size,
            });
        }
        Ok(self.stream_range_of(info, range))
    }

    pub(crate) fn stream_range_of(
        &self,
        info: ObjectInfo,
        range: Range<u64>,
    ) -> BoxStream<'static, Result<Bytes>> {
        if range.is_empty() {
            return stream::empty().boxed();
        }
        let ps = self.inner.opts.part_size;
        let first = range.start / ps;
        let last = (range.end - 1) / ps;
        let this = self.clone();
        let info = Arc::new(info);
        let budget = self.inner.budget.clone();
        let size = info.size;
        let opening = stream::iter(first..=last)
            // Budget is taken in part order, one part at a time: a part only waits for budget
            // when every part before it already holds its own, so the oldest part never waits
            // behind younger ones (no hold-and-wait).
            .then(move |b| {
                let budget = budget.clone();
                async move {
                    let base = b * ps;
                    let end = (base + ps).min(size);
                    (b, budget.reserve(end - base).await)
                }
            })
            .map(move |(b, hold)| {
                let this = this.clone();
                let info = info.clone();
                let range = range.clone();
                async move {
                    let base = b * ps;
                    let end = (base + ps).min(info.size);
                    let lo = range.start.max(base);
                    let hi = range.end.min(end);
                    let part = if this.inner.cache_enabled {
                        let block = this.block(&info, b).await?;
                        let bytes = block.slice((lo - base) as usize..(hi - base) as usize);
                        stream::once(async move { Ok(bytes) }).boxed()
                    } else {
                        // Nobody keeps the part: its chunks are passed on as they arrive (no
                        // copy), read ahead only as far as `InOrder` allows.
                        Body::open(&this, &info.key, lo..hi, info.etag.clone(), false)
                            .await?
                            .into_stream()
                    };
                    Ok((part, hold))
                }
                .boxed()
            })
            .boxed();
        // The part's budget is held until its last chunk has been handed on.
        InOrder::new(
            opening,
            self.inner.opts.max_concurrency,
            PART_READ_AHEAD.min(ps),
        )
        .boxed()
    }

    pub(crate) fn block_key(&self, key: &str, tag: &str, block: u64) -> BlockKey {
        BlockKey {
            object: self.object_url(key).into(),
            version: tag.into(),
            block,
        }
    }

    /// Brings part `block` of an object (block 0 of an object up to the part size is all of
    /// it) into the block cache, for a read that is expected soon. Returns at once when the
    /// cache is off (the bytes would have nowhere to wait), and without a request when the
    /// block is cached; joins a fetch of the same block already in flight.
    pub async fn prefetch(&self, info: &ObjectInfo, block: u64) -> Result<()> {
        if !self.inner.cache_enabled || block * self.inner.opts.part_size >= info.size {
            return Ok(());
        }
        self.block(info, block).await.map(drop)
    }

    /// Whether reads populate a block cache (memory or disk).
    pub fn caches(&self) -> bool {
        self.inner.cache_enabled
    }

    /// Block `b` of the object, from the cache or by one ranged GET (single-flight).
    pub(crate) async fn block(&self, info: &ObjectInfo, b: u64) -> Result<Bytes> {
        let ps = self.inner.opts.part_size;
        let start = b * ps;
        let end = (start + ps).min(info.size);
        if start >= end {
            return Ok(Bytes::new());
        }
        let key = self.block_key(&info.key, &info.version_tag(), b);
        let this = self.clone();
        let etag = info.etag.clone();
        let k = info.key.clone();
        self.inner
            .cache
            .get_or_fetch(key, move || async move {
                this.fetch(&k, start..end, etag, false)
                    .await
                    .map(|(_, b)| b)
            })
            .await
    }

    /// One ranged GET with Stoker's body handling ([`Body`]): the body is checked against the
    /// range's length, and a body cut short is resumed from the last byte received (with
    /// `If-Match` on the ETag, so bytes of two versions are never spliced) up to the retry
    /// budget. `want_meta` also returns the object's metadata from the response.
    pub(crate) async fn fetch(
        &self,
        key: &str,
        range: Range<u64>,
        etag: Option<String>,
        want_meta: bool,
    ) -> Result<(Option<ObjectInfo>, Bytes)> {
        let mut body = Body::open(self, key, range, etag, want_meta).await?;
        let info = body.take_info();
        let expected = body.expected() as usize;
        let Some(first) = body.next_chunk().await? else {
            return Ok((info, Bytes::new()));
        };
        // A local file read in one chunk is already an allocation of exactly its bytes:
        // no copy. (A network chunk may be a slice of a larger receive buffer; those are
        // gathered into a buffer of the range's size.)
        if body.is_local() && first.len() == expected {
            return Ok((info, first));
        }
        let mut buf = self.inner.pool.take(expected);
        buf.extend_from_slice(&first);
        while let Some(c) = body.next_chunk().await? {
            buf.extend_from_slice(&c);
        }
        Ok((info, self.inner.pool.freeze(buf)))
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// Forgets cached metadata (not blocks) so the next access asks the server again.
    pub fn forget_metadata(&self) {
        self.inner.meta.clear();
    }
}
