//! Record counts per shard, for the contiguous rank split (see `split`) and `stoker index`:
//! from the format's metadata (Parquet footers: two small ranged reads per file, made
//! concurrently before the first epoch) or from a shard index ([`crate::Pipeline::shard_index`]),
//! a JSON file `stoker index` writes ([`crate::Pipeline::count_records`]). An error names what
//! is missing or unreadable.

use std::collections::HashMap;
use std::sync::Arc;

use stoker_core::Error;
use stoker_formats::ShardInfo;
use stoker_store::{Store, StoreOptions};

use super::Dataset;

/// Every shard's record count, in `ds.shards` order: from the shard index at `index` if
/// given, else from the format's metadata. An error names what is missing or unreadable.
pub(crate) fn record_counts(
    ds: &Dataset,
    index: Option<&str>,
    options: &StoreOptions,
) -> Result<Arc<Vec<u64>>, Error> {
    match index {
        Some(url) => counts_from_index(ds, url, options),
        None => counts_from_metadata(ds),
    }
    .map(Arc::new)
}

/// Shard counts by URL, from an index's JSON (see [`crate::Pipeline::shard_index`]).
pub(crate) fn parse_index(json: &[u8], index_url: &str) -> Result<HashMap<String, u64>, Error> {
    #[derive(serde::Deserialize)]
    struct Entry {
        url: Option<String>,
        key: Option<String>,
        records: Option<u64>,
        nsamples: Option<u64>,
    }
    #[derive(serde::Deserialize)]
    struct Index {
        shards: Option<Vec<Entry>>,
        shardlist: Option<Vec<Entry>>,
    }
    let bad = |why: String| Error::invalid(format!("shard index {index_url}: {why}"));
    let idx: Index = serde_json::from_slice(json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let entries = idx
        .shards
        .or(idx.shardlist)
        .ok_or_else(|| bad("no \"shards\" (or WebDataset \"shardlist\") list".into()))?;
    // A relative name is relative to the index's own directory.
    let dir = &index_url[..index_url.rfind('/').map_or(0, |i| i + 1)];
    let mut out = HashMap::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        let name = e
            .url
            .or(e.key)
            .ok_or_else(|| bad(format!("entry {i} has no \"url\"")))?;
        let n = e
            .records
            .or(e.nsamples)
            .ok_or_else(|| bad(format!("entry {i} ({name}) has no \"records\" count")))?;
        let url = if name.contains("://") {
            name
        } else {
            resolve(dir, &name)
        };
        out.insert(url, n);
    }
    Ok(out)
}

/// `name` (relative, with `.` and `..` segments) under the URL directory `dir` (ending in
/// `/`): `s3://b/i/` + `../t/x.tar` is `s3://b/t/x.tar`. `..` stops at the bucket.
fn resolve(dir: &str, name: &str) -> String {
    let root_end = dir.find("://").map_or(0, |i| {
        let after = i + 3;
        after + dir[after..].find('/').map_or(dir.len() - after, |j| j + 1)
    });
    let (root, path) = dir.split_at(root_end.min(dir.len()));
    let mut segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for seg in name.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segs.pop();
            }
            s => segs.push(s),
        }
    }
    let root = if root.ends_with('/') || root.is_empty() {
        root.to_string()
    } else {
        format!("{root}/")
    };
    format!("{root}{}", segs.join("/"))
}

fn counts_from_index(ds: &Dataset, url: &str, options: &StoreOptions) -> Result<Vec<u64>, Error> {
    // Of the store error's kind (a missing index is not found), with it as the source.
    let storage = |e: stoker_store::Error| {
        let mut err = Error::from(e);
        err.message = format!("cannot read the shard index: {}", err.message);
        err.with_object(url.to_string())
    };
    let store = Store::open(url, options.clone().with_cache_memory(0)).map_err(storage)?;
    let json = ds
        .runtime
        .block_on(store.get(store.url_key()))
        .map_err(storage)?;
    // Keys as the index's store names them, so `s3://b/x` matches however it was listed.
    let canonical = store.object_url(store.url_key());
    let counts = parse_index(&json, &canonical)?;
    ds.shards
        .iter()
        .map(|s| {
            counts.get(&s.url).copied().ok_or_else(|| {
                Error::invalid(format!(
                    "the shard index {url} has no count for {} (it lists {} shards): \
                     write it again with `stoker index`",
                    s.url,
                    counts.len()
                ))
                .with_object(s.url.clone())
            })
        })
        .collect()
}

/// Shards counted at once from their metadata (each count is a few small ranged reads
/// that mostly wait on the network).
const COUNT_THREADS: usize = 16;

fn counts_from_metadata(ds: &Dataset) -> Result<Vec<u64>, Error> {
    if !ds.format.counts_from_metadata() {
        return Err(Error::invalid(format!(
            "the contiguous rank split needs every shard's record count, and {} cannot \
             count from metadata: give a shard index (`stoker index` writes one), or use \
             split = \"interleaved\"",
            ds.format.name()
        )));
    }
    count_all(ds)
}

/// `count_records` of every shard, [`COUNT_THREADS`] at a time.
fn count_all(ds: &Dataset) -> Result<Vec<u64>, Error> {
    let n = ds.shards.len();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<parking_lot::Mutex<Option<Result<u64, Error>>>> =
        (0..n).map(|_| parking_lot::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..COUNT_THREADS.min(n) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let shard: &ShardInfo = &ds.shards[i];
                let r = crate::source::open_input(ds, i as u32)
                    .and_then(|input| ds.format.count_records(shard, input))
                    .map_err(|e| e.with_object(shard.url.clone()));
                *results[i].lock() = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.into_inner().expect("every shard counted"))
        .collect()
}

impl crate::Pipeline {
    /// The source listed (or, in memory, its samples), as a run would see it, with the
    /// runtime its reads go through (keep it while reading).
    fn listed(&self) -> Result<(Dataset, tokio::runtime::Runtime), Error> {
        let runtime = crate::source::io_runtime()?;
        let budget = self.memory_limit().map_or_else(
            stoker_core::MemoryBudget::from_system,
            stoker_core::MemoryBudget::new,
        );
        let opened = match &self.source {
            crate::plan::Source::Url { url, options, .. } => {
                Some(crate::source::open_url_store(url, options, &budget, true)?)
            }
            _ => None,
        };
        let ds = Dataset::resolve(
            &self.source,
            &self.format,
            runtime.handle(),
            Some(budget),
            false,
            opened,
        )?;
        Ok((ds, runtime))
    }

    /// What each epoch's order is made of, listed (nothing read): the shards' URLs (for
    /// formats of one sample per object, its samples), and whether each is one sample.
    /// The order's length is what [`Pipeline::span`] cuts (with a rank split of objects:
    /// the rank's share of it, see [`Pipeline::epoch_len`]).
    pub fn list_shards(&self) -> Result<(Vec<String>, bool), Error> {
        // (The tuple drops the dataset before its runtime.)
        let listed = self.listed()?;
        let ds = &listed.0;
        Ok((
            ds.shards.iter().map(|s| s.url.clone()).collect(),
            ds.per_object,
        ))
    }

    /// The length of each epoch's order (what [`Pipeline::span`] cuts): the shards listed,
    /// or with a rank split of objects, this rank part's share of them; and whether each
    /// entry is one sample (a format of one sample per object, or samples in memory).
    pub fn epoch_len(&self) -> Result<(u64, bool), Error> {
        // (The tuple drops the dataset before its runtime.)
        let listed = self.listed()?;
        let ds = &listed.0;
        let cfg = crate::source::SourceConfig {
            held_ahead: None,
            shuffle_shards: false,
            cycle: self.cycle,
            rank: self.rank,
            seed: self.seed,
            columnar: None,
            counts: None,
            span: None,
        };
        let n = crate::source::epoch_order(ds, &cfg, self.first_epoch).len() as u64;
        Ok((n, ds.per_object))
    }

    /// Every shard of the source with its record count, read whole (`count_records` of the
    /// format, many shards at once; Parquet reads only its footers): the content of a shard
    /// index, which `stoker index` writes. One-sample-per-object formats count 1 each.
    pub fn count_records(&self) -> Result<Vec<(String, u64)>, Error> {
        // (The tuple drops the dataset before its runtime.)
        let listed = self.listed()?;
        let ds = &listed.0;
        let counts = if ds.per_object {
            vec![1; ds.shards.len()]
        } else {
            count_all(ds)?
        };
        Ok(ds
            .shards
            .iter()
            .map(|s| s.url.clone())
            .zip(counts)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_forms_and_relative_names() {
        let plain = br#"{"shards": [{"url": "a/x.tar", "records": 3},
                                      {"url": "s3://other/y.tar", "records": 4}]}"#;
        let m = parse_index(plain, "s3://b/train/index.json").unwrap();
        assert_eq!(m["s3://b/train/a/x.tar"], 3);
        assert_eq!(m["s3://other/y.tar"], 4);
        let wids = br#"{"__kind__": "wids-shard-index-v1", "name": "t",
                        "shardlist": [{"url": "./s-000.tar", "nsamples": 9}]}"#;
        let m = parse_index(wids, "file:///d/idx.json").unwrap();
        assert_eq!(m["file:///d/s-000.tar"], 9);
        assert_eq!(resolve("s3://b/i/j/", "../t/./x.tar"), "s3://b/i/t/x.tar");
        assert_eq!(resolve("s3://b/i/", "../../x.tar"), "s3://b/x.tar");
        assert_eq!(resolve("file:///d/e/", "../x"), "file:///d/x");
        let e = parse_index(br#"{"shards": [{"url": "x"}]}"#, "s3://b/i.json").unwrap_err();
        assert!(e.message.contains("no \"records\" count"), "{e}");
        let e = parse_index(b"[]", "s3://b/i.json").unwrap_err();
        assert!(e.message.contains("s3://b/i.json"), "{e}");
    }
}
