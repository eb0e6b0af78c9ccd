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

use crate::error::{Error, Result};
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

impl Store {
    /// Every object under `prefix` (a "directory": `a/b` and `a/b/` both mean the keys under
    /// `a/b/`), streamed page by page in the backend's order (key order for S3, GCS, Azure and
    /// memory; directory order for local files).
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
        let path = (!dir.is_empty()).then(|| to_path(&dir));
        let metrics = self.inner.metrics.clone();
        metrics
            .list_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .backend
            .list(path.as_ref())
            .map_err(move |e| Error::from_backend("list", &url, e))
            .try_filter_map(move |meta| {
                let info = ObjectInfo::from_meta(&meta);
                let keep = matcher
                    .as_ref()
                    .map(|m| m.is_match(relative(&info.key, &dir)))
                    .unwrap_or(true);
                if keep {
                    this.remember(&info);
                }
                futures::future::ready(Ok(keep.then_some(info)))
            })
            .boxed()
    }

    /// The listing of the directory `prefix` if [`Store::list_dir`] fetched it less than
    /// the metadata TTL ago; never sends a request.
    pub fn cached_dir(&self, prefix: &str) -> Option<Arc<Listing>> {
        let dir = dir_prefix(prefix);
        let dirs = self.inner.meta.dirs.lock();
        let (l, at) = dirs.get(&dir)?;
        (at.elapsed() < self.inner.opts.metadata_ttl).then(|| l.clone())
    }

    /// Whether any object lies under the directory `prefix` (`a/b` and `a/b/` both mean
    /// under `a/b/`): one LIST request for the first page, whatever the directory's size.
    pub async fn dir_exists(&self, prefix: &str) -> Result<bool> {
        if let Some(l) = self.cached_dir(prefix) {
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
    /// delimiter listing), cached for the metadata TTL.
    pub async fn list_dir(&self, prefix: &str) -> Result<Arc<Listing>> {
        let dir = dir_prefix(prefix);
        if let Some((l, at)) = self.inner.meta.dirs.lock().get(&dir) {
            if at.elapsed() < self.inner.opts.metadata_ttl {
                return Ok(l.clone());
            }
        }
        self.inner
            .metrics
            .list_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = (!dir.is_empty()).then(|| to_path(&dir));
        let res = self
            .inner
            .backend
            .list_with_delimiter(path.as_ref())
            .await
            .map_err(|e| Error::from_backend("list", &self.object_url(&dir), e))?;
        let mut objects: Vec<ObjectInfo> = res.objects.iter().map(ObjectInfo::from_meta).collect();
        // S3 lists in key order; local directories do not.
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        for o in &objects {
            self.remember(o);
        }
        let mut prefixes: Vec<String> = res
            .common_prefixes
            .iter()
            .map(|p| format!("{p}/"))
            .collect();
        prefixes.sort();
        let listing = Arc::new(Listing { objects, prefixes });
        if !self.inner.opts.metadata_ttl.is_zero() {
            self.inner
                .meta
                .dirs
                .lock()
                .insert(dir, (listing.clone(), Instant::now()));
        }
        Ok(listing)
    }

    /// Every object under `prefix`, in key order, listing sub-prefixes concurrently.
    pub async fn list_all(&self, prefix: &str, options: &ListOptions) -> Result<Vec<ObjectInfo>> {
        let matcher = options.matcher()?;
        let dir = dir_prefix(prefix);
        let mut all = self.list_tree(dir.clone(), options.concurrency).await?;
        if let Some(m) = matcher {
            all.retain(|o| m.is_match(relative(&o.key, &dir)));
        }
        Ok(all)
    }

    fn list_tree(
        &self,
        dir: String,
        concurrency: usize,
    ) -> futures::future::BoxFuture<'static, Result<Vec<ObjectInfo>>> {
        let this = self.clone();
        Box::pin(async move {
            let level = this.list_dir(&dir).await?;
            if level.prefixes.is_empty() {
                return Ok(level.objects.clone());
            }
            let subtrees: Vec<Vec<ObjectInfo>> = stream::iter(level.prefixes.clone())
                .map(|p| this.list_tree(p, concurrency))
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
