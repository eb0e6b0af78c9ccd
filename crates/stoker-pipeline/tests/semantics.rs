//! Ordering, shuffling, rank splitting, batching and error policies.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use stoker_core::{OpMeta, Value};
use stoker_pipeline::{
    Builtin, ErrorPolicy, FieldOp, FnOp, Item, Pipeline, RankPolicy, RunOptions,
};

/// An operator that takes a while, so several workers overlap and finish out of order.
fn jittery() -> FnOp {
    FnOp::new(OpMeta::new("jitter"), |s, cx| {
        let us = cx.rng().below(300);
        std::thread::sleep(Duration::from_micros(us));
        Ok(Some(s))
    })
}

#[test]
fn output_does_not_depend_on_the_number_of_workers() {
    let p = |threads: usize| {
        shards()
            .interleave(3)
            .shuffle_shards(true)
            .map(jittery())
            .map(Builtin::Fields(FieldOp::RandomInt {
                to: "r".into(),
                below: 1_000_000,
            }))
            .shuffle(17)
            .batch(8, false)
            .seed(3)
            .options(
                RunOptions::default()
                    .with_threads(threads)
                    .with_autotune(false),
            )
    };
    let one: Vec<Item> = p(1).run().unwrap().map(Result::unwrap).collect();
    let four: Vec<Item> = p(4).run().unwrap().map(Result::unwrap).collect();
    assert_eq!(one, four);
    assert_eq!(one.iter().map(Item::samples).sum::<usize>(), 203);
}

#[test]
fn without_shuffling_the_order_is_the_source_order() {
    let got = all_keys(&files().options(RunOptions::default().with_threads(4)));
    let want: Vec<String> = (0..57).map(|i| format!("{:03}", i)).collect();
    assert_eq!(got, want);
    // Interleaving takes one line from each open shard in turn.
    let got = all_keys(&shards().interleave(2));
    assert_eq!(
        &got[..4],
        &[
            "shards/s0.txt:0",
            "shards/s1.txt:0",
            "shards/s0.txt:1",
            "shards/s2.txt:0"
        ]
    );
    assert_eq!(got.len(), 203);
}

#[test]
fn a_shuffle_is_a_permutation_and_differs_across_epochs_and_seeds() {
    let p = |seed| {
        shards()
            .interleave(2)
            .shuffle_shards(true)
            .shuffle(50)
            .epochs(Some(2))
            .seed(seed)
    };
    let all = all_keys(&p(1));
    let (e0, e1) = all.split_at(203);
    let mut a = e0.to_vec();
    let mut b = e1.to_vec();
    a.sort();
    b.sort();
    let plain = {
        let mut v = all_keys(&shards());
        v.sort();
        v
    };
    assert_eq!(a, plain);
    assert_eq!(b, plain);
    assert_ne!(e0, e1, "every epoch has its own order");
    assert_ne!(all_keys(&p(2))[..203], *e0, "the seed changes the order");
    assert_eq!(all_keys(&p(1)), all, "the same seed gives the same order");
    // Objects of a one-sample-per-object format are shuffled whole.
    let f = all_keys(&files().shuffle_shards(true).seed(5));
    assert_eq!(f.iter().collect::<HashSet<_>>().len(), 57);
    assert_ne!(f, all_keys(&files()));
}

#[test]
fn runs_from_a_first_epoch_read_what_one_longer_run_reads() {
    let p = shards()
        .interleave(2)
        .shuffle_shards(true)
        .map(Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 1_000_000,
        }))
        .shuffle(30)
        .seed(4);
    let items = |p: &stoker_pipeline::Pipeline| -> Vec<Item> {
        p.run().unwrap().map(Result::unwrap).collect()
    };
    let whole = items(&p.clone().epochs(Some(3)));
    // One run per epoch, each from its first epoch, is the same stream of samples and
    // random draws; two epochs from epoch 1 are its second and third.
    let per_epoch: Vec<Item> = (0..3)
        .flat_map(|e| items(&p.clone().first_epoch(e)))
        .collect();
    assert_eq!(per_epoch, whole);
    assert_eq!(
        items(&p.clone().first_epoch(1).epochs(Some(2))),
        whole[203..].to_vec()
    );
    // A state taken in such a run resumes with the same first epoch, and a state from
    // before it is refused.
    let from1 = p.clone().first_epoch(1);
    let mut run = from1.run().unwrap();
    for _ in 0..50 {
        run.next().unwrap().unwrap();
    }
    let state = run.state().unwrap();
    assert_eq!(state.epoch, 1);
    drop(run);
    let rest: Vec<Item> = from1.resume(&state).unwrap().map(Result::unwrap).collect();
    assert_eq!(rest, whole[203 + 50..406].to_vec());
    let e = from1
        .clone()
        .first_epoch(2)
        .resume(&state)
        .unwrap_err()
        .to_string();
    assert!(e.contains("before the pipeline's first epoch 2"), "{e}");
}

#[test]
fn every_rank_gets_the_same_number_of_samples() {
    for policy in [RankPolicy::Drop, RankPolicy::Pad] {
        for world in 1..=8u32 {
            for (name, total, p) in [
                (
                    "shards",
                    203usize,
                    shards().interleave(3).shuffle_shards(true),
                ),
                ("files", 57, files().shuffle_shards(true)),
            ] {
                let mut counts = Vec::new();
                let mut seen = HashSet::new();
                for rank in 0..world {
                    let k = all_keys(&p.clone().shard_by_rank(rank, world, policy).seed(9));
                    counts.push(k.len());
                    seen.extend(k);
                }
                let w = world as usize;
                let want = match policy {
                    RankPolicy::Drop => total / w,
                    RankPolicy::Pad => total.div_ceil(w),
                };
                assert!(
                    counts.iter().all(|&c| c == want),
                    "{name} {policy:?} world {world}: {counts:?}, want {want} each"
                );
                let covered = match policy {
                    RankPolicy::Drop => want * w,
                    RankPolicy::Pad => total,
                };
                assert_eq!(seen.len(), covered, "{name} {policy:?} world {world}");
            }
        }
    }
}

#[test]
fn a_rank_s_share_is_dealt_to_its_parts_whole_and_evenly() {
    // DataLoader workers: part k of `parts` of each rank's share. The parts of a rank
    // together are exactly the rank's share (nothing more dropped), dealt in turn; part k
    // has the same length on every rank.
    for policy in [RankPolicy::Drop, RankPolicy::Pad] {
        for world in [1u32, 2, 3] {
            for parts in [1u32, 2, 3] {
                for (name, p) in [
                    ("shards", shards().interleave(3).shuffle_shards(true)),
                    ("files", files().shuffle_shards(true)),
                ] {
                    let mut part_lens = vec![Vec::new(); parts as usize];
                    for rank in 0..world {
                        let whole = all_keys(&p.clone().shard_by_rank(rank, world, policy).seed(9));
                        let split: Vec<Vec<String>> = (0..parts)
                            .map(|part| {
                                all_keys(
                                    &p.clone()
                                        .shard_by_rank_part(rank, world, policy, part, parts)
                                        .seed(9),
                                )
                            })
                            .collect();
                        let dealt: Vec<Vec<String>> = (0..parts as usize)
                            .map(|k| {
                                whole
                                    .iter()
                                    .skip(k)
                                    .step_by(parts as usize)
                                    .cloned()
                                    .collect()
                            })
                            .collect();
                        assert_eq!(
                            split, dealt,
                            "{name} {policy:?} world {world} rank {rank} parts {parts}"
                        );
                        for (k, s) in split.iter().enumerate() {
                            part_lens[k].push(s.len());
                        }
                    }
                    for lens in &part_lens {
                        assert!(
                            lens.windows(2).all(|w| w[0] == w[1]),
                            "{name} {policy:?} world {world} parts {parts}: {part_lens:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batches_keep_or_drop_the_last_partial_one() {
    let sizes = |drop_last| -> Vec<usize> {
        files()
            .batch(10, drop_last)
            .run()
            .unwrap()
            .map(|i| i.unwrap().samples())
            .collect()
    };
    assert_eq!(sizes(false), vec![10, 10, 10, 10, 10, 7]);
    assert_eq!(sizes(true), vec![10; 5]);
    let b = files()
        .batch(4, true)
        .run()
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let b = b.into_batch().unwrap();
    assert!(matches!(b.get("txt"), Some(Value::List(l)) if l.len() == 4));
    // take / skip count items per epoch.
    let k = all_keys(&files().skip(3).take(2).epochs(Some(2)));
    assert_eq!(k, vec!["003", "004", "003", "004"]);
    // unbatch undoes batch.
    assert_eq!(
        all_keys(&files().batch(5, false).unbatch()),
        all_keys(&files())
    );
}

#[test]
fn errors_are_raised_with_their_place_by_default() {
    let p = |policy| {
        stoker_pipeline::Pipeline::from_url(
            &format!("s3://{BUCKET}/bad/"),
            store_options(),
            stoker_pipeline::FormatChoice::Fixed(std::sync::Arc::new(Lines)),
        )
        .options(RunOptions::default().with_errors(policy))
    };
    let mut run = p(ErrorPolicy::Raise).run().unwrap();
    let mut got = Vec::new();
    let err = loop {
        match run.next().unwrap() {
            Ok(i) => got.extend(keys(&i)),
            Err(e) => break e,
        }
    };
    assert_eq!(got, vec!["bad/a.txt:0", "bad/a.txt:1"]);
    let msg = err.to_string();
    assert!(msg.contains("s3://pipe/bad/a.txt"), "{msg}");
    assert!(
        msg.contains("record 2") && msg.contains("at byte 6") && msg.contains("lines"),
        "{msg}"
    );
    assert!(run.next().is_none(), "a raised error ends the run");

    // Skip: the rest arrives, and the skip is counted and listed.
    let mut run = p(ErrorPolicy::Skip).run().unwrap();
    let got: Vec<String> = run.by_ref().flat_map(|i| keys(&i.unwrap())).collect();
    assert_eq!(
        got,
        vec![
            "bad/a.txt:0",
            "bad/a.txt:1",
            "bad/a.txt:3",
            "bad/b.txt:0",
            "bad/b.txt:1"
        ]
    );
    let st = run.stats();
    assert_eq!(st.skipped, 1);
    assert!(
        st.skipped_errors[0].error.contains("record 2"),
        "{:?}",
        st.skipped_errors
    );
}

#[test]
fn an_operator_error_names_the_operator_and_the_sample() {
    let p = files().map(Builtin::Fields(FieldOp::ToTensor {
        field: "txt".into(),
        dtype: "int32".into(),
        shape: Some(vec![2]),
    }));
    let e = p.run().unwrap().find_map(Result::err).unwrap().to_string();
    assert!(
        e.contains("to_tensor(txt)") && e.contains("s3://pipe/files/000.txt"),
        "{e}"
    );
    // Skipped, every sample fails: nothing arrives, all are counted.
    let mut run = p
        .options(RunOptions::default().with_errors(ErrorPolicy::Skip))
        .run()
        .unwrap();
    assert_eq!(run.by_ref().count(), 0);
    assert_eq!(run.stats().skipped, 57);
}

#[test]
fn stats_name_every_stage_and_count_items() {
    let mut run = files()
        .map(Builtin::Fields(FieldOp::DecodeUtf8 {
            field: "txt".into(),
        }))
        .map(Builtin::Fields(FieldOp::FilterLen {
            field: "txt".into(),
            min: Some(7),
            max: None,
        }))
        .batch(5, false)
        .run()
        .unwrap();
    let n: usize = run.by_ref().map(|i| i.unwrap().samples()).sum();
    assert_eq!(n, 47); // "file 0".."file 9" are 6 bytes
    let st = run.stats();
    let names: Vec<&str> = st.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "source(files)",
            "map[decode_utf8(txt), filter_len(txt)]",
            "batch(5)",
            "prefetch(4)"
        ]
    );
    assert_eq!(st.stages[0].items_out, 57);
    assert_eq!(st.stages[1].items_in, 57);
    assert_eq!(st.stages[1].dropped, 10);
    assert_eq!(st.stages[2].items_out, 10);
    assert_eq!(st.samples, 47);
    assert!(st.stages[1].busy_s > 0.0);
}

/// The samples of each epoch of `p` (of `per_epoch` samples), as (key, r) pairs, in order.
fn epochs_of(p: &Pipeline, per_epoch: usize) -> Vec<Vec<(String, i64)>> {
    let mut all: Vec<(String, i64)> = Vec::new();
    for item in p.run().unwrap() {
        let item = item.unwrap();
        let rs: Vec<i64> = match &item {
            Item::Sample(s) => vec![s.get("r").and_then(Value::as_int).unwrap()],
            Item::Batch(b) => match b.get("r").unwrap() {
                Value::Tensor(t) => t.to_vec::<i64>().unwrap(),
                v => panic!("{v:?}"),
            },
        };
        all.extend(keys(&item).into_iter().zip(rs));
    }
    all.chunks(per_epoch).map(<[_]>::to_vec).collect()
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

#[test]
fn a_shuffle_over_objects_becomes_a_permutation_with_the_same_samples() {
    let random = || {
        Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 1000,
        })
    };
    let p = memory(40)
        .map(random())
        .shuffle(8)
        .map(Builtin::Fields(FieldOp::Len {
            field: "x".into(),
            to: "n".into(),
        }))
        .batch(4, false)
        .epochs(Some(2))
        .seed(5);
    let plan = p.explain();
    assert!(
        plan.contains("shuffle(8) became a seeded permutation"),
        "{plan}"
    );
    assert!(
        plan.contains("workers: map[random_int(r), len(x)]"),
        "{plan}"
    );
    let off = p
        .clone()
        .options(RunOptions::default().with_disabled_passes(["shuffle"]));
    assert!(
        off.explain().contains("  shuffle(8)\n"),
        "{}",
        off.explain()
    );
    let (on, as_written) = (epochs_of(&p, 40), epochs_of(&off, 40));
    assert_eq!(on.len(), 2);
    for (a, b) in on.iter().zip(&as_written) {
        // The same samples, each with the same draws, in another order.
        assert_eq!(a.len(), 40);
        assert_eq!(sorted(a), sorted(b));
    }
    assert_ne!(on[0], as_written[0]);
    // A new order every epoch, the same one for the same seed.
    assert_ne!(
        on[0].iter().map(|(k, _)| k).collect::<Vec<_>>(),
        on[1].iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
    assert_eq!(on, epochs_of(&p, 40));
    // And it resumes exactly.
    let mut run = p.run().unwrap();
    let head: Vec<Item> = run.by_ref().take(13).map(Result::unwrap).collect();
    let state = run.state().unwrap();
    let rest: Vec<Item> = run.map(Result::unwrap).collect();
    let resumed: Vec<Item> = p.resume(&state).unwrap().map(Result::unwrap).collect();
    assert_eq!(head.len(), 13);
    assert_eq!(rest, resumed);
}

#[test]
fn a_shuffle_buffer_over_records_moves_to_where_samples_are_smallest_and_changes_nothing() {
    // A map that makes each record 8 times its size (declared), then a random one, then
    // the buffer: the buffer moves before both, where records are smallest.
    let grow = FnOp::new(OpMeta::new("grow").with_size_ratio(8.0), |mut s, _| {
        let t = s.get("txt").and_then(Value::as_bytes).unwrap().to_vec();
        s.insert("txt", Value::Bytes(t.repeat(8).into()));
        Ok(Some(s))
    });
    let p = shards()
        .map(grow)
        .map(Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 1000,
        }))
        .shuffle(16)
        .epochs(Some(2))
        .seed(3);
    let plan = p.explain();
    assert!(
        plan.contains("moved shuffle(16) before grow, random_int(r)"),
        "{plan}"
    );
    assert!(
        plan.contains("  shuffle(16)\n  workers: map[grow, random_int(r)] (in order)\n"),
        "{plan}"
    );
    let off = p
        .clone()
        .options(RunOptions::default().with_disabled_passes(["shuffle"]));
    assert!(
        !off.explain().contains("moved shuffle"),
        "{}",
        off.explain()
    );
    // Exactly the same items in the same order: the maps it passed keep every sample and
    // draw by the sample's position.
    let (on, as_written) = (epochs_of(&p, 203), epochs_of(&off, 203));
    assert_eq!(on.len(), 2);
    for (a, b) in on.iter().zip(&as_written) {
        assert_eq!(a[..5], b[..5]);
        assert_eq!(a, b);
    }
}

#[test]
fn an_unknown_pass_to_disable_is_refused_naming_the_passes() {
    let e = memory(3)
        .options(RunOptions::default().with_disabled_passes(["shufle"]))
        .run()
        .unwrap_err();
    assert!(
        e.to_string().contains("unknown optimizer pass \"shufle\""),
        "{e}"
    );
    assert!(
        e.to_string().contains("shuffle, batching, cache, fusion"),
        "{e}"
    );
}

#[test]
fn a_map_after_a_filter_after_a_shuffle_runs_after_the_filter() {
    // The filter keeps even `x`; the map after it makes `x` odd. Were the map moved ahead
    // of the shuffle (it keeps every sample), the filter would see odd numbers only.
    let even = FnOp::new(OpMeta::new("even").filter(), |s, _| {
        let keep = matches!(s.get("x"), Some(Value::Int(x)) if x % 2 == 0);
        Ok(keep.then_some(s))
    });
    let plus_one = FnOp::new(OpMeta::new("plus_one"), |mut s, _| {
        let Some(Value::Int(x)) = s.get("x").cloned() else {
            unreachable!("x is an int")
        };
        s.insert("x", x + 1);
        Ok(Some(s))
    });
    let p = memory(20).shuffle(4).map(even).map(plus_one);
    let mut got: Vec<i64> = p
        .run()
        .unwrap()
        .map(|i| match i.unwrap().into_sample().unwrap().get("x") {
            Some(Value::Int(x)) => *x,
            other => panic!("{other:?}"),
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..10).map(|i| 2 * i + 1).collect::<Vec<_>>());
    assert!(!p.explain().contains("moved plus_one"), "{}", p.explain());
}

#[test]
fn a_disk_cache_changes_speed_not_results_and_serves_later_runs() {
    for (name, p) in [("shards", shards().interleave(2)), ("files", files())] {
        let dir = tempfile::tempdir().unwrap();
        let p = p
            .shuffle_shards(true)
            .map(Builtin::Fields(FieldOp::RandomInt {
                to: "r".into(),
                below: 1_000_000,
            }))
            .shuffle(10)
            .seed(4);
        let plain: Vec<Item> = p
            .clone()
            .epochs(Some(3))
            .run()
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let cached_p = p.clone().epochs(Some(3)).cache_on_disk(dir.path());
        let mut run = cached_p.run().unwrap();
        let cached: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
        assert_eq!(plain, cached, "{name}");
        let gets_cached = run.stats().storage.unwrap().get_requests;
        let mut one = p.clone().epochs(Some(1)).run().unwrap();
        one.by_ref().for_each(drop);
        let gets_one_epoch = one.stats().storage.unwrap().get_requests;
        assert_eq!(
            gets_cached, gets_one_epoch,
            "{name}: epochs 2 and 3 came from disk"
        );
        assert!(std::fs::read_dir(dir.path()).unwrap().count() > 0);
        // A later run over the same objects reads nothing from storage.
        let mut later = cached_p.run().unwrap();
        let again: Vec<Item> = later.by_ref().map(Result::unwrap).collect();
        assert_eq!(again, plain, "{name}: later run");
        assert_eq!(later.stats().storage.unwrap().get_requests, 0, "{name}");
    }
}

/// The test server's store options, for pipelines built here.
fn server_options(s: &stoker_testserver::TestServer) -> stoker_store::StoreOptions {
    stoker_store::StoreOptions::default()
        .with_endpoint(s.endpoint())
        .with_credentials(s.access_key(), s.secret_key())
        .with_region(s.region())
}

/// A run's lines (`Lines` samples' `txt`), with the GETs it made.
fn lines_and_gets(p: &stoker_pipeline::Pipeline) -> (Vec<String>, u64) {
    let mut run = p.run().unwrap();
    let t = run
        .by_ref()
        .map(|i| {
            let s = i.unwrap().into_sample().unwrap();
            String::from_utf8(s.get("txt").unwrap().as_bytes().unwrap().to_vec()).unwrap()
        })
        .collect();
    (t, run.stats().storage.unwrap().get_requests)
}

#[test]
fn a_disk_cache_never_serves_a_changed_object() {
    let s = stoker_testserver::TestServer::start_blocking(
        stoker_testserver::ServerOptions::new().bucket("dcache"),
    )
    .unwrap();
    s.put_object("dcache", "t/a.txt", b"a0\na1\n").unwrap();
    s.put_object("dcache", "t/b.txt", b"b0\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = stoker_pipeline::Pipeline::from_url(
        "s3://dcache/t/",
        server_options(&s),
        stoker_pipeline::FormatChoice::Fixed(std::sync::Arc::new(Lines)),
    )
    .cache_on_disk(dir.path());
    assert_eq!(
        lines_and_gets(&p),
        (vec!["a0".into(), "a1".into(), "b0".into()], 2)
    );
    assert_eq!(lines_and_gets(&p).1, 0);
    // Same size, new content: the cached copy of the old version is not used.
    s.put_object("dcache", "t/a.txt", b"A0\nA1\n").unwrap();
    assert_eq!(
        lines_and_gets(&p),
        (vec!["A0".into(), "A1".into(), "b0".into()], 1)
    );
}

#[test]
fn a_list_of_keys_is_read_in_its_order_and_its_objects_versions_are_known() {
    let s = stoker_testserver::TestServer::start_blocking(
        stoker_testserver::ServerOptions::new().bucket("keys"),
    )
    .unwrap();
    s.put_object("keys", "t/a.txt", b"a0\na1\n").unwrap();
    s.put_object("keys", "t/sub/b.txt", b"b0\n").unwrap();
    s.put_object("keys", "t/c.txt", b"c0\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source = |keys: &[&str]| {
        stoker_pipeline::Pipeline::from_url(
            "s3://keys/t",
            server_options(&s),
            stoker_pipeline::FormatChoice::Fixed(std::sync::Arc::new(Lines)),
        )
        .keys(keys.iter().map(|k| k.to_string()).collect())
    };
    let p = source(&["sub/b.txt", "a.txt"]).cache_on_disk(dir.path());
    // Not c.txt, which a listing would have read; in the list's order.
    assert_eq!(
        lines_and_gets(&p),
        (vec!["b0".into(), "a0".into(), "a1".into()], 2)
    );
    assert_eq!(lines_and_gets(&p).1, 0);
    // The lookups give the versions a listing gives: a changed object is read anew.
    s.put_object("keys", "t/a.txt", b"A0\nA1\n").unwrap();
    assert_eq!(
        lines_and_gets(&p),
        (vec!["b0".into(), "A0".into(), "A1".into()], 1)
    );
    // A missing key fails the run where it reaches it, naming the object; with a disk
    // cache, which looks every key up first, at its start.
    let missing = source(&["a.txt", "nope.txt"]);
    let items: Vec<_> = missing.run().unwrap().collect();
    assert!(
        items[0].is_ok() && items[1].is_ok(),
        "a.txt's two lines first"
    );
    let e = items.last().unwrap().as_ref().expect_err("nope.txt fails");
    assert_eq!(e.kind, stoker_core::ErrorKind::NotFound);
    assert_eq!(e.object.as_deref(), Some("s3://keys/t/nope.txt"), "{e}");
    let Err(e) = missing.cache_on_disk(dir.path()).run() else {
        panic!("a run over a missing key with a disk cache started");
    };
    assert_eq!(e.object.as_deref(), Some("s3://keys/t/nope.txt"), "{e}");
    let Err(e) = source(&[]).run() else {
        panic!("a run over no keys started");
    };
    assert!(e.to_string().contains("list of keys is empty"), "{e}");
}

#[test]
fn a_cache_changes_speed_not_results() {
    for (name, p) in [("shards", shards().interleave(2)), ("files", files())] {
        let p = p
            .shuffle_shards(true)
            .map(Builtin::Fields(FieldOp::RandomInt {
                to: "r".into(),
                below: 1_000_000,
            }))
            .shuffle(10)
            .epochs(Some(3))
            .seed(4);
        let plain: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
        let mut run = p.clone().cache().run().unwrap();
        let cached: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
        assert_eq!(plain, cached, "{name}");
        let gets_cached = run.stats().storage.unwrap().get_requests;
        let mut one = p.epochs(Some(1)).run().unwrap();
        one.by_ref().for_each(drop);
        let gets_one_epoch = one.stats().storage.unwrap().get_requests;
        assert_eq!(
            gets_cached, gets_one_epoch,
            "{name}: epochs 2 and 3 came from the cache"
        );
    }
}

/// The bytes of every file in `dir`. While a run writes, a listing can race a rename (a
/// file listed under its temporary name is gone when asked for its size, or is listed
/// under both names): so the smallest of three measurements, which a real excess (files
/// stay) survives.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    (0..3)
        .map(|_| {
            std::fs::read_dir(dir)
                .unwrap()
                .filter_map(|e| Some(e.ok()?.metadata().ok()?.len()))
                .sum()
        })
        .min()
        .unwrap()
}

/// What an unbounded disk cache of `p` stores, in bytes.
fn cache_bytes(p: &stoker_pipeline::Pipeline, n: u64) -> u64 {
    let full = tempfile::tempdir().unwrap();
    let mut run = p.clone().cache_on_disk(full.path()).run().unwrap();
    run.by_ref().for_each(drop);
    let c = run.stats().cache.unwrap();
    assert_eq!((c.stored, c.over_limit, c.limit), (n, 0, None));
    assert_eq!(
        dir_bytes(full.path()),
        c.stored_bytes + c.stored_bytes.to_string().len() as u64,
        "the entries and the count"
    );
    c.stored_bytes
}

/// The line shards (7) or the small files (57, one sample per object), and their count,
/// with the store's block cache off, so every shard not served by the pipeline's cache is
/// fetched again.
fn uncached_store(what: &str) -> (stoker_pipeline::Pipeline, u64) {
    let (format, n) = match what {
        "shards" => (
            stoker_pipeline::FormatChoice::Fixed(std::sync::Arc::new(Lines)),
            7,
        ),
        _ => (stoker_pipeline::FormatChoice::Files, 57),
    };
    let p = stoker_pipeline::Pipeline::from_url(
        &format!("s3://{BUCKET}/{what}/"),
        store_options().with_cache_memory(0),
        format,
    )
    .interleave(2)
    .shuffle_shards(true)
    .map(Builtin::Fields(FieldOp::RandomInt {
        to: "r".into(),
        below: 1_000_000,
    }))
    .shuffle(10)
    .seed(9)
    .epochs(Some(3));
    (p, n)
}

#[test]
fn a_disk_cache_over_its_size_limit_keeps_what_fits_and_reads_the_rest() {
    for what in ["shards", "files"] {
        limited_disk_cache(what);
    }
}

fn limited_disk_cache(what: &str) {
    let (p, n) = uncached_store(what);
    let plain: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
    let mut run = p.run().unwrap();
    run.by_ref().for_each(drop);
    let gets_plain = run.stats().storage.unwrap().get_requests;
    // Half of what all shards take: some fit, some do not.
    let limit = cache_bytes(&p, n) / 2;
    let dir = tempfile::tempdir().unwrap();
    let limited = p.clone().cache_on_disk_limited(dir.path(), limit);
    let mut run = limited.run().unwrap();
    let mut got = Vec::new();
    for item in run.by_ref() {
        got.push(item.unwrap());
        assert!(
            dir_bytes(dir.path()) <= limit,
            "the directory stays within the limit"
        );
    }
    assert_eq!(got, plain, "{what}: identical samples in all three epochs");
    let stats = run.stats();
    let c = stats.cache.clone().unwrap();
    assert!(c.stored > 0 && c.over_limit > 0, "{what}: {c:?}");
    assert_eq!(c.stored + c.over_limit, n, "{what}: {c:?}");
    assert_eq!(
        c.hits,
        2 * c.stored,
        "{what}: epochs 2 and 3 read the stored shards from disk"
    );
    assert_eq!(c.limit, Some(limit));
    assert!(
        c.stored_bytes <= limit && c.bytes == c.stored_bytes,
        "{c:?}"
    );
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "samples"))
        .collect();
    assert_eq!(files.len() as u64, c.stored);
    let on_disk: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(on_disk, c.bytes);
    // The shards over the limit were fetched in every epoch, the others once.
    let gets = stats.storage.unwrap().get_requests;
    assert!(
        gets > gets_plain / 3 && gets < gets_plain,
        "{what}: {gets} of {gets_plain}"
    );

    // A later run over the full directory stores nothing more and gives the same samples.
    let mut later = limited.run().unwrap();
    let again: Vec<Item> = later.by_ref().map(Result::unwrap).collect();
    assert_eq!(again, plain);
    let c2 = later.stats().cache.unwrap();
    assert_eq!((c2.stored, c2.over_limit), (0, c.over_limit));
    assert_eq!(c2.hits, 3 * c.stored);
    assert!(dir_bytes(dir.path()) <= limit);
}

#[test]
fn runs_sharing_a_limited_disk_cache_stay_within_it_and_agree() {
    let (p, n) = uncached_store("shards");
    let plain: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
    let dir = tempfile::tempdir().unwrap();
    let limit = cache_bytes(&p, n) / 2;
    let limited = p.cache_on_disk_limited(dir.path(), limit);
    let outs: Vec<Vec<Item>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let l = limited.clone();
                s.spawn(move || l.run().unwrap().map(Result::unwrap).collect())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in &outs {
        assert_eq!(o, &plain);
    }
    assert!(dir_bytes(dir.path()) <= limit);
    let mut later = limited.run().unwrap();
    assert_eq!(
        later.by_ref().map(Result::unwrap).collect::<Vec<_>>(),
        plain
    );
    let c = later.stats().cache.unwrap();
    assert!(c.hits > 0 && c.over_limit > 0, "{c:?}");
}

#[test]
fn a_cache_size_needs_a_directory_in_a_spec() {
    let build = |ops: &str| {
        let spec: stoker_pipeline::PipelineSpec = toml::from_str(&format!(
            "source = \"s3://{BUCKET}/shards/\"\nformat = \"jsonl\"\n{ops}"
        ))
        .unwrap();
        spec.build(stoker_store::StoreOptions::default())
    };
    let err = build("[[ops]]\nop = \"cache\"\nsize = \"1MiB\"\n").unwrap_err();
    assert!(err.to_string().contains("give dir"), "{err}");
    let err = build("[[ops]]\nop = \"cache\"\ndir = \"/tmp/x\"\nsize = \"lots\"\n").unwrap_err();
    assert!(err.to_string().contains("cache size"), "{err}");
    let p = build("[[ops]]\nop = \"cache\"\ndir = \"/tmp/x\"\nsize = \"20GiB\"\n").unwrap();
    assert!(
        format!("{p:?}").contains("cache_size: Some(21474836480)"),
        "{p:?}"
    );
}

#[test]
fn a_one_epoch_run_keeps_no_blocks_in_memory_and_two_epochs_do() {
    let mut one = shards().interleave(2).epochs(Some(1)).run().unwrap();
    one.by_ref().for_each(drop);
    let m = one.stats().storage.unwrap();
    assert!(m.bytes_read > 0);
    assert_eq!(
        (
            m.cache.memory_capacity,
            m.cache.memory_bytes,
            m.cache.inserts
        ),
        (0, 0, 0),
        "{:?}",
        m.cache
    );
    // Asked for explicitly, it is there.
    let asked = stoker_pipeline::Pipeline::from_url(
        &format!("s3://{BUCKET}/shards/"),
        store_options().with_cache_memory(64 << 20),
        stoker_pipeline::FormatChoice::Fixed(std::sync::Arc::new(Lines)),
    );
    let mut run = asked.run().unwrap();
    run.by_ref().for_each(drop);
    let m = run.stats().storage.unwrap();
    assert_eq!(m.cache.memory_capacity, 64 << 20);
    assert!(m.cache.memory_bytes > 0);
    // Two epochs: the second is served by the block cache.
    let mut two = shards().interleave(2).epochs(Some(2)).run().unwrap();
    two.by_ref().for_each(drop);
    let m2 = two.stats().storage.unwrap();
    assert!(m2.cache.memory_capacity > 0 && m2.cache.memory_bytes > 0);
    assert!(m2.cache.memory_hits > 0, "{:?}", m2.cache);
    assert_eq!(m2.get_requests, one.stats().storage.unwrap().get_requests);
}

#[test]
fn operators_are_profiled_and_run_explain_compares_measurements_with_declarations() {
    // It declares that it makes a record a tenth of its size; in fact it makes it 20 times.
    let grow = FnOp::new(OpMeta::new("grow").with_size_ratio(0.1), |mut s, _| {
        let t = s.get("txt").and_then(Value::as_bytes).unwrap().to_vec();
        s.insert("txt", Value::Bytes(t.repeat(20).into()));
        Ok(Some(s))
    });
    let p = shards().map(grow).shuffle(16).seed(1);
    // Planned from the declaration: the buffer stays after it, as written.
    assert!(!p.explain().contains("moved shuffle"), "{}", p.explain());
    let mut run = p.run().unwrap();
    assert_eq!(run.by_ref().map(Result::unwrap).count(), 203);
    let st = run.stats();
    assert_eq!(st.operators.len(), 1);
    let op = &st.operators[0];
    assert_eq!((op.name.as_str(), op.index), ("grow", 0));
    // One sample in eight, by its number in the epoch: 203 samples, 26 of them.
    assert_eq!(op.samples, 26);
    let r = op.size_ratio.unwrap();
    assert!(r > 3.0, "measured ratio {r}");
    assert_eq!(op.hint_size_ratio, Some(0.1));
    assert!(op.ns_per_sample.unwrap() > 0.0);
    let e = run.explain();
    assert!(e.contains("measured (one sample in 8):"), "{e}");
    assert!(e.contains("  grow: "), "{e}");
    assert!(e.contains("declared x0.10"), "{e}");
    // Planned from the measurement, the buffer would go before it.
    assert!(
        e.contains("with these measurements the plan would be"),
        "{e}"
    );
    assert!(e.contains("moved shuffle(16) before grow"), "{e}");
    assert!(e.contains("grow x"), "{e}");
    assert!(e.contains(" measured"), "{e}");
}

#[test]
fn a_multi_epoch_run_caches_what_its_deterministic_head_makes_and_yields_the_same() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    // A costly deterministic operator (it declares 1 ms a sample, doubling its size), then a
    // random one: the samples as the first leaves them are worth keeping for later epochs.
    let calls = Arc::new(AtomicUsize::new(0));
    let costly = {
        let calls = calls.clone();
        FnOp::new(
            OpMeta::new("costly").with_cost_ns(1e6).with_size_ratio(2.0),
            move |mut s, _| {
                calls.fetch_add(1, Ordering::Relaxed);
                let t = s.get("txt").and_then(Value::as_bytes).unwrap().to_vec();
                s.insert("txt", Value::Bytes(t.repeat(2).into()));
                Ok(Some(s))
            },
        )
    };
    let p = files()
        .map(costly)
        .map(Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 1000,
        }))
        .epochs(Some(3))
        .seed(4);
    let mut run = p.run().unwrap();
    let cached: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
    let st = run.stats();
    let c = st.sample_cache.clone().expect("the run keeps a cache");
    assert_eq!((c.stored, c.hits, c.over_limit), (57, 114, 0));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        57,
        "the head ran once a sample"
    );
    // Nor was any object fetched again in epochs 2 and 3.
    assert_eq!(st.storage.as_ref().unwrap().objects_fetched, 57);
    let plan = run.explain();
    assert!(plan.contains("a cache after map[costly]: "), "{plan}");
    // Without the pass: the head runs every epoch, and the samples are the same.
    calls.store(0, Ordering::Relaxed);
    let off = p
        .clone()
        .options(RunOptions::default().with_disabled_passes(["cache"]));
    let mut run = off.run().unwrap();
    let uncached: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
    let st = run.stats();
    assert!(st.sample_cache.is_none());
    assert_eq!(st.storage.unwrap().objects_fetched, 3 * 57);
    assert_eq!(calls.load(Ordering::Relaxed), 3 * 57);
    assert_eq!(cached.len(), 3 * 57);
    assert_eq!(cached, uncached);
}

#[test]
fn the_sample_cache_stays_within_its_limit_and_what_does_not_fit_is_made_again() {
    // Samples of 1 MiB after the head, 8 MiB of budget: the cache may hold 4 MiB.
    let grow = FnOp::new(
        OpMeta::new("grow").with_cost_ns(1e6).with_size_ratio(1.0),
        |mut s, _| {
            s.insert("big", Value::Bytes(vec![1u8; 1 << 20].into()));
            Ok(Some(s))
        },
    );
    let p = files()
        .map(grow)
        .map(Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 1000,
        }))
        .epochs(Some(2))
        .options(
            RunOptions::default()
                .with_memory_limit(8 << 20)
                .with_threads(2),
        );
    let mut run = p.run().unwrap();
    let n = run.by_ref().map(Result::unwrap).count();
    assert_eq!(n, 2 * 57);
    let st = run.stats();
    let c = st.sample_cache.expect("a cache: the declared sizes fit");
    assert_eq!(c.limit, Some(4 << 20));
    assert!(c.bytes <= 4 << 20, "{c:?}");
    assert!(c.stored >= 1 && c.over_limit >= 1, "{c:?}");
    assert!(c.hits >= 1 && c.hits <= c.stored, "{c:?}");
}

#[test]
fn a_cache_of_undeclared_size_is_measured_as_it_fills_and_dropped_if_the_epoch_would_not_fit() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    // A costly deterministic head that declares no size ratio (like an audio decoder), making
    // each sample `grow` bytes larger, then a random operator.
    let pipeline = |grow: usize, calls: Arc<AtomicUsize>, memory: u64| {
        let head = FnOp::new(OpMeta::new("head").with_cost_ns(1e6), move |mut s, _| {
            calls.fetch_add(1, Ordering::Relaxed);
            s.insert("big", Value::Bytes(vec![7u8; grow].into()));
            Ok(Some(s))
        });
        files()
            .map(head)
            .map(Builtin::Fields(FieldOp::RandomInt {
                to: "r".into(),
                below: 1000,
            }))
            .epochs(Some(2))
            .seed(9)
            .options(
                RunOptions::default()
                    .with_memory_limit(memory)
                    .with_threads(2),
            )
    };
    let off = |p: stoker_pipeline::Pipeline| {
        p.options(
            RunOptions::default()
                .with_memory_limit(64 << 20)
                .with_threads(2)
                .with_disabled_passes(["cache"]),
        )
    };
    // Small samples: the measured epoch fits, the cache is kept, and the second epoch
    // neither fetches nor runs the head.
    let calls = Arc::new(AtomicUsize::new(0));
    let p = pipeline(16, calls.clone(), 64 << 20);
    let mut run = p.run().unwrap();
    assert!(
        run.explain().contains("is measured as it fills"),
        "{}",
        run.explain()
    );
    let kept: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
    let st = run.stats();
    let c = st.sample_cache.clone().expect("a cache");
    assert!(!c.dropped, "{c:?}");
    assert!(c.projected.is_some(), "{c:?}");
    assert_eq!((c.stored, c.hits), (57, 57), "{c:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 57);
    assert_eq!(st.storage.as_ref().unwrap().objects_fetched, 57);
    assert!(
        run.explain().contains("within its limit"),
        "{}",
        run.explain()
    );
    let mut run = off(pipeline(16, Arc::default(), 64 << 20)).run().unwrap();
    assert_eq!(kept, run.by_ref().map(Result::unwrap).collect::<Vec<_>>());
    // Samples of 1 MiB, a cache of 4 MiB: the first samples show that the epoch (57 MiB)
    // would not fit, so the cache gives its bytes back and stores nothing more; every
    // sample is still read and made, the same as without the pass.
    let calls = Arc::new(AtomicUsize::new(0));
    let mut run = pipeline(1 << 20, calls.clone(), 8 << 20).run().unwrap();
    let dropped: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
    let st = run.stats();
    let c = st.sample_cache.clone().expect("a cache");
    assert!(c.dropped, "{c:?}");
    assert!(c.projected.unwrap() > 4 << 20, "{c:?}");
    assert_eq!((c.hits, c.bytes), (0, 0), "{c:?}");
    assert!(c.stored < 32, "{c:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 2 * 57);
    assert_eq!(st.storage.as_ref().unwrap().objects_fetched, 2 * 57);
    let e = run.explain();
    assert!(e.contains("over its limit of 4.0 MiB: dropped"), "{e}");
    let mut run = off(pipeline(1 << 20, Arc::default(), 8 << 20))
        .run()
        .unwrap();
    assert_eq!(
        dropped,
        run.by_ref().map(Result::unwrap).collect::<Vec<_>>()
    );
}
