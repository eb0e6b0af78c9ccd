//! The profiler: what a run did over time, whether it kept its consumer waiting, why, and
//! what to change.
//!
//! Every [`Run`](crate::Run) keeps a *timeline*: a sampler thread copies the run's counters
//! (the same relaxed atomics [`Run::stats`](crate::Run::stats) reads) every
//! [`INTERVAL`], and when the timeline reaches [`MAX_POINTS`] points it keeps every other
//! one and samples half as often, so a run of any length holds at most that many. Nothing
//! is logged per sample: the per-operator times are the profile that one sample in eight
//! records anyway ([`crate::stats::OpProfile`]). The consumer's side is two clock reads per
//! item in `Run::next`: how long it waited for the pipeline, and how long it spent between
//! items (its training step).
//!
//! A *trace* ([`stoker_core::trace`]) is off unless asked for: with it on, the profiled
//! samples' operator runs, the stages' work and the store's requests are also kept as
//! spans (at most [`stoker_core::trace::MAX_SPANS`]), written as Chrome trace events.
//!
//! [`Profile`] is the report: the timeline, each operator's cost, the store's requests, the
//! consumer, and the [`Verdict`] (`verdict.rs`): input-bound or not, the bottleneck and its
//! cause, and a ranked list of changes with the gain the measurements predict. It is written
//! as `profile.json`, `report.html` (`html.rs`: inline SVG, no network) and `trace.json`
//! (`chrome.rs`) by [`Profile::write`].

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::stats::{OperatorStats, Stats};

mod chrome;
mod html;
pub(crate) mod verdict;

pub(crate) use verdict::judge;
pub use verdict::{Cause, Recommendation, Verdict, INPUT_BOUND_SHARE};

/// How often the timeline samples a run's counters at first.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// The most points a timeline keeps (it thins itself by half when it reaches this).
pub const MAX_POINTS: usize = 1200;

/// One stage at one moment: counters since the run started (the plots take differences).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagePoint {
    /// Items that left the stage.
    pub items_out: u64,
    /// Seconds its threads spent working (summed over them).
    pub busy_s: f64,
    /// Seconds its threads spent waiting for input or room.
    pub wait_s: f64,
    /// Items in its output queue now.
    pub queue: u64,
    /// That queue's capacity.
    pub queue_cap: u64,
}

/// The memory budget's use at one moment, by what holds it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// All the budget holds now.
    pub held: u64,
    /// The budget's limit.
    pub limit: u64,
    /// The store's block cache (in memory).
    pub block_cache: u64,
    /// The caches of samples (the optimizer's and the `cache` operator's, in memory).
    pub sample_cache: u64,
    /// The run's samples in flight: admitted by the source, grown by the operators, in
    /// queues and in batches being filled, until the consumer takes them.
    pub samples: u64,
    /// The rest: the store's read-ahead windows and fetches in flight.
    pub read_ahead: u64,
}

/// The store's counters at one moment (since the run started).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StoragePoint {
    /// Logical GETs (whole objects or ranges).
    pub requests: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// Block cache hits and misses.
    pub cache_hits: u64,
    pub cache_misses: u64,
}

/// Everything the timeline records at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimePoint {
    /// Seconds since the run started.
    pub t_s: f64,
    /// Samples and items delivered so far.
    pub samples: u64,
    pub items: u64,
    /// The epoch being read.
    pub epoch: u64,
    /// Worker threads active (the autotuner moves this).
    pub threads: u64,
    /// Per stage, in the order of [`Profile::stages`].
    pub stages: Vec<StagePoint>,
    /// The memory budget.
    pub memory: MemoryPoint,
    /// The store, when the source is one.
    pub storage: Option<StoragePoint>,
    /// Seconds the consumer waited for items so far.
    pub consumer_wait_s: f64,
    /// Seconds the consumer spent between items so far (its own step).
    pub consumer_step_s: f64,
    /// Seconds the source waited for room in the memory budget so far.
    pub budget_wait_s: f64,
    /// CPU seconds the process used since the run started (every thread's).
    #[serde(default)]
    pub cpu_s: f64,
}

/// The consumer's side of a run: how long it waited for input and how long it worked.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ConsumerStats {
    /// Seconds spent in `next` waiting for an item.
    pub wait_s: f64,
    /// Seconds spent between items (the training step, or whatever the consumer does).
    pub step_s: f64,
    /// Items handed over.
    pub items: u64,
}

/// One bucket of the store's latency histogram: requests whose time to first byte was in
/// `[lo_ms, hi_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyBucket {
    pub lo_ms: f64,
    pub hi_ms: f64,
    pub count: u64,
}

/// The store's requests over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorageSummary {
    /// Logical GETs, HEADs and LIST pages.
    pub get_requests: u64,
    pub head_requests: u64,
    pub list_requests: u64,
    /// Payload bytes received.
    pub bytes_read: u64,
    /// Retries made, and reads that failed after them.
    pub retries: u64,
    pub failed_reads: u64,
    /// Time to first byte: percentiles and the histogram's non-empty buckets.
    pub latency_p50_ms: f64,
    pub latency_p90_ms: f64,
    pub latency_p99_ms: f64,
    pub latency: Vec<LatencyBucket>,
    /// Block cache hits and misses.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// The most requests the store runs at once: its `fetch_concurrency` for a source of
    /// whole objects (files, ImageFolder), else its `max_concurrency`.
    pub max_concurrency: usize,
}

/// A whole profile: what [`Run::profile`](crate::Run::profile) returns and `stoker profile`
/// writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The verdict: input-bound or not, the bottleneck, its cause, what to change.
    pub verdict: Verdict,
    /// Seconds the profile covers (from the run's start).
    pub seconds: f64,
    /// Samples and items delivered, and their rates.
    pub samples: u64,
    pub items: u64,
    pub samples_per_s: f64,
    /// Seconds from the start to the first item (`None`: none came).
    pub first_item_s: Option<f64>,
    /// CPUs this process may use, and the worker threads the run ended with.
    pub cpus: usize,
    pub threads: u64,
    /// The stages' names, in pipeline order (the source first, the prefetch last), as
    /// `explain()` and `Run::stats` name them.
    pub stages: Vec<String>,
    /// Each stage's final numbers.
    pub stage_stats: Vec<crate::stats::StageStats>,
    /// Each operator's measured cost and bytes against its declaration.
    pub operators: Vec<OperatorStats>,
    /// The timeline, oldest first.
    pub timeline: Vec<TimePoint>,
    /// The consumer's wait and work.
    pub consumer: ConsumerStats,
    /// Seconds the source waited for room in the memory budget.
    pub budget_wait_s: f64,
    /// CPU seconds the process used over the run (all its threads, the consumer's too).
    #[serde(default)]
    pub cpu_s: f64,
    /// The memory budget at the end (held, peak, limit).
    pub memory: crate::stats::MemoryStats,
    /// The store's requests, when the source is a store.
    pub storage: Option<StorageSummary>,
    /// The autotuner's decisions: (seconds since start, threads after, why).
    pub autotune: Vec<(f64, u64, String)>,
    /// `Run::explain()`: the plan as written and as run, with every pass's reasons.
    pub explain: String,
    /// Records or samples skipped under the skip policy.
    pub skipped: u64,
    /// When the run started, in microseconds from the trace's origin
    /// ([`stoker_core::trace::origin`]): places the timeline on the trace's clock.
    #[serde(default)]
    pub run_start_us: f64,
}

impl Profile {
    /// Writes `profile.json`, `report.html` and, when `trace` has spans, `trace.json` into
    /// `dir` (made if missing). Returns the paths written.
    pub fn write(
        &self,
        dir: &Path,
        trace: &[stoker_core::trace::Span],
    ) -> std::io::Result<Vec<std::path::PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        let json = dir.join("profile.json");
        std::fs::write(&json, serde_json::to_string_pretty(self)? + "\n")?;
        out.push(json);
        let html = dir.join("report.html");
        std::fs::write(&html, html::render(self))?;
        out.push(html);
        let t = dir.join("trace.json");
        std::fs::write(&t, chrome::render(self, trace))?;
        out.push(t);
        Ok(out)
    }

    /// The report as HTML (one self-contained page).
    pub fn html(&self) -> String {
        html::render(self)
    }

    /// The trace as Chrome trace-event JSON (opens in Perfetto and `chrome://tracing`).
    pub fn chrome_trace(&self, trace: &[stoker_core::trace::Span]) -> String {
        chrome::render(self, trace)
    }
}

/// A timeline point from a stats snapshot and the consumer's numbers.
pub(crate) fn point(st: &Stats, consumer: ConsumerStats, budget_wait_s: f64) -> TimePoint {
    let sample_cache = st.sample_cache.as_ref().map_or(0, |c| c.bytes)
        + st.cache
            .as_ref()
            .filter(|c| c.limit.is_some())
            .map_or(0, |c| c.bytes);
    let block_cache = st.storage.as_ref().map_or(0, |s| s.cache.memory_bytes);
    let held = st.memory.held;
    TimePoint {
        t_s: st.elapsed_s,
        samples: st.samples,
        items: st.items,
        epoch: st.epoch,
        threads: st.threads,
        stages: st
            .stages
            .iter()
            .map(|s| StagePoint {
                items_out: s.items_out,
                busy_s: s.busy_s,
                wait_s: s.wait_s,
                queue: s.queue.0,
                queue_cap: s.queue.1,
            })
            .collect(),
        memory: MemoryPoint {
            held,
            limit: st.memory.limit,
            block_cache,
            sample_cache,
            samples: st.memory.samples,
            read_ahead: held.saturating_sub(block_cache + sample_cache + st.memory.samples),
        },
        storage: st.storage.as_ref().map(|s| StoragePoint {
            requests: s.get_requests,
            bytes: s.bytes_read,
            cache_hits: s.cache.hits,
            cache_misses: s.cache.misses,
        }),
        consumer_wait_s: consumer.wait_s,
        consumer_step_s: consumer.step_s,
        budget_wait_s,
        cpu_s: st.cpu_s,
    }
}
