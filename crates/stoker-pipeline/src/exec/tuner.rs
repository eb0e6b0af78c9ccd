//! The autotuner: moves worker threads toward the bottleneck from measured utilisation.
//! Every 250 ms it compares the workers' busy time with the time that passed: above 85%
//! busy with samples waiting it unparks a worker (up to `threads`), under 30% it parks one;
//! each change and its reason goes to `stats().autotune`. Its whole policy is here.

use super::tail::TailCtx;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Moves worker threads toward the bottleneck from measured utilisation.
pub(super) struct Tuner {
    pub(super) last: Instant,
    pub(super) busy: u64,
    pub(super) max: usize,
}

impl Tuner {
    pub(super) fn new(ctx: &TailCtx) -> Tuner {
        Tuner {
            last: Instant::now(),
            busy: 0,
            max: ctx.threads,
        }
    }

    /// `par_queued`: hand-offs of the parallel stages after the tail waiting for a worker.
    pub(super) fn tick(&mut self, ctx: &TailCtx, par_queued: usize) {
        let par = ctx.par_ops.iter().flatten();
        if !ctx.autotune
            || (ctx.producer.is_empty() && par.clone().next().is_none())
            || self.last.elapsed() < Duration::from_millis(250)
        {
            return;
        }
        // The workers' busy time: the operators before the tail and those after it.
        let mut busy: u64 = par
            .flat_map(|r| &r.counters)
            .map(|c| c.busy_ns.load(Ordering::Relaxed))
            .sum();
        if !ctx.producer.is_empty() {
            busy += ctx.shared.stats.stage(1).busy_ns.load(Ordering::Relaxed);
        }
        let dt = self.last.elapsed().as_nanos() as f64;
        let active = ctx.shared.active.load(Ordering::Relaxed);
        let util = busy.saturating_sub(self.busy) as f64 / (dt * active as f64);
        let queued =
            ctx.shared.stats.stage(0).queue_len.load(Ordering::Relaxed) as usize + par_queued;
        self.busy = busy;
        self.last = Instant::now();
        let new = if util > 0.85 && queued > active && active < self.max {
            Some((
                active + 1,
                format!(
                    "workers {:.0}% busy with {queued} samples waiting",
                    util * 100.0
                ),
            ))
        } else if util < 0.3 && active > 1 {
            Some((
                active - 1,
                format!("workers only {:.0}% busy", util * 100.0),
            ))
        } else {
            None
        };
        if let Some((n, why)) = new {
            ctx.shared.active.store(n, Ordering::Relaxed);
            ctx.shared.stats.threads.store(n as u64, Ordering::Relaxed);
            ctx.shared.stats.autotune.lock().push((
                ctx.shared.stats.started.elapsed().as_secs_f64(),
                n as u64,
                why,
            ));
        }
    }
}
