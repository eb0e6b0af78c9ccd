//! The profiler's verdict on constructed cases (a slow consumer, an expensive operator, a
//! slow store with little concurrency, a memory budget too small), its timeline, and its
//! Chrome trace.

mod common;

use std::time::{Duration, Instant};

use stoker_core::{OpMeta, Sample};
use stoker_pipeline::{Builtin, Cause, FieldOp, FnOp, FormatChoice, Pipeline, Profile, RunOptions};
use stoker_testserver::{ServerOptions, TestServer};

/// Runs `p` to the end (or `limit` items), sleeping `step` per item, and profiles it.
fn profile(p: &Pipeline, step: Duration, limit: usize) -> Profile {
    let mut run = p.run().unwrap();
    let mut n = 0;
    for item in run.by_ref() {
        item.unwrap();
        n += 1;
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        if n >= limit {
            break;
        }
    }
    run.profile()
}

/// Spins the CPU for `d` (an operator that costs CPU, not a sleep).
fn spin(d: Duration) {
    let t = Instant::now();
    let mut x = 0u64;
    while t.elapsed() < d {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
}

fn cheap() -> Builtin {
    Builtin::Fields(FieldOp::RandomInt {
        to: "r".into(),
        below: 10,
    })
}

#[test]
fn a_consumer_slower_than_the_pipeline_is_not_input_bound() {
    let p = common::memory(400)
        .map(cheap())
        .batch(4, false)
        .options(RunOptions::default().with_threads(2));
    let prof = profile(&p, Duration::from_millis(8), 60);
    let v = &prof.verdict;
    assert!(!v.input_bound, "{v:#?}");
    assert_eq!(v.cause, Cause::Consumer, "{v:#?}");
    assert_eq!(v.bottleneck, "consumer");
    assert!(v.wait_share < 0.1, "{v:#?}");
    assert!(prof.consumer.step_s >= 0.4, "{:?}", prof.consumer);
    assert_eq!(prof.consumer.items, 60);
}

#[test]
fn an_expensive_operator_is_named_as_the_bottleneck() {
    let expensive = FnOp::new(OpMeta::new("expensive_spin"), |s: Sample, _| {
        spin(Duration::from_millis(3));
        Ok(Some(s))
    });
    let p = common::memory(300)
        .map(cheap())
        .map(expensive)
        .batch(8, false)
        .options(RunOptions::default().with_threads(2).with_autotune(false));
    let prof = profile(&p, Duration::ZERO, usize::MAX);
    let v = &prof.verdict;
    assert!(v.input_bound, "{v:#?}");
    assert_eq!(v.cause, Cause::Cpu, "{v:#?}");
    assert_eq!(v.bottleneck, "expensive_spin", "{v:#?}");
    let op = prof
        .operators
        .iter()
        .find(|o| o.name == "expensive_spin")
        .unwrap();
    assert!(op.ns_per_sample.unwrap() > 2.5e6, "{op:?}");
    assert!(v.summary.contains("expensive_spin"), "{}", v.summary);
    // With every CPU of the machine busy, the way past them is more machines (Ray); with
    // CPUs to spare (other tests share the machine), not.
    let cores = prof.cpu_s / prof.seconds;
    let ray = v
        .recommendations
        .iter()
        .find(|r| r.change.contains("Ray worker actors"));
    if prof.threads >= prof.cpus as u64 && cores >= 0.8 * prof.cpus as f64 {
        let r = ray.unwrap_or_else(|| panic!("{cores} CPUs used: {v:#?}"));
        assert!(
            r.python
                .as_deref()
                .unwrap()
                .starts_with("dp = p.distribute("),
            "{r:?}"
        );
    } else {
        assert!(ray.is_none(), "{cores} of {} CPUs used: {v:#?}", prof.cpus);
    }
}

/// A server that answers every request after `latency`, with `n` small objects.
fn slow_server(n: usize) -> &'static TestServer {
    static S: std::sync::OnceLock<TestServer> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let s = TestServer::start_blocking(
            ServerOptions::new()
                .bucket("slow")
                .latency(Duration::from_millis(25)),
        )
        .unwrap();
        for i in 0..n {
            s.put_object("slow", &format!("f/{i:03}.bin"), &vec![i as u8; 2048])
                .unwrap();
        }
        s
    })
}

#[test]
fn a_slow_store_with_little_concurrency_is_named_io() {
    let s = slow_server(60);
    let store = stoker_store::StoreOptions::default()
        .with_endpoint(s.endpoint())
        .with_credentials(s.access_key(), s.secret_key())
        .with_region(s.region())
        .with_max_concurrency(1)
        .with_fetch_concurrency(1);
    let p = Pipeline::from_url("s3://slow/f/", store, FormatChoice::Files)
        .map(cheap())
        .options(RunOptions::default().with_threads(2));
    let prof = profile(&p, Duration::ZERO, usize::MAX);
    let v = &prof.verdict;
    assert_eq!(prof.samples, 60);
    assert!(v.input_bound, "{v:#?}");
    assert_eq!(v.cause, Cause::Io, "{v:#?}\n{:#?}", prof.stage_stats);
    assert!(v.bottleneck.starts_with("source("), "{v:#?}");
    let st = prof.storage.as_ref().unwrap();
    assert!(st.latency_p50_ms >= 20.0, "{st:?}");
    assert_eq!(st.max_concurrency, 1);
    assert!(!st.latency.is_empty());
    // What holds the budget is the store's fetch in flight, not the samples.
    assert!(
        prof.timeline.iter().any(|t| t.memory.read_ahead > 0),
        "{:?}",
        prof.timeline.iter().map(|t| t.memory).collect::<Vec<_>>()
    );
    // The first change: more requests at once, as a spec line.
    let first = &v.recommendations[0];
    assert_eq!(
        first
            .spec
            .as_deref()
            .map(|s| s.starts_with("[store] fetch_concurrency = ")),
        Some(true),
        "{first:#?}"
    );
    assert!(first.expected_gain > 1.5, "{first:#?}");
}

#[test]
fn a_memory_budget_too_small_is_named_memory() {
    // Samples of 256 KiB through a budget that holds about three of them: the source
    // spends the run waiting for room.
    let big = FnOp::new(OpMeta::new("payload"), |mut s: Sample, _| {
        s.insert("blob", bytes::Bytes::from(vec![1u8; 256 << 10]));
        spin(Duration::from_millis(1));
        Ok(Some(s))
    });
    let p = common::memory(400).map(big).options(
        RunOptions::default()
            .with_threads(2)
            .with_memory_limit(800 << 10),
    );
    let prof = profile(&p, Duration::ZERO, usize::MAX);
    let v = &prof.verdict;
    assert_eq!(prof.samples, 400);
    assert!(v.input_bound, "{v:#?}");
    assert_eq!(
        v.cause,
        Cause::Memory,
        "{v:#?}\nbudget wait {}",
        prof.budget_wait_s
    );
    assert!(prof.budget_wait_s > 0.2 * prof.seconds, "{v:#?}");
    // What held the budget: the samples (no store, so no read-ahead, and no cache).
    let m: Vec<_> = prof.timeline.iter().map(|t| t.memory).collect();
    assert!(m.iter().any(|m| m.samples >= 256 << 10), "{m:?}");
    assert!(
        m.iter().all(|m| m.block_cache + m.sample_cache == 0),
        "{m:?}"
    );
    assert_eq!(v.bottleneck, "memory budget");
    assert!(v.recommendations.iter().any(|r| r
        .spec
        .as_deref()
        .is_some_and(|s| s.contains("memory_limit"))));
}

#[test]
fn the_timeline_samples_the_run_and_the_trace_has_tracks() {
    stoker_core::trace::start();
    let expensive = FnOp::new(OpMeta::new("spin_1ms"), |s: Sample, _| {
        spin(Duration::from_millis(1));
        Ok(Some(s))
    });
    let p = common::memory(400)
        .map(expensive)
        .shuffle(16)
        .batch(4, false)
        .options(RunOptions::default().with_threads(2));
    let prof = profile(&p, Duration::ZERO, usize::MAX);
    let (spans, dropped) = stoker_core::trace::stop();
    assert_eq!(dropped, 0);
    // 400 samples at 1 ms on 2 threads: about 0.2 s, so a point every 100 ms or so.
    assert!(prof.timeline.len() >= 2, "{}", prof.timeline.len());
    let last = prof.timeline.last().unwrap();
    assert_eq!(last.samples, 400);
    assert_eq!(last.stages.len(), prof.stages.len());
    assert!(prof.timeline.windows(2).all(|w| w[0].t_s <= w[1].t_s));

    let trace: serde_json::Value = serde_json::from_str(&prof.chrome_trace(&spans)).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let threads: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(
        threads.iter().any(|t| t.starts_with("stoker-cpu-")),
        "{threads:?}"
    );
    assert!(threads.contains(&"stoker-tail"), "{threads:?}");
    assert!(threads.contains(&"stoker-source"), "{threads:?}");
    // One span in eight samples per operator (the profiled ones), each with its duration.
    let op_spans = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "spin_1ms")
        .count();
    assert_eq!(op_spans, 50);
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
    }
    // A counter track per stage.
    for stage in &prof.stages {
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "C" && e["name"] == **stage),
            "{stage}"
        );
    }
    // Written as files.
    let dir = tempfile::tempdir().unwrap();
    let written = prof.write(dir.path(), &spans).unwrap();
    assert_eq!(written.len(), 3);
    let json: Profile =
        serde_json::from_slice(&std::fs::read(dir.path().join("profile.json")).unwrap()).unwrap();
    // (JSON's decimal floats need not give back the last bit.)
    assert_eq!(
        (
            json.verdict.bottleneck,
            json.stages,
            json.timeline.len(),
            json.samples
        ),
        (
            prof.verdict.bottleneck.clone(),
            prof.stages.clone(),
            prof.timeline.len(),
            400
        )
    );
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("spin_1ms"));
}
