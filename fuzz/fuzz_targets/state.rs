//! Resume states (`PipelineState::from_json`, what `stoker.torch` and checkpoints hand
//! back): parsed, then given to `resume` of a small in-memory pipeline with a shuffle, a
//! batch and an unbatch, which must refuse a state that does not fit rather than panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_core::{Sample, Value};
use stoker_pipeline::{Pipeline, PipelineState, RunOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(state) = PipelineState::from_json(text) else {
        return;
    };
    let again = PipelineState::from_json(&state.to_json()).expect("a state's JSON reads back");
    assert_eq!(again, state);
    let samples: Vec<Sample> = (0..20)
        .map(|i| {
            let mut s = Sample::with_capacity(1);
            s.insert("x", Value::Int(i));
            s
        })
        .collect();
    let p = Pipeline::from_samples(samples)
        .seed(7)
        .shuffle(4)
        .batch(3, false)
        .unbatch()
        .epochs(Some(2))
        .options(RunOptions::default().with_threads(1));
    if let Ok(run) = p.resume(&state) {
        for item in run.take(100) {
            let _ = item;
        }
    }
});
