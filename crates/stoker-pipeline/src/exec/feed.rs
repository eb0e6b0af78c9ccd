//! The source thread of an epoch: reads the dataset (`source::run_source`) and hands what
//! it emits to the workers in chunks, keeping each sample's cursor for `Run::state`.
//!
//! Three things hold it back, so that memory stays bounded whatever the consumer does: the
//! budget (each sample reserves what the operators are expected to make of it before it is
//! admitted, [`expected_bytes`]; a budget that stays full for the budget wait ends the run
//! with the source's own error, [`budget_full`]), the window (it never runs more than
//! `window` samples ahead of the tail), and, until a first sample has been through the
//! operators, one sample at a time (the reservation is a guess until then). A panic in a
//! format's reader ends the run with its message.

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use stoker_core::Error;

use super::runtime::budget_full;
use super::tail::TailCtx;
use super::worker::{chunk_cap, expected_bytes, Done, CHUNK};
use crate::source::{run_source, Produced, SourceCursor};

/// Starts the source thread for `epoch`, from `cursor0`.
pub(super) fn spawn_source(
    ctx: &TailCtx,
    epoch: u64,
    cursor0: SourceCursor,
    work_tx: Sender<(u64, Vec<Produced>)>,
    done_tx: Sender<Done>,
) -> JoinHandle<()> {
    let ds = ctx.ds.clone();
    let cfg = ctx.cfg.clone();
    let shared = ctx.shared.clone();
    let window = ctx.window;
    let stage = ctx.shared.stats.stage(0);
    let budget = ctx.budget.clone();
    let wait = ctx.shared.budget_wait;
    // Operators before the tail make samples into what the budget holds: until
    // one is measured, admit one sample at a time.
    let gate = !ctx.producer.is_empty() && ctx.cfg.columnar.is_none();
    let rt = ctx.ds.runtime.clone();
    std::thread::Builder::new()
        .name("stoker-source".into())
        .spawn(move || {
            let mut last = Instant::now();
            let mut next_seq = cursor0.emitted;
            let done_tx2 = done_tx.clone();
            // Samples (and their cursors) not yet handed to the workers.
            let mut chunk: Vec<Produced> = Vec::with_capacity(CHUNK);
            let mut hist: Vec<(u64, u64, SourceCursor)> = Vec::with_capacity(CHUNK);
            let flush =
                |chunk: &mut Vec<Produced>, hist: &mut Vec<(u64, u64, SourceCursor)>| -> bool {
                    if chunk.is_empty() {
                        return true;
                    }
                    // Cursors first: the consumer may ask for one as soon as the
                    // tail has the sample.
                    shared.history.lock().extend(hist.drain(..));
                    work_tx.send((epoch, std::mem::take(chunk))).is_ok()
                };
            // The tail's position plus the window, refreshed when reached.
            let mut limit = *shared.tail_next.lock() + window;
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_source(&ds, &cfg, epoch, cursor0, &mut |mut p, cursor| {
                    let now = Instant::now();
                    // The sample's bytes count against the budget until the
                    // consumer takes it: a full budget stops the source.
                    let held = match &mut p {
                        Produced::Elem(e) => {
                            // An object the workers' cache holds is not read (its sample
                            // is empty here): admitted as if it had been, for what the
                            // workers will make of it.
                            let n = match e.sample.size_bytes() {
                                0 if ds.per_object => {
                                    ds.shards[e.pos.shard as usize].size.unwrap_or(0)
                                }
                                n => n as u64,
                            };
                            Some((n, &mut e.hold))
                        }
                        Produced::Rows { parts, hold, .. } => {
                            Some((parts.iter().map(|c| c.size_bytes() as u64).sum(), hold))
                        }
                        Produced::Fail { .. } => None,
                    };
                    if let Some((n, slot)) = held {
                        // What the sample will be after the workers' operators
                        // (the worker sets it right).
                        let n = expected_bytes(&ds, n, budget.limit());
                        let mut hold = budget.try_reserve(n);
                        if hold.is_none() {
                            // Hand the chunk over before waiting: its samples hold budget
                            // that only their way to the consumer gives back (kept here,
                            // they would wait for the budget as the budget waits for
                            // them, until the budget wait ended the run).
                            if !flush(&mut chunk, &mut hist) {
                                return false;
                            }
                            let w0 = Instant::now();
                            hold = rt
                                .block_on(async {
                                    tokio::time::timeout(wait, budget.reserve(n)).await
                                })
                                .ok();
                            shared
                                .stats
                                .budget_wait_ns
                                .fetch_add(w0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            stoker_core::trace::span("stage", w0, || "waiting for memory".into());
                        }
                        match hold {
                            Some(h) => *slot = Some(h),
                            None => {
                                // Not about the sample it was admitting (any
                                // would have waited): the run's error, named
                                // after what waited, never skipped.
                                let error = Error::invalid(budget_full(budget.limit(), wait, n))
                                    .with_stage("source");
                                let _ = done_tx2.send(Done::Fatal(error));
                                return false;
                            }
                        }
                    }
                    stage.add(&stage.busy_ns, (now - last).as_nanos() as u64);
                    stoker_core::trace::span_sampled("stage", 0, (last, now), || "read".into());
                    match &p {
                        Produced::Elem(e) => {
                            stage.add(&stage.items_out, 1);
                            stage.add(&stage.bytes, e.sample.size_bytes() as u64);
                        }
                        Produced::Rows {
                            parts, positions, ..
                        } => {
                            stage.add(&stage.items_out, positions.len() as u64);
                            let b: usize = parts.iter().map(|c| c.size_bytes()).sum();
                            stage.add(&stage.bytes, b as u64);
                        }
                        Produced::Fail { .. } => stage.add(&stage.items_out, 1),
                    }
                    let seq = p.seq();
                    next_seq = seq + 1;
                    hist.push((epoch, seq, cursor.clone()));
                    chunk.push(p);
                    if seq + 1 >= limit {
                        limit = *shared.tail_next.lock() + window;
                    }
                    let full = seq + 1 >= limit;
                    // Hand over when the workers are idle, the chunk is full, or
                    // before waiting for the tail (which needs these to move).
                    let mut ok = true;
                    let cap = chunk_cap(shared.sample_cost_ns.load(Ordering::Relaxed));
                    if full || chunk.len() >= cap || work_tx.is_empty() {
                        ok = flush(&mut chunk, &mut hist);
                    }
                    if gate && !shared.warm.load(Ordering::Acquire) {
                        // Samples admitted on a guess (a sixteenth of the
                        // budget) would each hold part of what their operators
                        // then charge (decoded frames) and wait for the rest of
                        // it together; the first measured sample sets the guess
                        // right (`expected_bytes`).
                        ok = ok && flush(&mut chunk, &mut hist);
                        while !shared.warm.load(Ordering::Acquire)
                            && !shared.stop.load(Ordering::Relaxed)
                        {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    if full {
                        // Stay within the window of the tail.
                        let mut t = shared.tail_next.lock();
                        while seq + 1 >= *t + window && !shared.stop.load(Ordering::Relaxed) {
                            shared
                                .tail_moved
                                .wait_for(&mut t, Duration::from_millis(50));
                        }
                        limit = *t + window;
                    }
                    let ok = ok && !shared.stop.load(Ordering::Relaxed);
                    stage
                        .queue_len
                        .store(work_tx.len() as u64, Ordering::Relaxed);
                    last = Instant::now();
                    stage.add(&stage.wait_ns, (last - now).as_nanos() as u64);
                    ok
                })
            }));
            match ran {
                Ok(()) => {
                    flush(&mut chunk, &mut hist);
                }
                Err(panic) => {
                    let _ = done_tx2.send(Done::Fatal(Error::invalid(format!(
                        "the source failed: {}",
                        stoker_core::panic_message(&*panic)
                    ))));
                }
            }
            let _ = done_tx.send(Done::SourceEnd { next_seq });
        })
        .expect("spawn source")
}
