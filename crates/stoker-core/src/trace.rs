//! The process-wide trace: spans of work (an operator on a sample, a stage's step, a store
//! request) kept while tracing is on, for the profiler's Chrome trace.
//!
//! Off by default, and then a span costs one relaxed load. On ([`start`]), a span is pushed
//! into one vector under a lock. Per-item work (an operator on one of the samples the
//! engine profiles anyway, a stage's step, a read) goes through [`span_sampled`], which
//! keeps every slow item and about one fast one a millisecond per thread, so the lock is
//! taken a few thousand times a second at most; the store's requests are all kept. At
//! [`MAX_SPANS`] it stops recording and counts what it dropped.
//! The trace belongs to the process: two runs traced at once share it.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::Mutex;

/// Per-item spans shorter than this are sampled: one per category and thread in each
/// such interval ([`span_sampled`]).
pub const GAP: std::time::Duration = std::time::Duration::from_millis(1);

/// The most spans a trace keeps.
pub const MAX_SPANS: usize = 500_000;

/// One span of work.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// What kind of work: `operator`, `stage`, `store`.
    pub cat: &'static str,
    /// What ran (`decode_image`, `GET bucket/key bytes=0-1023`).
    pub name: Cow<'static, str>,
    /// The thread it ran on (its name: `stoker-cpu-0`, `stoker-source`), or a track such as
    /// `store`.
    pub track: Cow<'static, str>,
    /// Microseconds from the trace's origin ([`origin`]) to the start.
    pub start_us: f64,
    /// Microseconds it lasted.
    pub dur_us: f64,
}

static ON: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());

/// The instant spans are measured from (the first use in the process).
pub fn origin() -> Instant {
    static O: OnceLock<Instant> = OnceLock::new();
    *O.get_or_init(Instant::now)
}

/// Whether spans are being kept.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Starts keeping spans (clearing any kept before).
pub fn start() {
    origin();
    SPANS.lock().clear();
    DROPPED.store(0, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

/// Stops keeping spans and returns them, with how many were dropped over [`MAX_SPANS`].
pub fn stop() -> (Vec<Span>, u64) {
    ON.store(false, Ordering::Relaxed);
    let spans = std::mem::take(&mut *SPANS.lock());
    (spans, DROPPED.swap(0, Ordering::Relaxed))
}

/// The spans kept so far (tracing goes on).
pub fn snapshot() -> Vec<Span> {
    SPANS.lock().clone()
}

/// The current thread's name as a track (`thread-N` when it has none).
pub fn this_track() -> Cow<'static, str> {
    thread_local! {
        static NAME: &'static str = {
            let t = std::thread::current();
            let name = t.name().map_or_else(|| format!("thread-{:?}", t.id()), str::to_string);
            // One leaked name per thread that ever records a span: bounded by the threads.
            Box::leak(name.into_boxed_str())
        };
    }
    NAME.with(|n| Cow::Borrowed(*n))
}

/// Records a span that started at `start` and ends now, on the current thread's track,
/// when tracing is on. `name` is only called then.
#[inline]
pub fn span(cat: &'static str, start: Instant, name: impl FnOnce() -> Cow<'static, str>) {
    if enabled() {
        record(cat, name(), this_track(), start, Instant::now());
    }
}

/// Like [`span`] (from `start` to `end`), for work done once per item (a stage's step, a
/// read, an operator on a sample): a span as long as [`GAP`] is always recorded; shorter
/// ones only when the thread recorded none of the same category and `key` (an operator,
/// a stage) in the last [`GAP`]. A
/// trace then costs the same whether the items take microseconds or milliseconds (at most
/// about one short span per category, thread and millisecond), and every slow item shows.
#[inline]
pub fn span_sampled(
    cat: &'static str,
    key: usize,
    (start, end): (Instant, Instant),
    name: impl FnOnce() -> Cow<'static, str>,
) {
    if !enabled() {
        return;
    }
    thread_local! {
        // The end of the last span recorded on this thread, by category and key.
        static LAST: std::cell::RefCell<Vec<(&'static str, usize, Instant)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let due = LAST.with(|last| {
        let mut last = last.borrow_mut();
        let slot = match last.iter().position(|(c, k, _)| *c == cat && *k == key) {
            Some(i) => &mut last[i].2,
            None => {
                last.push((cat, key, origin()));
                &mut last.last_mut().expect("pushed").2
            }
        };
        let due = end.saturating_duration_since(start) >= GAP
            || start.saturating_duration_since(*slot) >= GAP;
        if due {
            *slot = end;
        }
        due
    });
    if due {
        record(cat, name(), this_track(), start, end);
    }
}

/// Records a span from `start` to `end` on `track`, when tracing is on.
pub fn record(
    cat: &'static str,
    name: Cow<'static, str>,
    track: Cow<'static, str>,
    start: Instant,
    end: Instant,
) {
    if !enabled() {
        return;
    }
    let o = origin();
    let start_us = start.saturating_duration_since(o).as_secs_f64() * 1e6;
    let dur_us = end.saturating_duration_since(start).as_secs_f64() * 1e6;
    let mut v = SPANS.lock();
    if v.len() >= MAX_SPANS {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    v.push(Span {
        cat,
        name,
        track,
        start_us,
        dur_us,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_kept_only_while_on_and_name_their_thread() {
        let t0 = Instant::now();
        span("operator", t0, || "before".into());
        start();
        let t1 = Instant::now();
        std::thread::Builder::new()
            .name("stoker-cpu-7".into())
            .spawn(move || span("operator", t1, || "decode".into()))
            .unwrap()
            .join()
            .unwrap();
        // Sampled: 1,000 items of 5 us every 10 us (10 ms) keep about one a millisecond;
        // an item as long as GAP is always kept; another key is sampled on its own.
        std::thread::spawn(|| {
            let base = Instant::now() + GAP;
            let us = std::time::Duration::from_micros;
            for k in 0..1000 {
                let s = base + us(10 * k);
                span_sampled("stage", 1, (s, s + us(5)), || "fast".into());
            }
            let s = base + us(10_000);
            span_sampled("stage", 1, (s, s + GAP), || "slow".into());
            span_sampled("stage", 2, (s, s + us(5)), || "other".into());
        })
        .join()
        .unwrap();
        let (spans, dropped) = stop();
        let fast = spans.iter().filter(|s| s.name == "fast").count();
        assert!((9..=11).contains(&fast), "{fast} fast spans kept");
        assert_eq!(spans.iter().filter(|s| s.name == "slow").count(), 1);
        assert_eq!(spans.iter().filter(|s| s.name == "other").count(), 1);
        span("operator", t0, || "after".into());
        assert_eq!(dropped, 0);
        let mine: Vec<_> = spans.iter().filter(|s| s.name == "decode").collect();
        assert_eq!(mine.len(), 1, "{spans:?}");
        assert_eq!(mine[0].track, "stoker-cpu-7");
        assert!(mine[0].dur_us >= 0.0 && mine[0].start_us >= 0.0);
        assert!(!spans
            .iter()
            .any(|s| s.name == "before" || s.name == "after"));
    }
}
