//! Resume equivalence: a run stopped anywhere and resumed from its state yields exactly
//! the items the uninterrupted run would have yielded next.

mod common;

use common::*;
use proptest::prelude::*;
use stoker_pipeline::{Builtin, Item, Pipeline, PipelineState, RankPolicy, RunOptions};

#[derive(Debug, Clone)]
struct Shape {
    source: u8,
    cycle: usize,
    shuffle_shards: bool,
    buffer: Option<usize>,
    batch: Option<(usize, bool)>,
    skip: Option<u64>,
    take: Option<u64>,
    rank: Option<(u32, u32, bool)>,
    epochs: u64,
    seed: u64,
    threads: usize,
    cache: bool,
}

fn build(s: &Shape) -> Pipeline {
    let mut p = match s.source {
        0 => shards().interleave(s.cycle),
        1 => files(),
        _ => memory(45),
    };
    p = p.shuffle_shards(s.shuffle_shards);
    if s.cache {
        p = p.cache();
    }
    if let Some((rank, world, pad)) = s.rank {
        let policy = if pad {
            RankPolicy::Pad
        } else {
            RankPolicy::Drop
        };
        p = p.shard_by_rank(rank % world, world, policy);
    }
    p = p.map(Builtin::RandomInt {
        to: "r".into(),
        below: 1000,
    });
    if let Some(b) = s.buffer {
        p = p.shuffle(b);
    }
    if let Some(n) = s.skip {
        p = p.skip(n);
    }
    if let Some((n, drop_last)) = s.batch {
        p = p.batch(n, drop_last);
    }
    if let Some(n) = s.take {
        p = p.take(n);
    }
    p.epochs(Some(s.epochs)).seed(s.seed).options(
        RunOptions::default()
            .with_threads(s.threads)
            .with_window(16),
    )
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        (
            0u8..3,
            1usize..4,
            any::<bool>(),
            proptest::option::of(1usize..40),
        ),
        (
            proptest::option::of((1usize..7, any::<bool>())),
            proptest::option::of(0u64..10),
            proptest::option::of(1u64..60),
            proptest::option::of((0u32..4, 1u32..4, any::<bool>())),
        ),
        (1u64..3, any::<u64>(), 1usize..4, any::<bool>()),
    )
        .prop_map(
            |(
                (source, cycle, shuffle_shards, buffer),
                (batch, skip, take, rank),
                (epochs, seed, threads, cache),
            )| Shape {
                source,
                cycle,
                shuffle_shards,
                buffer,
                batch,
                skip,
                take,
                rank,
                epochs,
                seed,
                threads,
                cache,
            },
        )
}

fn collect(run: impl Iterator<Item = Result<Item, stoker_core::Error>>) -> Vec<Item> {
    run.map(Result::unwrap).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn resuming_yields_exactly_the_rest(s in shape(), stop in 0.0f64..1.0, stop2 in 0.0f64..1.0) {
        let p = build(&s);
        let full = collect(p.run().unwrap());
        let k = ((full.len() as f64) * stop) as usize;
        let mut run = p.run().unwrap();
        let head: Vec<Item> = run.by_ref().take(k).map(Result::unwrap).collect();
        prop_assert_eq!(&head[..], &full[..k]);
        let state = run.state().unwrap();
        drop(run);
        // Through JSON, as a checkpoint file would carry it.
        let state = PipelineState::from_json(&state.to_json()).unwrap();
        prop_assert_eq!(state.yielded, k as u64);

        // Resume, stop again, resume again.
        let mut resumed = p.resume(&state).unwrap();
        let rest_len = full.len() - k;
        let k2 = ((rest_len as f64) * stop2) as usize;
        let mid: Vec<Item> = resumed.by_ref().take(k2).map(Result::unwrap).collect();
        prop_assert_eq!(&mid[..], &full[k..k + k2]);
        let state2 = resumed.state().unwrap();
        drop(resumed);
        let tail = collect(p.resume(&state2).unwrap());
        prop_assert_eq!(&tail[..], &full[k + k2..]);
    }
}

#[test]
fn a_state_from_another_pipeline_is_refused() {
    let p = memory(10).shuffle(4).seed(1);
    let mut run = p.run().unwrap();
    run.next();
    let st = run.state().unwrap();
    let e = memory(10).shuffle(4).seed(2).resume(&st).unwrap_err();
    assert!(
        e.to_string()
            .contains("not taken from a run of this pipeline"),
        "{e}"
    );
}

#[test]
fn the_state_is_small() {
    let p = shards()
        .interleave(3)
        .shuffle_shards(true)
        .shuffle(20)
        .batch(4, false)
        .seed(1);
    let mut run = p.run().unwrap();
    run.next();
    let json = run.state().unwrap().to_json();
    // Positions, not data: a 20-sample buffer is a few hundred bytes.
    assert!(json.len() < 2000, "{} bytes: {json}", json.len());
}
