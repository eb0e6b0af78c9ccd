//! Maps and filters after a sequential stage (a shuffle buffer, a batch, an unbatch) run
//! on the engine's workers, several items at once: the same items in the same order as
//! with one worker, errors and skips as for the operators before the tail, the stage's
//! place in `explain()`. (Resume with such stages: the property test in `resume.rs`.)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use stoker_core::{Batch, Error, OpMeta, Sample, Tensor, Value};
use stoker_pipeline::{ErrorPolicy, Item, OpContext, Pipeline, RunOptions, SampleOp};

/// The calls of an operator under way at once, and the most there ever were.
#[derive(Debug, Default)]
struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
    calls: AtomicUsize,
}

struct Inside<'a>(&'a Overlap);

impl Overlap {
    fn enter(&self) -> Inside<'_> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        Inside(self)
    }
    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A filter (so the optimizer leaves it after the shuffle buffer) that drops the samples
/// whose `x` is a multiple of `drop_every`, adds `y = 3 x` and `r`, a draw from the
/// sample's generator, and fails on `x == fail_on`; on a batch the same column-wise (the
/// whole batch dropped or failed when its first `x` is dropped / any `x` fails). Each call
/// sleeps a random while up to `nap_us` so that calls on several workers overlap and
/// finish out of order.
#[derive(Debug)]
struct Probe {
    name: &'static str,
    overlap: Arc<Overlap>,
    drop_every: Option<i64>,
    fail_on: Option<i64>,
    nap_us: u64,
}

impl Probe {
    fn new(name: &'static str) -> Probe {
        Probe {
            name,
            overlap: Arc::default(),
            drop_every: Some(5),
            fail_on: None,
            nap_us: 600,
        }
    }
    fn nap(&self, cx: &mut OpContext) {
        // The draw comes from a generator of its own, so `r` does not depend on it.
        let us = cx.for_op(999).rng().below(self.nap_us.max(1));
        std::thread::sleep(Duration::from_micros(100 + us));
    }
}

impl SampleOp for Probe {
    fn meta(&self) -> OpMeta {
        OpMeta::new(self.name).filter()
    }

    fn apply(&self, mut s: Sample, cx: &mut OpContext) -> Result<Option<Sample>, Error> {
        let _inside = self.overlap.enter();
        self.nap(cx);
        let x = s.get("x").and_then(Value::as_int).expect("x");
        if Some(x) == self.fail_on {
            return Err(Error::operator(format!("x is {x}")));
        }
        if self.drop_every.is_some_and(|k| x % k == 0) {
            return Ok(None);
        }
        s.insert("y", 3 * x);
        s.insert("r", cx.rng().below(1000) as i64);
        Ok(Some(s))
    }

    fn apply_batch(
        &self,
        mut b: Batch,
        cx: &mut OpContext,
    ) -> Option<Result<Option<Batch>, Error>> {
        let _inside = self.overlap.enter();
        self.nap(cx);
        let xs: Vec<i64> = match b.get("x") {
            Some(Value::Tensor(t)) => t.to_vec::<i64>().expect("int64 x"),
            v => panic!("x is {v:?}"),
        };
        if let Some(f) = self.fail_on.filter(|f| xs.contains(f)) {
            return Some(Err(Error::operator(format!("x is {f}"))));
        }
        if self.drop_every.is_some_and(|k| xs[0] % k == 0) {
            return Some(Ok(None));
        }
        let y: Vec<i64> = xs.iter().map(|x| 3 * x).collect();
        let r = cx.rng().below(1000) as i64;
        b.insert(
            "y",
            Value::Tensor(Tensor::from_slice(vec![y.len()], &y).unwrap()),
        )
        .unwrap();
        b.insert("r", Value::List(vec![Value::Int(r); xs.len()]))
            .unwrap();
        Some(Ok(Some(b)))
    }
}

fn opts(threads: usize) -> RunOptions {
    RunOptions::default()
        .with_threads(threads)
        .with_autotune(false)
}

fn items(p: &Pipeline) -> Vec<Item> {
    p.run().unwrap().map(Result::unwrap).collect()
}

/// Every sample's `(x, y)` in the items, in order.
fn xy(items: &[Item]) -> Vec<(i64, i64)> {
    let ints = |v: &Value| -> Vec<i64> {
        match v {
            Value::Int(i) => vec![*i],
            Value::Tensor(t) => t.to_vec::<i64>().unwrap(),
            v => panic!("{v:?}"),
        }
    };
    items
        .iter()
        .flat_map(|i| {
            let (x, y) = match i {
                Item::Sample(s) => (ints(s.get("x").unwrap()), ints(s.get("y").unwrap())),
                Item::Batch(b) => (ints(b.get("x").unwrap()), ints(b.get("y").unwrap())),
            };
            x.into_iter().zip(y).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_filter_after_a_shuffle_runs_on_several_workers_in_order() {
    let run = |threads: usize| {
        let probe = Probe::new("probe");
        let overlap = probe.overlap.clone();
        let p = memory(300)
            .shuffle(16)
            .map(probe)
            .batch(8, false)
            .seed(4)
            .options(opts(threads));
        (items(&p), overlap.most())
    };
    let (one, most_one) = run(1);
    let (three, most_three) = run(3);
    // The same items in the same order, whatever the workers and their timing.
    assert_eq!(one, three);
    assert_eq!(most_one, 1);
    // Several calls at once, never more than the workers.
    assert!((2..=3).contains(&most_three), "{most_three} calls at once");
    // What a serial reference computes: every sample but the multiples of 5, y = 3 x,
    // in a shuffled order.
    let got = xy(&one);
    assert!(got.iter().all(|(x, y)| *y == 3 * x));
    let mut xs: Vec<i64> = got.iter().map(|(x, _)| *x).collect();
    assert_ne!(xs, (0..300).filter(|x| x % 5 != 0).collect::<Vec<_>>());
    xs.sort_unstable();
    assert_eq!(xs, (0..300).filter(|x| x % 5 != 0).collect::<Vec<_>>());
}

#[test]
fn an_operator_on_batches_runs_on_several_workers_in_order() {
    let run = |threads: usize| {
        let mut probe = Probe::new("on_batches");
        probe.drop_every = Some(7);
        let overlap = probe.overlap.clone();
        let p = memory(240)
            .shuffle_shards(true)
            .batch(6, false)
            .map(probe)
            .seed(9)
            .options(opts(threads));
        (items(&p), overlap.most())
    };
    let (one, most_one) = run(1);
    let (four, most_four) = run(4);
    assert_eq!(one, four);
    assert_eq!(most_one, 1);
    assert!((2..=4).contains(&most_four), "{most_four} calls at once");
    // Whole batches: each keeps its 6 rows, gets its y column, and those whose first x is
    // a multiple of 7 are dropped.
    assert!(one.iter().all(|i| i.samples() == 6));
    assert!(xy(&one).iter().all(|(x, y)| *y == 3 * x));
    let dropped = 40 - one.len();
    assert!(dropped > 0 && dropped < 40, "{dropped} batches dropped");
}

#[test]
fn maps_between_and_after_sequential_stages_keep_the_order() {
    // Two parallel stages (after a shuffle, after a batch), a cut of batches into samples
    // and a map on those, and a take: the same as with one worker.
    let run = |threads: usize| {
        let a = Probe::new("a");
        let mut b = Probe::new("b");
        b.drop_every = Some(4);
        let mut c = Probe::new("c");
        c.drop_every = None;
        let overlaps = [a.overlap.clone(), b.overlap.clone(), c.overlap.clone()];
        let p = memory(400)
            .shuffle(20)
            .map(a)
            .batch(4, false)
            .map(b)
            .unbatch()
            .map(c)
            .shuffle(7)
            .take(150)
            .epochs(Some(2))
            .seed(13)
            .options(opts(threads).with_window(64));
        (items(&p), overlaps.map(|o| o.most()))
    };
    let (one, _) = run(1);
    let (four, most) = run(4);
    assert_eq!(one.len(), 300);
    assert_eq!(one, four);
    assert!(
        most.iter().all(|m| *m >= 2),
        "calls at once per stage: {most:?}"
    );
}

#[test]
fn without_determinism_results_pass_as_they_finish() {
    let probe = Probe::new("probe");
    // A buffer, so that the map is a stage in the tail (not the optimizer's permutation).
    let p = memory(200).shuffle(10).map(probe).seed(2).options(
        opts(4)
            .with_deterministic(false)
            .with_disabled_passes(["shuffle"]),
    );
    assert!(p.explain().contains("workers: map[probe] (as they finish)"));
    let mut run = p.run().unwrap();
    let mut xs: Vec<i64> = xy(&run.by_ref().map(Result::unwrap).collect::<Vec<_>>())
        .into_iter()
        .map(|(x, _)| x)
        .collect();
    xs.sort_unstable();
    assert_eq!(xs, (0..200).filter(|x| x % 5 != 0).collect::<Vec<_>>());
    assert!(run.state().is_err());
}

#[test]
fn an_error_after_the_tail_is_raised_in_order_or_skipped_and_counted() {
    let p = |fail_on: Option<i64>, errors: ErrorPolicy| {
        let mut probe = Probe::new("probe");
        probe.drop_every = None;
        probe.fail_on = fail_on;
        memory(120)
            .shuffle(10)
            .map(probe)
            .seed(6)
            .options(opts(4).with_errors(errors))
    };
    let clean = items(&p(None, ErrorPolicy::Raise));
    let at = clean
        .iter()
        .position(|i| xy(std::slice::from_ref(i))[0].0 == 37)
        .unwrap();
    // Raise: everything before the failing sample arrives, then the error, naming the
    // operator, the object and the record, then nothing.
    let mut run = p(Some(37), ErrorPolicy::Raise).run().unwrap();
    let mut got = Vec::new();
    let err = loop {
        match run.next().expect("an error") {
            Ok(i) => got.push(i),
            Err(e) => break e,
        }
    };
    assert_eq!(&got[..], &clean[..at]);
    assert_eq!(err.stage.as_deref(), Some("probe"));
    assert_eq!(err.object.as_deref(), Some("memory:37"));
    assert_eq!(err.record, Some(0));
    assert!(err.to_string().contains("x is 37"), "{err}");
    assert!(run.next().is_none());
    // Skip: the rest arrives in order, and the skip is counted and listed.
    let mut run = p(Some(37), ErrorPolicy::Skip).run().unwrap();
    let got: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
    let mut want = clean.clone();
    want.remove(at);
    assert_eq!(got, want);
    let st = run.stats();
    assert_eq!(st.skipped, 1);
    assert!(
        st.skipped_errors[0].error.contains("memory:37"),
        "{:?}",
        st.skipped_errors
    );
}

#[test]
fn an_error_on_a_batch_names_the_operator_and_the_batch_s_first_sample() {
    let mut probe = Probe::new("on_batches");
    probe.drop_every = None;
    probe.fail_on = Some(37);
    let p = memory(60).batch(5, false).map(probe).options(opts(3));
    let mut run = p.run().unwrap();
    let mut got = 0;
    let err = loop {
        match run.next().expect("an error") {
            Ok(_) => got += 1,
            Err(e) => break e,
        }
    };
    // Batches 0..7 (x 0..35) arrive; the one holding 35..40 fails.
    assert_eq!(got, 7);
    assert_eq!(err.stage.as_deref(), Some("on_batches"));
    assert_eq!(err.object.as_deref(), Some("memory:35"));
    let msg = err.to_string();
    assert!(
        msg.contains("on a batch of 5 samples") && msg.contains("x is 37"),
        "{msg}"
    );
    // Skipped: the other 11 batches.
    let mut run = p
        .options(opts(3).with_errors(ErrorPolicy::Skip))
        .run()
        .unwrap();
    assert_eq!(run.by_ref().count(), 11);
    assert_eq!(run.stats().skipped, 1);
}

#[test]
fn a_per_sample_operator_after_a_batch_is_refused_by_name() {
    let p = memory(10).batch(5, false).map(stoker_pipeline::FnOp::new(
        OpMeta::new("per_sample"),
        |s, _| Ok(Some(s)),
    ));
    let e = p.run().unwrap().find_map(Result::err).unwrap();
    assert!(
        e.to_string()
            .contains("per_sample is a per-sample operator"),
        "{e}"
    );
    // Not skippable: a mistake in the pipeline.
    let p = p.options(RunOptions::default().with_errors(ErrorPolicy::Skip));
    assert!(p.run().unwrap().any(|r| r.is_err()));
}

#[test]
fn explain_shows_where_the_parallel_stages_run() {
    // A buffer, not the optimizer's permutation of the samples at the source.
    let plan = memory(10)
        .shuffle(4)
        .map(Probe::new("a"))
        .map(Probe::new("b"))
        .batch(2, false)
        .map(Probe::new("c"))
        .options(RunOptions::default().with_disabled_passes(["shuffle"]))
        .explain();
    assert!(
        plan.contains(
            "  shuffle(4)\n  workers: map[a, b] (in order)\n  batch(2)\n  workers: map[c] \
             (in order)\n"
        ),
        "{plan}"
    );
    assert!(
        plan.contains("because: map[a, b] after shuffle(4) runs on the workers too"),
        "{plan}"
    );
    assert!(
        plan.contains("because: map[c] after batch(2) runs on the workers too"),
        "{plan}"
    );
}

#[test]
fn stats_count_the_parallel_stage_per_operator() {
    let a = Probe::new("a");
    let mut run = memory(100)
        .shuffle(8)
        .map(a)
        .options(opts(2))
        .run()
        .unwrap();
    assert_eq!(run.by_ref().count(), 80);
    let st = run.stats();
    let a = st.stages.iter().find(|s| s.name == "map[a]").unwrap();
    assert_eq!((a.items_in, a.items_out, a.dropped), (100, 80, 20));
    assert!(a.busy_s > 0.0);
}

#[test]
fn the_autotuner_counts_the_work_of_a_parallel_stage() {
    // Every worker's work is after the shuffle buffer, and the consumer is slow: the
    // workers are mostly idle, and the tuner (which once looked only at the operators
    // before the tail) takes some away.
    let mut probe = Probe::new("cheap");
    probe.nap_us = 1;
    let mut run = memory(3000)
        .shuffle(8)
        .map(probe)
        .options(RunOptions::default().with_threads(4))
        .run()
        .unwrap();
    let fewer = |run: &stoker_pipeline::Run| {
        run.stats()
            .autotune
            .iter()
            .any(|(_, n, why)| *n < 4 && why.contains("only"))
    };
    // The consumer takes an item every 2 ms until the tuner has acted (a few ticks of
    // 250 ms once the first burst is through), for at most 6 s.
    let mut taken = 0;
    while taken < 3000 && !(taken % 50 == 0 && fewer(&run)) {
        run.next().unwrap().unwrap();
        taken += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(fewer(&run), "{:?}", run.stats().autotune);
}
