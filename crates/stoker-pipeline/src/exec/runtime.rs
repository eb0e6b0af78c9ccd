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
/// memory budget every part of the run charges, and the store a URL source is read
/// through. The memory limit (the run's, else its store options') enters here and only
/// here: it sizes the budget, and the store draws on that budget (a shared store brings its
/// own budget, sized by the same limit when the store was first opened, and its cached
/// blocks count against it).
pub(super) struct Resources {
    pub(super) runtime: RunRuntime,
    /// The store a URL source is read through and the key the URL names in it (`None` for
    /// other sources).
    pub(super) opened: Option<(stoker_store::Store, String)>,
    pub(super) budget: MemoryBudget,
}

impl Resources {
    pub(super) fn resolve(p: &Pipeline) -> Result<Resources, Error> {
        let memory_limit = p.memory_limit();
        // A run that reads its data once has no use for a memory block cache, unless it
        // shares its store with the runs that follow it.
        let single_pass = p.epochs.is_some_and(|e| e <= 1) && !p.options.share_store;
        let no_runtime =
            |e: std::io::Error| Error::invalid(format!("cannot start the I/O runtime: {e}"));
        match &p.source {
            // A shared store brings its runtime (its connections live there) and its budget.
            Source::Url { url, options, .. } if p.options.share_store => {
                let options = options.as_ref().clone();
                let options = match memory_limit {
                    Some(l) => options.with_memory_limit(l),
                    None => options,
                };
                let opened = crate::shared::shared_store(url, &options).map_err(Error::from)?;
                Ok(Resources {
                    runtime: RunRuntime::Shared(
                        crate::shared::shared_runtime().map_err(no_runtime)?,
                    ),
                    budget: opened.0.budget().clone(),
                    opened: Some(opened),
                })
            }
            source => {
                let budget = memory_limit.map_or_else(MemoryBudget::from_system, MemoryBudget::new);
                let opened = match source {
                    Source::Url { url, options, .. } => Some(crate::source::open_url_store(
                        url,
                        options,
                        &budget,
                        single_pass,
                    )?),
                    _ => None,
                };
                Ok(Resources {
                    runtime: RunRuntime::Own(io_runtime()?),
                    opened,
                    budget,
                })
            }
        }
    }
}
