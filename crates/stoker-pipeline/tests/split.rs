//! The contiguous rank split: each rank reads only its span of the epoch's records, every
//! rank (and every part of a rank) gets the same number, nothing is read twice or lost, a
//! stale record count is an error naming the shard, and a run stopped anywhere resumes
//! exactly.

mod common;

use std::collections::BTreeMap;

use common::*;
use proptest::prelude::*;
use stoker_pipeline::{Pipeline, PipelineState, RankPolicy, RunOptions, SplitMode};

/// The line shards' lengths (see `common::server`).
const LENS: [u64; 7] = [40, 1, 33, 0, 57, 29, 43];
const TOTAL: usize = 203;

/// Puts a shard index for the line shards at `index/{name}.json`, with the counts given,
/// and returns its URL.
fn index(name: &str, counts: &[u64]) -> String {
    let shards: Vec<serde_json::Value> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({"url": format!("s3://{BUCKET}/shards/s{i}.txt"), "records": n}))
        .collect();
    let body = serde_json::json!({ "shards": shards }).to_string();
    server()
        .put_object(BUCKET, &format!("index/{name}.json"), body.as_bytes())
        .unwrap();
    format!("s3://{BUCKET}/index/{name}.json")
}

fn contiguous() -> Pipeline {
    shards()
        .interleave(2)
        .shuffle_shards(true)
        .shard_index(index("good", &LENS))
        .seed(5)
}

/// Keys, and bytes read from storage, of one rank part's run.
fn read(p: &Pipeline) -> (Vec<String>, u64) {
    let mut run = p.run().unwrap();
    let keys: Vec<String> = run.by_ref().flat_map(|i| keys(&i.unwrap())).collect();
    let bytes = run.stats().storage.map_or(0, |s| s.bytes_read);
    (keys, bytes)
}

#[test]
fn every_rank_gets_an_equal_span_and_together_they_read_the_epoch_once() {
    let all: Vec<String> = {
        let mut k = all_keys(&contiguous());
        k.sort();
        k
    };
    assert_eq!(all.len(), TOTAL);
    let total_bytes = read(&contiguous()).1;
    for policy in [RankPolicy::Drop, RankPolicy::Pad] {
        for world in 1u32..=4 {
            for parts in 1u32..=3 {
                let mut seen: BTreeMap<String, usize> = BTreeMap::new();
                let mut part_lens = vec![Vec::new(); parts as usize];
                for rank in 0..world {
                    let mut rank_len = 0;
                    for part in 0..parts {
                        let p = contiguous().shard_by_rank_part(rank, world, policy, part, parts);
                        let (k, bytes) = read(&p);
                        if world > 1 {
                            assert!(
                                bytes < total_bytes,
                                "{policy:?} world {world}: rank {rank} part {part} read \
                                 {bytes} bytes, the whole epoch is {total_bytes}"
                            );
                        }
                        part_lens[part as usize].push(k.len());
                        rank_len += k.len();
                        for key in k {
                            *seen.entry(key).or_default() += 1;
                        }
                    }
                    let m = match policy {
                        RankPolicy::Drop => TOTAL / world as usize,
                        RankPolicy::Pad => TOTAL.div_ceil(world as usize),
                    };
                    assert_eq!(rank_len, m, "{policy:?} world {world} rank {rank}");
                }
                for lens in &part_lens {
                    assert!(lens.windows(2).all(|w| w[0] == w[1]), "{part_lens:?}");
                }
                match policy {
                    RankPolicy::Drop => {
                        assert!(seen.values().all(|&n| n == 1), "a record read twice");
                        assert_eq!(seen.len(), TOTAL / world as usize * world as usize);
                    }
                    RankPolicy::Pad => {
                        // Every record, the few padded ones twice.
                        assert_eq!(seen.keys().cloned().collect::<Vec<_>>(), all);
                        let extra: usize = seen.values().map(|n| n - 1).sum();
                        assert_eq!(
                            extra,
                            TOTAL.div_ceil(world as usize) * world as usize - TOTAL
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_interleaved_split_reads_every_shard_on_every_rank() {
    // The same ranks without counts: equal and exact too, but each reads everything.
    let total_bytes = read(&contiguous()).1;
    for rank in 0..3 {
        let p = shards()
            .interleave(2)
            .shuffle_shards(true)
            .seed(5)
            .shard_by_rank(rank, 3, RankPolicy::Drop);
        assert!(
            p.explain().contains("rank split interleaved"),
            "{}",
            p.explain()
        );
        let (k, bytes) = read(&p);
        assert_eq!(k.len(), TOTAL / 3);
        assert_eq!(bytes, total_bytes);
    }
    let p = contiguous().shard_by_rank(0, 3, RankPolicy::Drop);
    assert!(
        p.explain().contains("rank split contiguous"),
        "{}",
        p.explain()
    );
    // Asking for the contiguous split without counts says what is missing.
    let e = shards()
        .split_mode(SplitMode::Contiguous)
        .shard_by_rank(0, 2, RankPolicy::Drop)
        .run()
        .unwrap_err();
    assert!(e.message.contains("shard index"), "{e}");
}

#[test]
fn a_stale_count_is_an_error_naming_the_shard() {
    // s0 has 40 records. Counted as 41 it ends early; counted as 39 it goes on.
    for (name, n, says) in [
        ("long", 41, "ended after 40 records"),
        ("short", 39, "more records than its count of 39"),
    ] {
        let mut counts = LENS;
        counts[0] = n;
        // One rank: the span is the whole epoch, so s0 is read to its end.
        let p = shards()
            .shard_index(index(name, &counts))
            .split_mode(SplitMode::Contiguous)
            .shard_by_rank(0, 2, RankPolicy::Pad);
        let outcome: Vec<Result<_, _>> = p.run().unwrap().collect();
        let err = outcome
            .iter()
            .find_map(|r| r.as_ref().err())
            .unwrap_or_else(|| panic!("{name}: no error"));
        assert!(err.message.contains(says), "{name}: {err}");
        assert_eq!(
            err.object.as_deref(),
            Some(&*format!("s3://{BUCKET}/shards/s0.txt"))
        );
        // Skipped, it is counted once and the run goes on.
        let p = p.options(RunOptions::default().with_errors(stoker_pipeline::ErrorPolicy::Skip));
        let mut run = p.run().unwrap();
        let n = run.by_ref().count();
        assert!(n > 0);
        assert_eq!(run.stats().skipped, 1, "{name}");
    }
    // A shard the index does not list: the run does not start.
    let e = shards()
        .shard_index(index("missing", &LENS[..6]))
        .shard_by_rank(0, 2, RankPolicy::Drop)
        .run()
        .unwrap_err();
    assert!(e.message.contains("s6.txt"), "{e}");
}

#[test]
fn a_state_of_one_split_does_not_resume_the_other() {
    let c = contiguous().shard_by_rank(1, 2, RankPolicy::Drop);
    let mut run = c.run().unwrap();
    run.next().unwrap().unwrap();
    let state = run.state().unwrap();
    let i = c.clone().split_mode(SplitMode::Interleaved);
    let e = i.resume(&state).unwrap_err();
    assert!(e.message.contains("other rank split"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_contiguous_rank_resumes_exactly(
        world in 1u32..4,
        rank in 0u32..4,
        parts in 1u32..3,
        part in 0u32..3,
        pad in any::<bool>(),
        cycle in 1usize..4,
        stop in 0.0f64..1.0,
        epochs in 1u64..3,
        batch in proptest::option::of(1usize..9),
    ) {
        let policy = if pad { RankPolicy::Pad } else { RankPolicy::Drop };
        let mut p = contiguous()
            .interleave(cycle)
            .shard_by_rank_part(rank % world, world, policy, part % parts, parts)
            .epochs(Some(epochs))
            .options(RunOptions::default().with_threads(2).with_window(8));
        if let Some(b) = batch {
            p = p.batch(b, false);
        }
        let full: Vec<Vec<String>> = p.run().unwrap().map(|i| keys(&i.unwrap())).collect();
        let k = ((full.len() as f64) * stop) as usize;
        let mut run = p.run().unwrap();
        let head: Vec<Vec<String>> = run.by_ref().take(k).map(|i| keys(&i.unwrap())).collect();
        prop_assert_eq!(&head[..], &full[..k]);
        let state = PipelineState::from_json(&run.state().unwrap().to_json()).unwrap();
        drop(run);
        let tail: Vec<Vec<String>> =
            p.resume(&state).unwrap().map(|i| keys(&i.unwrap())).collect();
        prop_assert_eq!(&tail[..], &full[k..]);
    }
}

#[test]
fn parquet_counts_from_its_footers_and_splits_contiguously_by_itself() {
    // pyarrow-written files (tests/fixtures/columnar/rows): the spec says nothing about
    // the split; the footers give the counts, so `auto` cuts contiguously.
    put_parquet();
    let spec = |rank: u32| -> Pipeline {
        let text = format!(
            "source = \"s3://{BUCKET}/split-pq/\"\nformat = \"parquet\"\nshuffle_shards = true\n\
             seed = 3\ninterleave = 2\n[rank]\nrank = {rank}\nworld = 3\n"
        );
        let spec: stoker_pipeline::PipelineSpec = toml::from_str(&text).unwrap();
        spec.build(store_options()).unwrap()
    };
    assert!(
        spec(0).explain().contains("rank split contiguous"),
        "{}",
        spec(0).explain()
    );
    let whole = {
        let text = format!("source = \"s3://{BUCKET}/split-pq/\"\nformat = \"parquet\"\n");
        let spec: stoker_pipeline::PipelineSpec = toml::from_str(&text).unwrap();
        let p = spec.build(store_options()).unwrap();
        p.run().unwrap().count()
    };
    let mut rows = Vec::new();
    let mut lens = Vec::new();
    for rank in 0..3 {
        let got: Vec<String> = spec(rank)
            .run()
            .unwrap()
            .map(|i| format!("{:?}", i.unwrap()))
            .collect();
        lens.push(got.len());
        rows.extend(got);
    }
    assert!(lens.iter().all(|&n| n == whole / 3), "{lens:?} of {whole}");
    let n = rows.len();
    rows.sort();
    rows.dedup();
    assert_eq!(rows.len(), n, "a row read by two ranks");
}

/// Puts pyarrow's files (tests/fixtures/columnar/rows) at `split-pq/`.
fn put_parquet() {
    for f in ["a", "b", "c", "d"] {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/columnar/rows/{f}.parquet"));
        server()
            .put_object(
                BUCKET,
                &format!("split-pq/{f}.parquet"),
                &std::fs::read(p).unwrap(),
            )
            .unwrap();
    }
}

/// The Parquet fixtures at `split-pq/`, as a spec with extra lines.
fn parquet(extra: &str, rank_lines: &str, columnar: bool) -> Pipeline {
    put_parquet();
    let text = format!(
        "source = \"s3://{BUCKET}/split-pq/\"\nformat = \"parquet\"\nshuffle_shards = true\n\
         seed = 3\n{extra}\n[rank]\n{rank_lines}\n[options]\nthreads = 2\ncolumnar = {columnar}\n"
    );
    let spec: stoker_pipeline::PipelineSpec = toml::from_str(&text).unwrap();
    spec.build(store_options()).unwrap()
}

fn batches(p: &Pipeline) -> Vec<Result<String, String>> {
    p.run()
        .unwrap()
        .map(|i| i.map(|i| format!("{i:?}")).map_err(|e| e.to_string()))
        .collect()
}

#[test]
fn parquet_ranks_read_columns_straight_into_batches() {
    let batch = "[[ops]]\nop = \"batch\"\nsize = 7\n";
    let mut lens = Vec::new();
    for rank in 0..3 {
        let lines = format!("rank = {rank}\nworld = 3\n");
        let col = parquet(batch, &lines, true);
        assert!(
            col.explain().contains("source (columnar"),
            "{}",
            col.explain()
        );
        let rows = parquet(batch, &lines, false);
        let (a, b) = (batches(&col), batches(&rows));
        assert_eq!(
            a, b,
            "rank {rank}: the columnar path differs from the row path"
        );
        lens.push(a.len());
        // Resume at every batch.
        for k in 0..a.len() {
            let mut run = col.run().unwrap();
            for _ in 0..k {
                run.next().unwrap().unwrap();
            }
            let state = run.state().unwrap();
            drop(run);
            let rest: Vec<String> = col
                .resume(&state)
                .unwrap()
                .map(|i| format!("{:?}", i.unwrap()))
                .collect();
            let want: Vec<String> = a[k..].iter().map(|r| r.clone().unwrap()).collect();
            assert_eq!(rest, want, "rank {rank} resumed after {k}");
        }
    }
    assert!(lens.windows(2).all(|w| w[0] == w[1]), "{lens:?}");
}

#[test]
fn a_stale_index_fails_the_columnar_path_as_the_row_path() {
    // A shard index overrides the footers: a.parquet counted one too many, then one too
    // few. The index lives in another directory; its names are relative to it.
    put_parquet();
    let rows_of = |f: &str| -> u64 {
        let text =
            format!("source = \"s3://{BUCKET}/split-pq/{f}.parquet\"\nformat = \"parquet\"\n");
        let spec: stoker_pipeline::PipelineSpec = toml::from_str(&text).unwrap();
        spec.build(store_options()).unwrap().run().unwrap().count() as u64
    };
    let counts: Vec<u64> = ["a", "b", "c", "d"].iter().map(|f| rows_of(f)).collect();
    for delta in [1i64, -1] {
        let mut c = counts.clone();
        c[0] = (c[0] as i64 + delta) as u64;
        let shards: Vec<serde_json::Value> = ["a", "b", "c", "d"]
            .iter()
            .zip(&c)
            .map(|(f, n)| {
                serde_json::json!({"url": format!("../split-pq/{f}.parquet"), "records": n})
            })
            .collect();
        server()
            .put_object(
                BUCKET,
                "split-pq-index/i.json",
                serde_json::json!({ "shards": shards })
                    .to_string()
                    .as_bytes(),
            )
            .unwrap();
        let want = if delta > 0 {
            "ended after"
        } else {
            "more records than its count"
        };
        // Whichever rank's span holds the end of a.parquet reports it; both paths alike.
        let mut reported = 0;
        for rank in 0..2 {
            let mut outcomes = Vec::new();
            for columnar in [true, false] {
                let p = parquet(
                    "[[ops]]\nop = \"batch\"\nsize = 5\n",
                    &format!(
                        "rank = {rank}\nworld = 2\npolicy = \"pad\"\n\
                         shard_index = \"s3://{BUCKET}/split-pq-index/i.json\""
                    ),
                    columnar,
                );
                let got = batches(&p);
                if let Some(err) = got.iter().find_map(|r| r.as_ref().err()) {
                    assert!(err.contains(want) && err.contains("a.parquet"), "{err}");
                    reported += 1;
                }
                outcomes.push(got);
            }
            assert_eq!(
                outcomes[0], outcomes[1],
                "delta {delta} rank {rank}: paths differ"
            );
        }
        assert_eq!(
            reported, 2,
            "delta {delta}: one rank on each path reports it"
        );
    }
}
