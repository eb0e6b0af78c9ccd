//! The run's timeline and profile (see [`crate::profile`]): a sampler thread that copies the
//! run's counters at intervals, the consumer's clock, and [`Run::profile`].

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use stoker_core::MemoryBudget;

use super::{Run, Shared};
use crate::profile::{self, LatencyBucket, Profile, StorageSummary, TimePoint};
use crate::stats::Stats;

/// What the run's statistics are read from: its counters, budget and store.
#[derive(Clone)]
pub(super) struct StatsView {
    pub(super) shared: Arc<Shared>,
    pub(super) budget: MemoryBudget,
    pub(super) store: Option<stoker_store::Store>,
    pub(super) baseline: Option<stoker_store::MetricsSnapshot>,
}

impl StatsView {
    pub(super) fn stats(&self) -> Stats {
        let mut st =
            self.shared
                .stats
                .snapshot(&self.budget, self.store.as_ref(), self.baseline.as_ref());
        st.batch_slots = self.shared.slots.as_ref().map(|s| crate::BatchSlotStats {
            placed: s.placed(),
            copied: s.copied(),
            given_up: s.given_up(),
        });
        st
    }

    fn point(&self) -> TimePoint {
        let st = self.stats();
        profile::point(&st, st.consumer, st.budget_wait_s)
    }
}

/// The sampler's first interval: [`profile::INTERVAL`], or `STOKER_PROFILE_INTERVAL_MS`
/// when that is set (`0`: no timeline, for measuring what it costs).
fn interval() -> Option<std::time::Duration> {
    match std::env::var("STOKER_PROFILE_INTERVAL_MS") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(ms) => Some(std::time::Duration::from_millis(ms)),
            Err(_) => Some(profile::INTERVAL),
        },
        Err(_) => Some(profile::INTERVAL),
    }
}

/// Starts the sampler: a point every [`interval`] (then, past [`profile::MAX_POINTS`],
/// every other point dropped and the interval doubled) until `stop` is dropped; `None`
/// when the timeline is turned off.
pub(super) fn spawn(view: StatsView, stop: Receiver<()>) -> Option<JoinHandle<()>> {
    let mut every = interval()?;
    let t = std::thread::Builder::new()
        .name("stoker-timeline".into())
        .spawn(move || loop {
            match stop.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let p = view.point();
            let mut t = view.shared.timeline.lock();
            t.push(p);
            if t.len() >= profile::MAX_POINTS {
                let mut i = 0;
                t.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                every *= 2;
            }
        })
        .expect("spawn the timeline sampler");
    Some(t)
}

/// The consumer's clock: when it last received an item, and since when it waits for the
/// next one.
#[derive(Debug, Default)]
pub(super) struct ConsumerClock {
    last_return: Option<Instant>,
    waiting_since: Option<Instant>,
}

impl ConsumerClock {
    /// The consumer asks for an item: the time since the last one was its own step.
    pub(super) fn ask(&mut self, shared: &Shared) {
        if self.waiting_since.is_none() {
            let now = Instant::now();
            if let Some(r) = self.last_return {
                let ns = now.duration_since(r).as_nanos() as u64;
                shared
                    .stats
                    .consumer_step_ns
                    .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
            }
            self.waiting_since = Some(now);
        }
    }

    /// The consumer has its item (or the end): the time since it asked was its wait.
    pub(super) fn got(&mut self, shared: &Shared) {
        let now = Instant::now();
        if let Some(w) = self.waiting_since.take() {
            let ns = now.duration_since(w).as_nanos() as u64;
            shared
                .stats
                .consumer_wait_ns
                .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        }
        self.last_return = Some(now);
    }
}

impl Run {
    /// The run's timeline so far (a point every 100 ms or so; see [`crate::profile`]).
    pub fn timeline(&self) -> Vec<TimePoint> {
        self.shared.timeline.lock().clone()
    }

    /// The profile of the run so far: its timeline, each operator's cost, the store's
    /// requests, the consumer's wait and work, and the [`Verdict`](crate::profile::Verdict)
    /// on them (input-bound or not, the bottleneck, what to change). Cheap enough to call
    /// at any time; [`Profile::write`] writes it as JSON, HTML and a Chrome trace.
    pub fn profile(&self) -> Profile {
        let view = self.view();
        let st = view.stats();
        let mut timeline = self.timeline();
        timeline.push(profile::point(&st, st.consumer, st.budget_wait_s));
        let storage = st.storage.as_ref().map(|m| StorageSummary {
            get_requests: m.get_requests,
            head_requests: m.head_requests,
            list_requests: m.list_requests,
            bytes_read: m.bytes_read,
            retries: m.retries,
            failed_reads: m.failed_reads,
            latency_p50_ms: m.latency_p50_ms,
            latency_p90_ms: m.latency_p90_ms,
            latency_p99_ms: m.latency_p99_ms,
            latency: m
                .latency_histogram()
                .into_iter()
                .map(|(lo_ms, hi_ms, count)| LatencyBucket {
                    lo_ms,
                    hi_ms,
                    count,
                })
                .collect(),
            cache_hits: m.cache.hits,
            cache_misses: m.cache.misses,
            max_concurrency: self
                .store
                .as_ref()
                .map_or(0, |s| match profile::verdict::per_object(&self.planned.0) {
                    true => s.options().fetch_concurrency,
                    false => s.options().max_concurrency,
                }),
        });
        let mut p = Profile {
            verdict: profile::Verdict::pending(),
            seconds: st.elapsed_s,
            samples: st.samples,
            items: st.items,
            samples_per_s: st.samples as f64 / st.elapsed_s.max(1e-9),
            first_item_s: self.first_item_s,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads: st.threads,
            stages: st.stages.iter().map(|s| s.name.clone()).collect(),
            stage_stats: st.stages.clone(),
            operators: st.operators.clone(),
            timeline,
            consumer: st.consumer,
            budget_wait_s: st.budget_wait_s,
            cpu_s: st.cpu_s,
            memory: st.memory,
            storage,
            autotune: st.autotune.clone(),
            explain: self.explain(),
            skipped: st.skipped,
            run_start_us: self
                .shared
                .stats
                .started
                .saturating_duration_since(stoker_core::trace::origin())
                .as_secs_f64()
                * 1e6,
        };
        p.verdict = profile::judge(&p, &self.planned.0);
        p
    }

    pub(super) fn view(&self) -> StatsView {
        StatsView {
            shared: self.shared.clone(),
            budget: self.budget.clone(),
            store: self.store.clone(),
            baseline: self.storage_baseline.clone(),
        }
    }
}
