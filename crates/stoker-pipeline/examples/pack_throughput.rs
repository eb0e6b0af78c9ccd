//! Sequence packing throughput: tokens per second through the `pack` stage, against the
//! kernel alone and the same pipeline without it.
//!
//! ```sh
//! cargo build --release -p stoker-pipeline --example pack_throughput
//! target/release/examples/pack_throughput [--docs 20000] [--block 2048] [--reps 3]
//! ```
//!
//! Makes `--docs` in-memory documents (seeded; lengths uniform in 1..=1000 tokens, so
//! about 500 on average; ids below 50,257 as `int64` tensors, as `tokenize` makes them),
//! then times, `--reps` times each, interleaved, and prints one JSON line per mode with the
//! median:
//!
//! - `kernel`: `Packer::push_value` on every document plus `Block::to_tensors` on every
//!   block, on one thread, no engine;
//! - `source`: the pipeline without `pack` (the engine's cost of moving the documents);
//! - `pack`: the pipeline with `pack(block, separator 50256)`;
//! - `pack+batch`: the same with `batch(8)` after it.
//!
//! Pipelines run with 2 threads, autotuning off; wall time includes starting and joining
//! the engine's threads. Tokens counted are the documents' ids plus separators.

use std::time::Instant;

use stoker_core::{Sample, Tensor, Value};
use stoker_ops::text::{Packer, PackerParams};
use stoker_pipeline::{Pack, Pipeline, RunOptions};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let ndocs = arg("--docs", 20_000);
    let block = arg("--block", 2048);
    let reps = arg("--reps", 3);
    let mut rng = stoker_pipeline::rng::Rng::from_words(&[42]);
    let docs: Vec<Sample> = (0..ndocs)
        .map(|i| {
            let len = 1 + rng.below(1000) as usize;
            let ids: Vec<i64> = (0..len).map(|_| rng.below(50_257) as i64).collect();
            let mut s = Sample::new();
            s.insert("__key__", format!("d{i}"));
            s.insert("input_ids", Tensor::from_slice(vec![len], &ids).unwrap());
            s
        })
        .collect();
    let tokens: u64 = docs
        .iter()
        .map(|s| match s.get("input_ids") {
            Some(Value::Tensor(t)) => t.numel() as u64 + 1,
            _ => 0,
        })
        .sum();
    let options = RunOptions::default().with_threads(2).with_autotune(false);
    let pipeline = |mode: &str| {
        let p = Pipeline::from_samples(docs.clone()).options(options.clone());
        match mode {
            "source" => p,
            "pack" => p.pack(Pack::new(block).separator(Some(50_256))),
            _ => p
                .pack(Pack::new(block).separator(Some(50_256)))
                .batch(8, false),
        }
    };
    let modes = ["kernel", "source", "pack", "pack+batch"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut items = vec![0u64; modes.len()];
    for _ in 0..reps {
        for (m, mode) in modes.iter().enumerate() {
            let t0 = Instant::now();
            let n = if *mode == "kernel" {
                let mut p = Packer::new(PackerParams::new(block).separator(Some(50_256))).unwrap();
                let mut n = 0u64;
                for d in &docs {
                    for b in p.push_value(d.get("input_ids").unwrap()).unwrap() {
                        std::hint::black_box(b.to_tensors().unwrap());
                        n += 1;
                    }
                }
                if let Some(b) = p.finish().unwrap() {
                    std::hint::black_box(b.to_tensors().unwrap());
                    n += 1;
                }
                n
            } else {
                let mut n = 0u64;
                for item in pipeline(mode).run().unwrap() {
                    std::hint::black_box(item.unwrap());
                    n += 1;
                }
                n
            };
            times[m].push(t0.elapsed().as_secs_f64());
            items[m] = n;
        }
    }
    for (m, mode) in modes.iter().enumerate() {
        let mut t = times[m].clone();
        t.sort_by(f64::total_cmp);
        let median = t[t.len() / 2];
        println!(
            "{}",
            serde_json::json!({
                "mode": mode,
                "docs": ndocs,
                "tokens": tokens,
                "block": block,
                "items": items[m],
                "median_s": median,
                "tokens_per_s": tokens as f64 / median,
                "docs_per_s": ndocs as f64 / median,
                "times_s": times[m],
            })
        );
    }
}
