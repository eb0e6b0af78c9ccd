//! Where a parallel stage after the tail runs: a stage cheaper than handing its items to
//! the workers runs on the tail thread, and goes back to the workers when its cost rises;
//! the items are the same either way. (A test binary of its own: the decision rests on
//! measured costs, which other tests running at once in the same process would inflate.)

mod common;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use stoker_core::{Error, OpMeta, Sample, Value};
use stoker_pipeline::{Item, OpContext, RunOptions, SampleOp};

/// The calls under way at once, and the most there ever were.
#[derive(Debug, Default)]
struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// A filter that notes, for each `x`, whether its call ran on the tail thread: cheap (an
/// atomic store) for `x` below `costly_from`, 300 us from there on.
#[derive(Debug)]
struct Where {
    costly_from: i64,
    on_tail: Arc<Vec<AtomicU8>>,
    overlap: Arc<Overlap>,
}

impl SampleOp for Where {
    fn meta(&self) -> OpMeta {
        OpMeta::new("where").filter()
    }
    fn apply(&self, mut s: Sample, _: &mut OpContext) -> Result<Option<Sample>, Error> {
        let x = s.get("x").and_then(Value::as_int).expect("x");
        let tail = std::thread::current().name() == Some("stoker-tail");
        self.on_tail[x as usize].store(1 + tail as u8, Ordering::Relaxed);
        if x >= self.costly_from {
            let n = self.overlap.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.overlap.most.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(300));
            self.overlap.now.fetch_sub(1, Ordering::SeqCst);
        }
        s.insert("y", 3 * x);
        Ok(Some(s))
    }
}

#[test]
fn a_cheap_stage_runs_on_the_tail_thread_and_a_costly_one_on_the_workers() {
    let run = |threads: usize| {
        let w = Where {
            costly_from: 2000,
            on_tail: Arc::new((0..2400).map(|_| Default::default()).collect()),
            overlap: Arc::default(),
        };
        let (on_tail, overlap) = (w.on_tail.clone(), w.overlap.clone());
        // A buffer, not the optimizer's permutation at the source (which would put the
        // filter on the workers before anything): this tests a stage in the tail.
        let p = memory(2400).shuffle(4).map(w).seed(3).options(
            RunOptions::default()
                .with_threads(threads)
                .with_autotune(false)
                .with_disabled_passes(["shuffle"]),
        );
        let got: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
        let on_tail: Vec<u8> = on_tail.iter().map(|t| t.load(Ordering::Relaxed)).collect();
        (got, on_tail, overlap.most.load(Ordering::SeqCst))
    };
    let (one, _, _) = run(1);
    let (three, calls, most) = run(3);
    // The same items in the same order across the switches.
    assert_eq!(one, three);
    assert!(calls.iter().all(|c| *c > 0), "every sample was seen");
    let on_tail = |xs: std::ops::Range<usize>| calls[xs].iter().filter(|c| **c == 2).count();
    // Cheap: once measured, the samples are not handed to the workers (a hand-off costs
    // more than the work): they run where they are. The first hand-offs measure the cost;
    // on a loaded machine a worker's measurement includes its waits for a core, and the
    // switch came after 180 samples here and after 355 on a CI machine: the second half
    // of the 2,000 cheap samples leaves room for several times that.
    assert!(on_tail(1000..2000) >= 900, "{calls:?}");
    // Costly: back on the workers within a few samples, several at once.
    assert_eq!(on_tail(2100..2400), 0, "{calls:?}");
    assert!(most >= 2, "{most} calls at once");
}
