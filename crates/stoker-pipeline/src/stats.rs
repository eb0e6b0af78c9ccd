//! Per-stage statistics, always on and readable while the pipeline runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

/// Counters of one stage (updated with relaxed atomics: cheap, and exact once quiet).
#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    pub items_in: AtomicU64,
    pub items_out: AtomicU64,
    pub busy_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub bytes: AtomicU64,
    pub queue_len: AtomicU64,
    pub queue_cap: AtomicU64,
    pub dropped: AtomicU64,
}

impl StageCounters {
    pub(crate) fn add(&self, c: &AtomicU64, v: u64) {
        let _ = self;
        c.fetch_add(v, Ordering::Relaxed);
    }
}

/// A stage's numbers at one moment.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageStats {
    /// The stage (`source(tar)`, `map[decode_utf8(txt)]`, `batch(32)`).
    pub name: String,
    /// Items that entered.
    pub items_in: u64,
    /// Items that left.
    pub items_out: u64,
    /// Items dropped (filters).
    pub dropped: u64,
    /// Seconds spent working (summed over the stage's threads).
    pub busy_s: f64,
    /// Seconds spent waiting for input or for room downstream.
    pub wait_s: f64,
    /// Bytes read (source) or produced.
    pub bytes: u64,
    /// Items in the stage's output queue now, and its capacity.
    pub queue: (u64, u64),
}

/// What an operator measured while the run goes, for the optimizer's cost model and
/// `Run::explain`: one sample in [`PROFILE_EVERY`] (chosen by its number in the epoch, so
/// the same ones whatever the timing) is timed and weighed before and after the operator;
/// a batch (an operator after `batch`) always is. Only those touch these counters, so the
/// profile costs the others nothing.
#[derive(Debug, Default)]
pub(crate) struct OpProfile {
    /// The operator's name, for the trace's spans.
    pub name: String,
    /// Samples timed and weighed (rows, for an operator on batches).
    pub samples: AtomicU64,
    pub busy_ns: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

/// One sample in this many is profiled per operator (see [`OpProfile`]).
pub(crate) const PROFILE_EVERY: u64 = 8;

impl OpProfile {
    /// One profiled item of `rows` samples: `ns` in the operator since `start`, `bytes_in`
    /// in and `bytes_out` out (a span of the trace too, when it is on).
    pub(crate) fn note(&self, start: Instant, rows: u64, ns: u64, bytes_in: u64, bytes_out: u64) {
        let key = self as *const Self as usize;
        stoker_core::trace::span_sampled("operator", key, (start, Instant::now()), || {
            self.name.clone().into()
        });
        self.samples.fetch_add(rows, Ordering::Relaxed);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    }
}

/// An operator's measurements and declarations (`Stats::operators`): what the optimizer
/// plans with and `Run::explain` shows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OperatorStats {
    /// The operator as plans name it (a fused kernel: its operators joined by `+`).
    pub name: String,
    /// Its place in the plan as written (a fused kernel's: the crop's).
    pub index: usize,
    /// Samples measured (one in eight of those it ran on; every row of a batch).
    pub samples: u64,
    /// Nanoseconds per sample, measured.
    pub ns_per_sample: Option<f64>,
    /// Bytes per sample in and out, measured.
    pub bytes_in_per_sample: Option<f64>,
    /// Bytes per sample out, measured.
    pub bytes_out_per_sample: Option<f64>,
    /// Output bytes per input byte, measured.
    pub size_ratio: Option<f64>,
    /// What the operator declares: nanoseconds per sample.
    pub hint_ns: Option<f64>,
    /// What the operator declares: output bytes per input byte.
    pub hint_size_ratio: Option<f64>,
    /// A Python function on the engine's threads (it takes the GIL; see
    /// `stoker_core::OpMeta::gil`).
    #[serde(default)]
    pub gil: bool,
}

/// Counters of the `cache` operator (see [`SampleCacheStats`]).
#[derive(Debug, Default)]
pub(crate) struct CacheCounters {
    pub hits: AtomicU64,
    pub stored: AtomicU64,
    pub stored_bytes: AtomicU64,
    pub over_limit: AtomicU64,
    pub bytes: AtomicU64,
    /// `u64::MAX`: none.
    pub limit: AtomicU64,
    /// The epoch's bytes at the cache point as measured while it filled (0: not measured).
    pub projected: AtomicU64,
    /// 1: the measured size did not fit, and the cache was dropped.
    pub dropped: AtomicU64,
}

impl CacheCounters {
    pub(crate) fn snapshot(&self) -> SampleCacheStats {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SampleCacheStats {
            hits: ld(&self.hits),
            stored: ld(&self.stored),
            stored_bytes: ld(&self.stored_bytes),
            over_limit: ld(&self.over_limit),
            bytes: ld(&self.bytes),
            limit: Some(ld(&self.limit)).filter(|&l| l != u64::MAX),
            projected: Some(ld(&self.projected)).filter(|&l| l != 0),
            dropped: ld(&self.dropped) != 0,
        }
    }
}

/// The `cache` operator's numbers: what it served, stored and could not keep.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SampleCacheStats {
    /// Shards (objects) served from the cache instead of the source.
    pub hits: u64,
    /// Shards this run stored in the cache.
    pub stored: u64,
    /// Bytes this run stored (the files' sizes on disk; samples' sizes in memory).
    pub stored_bytes: u64,
    /// Shards not stored because the cache had no room for them (the directory's size
    /// limit; in memory, half the memory budget). They are read from the source each epoch.
    pub over_limit: u64,
    /// Bytes in the cache now: the directory's files (all runs', as of this run's last
    /// write or open), or the samples this run keeps in memory.
    pub bytes: u64,
    /// The size limit: the directory's (`None`: unbounded), or half the memory budget.
    pub limit: Option<u64>,
    /// The optimizer's cache of samples, when the size of an epoch's samples at its point
    /// was not known before the run: that size as measured on the first samples.
    pub projected: Option<u64>,
    /// The optimizer's cache of samples was dropped: the measured size did not fit.
    pub dropped: bool,
}

/// A skipped record or sample.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Skipped {
    /// The error, with object, offset and operator.
    pub error: String,
}

/// The run's memory budget at one moment, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryStats {
    /// Held now (samples and batches in flight, read-ahead, cached blocks).
    pub held: u64,
    /// The most held at once since the run started.
    pub peak: u64,
    /// The limit.
    pub limit: u64,
    /// Of `held`, what the run's samples hold: admitted by the source, grown by the
    /// operators, in queues and batches until the consumer takes them (not the caches, not
    /// the store's read-ahead).
    #[serde(default)]
    pub samples: u64,
}

/// Everything at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// Samples delivered (inside batches too).
    pub samples: u64,
    /// Items delivered (samples or batches).
    pub items: u64,
    /// The epoch being read.
    pub epoch: u64,
    /// Worker threads active now (the autotuner moves this).
    pub threads: u64,
    /// Records or samples skipped under the skip policy.
    pub skipped: u64,
    /// The first skipped errors (at most 100).
    pub skipped_errors: Vec<Skipped>,
    /// Per stage, in pipeline order.
    pub stages: Vec<StageStats>,
    /// Autotuner decisions: (seconds since start, threads after, why).
    pub autotune: Vec<(f64, u64, String)>,
    /// The memory budget.
    pub memory: MemoryStats,
    /// The store's request metrics (bytes read from storage, requests, latencies), when the
    /// source is a store.
    pub storage: Option<stoker_store::MetricsSnapshot>,
    /// The `cache` operator's numbers, when the pipeline has one.
    pub cache: Option<SampleCacheStats>,
    /// The optimizer's cache of samples at its cache point (decoded images, when the run
    /// has one; see `docs/pipeline.md`, The optimizer): `hits` and `stored` count samples.
    pub sample_cache: Option<SampleCacheStats>,
    /// Where the batch stage found its samples' tensors, when the operator before it
    /// writes them into the batch's buffer (see `stoker_core::BatchSlots`).
    pub batch_slots: Option<BatchSlotStats>,
    /// Each operator's measurements, in the order they run (the workers' first, then the
    /// parallel stages').
    pub operators: Vec<OperatorStats>,
    /// The consumer: how long it waited for items and how long it spent between them.
    pub consumer: crate::profile::ConsumerStats,
    /// Seconds the source waited for room in the memory budget.
    pub budget_wait_s: f64,
    /// CPU seconds the whole process used (user and system, every thread, the consumer's
    /// too) since the run started.
    pub cpu_s: f64,
}

/// The batch stage's slots: samples whose tensor was written in place by their operator,
/// and those the stage copied (the prediction missed, or the sample was too far ahead).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct BatchSlotStats {
    /// Samples found in their batch slot (no copy).
    pub placed: u64,
    /// Samples copied into a slot of a batch that started in place (the others' batches
    /// are stacked as without slots, and counted in neither).
    pub copied: u64,
    /// Whether slots were given up (batches kept missing them).
    pub given_up: bool,
}

#[derive(Debug)]
pub(crate) struct StatsHub {
    pub started: Instant,
    pub stages: Vec<(String, Arc<StageCounters>)>,
    pub samples: AtomicU64,
    pub items: AtomicU64,
    pub epoch: AtomicU64,
    pub threads: AtomicU64,
    pub skipped: AtomicU64,
    pub skipped_errors: Mutex<Vec<Skipped>>,
    pub autotune: Mutex<Vec<(f64, u64, String)>>,
    pub cache: Option<Arc<CacheCounters>>,
    /// The optimizer's cache of samples, when the run has one.
    pub sample_cache: Option<Arc<CacheCounters>>,
    /// Each operator that runs per item (its place in the plan, its declaration, its
    /// profile), in the order they run.
    pub operators: Vec<(usize, stoker_core::OpMeta, Arc<OpProfile>)>,
    /// Nanoseconds the consumer waited in `next`, and spent between items (see
    /// [`crate::profile`]).
    pub consumer_wait_ns: AtomicU64,
    pub consumer_step_ns: AtomicU64,
    /// Nanoseconds the source waited for room in the memory budget.
    pub budget_wait_ns: AtomicU64,
    /// The budget's bytes held by the run's samples in flight (not its caches').
    pub in_flight: Arc<AtomicU64>,
    /// The process's CPU seconds when the run started ([`process_cpu_s`]).
    pub cpu_start: f64,
}

/// CPU seconds this process has used (user and system, all threads), from
/// `/proc/self/stat` (in the kernel's 100 Hz ticks); 0 where it cannot be read.
pub(crate) fn process_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command name (which is in parentheses and may hold spaces):
    // utime and stime are the 14th and 15th of the line, the 12th and 13th after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

impl StatsHub {
    pub(crate) fn new(
        names: Vec<String>,
        cache: Option<Arc<CacheCounters>>,
        operators: Vec<(usize, stoker_core::OpMeta)>,
    ) -> StatsHub {
        // The trace's clock starts no later than the run (see `Profile::run_start_us`).
        stoker_core::trace::origin();
        StatsHub {
            started: Instant::now(),
            stages: names
                .into_iter()
                .map(|n| (n, Arc::new(StageCounters::default())))
                .collect(),
            samples: AtomicU64::new(0),
            items: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            threads: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            skipped_errors: Mutex::new(Vec::new()),
            autotune: Mutex::new(Vec::new()),
            cache,
            sample_cache: None,
            operators: operators
                .into_iter()
                .map(|(i, meta)| {
                    let p = OpProfile {
                        name: meta.name.clone(),
                        ..OpProfile::default()
                    };
                    (i, meta, Arc::new(p))
                })
                .collect(),
            consumer_wait_ns: AtomicU64::new(0),
            consumer_step_ns: AtomicU64::new(0),
            budget_wait_ns: AtomicU64::new(0),
            in_flight: Arc::default(),
            cpu_start: process_cpu_s(),
        }
    }

    /// The profiles of the operators at these places in the plan, in that order.
    pub(crate) fn profiles(&self, indices: impl IntoIterator<Item = usize>) -> Vec<Arc<OpProfile>> {
        indices
            .into_iter()
            .map(|i| {
                self.operators
                    .iter()
                    .find(|(j, ..)| *j == i)
                    .map(|(.., p)| p.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    pub(crate) fn stage(&self, i: usize) -> Arc<StageCounters> {
        self.stages[i].1.clone()
    }

    pub(crate) fn skip(&self, e: &stoker_core::Error) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
        let mut l = self.skipped_errors.lock();
        if l.len() < 100 {
            l.push(Skipped {
                error: e.to_string(),
            });
        }
    }

    pub(crate) fn snapshot(
        &self,
        budget: &stoker_core::MemoryBudget,
        store: Option<&stoker_store::Store>,
        baseline: Option<&stoker_store::MetricsSnapshot>,
    ) -> Stats {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            samples: ld(&self.samples),
            items: ld(&self.items),
            epoch: ld(&self.epoch),
            threads: ld(&self.threads),
            skipped: ld(&self.skipped),
            skipped_errors: self.skipped_errors.lock().clone(),
            stages: self
                .stages
                .iter()
                .map(|(name, c)| StageStats {
                    name: name.clone(),
                    items_in: ld(&c.items_in),
                    items_out: ld(&c.items_out),
                    dropped: ld(&c.dropped),
                    busy_s: ld(&c.busy_ns) as f64 / 1e9,
                    wait_s: ld(&c.wait_ns) as f64 / 1e9,
                    bytes: ld(&c.bytes),
                    queue: (ld(&c.queue_len), ld(&c.queue_cap)),
                })
                .collect(),
            autotune: self.autotune.lock().clone(),
            memory: MemoryStats {
                held: budget.used(),
                peak: budget.peak(),
                limit: budget.limit(),
                samples: ld(&self.in_flight),
            },
            storage: store.map(|s| match baseline {
                Some(b) => s.metrics().since(b),
                None => s.metrics(),
            }),
            cache: self.cache.as_deref().map(CacheCounters::snapshot),
            sample_cache: self.sample_cache.as_deref().map(CacheCounters::snapshot),
            batch_slots: None,
            operators: self
                .operators
                .iter()
                .map(|(index, meta, p)| {
                    let n = ld(&p.samples);
                    let per = |a: &AtomicU64| (n > 0).then(|| ld(a) as f64 / n as f64);
                    let (bin, bout) = (ld(&p.bytes_in), ld(&p.bytes_out));
                    OperatorStats {
                        name: meta.name.clone(),
                        index: *index,
                        samples: n,
                        ns_per_sample: per(&p.busy_ns),
                        bytes_in_per_sample: per(&p.bytes_in),
                        bytes_out_per_sample: per(&p.bytes_out),
                        size_ratio: (n > 0 && bin > 0).then(|| bout as f64 / bin as f64),
                        hint_ns: meta.cost_ns,
                        hint_size_ratio: meta.size_ratio,
                        gil: meta.gil,
                    }
                })
                .collect(),
            consumer: crate::profile::ConsumerStats {
                wait_s: ld(&self.consumer_wait_ns) as f64 / 1e9,
                step_s: ld(&self.consumer_step_ns) as f64 / 1e9,
                items: ld(&self.items),
            },
            budget_wait_s: ld(&self.budget_wait_ns) as f64 / 1e9,
            cpu_s: (process_cpu_s() - self.cpu_start).max(0.0),
        }
    }
}
