//! Engine overhead: what the pipeline engine costs per sample when the operators cost
//! nothing.
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/target-bench cargo build --release -p stoker-pipeline --example engine_overhead
//! /work/target-bench/release/examples/engine_overhead [--samples 1000000] [--reps 3] \
//!     [--threads 1,2] [--maps 0,1,4] [--kinds rename,fn]
//! ```
//!
//! Builds `Pipeline::from_samples` over `--samples` in-memory samples of two int fields
//! (`a`, `b`), then for every combination of
//!
//! - `maps` k: a chain of k trivial per-sample operators, either `rename` (alternately
//!   `FieldOp::Rename` a->c and c->a) or `fn` (an `FnOp` closure adding 1 to field `b`);
//!   k = 0 has no operator (its kind is `none`);
//! - `batch`: without batching, or with `.batch(256, false)`;
//! - `threads` t: `RunOptions::default().with_threads(t).with_autotune(false)`,
//!
//! runs the pipeline `--reps` times (the combinations interleaved within a rep), drains
//! it on the calling thread counting samples, and prints one JSON line per combination:
//! the median wall time, samples/s, and the overhead per sample (median wall time /
//! samples, in nanoseconds), with the per-stage busy/wait seconds of the median run. A
//! last line per (kind, maps, batch) gives the 1->2 thread scaling ratio (samples/s with
//! 2 threads / samples/s with 1). Wall time starts before `run()` and ends when the last
//! item has been received, so it includes starting and joining the engine's threads.
//!
//! Built as a cargo example it uses the system allocator (the `stoker` CLI uses
//! mimalloc), so these figures are an upper bound on the CLI's own overhead.

use std::time::Instant;

use stoker_core::{Error, OpMeta, Sample, Value};
use stoker_pipeline::{Builtin, FieldOp, FnOp, Pipeline, RunOptions};

struct Args {
    samples: usize,
    reps: usize,
    threads: Vec<usize>,
    maps: Vec<usize>,
    kinds: Vec<String>,
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| panic!("bad list item {x:?}"))
        })
        .collect()
}

fn parse_args() -> Args {
    let mut a = Args {
        samples: 1_000_000,
        reps: 3,
        threads: vec![1, 2],
        maps: vec![0, 1, 4],
        kinds: vec!["rename".into(), "fn".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--samples" => a.samples = val().parse().expect("--samples N"),
            "--reps" => a.reps = val().parse::<usize>().expect("--reps N").max(1),
            "--threads" => a.threads = list(&val()),
            "--maps" => a.maps = list(&val()),
            "--kinds" => a.kinds = list(&val()),
            "-h" | "--help" => {
                println!(
                    "engine_overhead [--samples N] [--reps N] [--threads 1,2] [--maps 0,1,4] \
                     [--kinds rename,fn]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other:?}"),
        }
    }
    a
}

#[derive(Clone)]
struct Case {
    kind: String,
    maps: usize,
    batch: bool,
    threads: usize,
}

impl Case {
    fn pipeline(&self, samples: &[Sample]) -> Pipeline {
        let mut p = Pipeline::from_samples(samples.to_vec());
        for i in 0..self.maps {
            p = match self.kind.as_str() {
                "rename" => {
                    let (from, to) = if i % 2 == 0 { ("a", "c") } else { ("c", "a") };
                    p.map(Builtin::Fields(FieldOp::Rename {
                        from: from.into(),
                        to: to.into(),
                    }))
                }
                "fn" => p.map(FnOp::new(
                    OpMeta::new(format!("inc_b_{i}")),
                    |mut s, _cx| {
                        match s.get_mut("b") {
                            Some(Value::Int(v)) => *v += 1,
                            _ => return Err(Error::invalid("field b is not an int")),
                        }
                        Ok(Some(s))
                    },
                )),
                other => panic!("unknown kind {other:?} (rename, fn)"),
            };
        }
        if self.batch {
            p = p.batch(256, false);
        }
        p.options(
            RunOptions::default()
                .with_threads(self.threads)
                .with_autotune(false),
        )
    }
}

struct Measured {
    seconds: f64,
    samples: u64,
    items: u64,
    stages: serde_json::Value,
}

fn measure(p: &Pipeline) -> Measured {
    let t0 = Instant::now();
    let mut run = p.run().expect("run");
    let mut samples = 0u64;
    let mut items = 0u64;
    for item in run.by_ref() {
        let item = item.expect("item");
        samples += item.samples() as u64;
        items += 1;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let stages = serde_json::to_value(
        run.stats()
            .stages
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name, "items_in": s.items_in, "items_out": s.items_out,
                    "busy_s": s.busy_s, "wait_s": s.wait_s,
                })
            })
            .collect::<Vec<_>>(),
    )
    .expect("json");
    drop(run);
    Measured {
        seconds,
        samples,
        items,
        stages,
    }
}

fn main() {
    let a = parse_args();
    let samples: Vec<Sample> = (0..a.samples as i64)
        .map(|i| [("a", i), ("b", i * 7)].into_iter().collect())
        .collect();

    let mut cases = Vec::new();
    let mut seen_zero = std::collections::HashSet::new();
    for kind in &a.kinds {
        for &maps in &a.maps {
            for batch in [false, true] {
                for &threads in &a.threads {
                    let kind = if maps == 0 {
                        "none".to_string()
                    } else {
                        kind.clone()
                    };
                    if maps == 0 && !seen_zero.insert((batch, threads)) {
                        continue;
                    }
                    cases.push(Case {
                        kind,
                        maps,
                        batch,
                        threads,
                    });
                }
            }
        }
    }

    // Warm-up: one small run, so the first case does not pay for page faults of the
    // allocator's first arenas.
    {
        let warm = Case {
            kind: "none".into(),
            maps: 0,
            batch: false,
            threads: 1,
        };
        let n = samples.len().min(100_000);
        let _ = measure(&warm.pipeline(&samples[..n]));
    }

    let mut results: Vec<Vec<Measured>> = cases.iter().map(|_| Vec::new()).collect();
    for rep in 0..a.reps {
        // Rotate the order every rep, so no case always runs first or after the same one.
        let n = cases.len();
        for j in 0..n {
            let idx = (j + rep) % n;
            let c = &cases[idx];
            let p = c.pipeline(&samples);
            let m = measure(&p);
            assert_eq!(m.samples, a.samples as u64, "lost samples");
            results[idx].push(m);
        }
    }

    let mut rate = std::collections::HashMap::new();
    for (c, ms) in cases.iter().zip(&mut results) {
        ms.sort_by(|x, y| x.seconds.total_cmp(&y.seconds));
        let med = &ms[ms.len() / 2];
        let per_rep: Vec<f64> = ms.iter().map(|m| m.seconds).collect();
        let sps = med.samples as f64 / med.seconds;
        rate.insert((c.kind.clone(), c.maps, c.batch, c.threads), sps);
        println!(
            "{}",
            serde_json::json!({
                "kind": c.kind, "maps": c.maps, "batch": if c.batch { 256 } else { 0 },
                "threads": c.threads, "samples": med.samples, "items": med.items,
                "seconds": med.seconds, "seconds_sorted": per_rep,
                "samples_per_s": sps,
                "ns_per_sample": med.seconds * 1e9 / med.samples as f64,
                "stages": med.stages,
            })
        );
    }
    if a.threads.contains(&1) && a.threads.contains(&2) {
        for c in &cases {
            if c.threads != 1 {
                continue;
            }
            let one = rate[&(c.kind.clone(), c.maps, c.batch, 1)];
            let two = rate[&(c.kind.clone(), c.maps, c.batch, 2)];
            println!(
                "{}",
                serde_json::json!({
                    "scaling": "1->2 threads", "kind": c.kind, "maps": c.maps,
                    "batch": if c.batch { 256 } else { 0 },
                    "samples_per_s_1": one, "samples_per_s_2": two, "ratio": two / one,
                })
            );
        }
    }
}
