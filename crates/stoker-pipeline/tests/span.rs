//! `Pipeline::span`: a run of entries `a..b` of each epoch's order. The spans of an epoch,
//! read one after the other, give what the whole pipeline gives (samples, their random
//! draws, batches aligned to the spans), and a bad span is refused with its reason.

mod common;

use common::*;
use stoker_pipeline::{Builtin, FieldOp, Pipeline, RankPolicy};

fn draw() -> Builtin {
    Builtin::Fields(FieldOp::RandomInt {
        to: "r".into(),
        below: 1_000_000,
    })
}

/// Every item of a run, as text (keys, values, random draws).
fn items(p: &Pipeline) -> Vec<String> {
    p.run()
        .unwrap()
        .map(|i| format!("{:?}", i.unwrap()))
        .collect()
}

/// The items of epoch `e` read span by span (cuts at `cuts`).
fn by_spans(p: &Pipeline, e: u64, cuts: &[u64]) -> Vec<String> {
    cuts.windows(2)
        .flat_map(|w| items(&p.clone().first_epoch(e).epochs(Some(1)).span(w[0], w[1])))
        .collect()
}

#[test]
fn the_spans_of_an_epoch_read_what_the_whole_epoch_reads() {
    let p = memory(100).shuffle_shards(true).map(draw()).seed(7);
    for e in 0..2 {
        let whole = items(&p.clone().first_epoch(e));
        assert_eq!(whole.len(), 100);
        assert_eq!(by_spans(&p, e, &[0, 1, 30, 64, 100]), whole, "epoch {e}");
        // An end past the order stops at it; an empty span reads nothing.
        assert_eq!(by_spans(&p, e, &[0, 64, 500]), whole);
        assert!(items(&p.clone().first_epoch(e).span(40, 40)).is_empty());
    }
    // Epochs differ (a new order, new draws), so the test above could fail.
    assert_ne!(
        items(&p.clone().first_epoch(0)),
        items(&p.clone().first_epoch(1))
    );
}

#[test]
fn batches_cut_at_the_spans_are_the_whole_runs_batches() {
    let p = memory(100)
        .shuffle_shards(true)
        .map(draw())
        .batch(8, false)
        .seed(3);
    let whole = items(&p);
    assert_eq!(whole.len(), 13);
    assert_eq!(by_spans(&p, 0, &[0, 16, 48, 96, 100]), whole);
}

#[test]
fn spans_of_files_and_of_record_shards() {
    // One sample per object: a span is samples.
    let f = files().shuffle_shards(true).map(draw()).seed(11);
    let whole = items(&f);
    let n = whole.len() as u64;
    assert!(n >= 4, "{n}");
    assert_eq!(by_spans(&f, 0, &[0, n / 3, n / 2, n]), whole);
    // Shards of many records: a span is whole shards, in the epoch's order.
    let s = shards().shuffle_shards(true).map(draw()).seed(11);
    let whole = items(&s);
    assert_eq!(whole.len(), 203);
    assert_eq!(s.epoch_len().unwrap(), (7, false));
    let (urls, one_each) = s.list_shards().unwrap();
    assert_eq!((urls.len(), one_each), (7, false));
    assert_eq!(f.list_shards().unwrap(), (f.list_shards().unwrap().0, true));
    assert_eq!(f.epoch_len().unwrap(), (n, true));
    assert_eq!(
        by_spans(&s, 1, &[0, 2, 3, 7]),
        items(&s.clone().first_epoch(1))
    );
    assert_eq!(by_spans(&s, 0, &[0, 2, 3, 7]), whole);
}

#[test]
fn a_bad_span_is_refused_with_its_reason() {
    let e = memory(10).span(5, 2).run().err().unwrap().to_string();
    assert!(e.contains("span 5..2"), "{e}");
    let e = shards()
        .shard_by_rank(0, 2, RankPolicy::Drop)
        .span(0, 2)
        .run()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("one sample per object"), "{e}");
    // Objects split by rank: the span is of the rank's share.
    let ranked = memory(20).shard_by_rank(1, 2, RankPolicy::Drop);
    assert_eq!(ranked.epoch_len().unwrap(), (10, true));
    let whole = items(&ranked);
    assert_eq!(whole.len(), 10);
    assert_eq!(by_spans(&ranked, 0, &[0, 4, 10]), whole);
}
