//! What a run runs on: its I/O runtime (its own, or the process's shared one with a shared
//! store) and how long the source and the operators wait for room in the memory budget.

use std::sync::Arc;
use std::time::Duration;
use stoker_core::{Error, MemoryBudget};

use crate::plan::{Pipeline, Source};
use crate::source::io_runtime;

/// A run's I/O runtime: its own (shut down when the run ends), or the process's shared one
/// (with a shared store).
pub(super) enum RunRuntime {
    Own(tokio::runtime::Runtime),
    Shared(Arc<tokio::runtime::Runtime>),
}

impl RunRuntime {
    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        match self {
            RunRuntime::Own(rt) => rt.handle(),
            RunRuntime::Shared(rt) => rt.handle(),
        }
    }
}

/// How long the source, or an operator charging a sample's buffers, waits for budget
/// before it calls the budget too small.
pub(super) const BUDGET_WAIT: Duration = Duration::from_secs(10);

/// [`BUDGET_WAIT`], or `STOKER_BUDGET_WAIT_S` seconds when that is set (tests of a full
/// budget set it short); read when a run starts.
pub(super) fn budget_wait() -> Duration {
    std::env::var("STOKER_BUDGET_WAIT_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(BUDGET_WAIT, Duration::from_secs_f64)
}

/// The error of a source that waited `wait` for `n` bytes to admit its next sample.
pub(super) fn budget_full(limit: u64, wait: Duration, n: u64) -> String {
    format!(
        "the memory budget ({}) stayed full for {} s while the source waited for {} to \
         admit its next sample; this is not about one sample: what the pipeline must hold \
         at once (the shuffle buffer, the batch being filled, the queues, samples waiting \
         for one ahead of them) needs more than the budget; raise memory_limit or make the \
         shuffle buffer or the batch smaller",
        crate::ops::size(limit),
        wait.as_secs_f64(),
        crate::ops::size(n)
    )
}

/// The run's memory budget and how long an operator waits in it (see
/// [`OpContext::reserve`]).
pub(super) type Charging<'a> = (&'a MemoryBudget, Duration);

/// What a run runs on, resolved once when it starts and handed down: its I/O runtime, the
/// store it shares with other runs (when it does), and the memory budget every part of the
/// run charges (a shared store's own, whose cached blocks count against it).
pub(super) struct Resources {
    pub(super) runtime: RunRuntime,
    /// The shared store and its key, with `share_store`.
    pub(super) opened: Option<(stoker_store::Store, String)>,
    pub(super) budget: MemoryBudget,
    /// The limit the run was given (`None`: a quarter of the machine's memory).
    pub(super) memory_limit: Option<u64>,
    /// The run reads its data once: a memory block cache is of no use to it.
    pub(super) single_pass: bool,
}

impl Resources {
    pub(super) fn resolve(p: &Pipeline) -> Result<Resources, Error> {
        let memory_limit = p.memory_limit();
        // A run that reads its data once has no use for a memory block cache, unless it
        // shares its store with the runs that follow it.
        let single_pass = p.epochs.is_some_and(|e| e <= 1) && !p.options.share_store;
        // A shared store brings its runtime (its connections live there) and its budget (its
        // cached blocks count against it).
        let (runtime, opened) = match &p.source {
            Source::Url { url, options, .. } if p.options.share_store => {
                let options = crate::source::url_store_options(options, memory_limit, single_pass);
                let opened = crate::shared::shared_store(url, &options).map_err(Error::from)?;
                (
                    RunRuntime::Shared(crate::shared::shared_runtime().map_err(|e| {
                        Error::invalid(format!("cannot start the I/O runtime: {e}"))
                    })?),
                    Some(opened),
                )
            }
            _ => (RunRuntime::Own(io_runtime()?), None),
        };
        let budget = match (&opened, memory_limit) {
            (Some((store, _)), _) => store.budget().clone(),
            (None, Some(l)) => MemoryBudget::new(l),
            (None, None) => MemoryBudget::from_system(),
        };
        Ok(Resources {
            runtime,
            opened,
            budget,
            memory_limit,
            single_pass,
        })
    }
}
