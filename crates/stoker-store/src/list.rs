//! Listing, and the metadata cache it fills.
//!
//! [`Store::list`] streams a prefix page by page (the first keys arrive after one round trip,
//! not after the whole prefix is listed). [`Store::list_all`] lists a whole tree faster by
//! fanning out: it lists one level with a delimiter, then lists every sub-prefix concurrently,
//! recursively, and returns the keys in lexicographic order, the same order as a flat
//! listing. Both feed the metadata cache, so the sizes and ETags learned while listing save a
//! HEAD per object on the first read. Entries expire after the metadata TTL; after that, a
//! read asks the server again and a changed object gets a new cache identity.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use globset::{Glob, GlobMatcher};
use parking_lot::Mutex;

use object_store::ObjectMeta;

use crate::error::{Error, Result};
use crate::keys::{stood_in, warn_skipped, Skipped};
use crate::store::{to_path, ObjectInfo, Store};

/// At most this many metadata entries are kept; past it the cache starts over (a listing of
/// millions of keys must not grow memory without bound).
const META_CAPACITY: usize = 2_000_000;

pub(crate) struct MetaCache {
    ttl: Duration,
    objects: Mutex<HashMap<String, (ObjectInfo, Instant)>>,
    dirs: Mutex<HashMap<String, (Arc<Listing>, Instant)>>,
}

impl MetaCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        MetaCache {
            ttl,
            objects: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<ObjectInfo> {
        let map = self.objects.lock();
        let (info, at) = map.get(key)?;
        (at.elapsed() < self.ttl).then(|| info.clone())
    }

    /// The entry for `key` even when expired, with whether it is still fresh.
    pub(crate) fn get_any(&self, key: &str) -> Option<(ObjectInfo, bool)> {
        let map = self.objects.lock();
        let (info, at) = map.get(key)?;
        Some((info.clone(), at.elapsed() < self.ttl))
    }

    /// Inserts fresh metadata, returning what was there before (fresh or not).
    pub(crate) fn insert(&self, info: ObjectInfo) -> Option<ObjectInfo> {
        if self.ttl.is_zero() {
            return None;
        }
        let mut map = self.objects.lock();
        if map.len() >= META_CAPACITY && !map.contains_key(&info.key) {
            map.clear();
        }
        map.insert(info.key.clone(), (info, Instant::now()))
            .map(|(old, _)| old)
    }

    pub(crate) fn clear(&self) {
        self.objects.lock().clear();
        self.dirs.lock().clear();
    }
}

/// One level of a delimiter listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Objects directly under the prefix.
    pub objects: Vec<ObjectInfo>,
    /// Sub-prefixes ("directories"), each ending in `/`.
    pub prefixes: Vec<String>,
    /// Keys and sub-prefixes left out: those that cannot be file names (control characters,
    /// `.`, `..`, empty segments) and, for local files, symbolic links out of the root. See
    /// `keys.rs`; [`Store::list_dir`] logs one warning naming them.
    pub skipped: Vec<Skipped>,
}

/// Options of [`Store::list`] and [`Store::list_all`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ListOptions {
    /// Keep only keys matching this glob (`**/*.jpg`, `train-*.tar`), matched against the key
    /// relative to the listed prefix.
    pub glob: Option<String>,
    /// Sub-prefixes listed at once by `list_all`. Default 16.
    pub concurrency: usize,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions {
            glob: None,
            concurrency: 16,
        }
    }
}

impl ListOptions {
    /// Sets the glob filter.
    pub fn with_glob(mut self, glob: impl Into<String>) -> Self {
        self.glob = Some(glob.into());
        self
    }

    /// Sets the fan-out concurrency.
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    fn matcher(&self) -> Result<Option<GlobMatcher>> {
        match &self.glob {
            None => Ok(None),
            Some(g) => Glob::new(g)
                .map(|g| Some(g.compile_matcher()))
                .map_err(|e| Error::InvalidOption {
                    key: "glob".into(),
                    value: g.clone(),
                    reason: e.to_string(),
                }),
        }
    }
}

fn dir_prefix(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

fn relative<'a>(key: &'a str, dir: &str) -> &'a str {
    key.strip_prefix(dir).unwrap_or(key)
}

/// An object of a listing, or the key it stood in for (`keys.rs`); `None` for a directory
/// marker, which is no object.
fn from_listed(meta: &ObjectMeta) -> Option<std::result::Result<ObjectInfo, Skipped>> {
    match stood_in(meta.location.as_ref()) {
        None => Some(Ok(ObjectInfo::from_meta(meta))),
        Some((key, reason)) => reason.map(|reason| Err(Skipped { key, reason })),
    }
}

impl Store {
    /// The root a listing of `dir` keeps local symbolic links inside: the store's own root
    /// (the directory it was opened on), or for a store over the whole file system, what is
    /// listed.
    fn listing_root(&self, dir: &str) -> String {
        match &self.inner.local {
            Some(l) if !l.root().is_empty() => l.root().to_string(),
            _ => dir.trim_end_matches('/').to_string(),
        }
    }

    /// Every object under `prefix` (a "directory": `a/b` and `a/b/` both mean the keys under
    /// `a/b/`), streamed page by page in the backend's order (key order for S3, GCS, Azure and
    /// memory; depth first, each directory in name order, for local files). Keys that cannot
    /// be file names are skipped, and named in one warning once the stream ends.
    pub fn list(
        &self,
        prefix: &str,
        options: &ListOptions,
    ) -> BoxStream<'static, Result<ObjectInfo>> {
        let matcher = match options.matcher() {
            Ok(m) => m,
            Err(e) => return stream::once(async move { Err(e) }).boxed(),
        };
        let dir = dir_prefix(prefix);
        let this = self.clone();
        let url = self.object_url(&dir);
        let metrics = self.inner.metrics.clone();
        metrics
            .list_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let skipped = Arc::new(Mutex::new(Vec::<Skipped>::new()));
        let keep = {
            let dir = dir.clone();
            move |key: &str| -> bool {
                matcher
                    .as_ref()
                    .map(|m| m.is_match(relative(key, &dir)))
                    .unwrap_or(true)
            }
        };
        let listed: BoxStream<'static, Result<ObjectInfo>> = if self.inner.local.is_some() {
            self.walk_local(dir.clone(), skipped.clone())
        } else {
            let path = (!dir.is_empty()).then(|| to_path(&dir));
            let skipped = skipped.clone();
            self.inner
                .backend
                .list(path.as_ref())
                .map_err(move |e| Error::from_backend("list", &url, e))
                .try_filter_map(move |meta| {
                    let out = match from_listed(&meta) {
                        Some(Ok(info)) => Some(info),
                        Some(Err(s)) => {
                            skipped.lock().push(s);
                            None
                        }
                        None => None,
                    };
                    futures::future::ready(Ok(out))
                })
                .boxed()
        };
        let keep2 = keep.clone();
        let what = self.object_url(&dir);
        let filtered = listed.try_filter_map(move |info| {
            let k = keep(&info.key);
            if k {
                this.remember(&info);
            }
            futures::future::ready(Ok(k.then_some(info)))
        });
        let done = stream::once(async move {
            let mut s = std::mem::take(&mut *skipped.lock());
            s.retain(|s| keep2(&s.key));
            warn_skipped(&what, &s);
            None
        })
        .filter_map(futures::future::ready);
        filtered.chain(done).boxed()
    }

    /// A local directory tree, depth first, each directory in name order.
    fn walk_local(
        &self,
        dir: String,
        skipped: Arc<Mutex<Vec<Skipped>>>,
    ) -> BoxStream<'static, Result<ObjectInfo>> {
        let root = self.listing_root(&dir);
        let this = self.clone();
        stream::unfold(vec![dir], move |mut stack| {
            let (this, root, skipped) = (this.clone(), root.clone(), skipped.clone());
            async move {
                let dir = stack.pop()?;
                match this.fetch_local(&dir, &root).await {
                    Ok(level) => {
                        skipped.lock().extend(level.skipped);
                        stack.extend(level.prefixes.into_iter().rev());
                        Some((Ok(level.objects), stack))
                    }
                    Err(e) => Some((Err(e), Vec::new())),
                }
            }
        })
        .map_ok(|objects| stream::iter(objects.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
    }

    /// One local directory level, listed on a blocking thread.
    async fn fetch_local(&self, dir: &str, root: &str) -> Result<Listing> {
        let local = self.inner.local.clone().expect("a local store");
        let (d, r) = (dir.to_string(), root.to_string());
        let url = self.object_url(dir);
        let level = tokio::task::spawn_blocking(move || local.list_dir(&d, &r))
            .await
            .map_err(|e| Error::Io {
                path: url.clone(),
                source: Arc::new(std::io::Error::other(e)),
            })?
            .map_err(|e| Error::from_backend("list", &url, e))?;
        Ok(Listing {
            objects: level.objects,
            prefixes: level.prefixes,
            skipped: level.skipped,
        })
    }

    /// Where the listing of `dir` under `root` is cached.
    fn dir_cache_key(&self, dir: &str, root: &str) -> String {
        let plain = match &self.inner.local {
            None => true,
            Some(l) => root == l.root() || root == dir.trim_end_matches('/'),
        };
        if plain {
            dir.to_string()
        } else {
            format!("{root}\0{dir}")
        }
    }

    /// The listing of the directory `prefix` if [`Store::list_dir`] fetched it less than
    /// the metadata TTL ago; never sends a request.
    pub fn cached_dir(&self, prefix: &str) -> Option<Arc<Listing>> {
        let dir = dir_prefix(prefix);
        let key = self.dir_cache_key(&dir, &self.listing_root(&dir));
        let dirs = self.inner.meta.dirs.lock();
        let (l, at) = dirs.get(&key)?;
        (at.elapsed() < self.inner.opts.metadata_ttl).then(|| l.clone())
    }

    /// Whether any object lies under the directory `prefix` (`a/b` and `a/b/` both mean
    /// under `a/b/`): one LIST request for the first page, whatever the directory's size.
    /// For local files: whether the directory exists with any entry, reached without a
    /// symbolic link out of the root.
    pub async fn dir_exists(&self, prefix: &str) -> Result<bool> {
        if let Some(l) = self.cached_dir(prefix) {
            return Ok(!l.objects.is_empty() || !l.prefixes.is_empty());
        }
        if self.inner.local.is_some() {
            let dir = dir_prefix(prefix);
            let root = self.listing_root(&dir);
            let l = self.fetch_local(&dir, &root).await?;
            return Ok(!l.objects.is_empty() || !l.prefixes.is_empty());
        }
        let mut first = self.list(prefix, &ListOptions::default());
        match first.next().await {
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }

    /// One level under `prefix`: its objects and sub-prefixes (S3 "directories" from a
    /// delimiter listing), cached for the metadata TTL. Keys that cannot be file names are
    /// left out and named in [`Listing::skipped`] (and in one warning when the listing is
    /// fetched).
    pub async fn list_dir(&self, prefix: &str) -> Result<Arc<Listing>> {
        let dir = dir_prefix(prefix);
        let root = self.listing_root(&dir);
        let (listing, fetched) = self.list_level(&dir, &root).await?;
        if fetched {
            warn_skipped(&self.object_url(&dir), &listing.skipped);
        }
        Ok(listing)
    }

    /// One level, from the cache or fetched (then `true`), without a warning.
    async fn list_level(&self, dir: &str, root: &str) -> Result<(Arc<Listing>, bool)> {
        let key = self.dir_cache_key(dir, root);
        if let Some((l, at)) = self.inner.meta.dirs.lock().get(&key) {
            if at.elapsed() < self.inner.opts.metadata_ttl {
                return Ok((l.clone(), false));
            }
        }
        self.inner
            .metrics
            .list_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut listing = if self.inner.local.is_some() {
            self.fetch_local(dir, root).await?
        } else {
            self.fetch_level(dir).await?
        };
        // S3 lists in key order; local directories do not.
        listing.objects.sort_by(|a, b| a.key.cmp(&b.key));
        listing.prefixes.sort();
        for o in &listing.objects {
            self.remember(o);
        }
        let listing = Arc::new(listing);
        if !self.inner.opts.metadata_ttl.is_zero() {
            self.inner
                .meta
                .dirs
                .lock()
                .insert(key, (listing.clone(), Instant::now()));
        }
        Ok((listing, true))
    }

    /// One level from the backend's delimiter listing, stand-ins turned back into skipped
    /// keys.
    async fn fetch_level(&self, dir: &str) -> Result<Listing> {
        let path = (!dir.is_empty()).then(|| to_path(dir));
        let res = self
            .inner
            .backend
            .list_with_delimiter(path.as_ref())
            .await
            .map_err(|e| Error::from_backend("list", &self.object_url(dir), e))?;
        let mut listing = Listing::default();
        for meta in &res.objects {
            match from_listed(meta) {
                Some(Ok(info)) => listing.objects.push(info),
                Some(Err(s)) => listing.skipped.push(s),
                None => {}
            }
        }
        for p in &res.common_prefixes {
            match stood_in(p.as_ref()) {
                None => listing.prefixes.push(format!("{p}/")),
                // A prefix as the server has it ends in `/`.
                Some((key, Some(reason))) => listing.skipped.push(Skipped { key, reason }),
                Some((_, None)) => {}
            }
        }
        Ok(listing)
    }

    /// Every object under `prefix`, in key order, listing sub-prefixes concurrently. Keys
    /// that cannot be file names are skipped, and named in one warning.
    pub async fn list_all(&self, prefix: &str, options: &ListOptions) -> Result<Vec<ObjectInfo>> {
        let (all, skipped) = self.list_all_and_skipped(prefix, options).await?;
        warn_skipped(&self.object_url(&dir_prefix(prefix)), &skipped);
        Ok(all)
    }

    /// Like [`Store::list_all`], returning the keys it skipped (a skipped sub-prefix stands
    /// for everything under it) instead of logging them.
    pub async fn list_all_and_skipped(
        &self,
        prefix: &str,
        options: &ListOptions,
    ) -> Result<(Vec<ObjectInfo>, Vec<Skipped>)> {
        let matcher = options.matcher()?;
        let dir = dir_prefix(prefix);
        let root = self.listing_root(&dir);
        let skipped = Arc::new(Mutex::new(Vec::new()));
        let mut all = self
            .list_tree(dir.clone(), root, options.concurrency, skipped.clone())
            .await?;
        let mut skipped = std::mem::take(&mut *skipped.lock());
        if let Some(m) = matcher {
            all.retain(|o| m.is_match(relative(&o.key, &dir)));
            skipped.retain(|s| m.is_match(relative(&s.key, &dir)));
        }
        skipped.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((all, skipped))
    }

    fn list_tree(
        &self,
        dir: String,
        root: String,
        concurrency: usize,
        skipped: Arc<Mutex<Vec<Skipped>>>,
    ) -> futures::future::BoxFuture<'static, Result<Vec<ObjectInfo>>> {
        let this = self.clone();
        Box::pin(async move {
            let (level, _) = this.list_level(&dir, &root).await?;
            skipped.lock().extend(level.skipped.iter().cloned());
            if level.prefixes.is_empty() {
                return Ok(level.objects.clone());
            }
            let subtrees: Vec<Vec<ObjectInfo>> = stream::iter(level.prefixes.clone())
                .map(|p| this.list_tree(p, root.clone(), concurrency, skipped.clone()))
                .buffered(concurrency)
                .try_collect()
                .await?;
            // Merge this level's objects with the subtrees in key order.
            let mut out = Vec::with_capacity(
                level.objects.len() + subtrees.iter().map(Vec::len).sum::<usize>(),
            );
            let mut objs = level.objects.iter().peekable();
            for (p, sub) in level.prefixes.iter().zip(subtrees) {
                while let Some(o) = objs.peek() {
                    if o.key.as_str() < p.as_str() {
                        out.push((*o).clone());
                        objs.next();
                    } else {
                        break;
                    }
                }
                out.extend(sub);
            }
            out.extend(objs.cloned());
            Ok(out)
        })
    }
}
