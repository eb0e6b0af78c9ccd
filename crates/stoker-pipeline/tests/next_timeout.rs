//! `Run::next_timeout`: a wait that comes back empty-handed changes nothing, so a consumer
//! that polls (the Python binding, between Ctrl-C checks) sees exactly the items, and the
//! state, of one that blocks.

use std::time::Duration;

use stoker_core::{OpMeta, Sample};
use stoker_pipeline::{Builtin, FieldOp, FnOp, Pipeline};

fn pipeline() -> Pipeline {
    let samples: Vec<Sample> = (0..500i64)
        .map(|i| [("x", i)].into_iter().collect())
        .collect();
    Pipeline::from_samples(samples)
        .shuffle_shards(true)
        .map(Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 100,
        }))
        // One slow sample: the output runs dry while it is worked on, so some polls
        // certainly come back empty.
        .map(FnOp::new(OpMeta::new("slow_250"), |s: Sample, _| {
            if s.get("x").and_then(|v| v.as_int()) == Some(250) {
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(Some(s))
        }))
        .shuffle(17)
        .batch(7, false)
        .seed(3)
}

#[test]
fn polling_with_timeouts_yields_what_blocking_yields() {
    let p = pipeline();
    let blocking: Vec<_> = p.run().unwrap().map(Result::unwrap).collect();

    let mut run = p.run().unwrap();
    let mut polled = Vec::new();
    let mut timeouts = 0u64;
    let mut state_at_10 = None;
    loop {
        match run.next_timeout(Duration::ZERO) {
            None => timeouts += 1,
            Some(None) => break,
            Some(Some(item)) => {
                polled.push(item.unwrap());
                if polled.len() == 10 {
                    state_at_10 = Some(run.state().unwrap());
                }
            }
        }
    }
    assert_eq!(polled, blocking);
    // Once finished, it stays finished without waiting.
    assert!(matches!(
        run.next_timeout(Duration::from_secs(60)),
        Some(None)
    ));
    let resumed: Vec<_> = p
        .resume(&state_at_10.unwrap())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(resumed, blocking[10..]);
    // The slow sample made the polls come back empty: that path was taken.
    assert!(timeouts > 0, "no poll came back empty");
}
