//! `stoker run PIPELINE.toml`: runs a pipeline spec and reports where the time goes.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use stoker_pipeline::{PipelineSpec, Stats};

use crate::args::{IndexArgs, RunArgs};

/// What `--json` prints.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub samples: u64,
    pub items: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
    pub items_per_s: f64,
    pub bytes_read: u64,
    pub skipped: u64,
    pub peak_rss_bytes: u64,
    pub memory_limit_bytes: u64,
    pub memory_peak_bytes: u64,
    pub step_ms: f64,
    /// Seconds the consumer waited for the pipeline (0 when it keeps up).
    pub consumer_wait_s: f64,
    /// Seconds from the start (listing included) to the first item; `null` when none came.
    pub first_item_s: Option<f64>,
    pub stages: Vec<stoker_pipeline::StageStats>,
    /// The `cache` op's numbers (hits, stored, over_limit, bytes, limit); `null` without one.
    pub cache: Option<stoker_pipeline::SampleCacheStats>,
    /// The optimizer's cache of samples (decoded images) for later epochs; `null` without one.
    pub sample_cache: Option<stoker_pipeline::SampleCacheStats>,
    /// Samples the batch stage found already in place in its buffer (written there by the
    /// operator before it) and those it copied; `null` when the batch does not follow an
    /// operator directly.
    pub batch_slots: Option<stoker_pipeline::BatchSlotStats>,
    pub skipped_errors: Vec<String>,
    pub autotune: Vec<(f64, u64, String)>,
    /// Each operator's measured time and bytes a sample (one sample in eight) against its
    /// declaration.
    pub operators: Vec<stoker_pipeline::OperatorStats>,
}

/// Progress on stderr while a pipeline runs, when stderr is a terminal: samples/s, bytes/s,
/// the memory in use, the epoch, and with a known count (`--limit`) a bar and its ETA.
pub struct Progress {
    bar: ProgressBar,
    last: std::cell::Cell<Instant>,
}

impl Progress {
    pub fn new(quiet: bool, items: Option<u64>) -> Progress {
        let bar = if quiet || !std::io::stderr().is_terminal() {
            ProgressBar::hidden()
        } else if let Some(n) = items {
            let b = ProgressBar::new(n);
            b.set_style(
                ProgressStyle::with_template(
                    "[{elapsed_precise}] {wide_bar} {pos}/{len} items, ETA {eta} {msg}",
                )
                .expect("template"),
            );
            b
        } else {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .expect("template"),
            );
            b
        };
        Progress {
            bar,
            last: std::cell::Cell::new(Instant::now()),
        }
    }

    /// After each item: redraws at most five times a second.
    pub fn tick(&self, run: &stoker_pipeline::Run, items: u64, samples: u64, t0: Instant) {
        if self.bar.is_hidden() || self.last.get().elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last.set(Instant::now());
        let st = run.stats();
        let s = t0.elapsed().as_secs_f64().max(1e-9);
        let read = st
            .storage
            .as_ref()
            .map_or(st.stages[0].bytes, |m| m.bytes_read);
        self.bar.set_position(items);
        self.bar.set_message(format!(
            "{samples} samples, {:.0} samples/s, {:.1} MiB/s read, memory {:.0}/{:.0} MiB, epoch {}",
            samples as f64 / s,
            read as f64 / s / (1 << 20) as f64,
            st.memory.held as f64 / (1 << 20) as f64,
            st.memory.limit as f64 / (1 << 20) as f64,
            st.epoch
        ));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// This process's peak resident set (VmHWM), in bytes.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// A spec with a `[distribute]` table is run on Ray from Python; here only when told
/// `--local`.
pub fn refuse_distributed(
    spec: &PipelineSpec,
    path: &std::path::Path,
    local: bool,
) -> anyhow::Result<()> {
    if spec.distribute.is_some() && !local {
        anyhow::bail!(
            "{} distributes its work on Ray (its [distribute] table): run it from Python, \
             where stoker.from_spec({:?}) is the distributed pipeline (Ray comes with \
             pip install './python[ray]'; docs/distributed.md), or on this machine with --local",
            path.display(),
            path.display().to_string()
        );
    }
    Ok(())
}

pub async fn run(a: RunArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.spec)
        .with_context(|| format!("cannot read {}", a.spec.display()))?;
    let mut spec: PipelineSpec = toml::from_str(&text)
        .with_context(|| format!("{} is not a pipeline spec", a.spec.display()))?;
    crate::run::refuse_distributed(&spec, &a.spec, a.local)?;
    if let Some(e) = a.epochs {
        spec.epochs = e;
    }
    if let Some(t) = a.threads {
        spec.options.threads = Some(t);
    }
    let store = a.store.options()?;
    // The engine has its own threads and I/O runtime; it runs outside this async context.
    tokio::task::spawn_blocking(move || run_blocking(a, spec, store)).await?
}

fn run_blocking(
    a: RunArgs,
    spec: PipelineSpec,
    store: stoker_store::StoreOptions,
) -> anyhow::Result<()> {
    let p = spec.build(store)?;
    if a.explain {
        print!("{}", p.explain());
        return Ok(());
    }
    let t0 = Instant::now();
    let mut run = p.run()?;
    let pb = Progress::new(a.json, a.limit);
    let mut items = 0u64;
    let mut samples = 0u64;
    let mut waited = Duration::ZERO;
    let step = Duration::from_secs_f64(a.step_ms.max(0.0) / 1000.0);
    let mut first_item_s = None;
    loop {
        if a.limit.is_some_and(|l| items >= l) {
            break;
        }
        let w0 = Instant::now();
        let Some(item) = run.next() else { break };
        waited += w0.elapsed();
        let item = item?;
        first_item_s.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        items += 1;
        samples += item.samples() as u64;
        drop(item);
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        pb.tick(&run, items, samples, t0);
    }
    let seconds = t0.elapsed().as_secs_f64();
    pb.finish();
    let st = run.stats();
    drop(run);
    let report = RunReport {
        samples,
        items,
        seconds,
        samples_per_s: samples as f64 / seconds,
        items_per_s: items as f64 / seconds,
        bytes_read: st.storage.as_ref().map_or(0, |m| m.bytes_read),
        skipped: st.skipped,
        peak_rss_bytes: peak_rss_bytes(),
        memory_limit_bytes: st.memory.limit,
        memory_peak_bytes: st.memory.peak,
        step_ms: a.step_ms,
        consumer_wait_s: waited.as_secs_f64(),
        first_item_s,
        stages: st.stages.clone(),
        cache: st.cache.clone(),
        sample_cache: st.sample_cache.clone(),
        batch_slots: st.batch_slots,
        skipped_errors: st.skipped_errors.iter().map(|s| s.error.clone()).collect(),
        autotune: st.autotune.clone(),
        operators: st.operators.clone(),
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        print_summary(&mut out, &report, &st)?;
    }
    Ok(())
}

fn print_summary(out: &mut impl Write, r: &RunReport, st: &Stats) -> std::io::Result<()> {
    writeln!(
        out,
        "{} samples in {} items, {:.2} s: {:.0} samples/s, {:.1} items/s, {:.1} MiB read",
        r.samples,
        r.items,
        r.seconds,
        r.samples_per_s,
        r.items_per_s,
        r.bytes_read as f64 / (1 << 20) as f64
    )?;
    writeln!(
        out,
        "memory: peak {:.1} MiB of a {:.0} MiB budget, process peak RSS {:.1} MiB; {} worker threads",
        r.memory_peak_bytes as f64 / (1 << 20) as f64,
        r.memory_limit_bytes as f64 / (1 << 20) as f64,
        r.peak_rss_bytes as f64 / (1 << 20) as f64,
        st.threads
    )?;
    if let Some(c) = &r.cache {
        writeln!(
            out,
            "cache: {} shards served, {} stored ({:.1} MiB), {} not stored (no room); {:.1} MiB held{}",
            c.hits,
            c.stored,
            c.stored_bytes as f64 / (1 << 20) as f64,
            c.over_limit,
            c.bytes as f64 / (1 << 20) as f64,
            c.limit
                .map(|l| format!(" of {:.1} MiB", l as f64 / (1 << 20) as f64))
                .unwrap_or_default()
        )?;
    }
    if let Some(c) = &r.sample_cache {
        writeln!(
            out,
            "sample cache: {} samples served, {} stored ({:.1} MiB), {} not stored (no room){}",
            c.hits,
            c.stored,
            c.stored_bytes as f64 / (1 << 20) as f64,
            c.over_limit,
            match (c.projected, c.dropped) {
                (Some(p), true) => format!(
                    "; dropped: an epoch measured {:.1} MiB, over its limit",
                    p as f64 / (1 << 20) as f64
                ),
                (Some(p), false) => format!(
                    "; an epoch measured {:.1} MiB as it filled",
                    p as f64 / (1 << 20) as f64
                ),
                _ => String::new(),
            }
        )?;
    }
    if let Some(b) = &r.batch_slots {
        writeln!(
            out,
            "batch: {} samples written in place by their operator, {} copied in{}",
            b.placed,
            b.copied,
            if b.given_up { " (slots given up)" } else { "" }
        )?;
    }
    if r.step_ms > 0.0 {
        writeln!(
            out,
            "consumer: {:.1} ms step, waited {:.2} s for input ({:.0}% of the run)",
            r.step_ms,
            r.consumer_wait_s,
            100.0 * r.consumer_wait_s / r.seconds
        )?;
    }
    writeln!(
        out,
        "{:<44} {:>10} {:>10} {:>8} {:>9} {:>9}",
        "stage", "in", "out", "dropped", "busy s", "wait s"
    )?;
    for s in &r.stages {
        writeln!(
            out,
            "{:<44} {:>10} {:>10} {:>8} {:>9.2} {:>9.2}",
            s.name, s.items_in, s.items_out, s.dropped, s.busy_s, s.wait_s
        )?;
    }
    if r.operators.iter().any(|o| o.samples > 0) {
        writeln!(
            out,
            "{:<44} {:>10} {:>12} {:>12} {:>8} {:>8}",
            "operator (one sample in 8)", "ms/sample", "KB in", "KB out", "ratio", "declared"
        )?;
        let f = |v: Option<f64>, scale: f64, digits: usize| {
            v.map_or("-".to_string(), |v| format!("{:.*}", digits, v / scale))
        };
        for o in &r.operators {
            writeln!(
                out,
                "{:<44} {:>10} {:>12} {:>12} {:>8} {:>8}",
                o.name,
                f(o.ns_per_sample, 1e6, 3),
                f(o.bytes_in_per_sample, 1e3, 1),
                f(o.bytes_out_per_sample, 1e3, 1),
                f(o.size_ratio, 1.0, 2),
                f(o.hint_size_ratio, 1.0, 2),
            )?;
        }
    }
    if r.skipped > 0 {
        writeln!(out, "skipped {} (policy: skip):", r.skipped)?;
        for e in &r.skipped_errors {
            writeln!(out, "  {e}")?;
        }
    }
    Ok(())
}

/// `stoker index URL --format F`: every shard's record count, as a shard index.
pub async fn index(a: IndexArgs) -> anyhow::Result<()> {
    let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
        "source": a.url,
        "format": a.format,
        "glob": a.glob,
    }))
    .context("bad arguments")?;
    let p = spec.build(a.store.options()?)?;
    // Counting reads whole shards and blocks: off the async runtime.
    let counts = tokio::task::spawn_blocking(move || p.count_records()).await??;
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    let index = serde_json::json!({
        "shards": counts
            .iter()
            .map(|(url, n)| serde_json::json!({"url": url, "records": n}))
            .collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&index)? + "\n";
    match &a.output {
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "stoker: {} shards, {total} records: {}",
                counts.len(),
                path.display()
            );
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(())
}
