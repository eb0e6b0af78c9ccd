//! `stoker bench`: read everything under a prefix (or one object) through the engine and
//! report throughput, request latency and client CPU time.
//!
//! Small objects (up to one part) go through [`Store::fetch_many`] with many requests in
//! flight; large objects through [`Store::read_stream`] as concurrent ranged parts. Every
//! object's length is checked against its listed size, so a client that drops bytes cannot
//! look fast.

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{bail, Context};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use stoker_store::{FetchManyOptions, ListOptions, MetricsSnapshot, ObjectInfo, Store};

use crate::args::BenchArgs;

/// Figures of one pass over the objects.
#[derive(Debug, Clone, Serialize)]
pub struct EpochReport {
    pub epoch: usize,
    pub objects: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub objects_per_s: f64,
    pub mib_per_s: f64,
}

impl EpochReport {
    /// The figures of epoch `epoch`: `objects` and `bytes` read in `seconds`.
    pub fn new(epoch: usize, objects: u64, bytes: u64, seconds: f64) -> EpochReport {
        let seconds = seconds.max(1e-9);
        EpochReport {
            epoch,
            objects,
            bytes,
            seconds,
            objects_per_s: objects as f64 / seconds,
            mib_per_s: bytes as f64 / (1 << 20) as f64 / seconds,
        }
    }
}

/// The whole run; `--json` prints this.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub url: String,
    pub objects: u64,
    pub bytes: u64,
    /// Seconds of the first epoch, from the first request to the last byte: for a prefix this
    /// includes the listing, which runs at the same time as the reads; for one object it
    /// excludes the lookup (see `list_seconds`).
    pub seconds: f64,
    pub objects_per_s: f64,
    pub mib_per_s: f64,
    pub list_seconds: f64,
    /// Seconds to set up the client (credentials, TLS, cache).
    pub open_seconds: f64,
    pub total_seconds: f64,
    pub cpu_seconds: f64,
    pub latency_p50_ms: f64,
    pub latency_p90_ms: f64,
    pub latency_p99_ms: f64,
    pub requests: u64,
    pub retries: u64,
    pub concurrency: usize,
    pub part_size: u64,
    /// Bytes the memory cache could use (0: off, the default for a single pass).
    pub cache_memory: u64,
    pub epochs: Vec<EpochReport>,
    pub metrics: MetricsSnapshot,
}

/// CPU seconds (user + system) used by this process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}

/// Lists the targets of a URL: every object under it, or the object it names.
pub async fn targets(store: &Store, glob: Option<&str>) -> anyhow::Result<Vec<ObjectInfo>> {
    let key = store.url_key().to_string();
    let mut opts = ListOptions::default();
    if let Some(g) = glob {
        opts = opts.with_glob(g);
    }
    let listed = store.list_all(&key, &opts).await?;
    if !listed.is_empty() {
        return Ok(listed);
    }
    if key.is_empty() || key.ends_with('/') {
        bail!("nothing to read under {}", store.object_url(&key));
    }
    let info = store.head(&key).await.with_context(|| {
        format!(
            "nothing under {} and no such object",
            store.object_url(&key)
        )
    })?;
    Ok(vec![info])
}

/// Fails when a fetched object is not the one listed, or not its listed size.
fn check_fetched(
    store: &Store,
    item: &stoker_store::FetchedObject,
    want: &ObjectInfo,
) -> anyhow::Result<()> {
    if item.key != want.key || item.bytes.len() as u64 != want.size {
        bail!(
            "{}: got {} bytes, listed size is {}",
            store.object_url(&want.key),
            item.bytes.len(),
            want.size
        );
    }
    Ok(())
}

/// Streams one large object as parallel ranged parts; checks its length.
async fn read_large(store: &Store, o: &ObjectInfo, progress: &ProgressBar) -> anyhow::Result<u64> {
    let mut parts = store.read_stream(&o.key, None).await?;
    let mut got = 0u64;
    while let Some(p) = parts.next().await {
        let p = p?;
        got += p.len() as u64;
        progress.inc(p.len() as u64);
    }
    if got != o.size {
        bail!(
            "{}: got {got} bytes, size is {}",
            store.object_url(&o.key),
            o.size
        );
    }
    Ok(got)
}

/// The keys of a `--keys` file, as keys of the store: each line relative to the URL's prefix;
/// blank lines and lines starting with `#` are skipped.
fn read_key_file(store: &Store, file: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the key file {}", file.display()))?;
    let base = store.url_key();
    let dir = if base.is_empty() || base.ends_with('/') {
        base.to_string()
    } else {
        format!("{base}/")
    };
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| format!("{dir}{}", l.trim_start_matches('/')))
        .collect();
    if keys.is_empty() {
        bail!("the key file {} names no key", file.display());
    }
    Ok(keys)
}

/// Reads the given keys, whole, once per epoch, with no listing. Sizes are learnt in the first
/// epoch (the store checks each body against its Content-Length); a later epoch that gets a
/// different size for a key is an error. Returns what was read, as objects, and each epoch.
async fn measure_keys(
    store: &Store,
    keys: &[String],
    epochs: usize,
    progress: &ProgressBar,
) -> anyhow::Result<(Vec<ObjectInfo>, Vec<EpochReport>)> {
    let mut sizes: Vec<u64> = Vec::with_capacity(keys.len());
    let mut reports = Vec::new();
    for epoch in 1..=epochs.max(1) {
        progress.set_message(format!("epoch {epoch}"));
        let start = Instant::now();
        let (mut bytes, mut objects) = (0u64, 0usize);
        let mut stream = store.fetch_many(keys.to_vec(), FetchManyOptions::default());
        while let Some(item) = stream.next().await {
            let item = item?;
            let got = item.bytes.len() as u64;
            if item.key != keys[objects] {
                bail!(
                    "{}: fetched out of order (expected {})",
                    store.object_url(&item.key),
                    store.object_url(&keys[objects])
                );
            }
            match sizes.get(objects) {
                None => sizes.push(got),
                Some(&want) if want != got => bail!(
                    "{}: got {got} bytes in epoch {epoch}, {want} in epoch 1",
                    store.object_url(&item.key)
                ),
                Some(_) => {}
            }
            bytes += got;
            objects += 1;
            progress.inc(got);
        }
        let seconds = start.elapsed().as_secs_f64();
        reports.push(EpochReport::new(epoch, objects as u64, bytes, seconds));
    }
    progress.finish_and_clear();
    let listed = keys
        .iter()
        .zip(&sizes)
        .map(|(k, &size)| ObjectInfo {
            key: k.clone(),
            size,
            etag: None,
            version: None,
            last_modified_ms: 0,
        })
        .collect();
    Ok((listed, reports))
}

/// Reads every target once per epoch.
pub async fn measure(
    store: &Store,
    targets: &[ObjectInfo],
    epochs: usize,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<EpochReport>> {
    let ps = store.options().part_size;
    let (small, large): (Vec<&ObjectInfo>, Vec<&ObjectInfo>) =
        targets.iter().partition(|o| o.size <= ps);
    let total: u64 = targets.iter().map(|o| o.size).sum();
    let mut reports = Vec::new();
    for epoch in 1..=epochs.max(1) {
        progress.reset();
        progress.set_length(total);
        progress.set_message(format!("epoch {epoch}"));
        let start = Instant::now();
        let mut bytes = 0u64;
        let mut objects = 0u64;
        let keys: Vec<String> = small.iter().map(|o| o.key.clone()).collect();
        let mut stream = store.fetch_many(keys, FetchManyOptions::default());
        let mut expected = small.iter();
        while let Some(item) = stream.next().await {
            let item = item?;
            let want = expected.next().expect("one result per key");
            check_fetched(store, &item, want)?;
            bytes += item.bytes.len() as u64;
            objects += 1;
            progress.inc(item.bytes.len() as u64);
        }
        for o in &large {
            bytes += read_large(store, o, progress).await?;
            objects += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        reports.push(EpochReport::new(epoch, objects, bytes, seconds));
    }
    progress.finish_and_clear();
    Ok(reports)
}

/// The first epoch of a prefix, with listing and reading overlapped: small objects are fetched
/// as soon as their listing page arrives. Returns the epoch's figures and everything listed
/// (for later epochs). `None` when the prefix lists nothing (the URL may name one object).
pub async fn first_epoch_streaming(
    store: &Store,
    glob: Option<&str>,
    progress: &ProgressBar,
) -> anyhow::Result<Option<(EpochReport, Vec<ObjectInfo>)>> {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    let ps = store.options().part_size;
    let mut opts = ListOptions::default();
    if let Some(g) = glob {
        opts = opts.with_glob(g);
    }
    let prefix = store.url_key().to_string();
    let mut listing = store.list(&prefix, &opts);
    let expected: Arc<Mutex<VecDeque<ObjectInfo>>> = Arc::default();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let exp = expected.clone();
    let lister = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(o) = listing.next().await {
            let o = o?;
            if o.size <= ps {
                exp.lock().expect("not poisoned").push_back(o.clone());
                let _ = tx.send(o.key.clone());
            }
            all.push(o);
        }
        Ok::<_, stoker_store::Error>(all)
    });
    let keys =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|k| (k, rx)) });
    progress.set_message("epoch 1");
    let start = Instant::now();
    let mut stream = store.fetch_many_stream(keys, FetchManyOptions::default());
    let (mut bytes, mut objects) = (0u64, 0u64);
    while let Some(item) = stream.next().await {
        let item = item?;
        let want = expected
            .lock()
            .expect("not poisoned")
            .pop_front()
            .expect("one listed object per result");
        check_fetched(store, &item, &want)?;
        bytes += want.size;
        objects += 1;
        progress.inc(want.size);
    }
    let all = lister.await??;
    if all.is_empty() {
        return Ok(None);
    }
    for o in all.iter().filter(|o| o.size > ps) {
        bytes += read_large(store, o, progress).await?;
        objects += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Some((EpochReport::new(1, objects, bytes, seconds), all)))
}

pub fn progress_bar(hidden: bool) -> ProgressBar {
    if hidden || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
        )
        .expect("valid template"),
    );
    pb
}

pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    let mut opts = a.store.options()?;
    if let Some(c) = a.concurrency {
        opts.fetch_concurrency = c.max(1);
        opts.max_concurrency = c.max(1);
    }
    if let Some(p) = a.part_size {
        opts.part_size = p.bytes().max(1);
    }
    // One pass re-reads nothing, so filling the memory cache would be pure cost (fresh pages
    // for every byte read). Cache when there is a later epoch, or when asked with
    // `-o cache_memory=...` / `--cache-dir`.
    let single_pass = a.epochs <= 1 && opts.cache_memory.is_none() && opts.cache_dir.is_none();
    if a.no_cache || single_pass {
        opts.cache_memory = Some(0);
    }
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let store = Store::open(&a.url, opts)?;
    let pb = progress_bar(a.json);
    let open_seconds = t0.elapsed().as_secs_f64();
    // A key file: no listing. A prefix: list and read at once. Otherwise (one object), look
    // it up first.
    let (targets, mut epochs, list_seconds) = if let Some(file) = &a.keys {
        let keys = read_key_file(&store, file)?;
        let (listed, epochs) = measure_keys(&store, &keys, a.epochs, &pb).await?;
        (listed, epochs, 0.0)
    } else if let Some((first, listed)) =
        first_epoch_streaming(&store, a.glob.as_deref(), &pb).await?
    {
        let mut epochs = vec![first];
        if a.epochs > 1 {
            for mut e in measure(&store, &listed, a.epochs - 1, &pb).await? {
                e.epoch += 1;
                epochs.push(e);
            }
        }
        (listed, epochs, 0.0)
    } else {
        let targets = targets(&store, a.glob.as_deref()).await?;
        let list_seconds = t0.elapsed().as_secs_f64() - open_seconds;
        let epochs = measure(&store, &targets, a.epochs, &pb).await?;
        (targets, epochs, list_seconds)
    };
    pb.finish_and_clear();
    epochs.sort_by_key(|e| e.epoch);
    let m = store.metrics();
    let first = &epochs[0];
    let o = store.options();
    let report = BenchReport {
        url: a.url.clone(),
        objects: first.objects,
        bytes: first.bytes,
        seconds: first.seconds,
        objects_per_s: first.objects_per_s,
        mib_per_s: first.mib_per_s,
        list_seconds,
        open_seconds,
        total_seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds: cpu_seconds() - cpu0,
        latency_p50_ms: m.latency_p50_ms,
        latency_p90_ms: m.latency_p90_ms,
        latency_p99_ms: m.latency_p99_ms,
        requests: m
            .http_requests
            .max(m.get_requests + m.head_requests + m.list_requests),
        retries: m.retries,
        concurrency: if targets.iter().all(|t| t.size <= o.part_size) {
            o.fetch_concurrency
        } else {
            o.max_concurrency
        },
        part_size: o.part_size,
        cache_memory: m.cache.memory_capacity,
        epochs,
        metrics: m,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

pub fn print_report(r: &BenchReport) {
    println!("{}", r.url);
    println!(
        "  {} objects, {} (listed in {:.2} s)",
        r.objects,
        stoker_core::ByteSize(r.bytes),
        r.list_seconds
    );
    for e in &r.epochs {
        println!(
            "  epoch {}: {:>8.2} s  {:>10.1} objects/s  {:>9.1} MiB/s",
            e.epoch, e.seconds, e.objects_per_s, e.mib_per_s
        );
    }
    println!(
        "  latency p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms;  {} requests, {} retries",
        r.latency_p50_ms, r.latency_p90_ms, r.latency_p99_ms, r.requests, r.retries
    );
    println!(
        "  cache: {} hits, {} misses;  client CPU {:.2} s;  peak budget {}",
        r.metrics.cache.hits,
        r.metrics.cache.misses,
        r.cpu_seconds,
        stoker_core::ByteSize(r.metrics.memory_peak)
    );
}
