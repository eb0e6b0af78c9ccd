//! The contiguous rank split: each rank reads a span of the epoch's records, not every
//! shard.
//!
//! The interleaved split (the source's rounds of `world` samples) is exact and needs no
//! knowledge of the data, but every rank parses every shard and keeps `1 / world` of it:
//! eight ranks read the dataset eight times. When every shard's record count is known, the
//! epoch can be cut instead: concatenate the shards in the epoch's order (the same seeded
//! permutation on every rank), give rank `r` the records `[r * m, (r + 1) * m)` (`m` the
//! floor or, padded, the ceiling of `total / world`), and within a rank give part `k` of
//! `parts` (a DataLoader worker) its own sub-span. A rank then opens only the shards its
//! span touches, the first and last of them perhaps only in part, and interleaves them as
//! the source interleaves shards. Every rank, and part `k` of every rank, gets the same
//! number of records; with `Pad`, spans past the end wrap around to the first records.
//!
//! Record counts come from the format's metadata (Parquet footers: two small ranged reads
//! per file, made concurrently before the first epoch) or from a shard index
//! ([`crate::Pipeline::shard_index`]), a JSON file `stoker index` writes. A count is a
//! promise the reading checks: a shard that ends before its count, or goes on after it,
//! is an error that names it (a stale index must not silently shift every rank's span).

use std::collections::HashMap;
use std::sync::Arc;

use stoker_core::Error;
use stoker_formats::ShardInfo;
use stoker_store::{Store, StoreOptions};

use crate::plan::{RankPolicy, RankSplit, SplitMode};
use crate::source::Dataset;

/// A part of one shard that the source reads: records `start..end` (`end` `None`: to the
/// shard's end, with no count to check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub shard: u32,
    pub start: u64,
    pub end: Option<u64>,
}

impl Piece {
    /// All of `shard`.
    pub(crate) fn whole(shard: u32) -> Piece {
        Piece {
            shard,
            start: 0,
            end: None,
        }
    }
}

/// The records per rank and per part: `(m, len, offset)`, where `m` is every rank's share
/// of `total`, and this part's sub-span of it is `len` records from `offset`.
fn shares(total: u64, r: &RankSplit) -> (u64, u64, u64) {
    let w = u64::from(r.world.max(1));
    let m = match r.policy {
        RankPolicy::Drop => total / w,
        RankPolicy::Pad => total.div_ceil(w),
    };
    let parts = u64::from(r.parts.max(1));
    let part = u64::from(r.part).min(parts - 1);
    let (q, rem) = (m / parts, m % parts);
    let len = q + u64::from(part < rem);
    let offset = part * q + part.min(rem);
    (m, len, offset)
}

/// This rank part's pieces of the epoch whose shards come in `order`, with `counts[s]`
/// records in shard `s` (see the module docs).
pub(crate) fn contiguous_pieces(order: &[u32], counts: &[u64], r: &RankSplit) -> Vec<Piece> {
    let ends: Vec<u64> = order
        .iter()
        .scan(0u64, |acc, &s| {
            *acc += counts[s as usize];
            Some(*acc)
        })
        .collect();
    let total = ends.last().copied().unwrap_or(0);
    let (m, len, offset) = shares(total, r);
    if total == 0 || len == 0 {
        return Vec::new();
    }
    let mut pos = (u64::from(r.rank) * m + offset) % total;
    let mut left = len;
    let mut out: Vec<Piece> = Vec::new();
    while left > 0 {
        // The shard holding position `pos`: the first whose end lies past it (shards with
        // no records are never chosen).
        let i = ends.partition_point(|&e| e <= pos);
        let first = if i == 0 { 0 } else { ends[i - 1] };
        let from = pos - first;
        let take = (ends[i] - pos).min(left);
        match out.last_mut() {
            // A wrap-around that comes back to the shard it started in continues it.
            Some(p) if p.shard == order[i] && p.end == Some(from) => p.end = Some(from + take),
            _ => out.push(Piece {
                shard: order[i],
                start: from,
                end: Some(from + take),
            }),
        }
        left -= take;
        pos = (pos + take) % total;
    }
    out
}

/// For a pipeline whose ranks split a dataset of shards of many records: whether the split
/// is contiguous, and why (for `explain`). `None` when there is no rank split or the format
/// has one sample per object (split by object, always).
pub(crate) fn choose(p: &crate::Pipeline) -> Option<(bool, String)> {
    let r = p.rank.filter(RankSplit::splits)?;
    let counts_from_metadata = match &p.format {
        crate::plan::FormatChoice::Fixed(f) if !f.one_sample_per_object() => {
            f.counts_from_metadata()
        }
        _ => return None,
    };
    if matches!(p.source, crate::plan::Source::Memory(_)) {
        return None;
    }
    let counted_by = if p.shard_index.is_some() {
        "from the shard index"
    } else {
        "from the files' metadata"
    };
    Some(match r.mode {
        SplitMode::Interleaved => (
            false,
            "rank split interleaved (as asked): every rank reads every shard and keeps one \
             sample per round of world"
                .into(),
        ),
        SplitMode::Contiguous => (
            true,
            format!(
                "rank split contiguous (as asked): each rank reads its span of the epoch's \
                 records, about 1/world of the shards, record counts {counted_by}"
            ),
        ),
        SplitMode::Auto if p.shard_index.is_some() || counts_from_metadata => (
            true,
            format!(
                "rank split contiguous: record counts are known {counted_by}, so each rank \
                 reads only its span of the epoch's records (about 1/world of the shards)"
            ),
        ),
        SplitMode::Auto => (
            false,
            "rank split interleaved: no record counts (give a shard index, which `stoker \
             index` writes, for the contiguous split), so every rank reads every shard"
                .into(),
        ),
    })
}

/// The error for a shard that ended after `got` records where its count is `n`.
pub(crate) fn ended_early(url: String, got: u64, n: u64) -> Error {
    Error::record(format!(
        "the shard ended after {got} records, but its count is {n} (a stale shard index? \
         write it again with `stoker index`)"
    ))
    .with_object(url)
    .with_record(got)
}

/// The error for a shard with a record at `got`, past its count `n`.
pub(crate) fn goes_on(url: String, got: u64, n: u64) -> Error {
    Error::record(format!(
        "the shard has more records than its count of {n} (a stale shard index? write it \
         again with `stoker index`)"
    ))
    .with_object(url)
    .with_record(got)
}

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
    let storage = |e: stoker_store::Error| {
        let message = format!("cannot read the shard index: {e}");
        Error::storage(message)
            .with_object(url.to_string())
            .with_cause(e)
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
    /// Every shard of the source with its record count, read whole (`count_records` of the
    /// format, many shards at once; Parquet reads only its footers): the content of a shard
    /// index, which `stoker index` writes. One-sample-per-object formats count 1 each.
    pub fn count_records(&self) -> Result<Vec<(String, u64)>, Error> {
        let runtime = crate::exec::io_runtime()?;
        let ds = Dataset::resolve(
            &self.source,
            &self.format,
            runtime.handle(),
            None,
            crate::source::ResolveOptions {
                memory_limit: self.memory_limit(),
                single_pass: true,
                look_up_keys: false,
            },
            None,
        )?;
        let counts = if ds.per_object {
            vec![1; ds.shards.len()]
        } else {
            count_all(&ds)?
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

    fn split(rank: u32, world: u32, policy: RankPolicy, part: u32, parts: u32) -> RankSplit {
        RankSplit {
            rank,
            world,
            policy,
            part,
            parts,
            mode: crate::plan::SplitMode::Contiguous,
        }
    }

    /// The records a list of pieces stands for, as (shard, record).
    fn records(p: &[Piece]) -> Vec<(u32, u64)> {
        p.iter()
            .flat_map(|p| (p.start..p.end.unwrap()).map(move |r| (p.shard, r)))
            .collect()
    }

    #[test]
    fn spans_cover_the_epoch_once_and_equally() {
        let counts = [5u64, 0, 3, 7, 1, 4];
        let order = [3u32, 0, 5, 1, 2, 4];
        let all: Vec<(u32, u64)> = order
            .iter()
            .flat_map(|&s| (0..counts[s as usize]).map(move |r| (s, r)))
            .collect();
        for world in 1..=5u32 {
            for parts in 1..=3u32 {
                let mut got = Vec::new();
                let mut lens = vec![Vec::new(); world as usize];
                for rank in 0..world {
                    for part in 0..parts {
                        let p = contiguous_pieces(
                            &order,
                            &counts,
                            &split(rank, world, RankPolicy::Drop, part, parts),
                        );
                        let r = records(&p);
                        lens[rank as usize].push(r.len());
                        got.extend(r);
                    }
                }
                let m = all.len() / world as usize;
                // In order, each once, the remainder dropped.
                assert_eq!(
                    got,
                    all[..m * world as usize],
                    "world {world} parts {parts}"
                );
                // Part k has the same length on every rank.
                assert!(lens.windows(2).all(|w| w[0] == w[1]), "{lens:?}");
            }
        }
    }

    #[test]
    fn pad_wraps_around_to_the_first_records() {
        let counts = [3u64, 2];
        let order = [1u32, 0];
        // 5 records over 3 ranks: 2 each, the last rank's second is the first record again.
        let r2 = records(&contiguous_pieces(
            &order,
            &counts,
            &split(2, 3, RankPolicy::Pad, 0, 1),
        ));
        assert_eq!(r2, vec![(0, 2), (1, 0)]);
        // More ranks than records: everyone still gets one.
        for rank in 0..7 {
            let r = records(&contiguous_pieces(
                &order,
                &counts,
                &split(rank, 7, RankPolicy::Pad, 0, 1),
            ));
            assert_eq!(r.len(), 1);
        }
        assert!(
            contiguous_pieces(&order, &counts, &split(6, 7, RankPolicy::Drop, 0, 1)).is_empty()
        );
    }

    #[test]
    fn a_rank_opens_only_the_shards_of_its_span() {
        let counts = [10u64; 8];
        let order: Vec<u32> = (0..8).collect();
        let p = contiguous_pieces(&order, &counts, &split(1, 4, RankPolicy::Drop, 0, 1));
        assert_eq!(
            p,
            vec![
                Piece {
                    shard: 2,
                    start: 0,
                    end: Some(10)
                },
                Piece {
                    shard: 3,
                    start: 0,
                    end: Some(10)
                }
            ]
        );
    }

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
