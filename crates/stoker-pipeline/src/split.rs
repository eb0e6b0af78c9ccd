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
//! Record counts come from the format's metadata or from a shard index (`source::count`).
//! A count is a promise the reading checks: a shard that ends before its count, or goes on
//! after it, is an error that names it ([`ended_early`], [`goes_on`]; a stale index must not
//! silently shift every rank's span). This module is pure arithmetic over positions: the
//! source calls it, it reads nothing.

use stoker_core::Error;

use crate::plan::{RankPolicy, RankSplit, SplitMode};

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
}
