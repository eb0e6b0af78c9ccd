//! Resume equivalence: a run stopped anywhere and resumed from its state yields exactly
//! the items the uninterrupted run would have yielded next.

mod common;

use common::*;
use proptest::prelude::*;
use std::time::Duration;

use stoker_core::{Batch, Error, OpMeta, Sample, Value};
use stoker_pipeline::{
    Builtin, ColumnOp, FieldOp, FnOp, Item, ItemPos, OpContext, Pipeline, PipelineState,
    RankPolicy, RunOptions, SampleOp, StageState,
};

#[derive(Debug, Clone)]
struct Shape {
    source: u8,
    cycle: usize,
    shuffle_shards: bool,
    /// A batch of this size, an operator on batches, an unbatch and a per-sample operator,
    /// before the shuffle buffer.
    unbatch: Option<usize>,
    buffer: Option<usize>,
    batch: Option<(usize, bool)>,
    /// A shuffle of the batches, after the batch.
    batch_buffer: Option<usize>,
    skip: Option<u64>,
    take: Option<u64>,
    rank: Option<(u32, u32, bool)>,
    epochs: u64,
    seed: u64,
    threads: usize,
    cache: bool,
    /// Maps and filters after the sequential stages (parallel stages): a filter after the
    /// shuffle buffer (which keeps it there), an operator on batches after the batch.
    tail_maps: bool,
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
    p = p.map(Builtin::Fields(FieldOp::RandomInt {
        to: "r".into(),
        below: 1000,
    }));
    if let Some(n) = s.unbatch {
        p = p
            .batch(n, false)
            .map(clip())
            .unbatch()
            .map(Builtin::Fields(FieldOp::RandomInt {
                to: "r2".into(),
                below: 1000,
            }));
    }
    if let Some(b) = s.buffer {
        p = p.shuffle(b);
    }
    if s.tail_maps {
        p = p.map(Slow(thin()));
    }
    if let Some(n) = s.skip {
        p = p.skip(n);
    }
    if let Some((n, drop_last)) = s.batch {
        p = p.batch(n, drop_last);
        if s.tail_maps {
            p = p.map(Slow(clip_r2()));
        }
        if let Some(b) = s.batch_buffer {
            p = p.shuffle(b);
        }
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

/// `op`, slowed down (a sleep of 20 us a call), so that it costs more than handing it to
/// a worker: a parallel stage of it stays on the workers (a cheaper one, such as `clip`
/// after the batch and `random_int` after the unbatch above, runs on the tail thread).
#[derive(Debug)]
struct Slow<T>(T);

impl<T: SampleOp> SampleOp for Slow<T> {
    fn meta(&self) -> OpMeta {
        self.0.meta()
    }
    fn apply(&self, s: Sample, cx: &mut OpContext) -> Result<Option<Sample>, Error> {
        std::thread::sleep(Duration::from_micros(20));
        self.0.apply(s, cx)
    }
    fn apply_batch(&self, b: Batch, cx: &mut OpContext) -> Option<Result<Option<Batch>, Error>> {
        std::thread::sleep(Duration::from_micros(20));
        self.0.apply_batch(b, cx)
    }
}

/// A filter (so it stays after a shuffle buffer) that drops about one sample in 7 and
/// draws from the sample's generator.
fn thin() -> FnOp {
    FnOp::new(OpMeta::new("thin").filter(), |mut s, cx| {
        // An int from the source; after a clip on batches and an unbatch, a scalar tensor.
        let r = match s.get("r") {
            Some(Value::Int(r)) => *r as f64,
            Some(Value::Float(r)) => *r,
            Some(Value::Tensor(t)) => t
                .to_vec::<f32>()
                .map(|v| v[0] as f64)
                .or_else(|| t.to_vec::<f64>().map(|v| v[0]))
                .or_else(|| t.to_vec::<i64>().map(|v| v[0] as f64))
                .expect("a number"),
            v => panic!("r is {v:?}"),
        };
        if r as i64 % 7 == 0 {
            return Ok(None);
        }
        s.insert("r3", cx.rng().below(1000) as i64);
        Ok(Some(s))
    })
}

/// Column-wise on batches, after the last batch.
fn clip_r2() -> Builtin {
    Builtin::Columns(ColumnOp::Clip {
        field: "r".into(),
        min: Some(200.0),
        max: Some(800.0),
    })
}

/// An operator that works on whole batches (column-wise).
fn clip() -> Builtin {
    Builtin::Columns(ColumnOp::Clip {
        field: "r".into(),
        min: Some(100.0),
        max: Some(900.0),
    })
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        (
            0u8..3,
            1usize..4,
            any::<bool>(),
            proptest::option::of(1usize..40),
            proptest::option::of(1usize..6),
        ),
        (
            proptest::option::of((1usize..7, any::<bool>())),
            proptest::option::of(1usize..8),
            proptest::option::of(0u64..10),
            proptest::option::of(1u64..60),
            proptest::option::of((0u32..4, 1u32..4, any::<bool>())),
        ),
        (
            1u64..3,
            any::<u64>(),
            1usize..5,
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (source, cycle, shuffle_shards, buffer, unbatch),
                (batch, batch_buffer, skip, take, rank),
                (epochs, seed, threads, cache, tail_maps),
            )| Shape {
                source,
                cycle,
                shuffle_shards,
                unbatch,
                buffer,
                batch,
                batch_buffer,
                skip,
                take,
                rank,
                epochs,
                seed,
                threads,
                cache,
                tail_maps,
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

/// Stops `p` after every item (and its resumed runs again, halfway through the rest),
/// through JSON, and checks that the resumed runs yield exactly the rest; returns the
/// states taken.
fn stop_everywhere(p: &Pipeline) -> Vec<PipelineState> {
    let full = collect(p.run().unwrap());
    assert!(!full.is_empty());
    let mut states = Vec::new();
    for k in 0..=full.len() {
        let mut run = p.run().unwrap();
        let head: Vec<Item> = run.by_ref().take(k).map(Result::unwrap).collect();
        assert_eq!(&head[..], &full[..k]);
        let json = run.state().unwrap().to_json();
        drop(run);
        let state = PipelineState::from_json(&json).unwrap();
        let mut resumed = p.resume(&state).unwrap();
        let k2 = (full.len() - k) / 2;
        let mid: Vec<Item> = resumed.by_ref().take(k2).map(Result::unwrap).collect();
        assert_eq!(&mid[..], &full[k..k + k2], "stopped after {k}");
        let state2 = resumed.state().unwrap();
        drop(resumed);
        let rest = collect(p.resume(&state2).unwrap());
        assert_eq!(&rest[..], &full[k + k2..], "stopped after {k}, then {k2}");
        states.push(state);
    }
    states
}

fn with_threads(p: Pipeline, threads: usize) -> Pipeline {
    p.options(RunOptions::default().with_threads(threads).with_window(16))
}

fn random_int(to: &str) -> Builtin {
    Builtin::Fields(FieldOp::RandomInt {
        to: to.into(),
        below: 1000,
    })
}

#[test]
fn stopping_inside_an_unbatched_batch_resumes_exactly() {
    for threads in [1, 4] {
        let p = shards()
            .interleave(2)
            .shuffle_shards(true)
            .map(random_int("r"))
            .batch(4, false)
            .map(clip())
            .unbatch()
            .map(random_int("r2"))
            .epochs(Some(2))
            .seed(5);
        let states = stop_everywhere(&with_threads(p, threads));
        // After 1, 2 or 3 samples of a batch of 4 the state names that batch and how many
        // of its samples were handed on.
        for (k, st) in states.iter().enumerate().take(40) {
            let cutting = st
                .stages
                .iter()
                .find_map(|s| match s {
                    StageState::Unbatch { cut, sent } => Some((*cut, *sent)),
                    _ => None,
                })
                .unwrap();
            if k % 4 == 0 {
                assert_eq!(cutting, (None, 0), "after {k}");
            } else {
                assert_eq!(cutting, (Some(0), (k % 4) as u32), "after {k}");
                assert_eq!(st.cuts.len(), 1);
                assert_eq!(st.cuts[0].len(), 4);
            }
        }
    }
}

#[test]
fn unbatch_then_shuffle_then_batch_resumes_exactly_over_epochs() {
    for threads in [1, 3] {
        // source -> batch -> map -> unbatch -> shuffle -> batch, three epochs.
        let p = files()
            .shuffle_shards(true)
            .map(random_int("r"))
            .batch(5, false)
            .map(clip())
            .unbatch()
            .map(random_int("r2"))
            .shuffle(9)
            .batch(4, false)
            .epochs(Some(3))
            .seed(11);
        let p = with_threads(p, threads);
        let full = collect(p.run().unwrap());
        // A new order every epoch: 57 files in batches of 4 are 15 batches an epoch.
        assert_eq!(full.len(), 45);
        let epoch =
            |e: usize| -> Vec<String> { full[e * 15..][..15].iter().flat_map(keys).collect() };
        assert_ne!(epoch(0), epoch(1));
        assert_ne!(epoch(1), epoch(2));
        let states = stop_everywhere(&p);
        // The shuffle buffer holds samples cut from batches: the state names those
        // batches once each.
        assert!(states.iter().any(|s| s.cuts.len() > 1));
        for s in &states {
            assert!(s.to_json().len() < 4000, "{}", s.to_json());
        }
    }
}

#[test]
fn stopping_after_k_batches_of_a_shuffle_of_batches_resumes_exactly() {
    for threads in [1, 4] {
        let p = shards()
            .shuffle_shards(true)
            .map(random_int("r"))
            .shuffle(6)
            .batch(3, true)
            .map(clip())
            .shuffle(5)
            .take(50)
            .epochs(Some(2))
            .seed(3);
        let p = with_threads(p, threads);
        let full = collect(p.run().unwrap());
        assert_eq!(full.len(), 2 * 50);
        let states = stop_everywhere(&p);
        // The buffer of batches is in the state, as batches of positions.
        let buffered = |s: &PipelineState| {
            s.stages
                .iter()
                .rev()
                .find_map(|st| match st {
                    StageState::Shuffle { buffer, .. } => Some(buffer.clone()),
                    _ => None,
                })
                .unwrap()
        };
        let b = buffered(&states[10]);
        assert_eq!(b.len(), 5);
        assert!(b
            .iter()
            .all(|i| matches!(i, ItemPos::Batch(m) if m.len() == 3)));
    }
}

#[test]
fn a_shuffle_of_batches_is_a_new_order_every_epoch() {
    let p = memory(40)
        .batch(4, false)
        .shuffle(10)
        .epochs(Some(2))
        .seed(8);
    let full = collect(p.run().unwrap());
    let firsts: Vec<String> = full.iter().map(|i| keys(i)[0].clone()).collect();
    assert_eq!(full.len(), 20);
    assert_ne!(firsts[..10], firsts[10..]);
    let mut sorted = firsts[..10].to_vec();
    sorted.sort_by_key(|k| k[1..].parse::<u32>().unwrap());
    assert_ne!(sorted, firsts[..10]);
    stop_everywhere(&p);
}

#[test]
fn two_unbatches_resume_exactly() {
    // Samples cut from batches of samples cut from batches: the state's batches name
    // earlier ones.
    let p = memory(30)
        .map(random_int("r"))
        .batch(3, false)
        .map(clip())
        .unbatch()
        .shuffle(4)
        .batch(4, false)
        .unbatch()
        .shuffle(5)
        .map(random_int("r2"))
        .epochs(Some(2))
        .seed(2);
    let states = stop_everywhere(&p);
    assert!(states.iter().any(|s| s
        .cuts
        .iter()
        .flatten()
        .any(|i| matches!(i, ItemPos::Cut { .. }))));
}

#[test]
fn two_shuffle_buffers_of_samples_resume_exactly() {
    // Each buffer has its own contents in the state (and its own undo log entries).
    // Buffers, not the optimizer's permutation of the samples at the source.
    let p = memory(30)
        .map(random_int("r"))
        .shuffle(4)
        .skip(1)
        .shuffle(6)
        .epochs(Some(2))
        .seed(9)
        .options(RunOptions::default().with_disabled_passes(["shuffle"]));
    let states = stop_everywhere(&p);
    let sizes: Vec<usize> = states[12]
        .stages
        .iter()
        .filter_map(|s| match s {
            StageState::Shuffle { buffer, .. } => Some(buffer.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, [4, 6]);
}

#[test]
fn maps_after_a_shuffle_and_after_a_batch_resume_exactly_from_every_item() {
    // Parallel stages after the shuffle buffer and after the batch, with a shuffle of the
    // batches after them: the marks they carry make every checkpoint exact.
    for threads in [1, 4] {
        let p = files()
            .shuffle_shards(true)
            .map(random_int("r"))
            .shuffle(7)
            .map(Slow(thin()))
            .batch(3, false)
            .map(Slow(clip_r2()))
            .shuffle(4)
            .epochs(Some(2))
            .seed(21);
        let states = stop_everywhere(&with_threads(p, threads));
        assert!(states.len() > 20);
    }
}

#[test]
fn a_filter_between_two_shuffle_buffers_resumes_exactly() {
    // The first buffer moves on while items are on the workers: each buffer is rewound
    // to where it was when the consumer's item passed it.
    for threads in [1, 3] {
        let p = memory(60)
            .map(random_int("r"))
            .shuffle(5)
            .map(Slow(thin()))
            .shuffle(6)
            .take(40)
            .epochs(Some(2))
            .seed(4);
        stop_everywhere(&with_threads(p, threads));
    }
}
