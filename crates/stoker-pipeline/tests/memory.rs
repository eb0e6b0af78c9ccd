//! A pipeline over more data than its memory budget, with a slow consumer, stays within
//! the budget: the source waits, nothing piles up.

mod common;

use std::time::Duration;

use common::*;
use stoker_core::{Batch, Error, OpMeta, Sample};
use stoker_pipeline::{FormatChoice, OpContext, Pipeline, RunOptions, SampleOp};

/// The 96 objects of 1 MiB.
fn big() -> Pipeline {
    static PUT: std::sync::Once = std::sync::Once::new();
    PUT.call_once(|| {
        let s = server();
        let mib = 1usize << 20;
        for i in 0..96 {
            s.put_object(BUCKET, &format!("big/{i:03}.bin"), &vec![i as u8; mib])
                .unwrap();
        }
    });
    Pipeline::from_url(
        &format!("s3://{BUCKET}/big/"),
        store_options().with_cache_memory(0),
        FormatChoice::Files,
    )
}

/// A filter that keeps everything (a filter stays after a shuffle buffer), and on batches
/// keeps them too: each a parallel stage after the sequential one before it (slow enough,
/// 200 us a call, to stay on the workers).
#[derive(Debug)]
struct KeepAll;

impl SampleOp for KeepAll {
    fn meta(&self) -> OpMeta {
        OpMeta::new("keep_all").filter()
    }
    fn apply(&self, s: Sample, _: &mut OpContext) -> Result<Option<Sample>, Error> {
        std::thread::sleep(Duration::from_micros(200));
        Ok(Some(s))
    }
    fn apply_batch(&self, b: Batch, _: &mut OpContext) -> Option<Result<Option<Batch>, Error>> {
        std::thread::sleep(Duration::from_micros(200));
        Some(Ok(Some(b)))
    }
}

#[test]
fn a_slow_consumer_holds_the_pipeline_within_its_budget() {
    held_within_the_budget(big().shuffle(4).batch(2, false));
}

#[test]
fn maps_after_the_shuffle_and_the_batch_hold_the_pipeline_within_its_budget() {
    // Items on the workers after the tail count in the budget, and a full stage stops the
    // tail, so the source stops as without them.
    held_within_the_budget(big().shuffle(4).map(KeepAll).batch(2, false).map(KeepAll));
}

#[test]
fn a_memory_limit_among_the_store_options_is_the_run_s_budget() {
    // `memory_limit` given with the store's options (as `stoker.from_url(...,
    // memory_limit=...)` and a spec's `[store]` table give it) bounds the run like the run
    // option; the run option wins when both are set.
    let opts = store_options()
        .with_cache_memory(0)
        .with_memory_limit(24 << 20);
    let p = Pipeline::from_url(&format!("s3://{BUCKET}/big/"), opts, FormatChoice::Files);
    big(); // the objects
    let mut run = p.clone().run().unwrap();
    run.next().unwrap().unwrap();
    assert_eq!(run.stats().memory.limit, 24 << 20);
    drop(run);
    let both = p.options(RunOptions::default().with_memory_limit(16 << 20));
    let mut run = both.run().unwrap();
    run.next().unwrap().unwrap();
    assert_eq!(run.stats().memory.limit, 16 << 20);
}

#[test]
fn what_operators_add_to_samples_counts_in_the_budget() {
    // Tiny samples that an operator makes 1 MiB each (as a decode makes a JPEG several
    // times larger), to a slow consumer, through an 8 MiB budget. The budget used to hold
    // only what the source read (bytes), so the window (1,024 samples) was the only bound.
    let mib = 1usize << 20;
    let grow = stoker_pipeline::FnOp::new(OpMeta::new("grow"), move |mut s, _| {
        s.insert("big", bytes::Bytes::from(vec![7u8; mib]));
        Ok(Some(s))
    });
    let limit: u64 = 8 << 20;
    let p = common::memory(96).map(grow).batch(2, false).options(
        RunOptions::default()
            .with_memory_limit(limit)
            .with_threads(2),
    );
    let mut run = p.run().unwrap();
    let mut ahead = 0;
    let mut n = 0;
    while let Some(item) = run.next() {
        n += item.unwrap().samples() as u64;
        let st = run.stats();
        ahead = ahead.max(st.stages[0].items_out - st.samples);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(n, 96);
    let peak = run.stats().memory.peak;
    // About the budget's worth of grown samples in flight (plus the 16 admitted before
    // the first one is measured), and the budget saw them.
    assert!(
        ahead <= 24,
        "{ahead} samples of 1 MiB in flight with an 8 MiB budget"
    );
    assert!(peak > limit / 2 && peak <= 3 * limit, "budget peak {peak}");
}

fn held_within_the_budget(p: Pipeline) {
    let limit: u64 = 24 << 20;
    let p = p.options(
        RunOptions::default()
            .with_memory_limit(limit)
            .with_threads(2),
    );
    let mut run = p.run().unwrap();
    let mut samples = 0;
    let mut held_max = 0;
    // Give the source all the time it wants: it still stops where the budget is full.
    samples += run.next().unwrap().unwrap().samples();
    std::thread::sleep(Duration::from_millis(500));
    let ahead = run.stats().stages[0].items_out;
    assert!(
        ahead < 48,
        "the source ran {ahead} samples ahead of a consumer at 2"
    );
    while let Some(item) = run.next() {
        samples += item.unwrap().samples();
        held_max = held_max.max(run.stats().memory.held);
        // The consumer is much slower than the source.
        std::thread::sleep(Duration::from_millis(15));
    }
    assert_eq!(samples, 96);
    let st = run.stats();
    let (peak, lim) = (st.memory.peak, st.memory.limit);
    assert_eq!(lim, limit);
    assert!(peak <= limit, "budget peak {peak} over {limit}");
    // Four times the budget went through, and the budget was used (it bounds, and it is
    // the bound that held: the pipeline would have read ahead much further).
    assert!(held_max > limit / 2, "held at most {held_max} bytes");
    // (The process's RSS is checked in a process of its own: crates/stoker/tests/run.rs.)
}
