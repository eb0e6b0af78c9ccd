//! The trace as Chrome trace events (the JSON object format that Perfetto and
//! `chrome://tracing` open): a track per thread (each worker, the source, the tail) with the
//! spans it recorded, the store's requests as asynchronous spans on a `store` track (they
//! overlap), and per stage a counter track of its throughput and queue from the timeline.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use stoker_core::trace::Span;

use super::Profile;

const PID: u64 = 1;

/// The trace-event JSON for a profile and the spans recorded while it ran.
pub(super) fn render(p: &Profile, spans: &[Span]) -> String {
    let mut events: Vec<Value> = Vec::new();
    events.push(json!({
        "name": "process_name", "ph": "M", "pid": PID, "args": {"name": "stoker"}
    }));
    // Threads get ids in order of their names, so tracks sort as the engine's parts do.
    let mut tids: BTreeMap<&str, u64> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.cat != "store") {
        let n = tids.len() as u64 + 1;
        tids.entry(&s.track).or_insert(n);
    }
    for (i, (name, tid)) in tids.iter().enumerate() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid,
            "args": {"sort_index": i}
        }));
    }
    for (id, s) in spans.iter().enumerate() {
        if s.cat == "store" {
            // Requests overlap: each is an async span of its own.
            let common = json!({"name": s.name, "cat": "store", "id": id, "pid": PID, "tid": 0});
            let mut b = common.clone();
            b["ph"] = "b".into();
            b["ts"] = s.start_us.into();
            let mut e = common;
            e["ph"] = "e".into();
            e["ts"] = (s.start_us + s.dur_us).into();
            events.push(b);
            events.push(e);
        } else {
            events.push(json!({
                "name": s.name, "cat": s.cat, "ph": "X", "pid": PID, "tid": tids[&*s.track],
                "ts": s.start_us, "dur": s.dur_us
            }));
        }
    }
    // Per stage, its throughput and queue over time; the consumer's wait share; memory.
    for w in p.timeline.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let dt = b.t_s - a.t_s;
        if dt <= 0.0 {
            continue;
        }
        let ts = p.run_start_us + b.t_s * 1e6;
        for (i, name) in p.stages.iter().enumerate() {
            let (Some(sa), Some(sb)) = (a.stages.get(i), b.stages.get(i)) else {
                continue;
            };
            let rate = sb.items_out.saturating_sub(sa.items_out) as f64 / dt;
            events.push(json!({
                "name": name, "ph": "C", "pid": PID, "ts": ts,
                "args": {"items/s": rate, "queue": sb.queue,
                         "busy threads": ((sb.busy_s - sa.busy_s) / dt).max(0.0)}
            }));
        }
        let step = (b.consumer_step_s - a.consumer_step_s).max(0.0);
        let wait = (b.consumer_wait_s - a.consumer_wait_s).max(0.0);
        events.push(json!({
            "name": "consumer", "ph": "C", "pid": PID, "ts": ts,
            "args": {"samples/s": b.samples.saturating_sub(a.samples) as f64 / dt,
                     "waiting share": if step + wait > 0.0 { wait / (step + wait) } else { 0.0 }}
        }));
        events.push(json!({
            "name": "memory (MiB)", "ph": "C", "pid": PID, "ts": ts,
            "args": {"block cache": b.memory.block_cache as f64 / 1048576.0,
                     "sample cache": b.memory.sample_cache as f64 / 1048576.0,
                     "samples": b.memory.samples as f64 / 1048576.0,
                     "read-ahead": b.memory.read_ahead as f64 / 1048576.0}
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "stoker profile",
            "samples_per_s": p.samples_per_s,
            "bottleneck": p.verdict.bottleneck,
        }
    })
    .to_string()
}
