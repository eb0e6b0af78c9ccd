//! `_native.Run`: a running pipeline as a Python iterator.
//!
//! The [`Run`] sits behind a mutex, so any number of Python threads may iterate one run:
//! each item goes to exactly one of them. Each `__next__` releases the GIL and waits for
//! the engine in slices ([`Run::next_timeout`]), checking for signals between slices, so
//! Ctrl-C interrupts a blocked iteration without losing anything: an item that had not
//! arrived is still the run's next one, and `state_dict()` is still exact.
//!
//! Dropping a run stops its threads and joins them, which can wait for a request in
//! flight; a `Run` given up by Python (closed or collected) is therefore dropped on a
//! thread of its own. In a child process after `fork()` a run is unusable (its threads are
//! the parent's): every method says so, and the handle is forgotten rather than dropped.

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use stoker_pipeline::Run;

use crate::convert::item_to_py;
use crate::error::pipeline_error;
use crate::wait::SLICE;

/// A running pipeline (see the module docs).
#[pyclass(frozen, name = "Run", module = "stoker._native")]
#[derive(Debug)]
pub struct PyRun {
    run: Mutex<Option<Run>>,
    pid: u32,
    /// What this run holds on Python's side (leases on the worker pools of Python map
    /// stages): each one's `release()` is called once, when the run ends, is closed or is
    /// dropped.
    holds: Mutex<Vec<Py<PyAny>>>,
}

static JSON_LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// JSON text as Python objects.
pub(crate) fn json_loads<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    JSON_LOADS.import(py, "json", "loads")?.call1((text,))
}

fn drop_in_background(run: Run) {
    // If no thread can start, the closure (and the run) is dropped right here.
    let _ = std::thread::Builder::new()
        .name("stoker-run-drop".into())
        .spawn(move || drop(run));
}

impl PyRun {
    pub(crate) fn new(run: Run) -> PyRun {
        PyRun {
            run: Mutex::new(Some(run)),
            pid: std::process::id(),
            holds: Mutex::new(Vec::new()),
        }
    }

    /// Releases what the run holds on Python's side (see `holds`). A failing `release` is
    /// reported as unraisable: it must not hide the run's own result.
    fn release_holds(&self, py: Python<'_>) {
        let holds = std::mem::take(&mut *self.holds.lock());
        for h in holds {
            if let Err(e) = h.bind(py).call_method0("release") {
                e.write_unraisable(py, Some(h.bind(py)));
            }
        }
    }

    fn check_process(&self) -> PyResult<()> {
        if std::process::id() != self.pid {
            return Err(PyRuntimeError::new_err(
                "this run was started in another process (before fork()); start a new run \
                 of the pipeline in this one",
            ));
        }
        Ok(())
    }

    /// `f` on the run, with the GIL released; an error if the run is closed.
    fn with_run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Run) -> T + Send,
    ) -> PyResult<T> {
        self.check_process()?;
        py.detach(|| self.run.lock().as_mut().map(f))
            .ok_or_else(|| PyValueError::new_err("this run is closed"))
    }
}

impl Drop for PyRun {
    fn drop(&mut self) {
        if std::process::id() == self.pid && !self.holds.get_mut().is_empty() {
            // Python drops its objects with the GIL held; `attach` only makes that explicit.
            Python::attach(|py| {
                // A run is often dropped while an exception is on its way out of the loop
                // that iterated it (`raise` in the body, Ctrl-C): CPython then deallocates
                // the iterator with that exception set. Calling into Python with an
                // exception set is undefined (a `SystemError` from the first C call that
                // checks, then a crash), so it is set aside for the releases and put back
                // after them, untouched.
                let pending = PyErr::take(py);
                self.release_holds(py);
                if let Some(e) = pending {
                    e.restore(py);
                }
            });
        }
        if let Some(run) = self.run.get_mut().take() {
            if std::process::id() == self.pid {
                drop_in_background(run);
            } else {
                // Its threads and runtime belong to the parent process.
                std::mem::forget(run);
            }
        }
    }
}

#[pymethods]
impl PyRun {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.check_process()?;
        loop {
            let got = py.detach(|| match self.run.lock().as_mut() {
                None => Some(None),
                Some(run) => run.next_timeout(SLICE),
            });
            match got {
                Some(None) => {
                    self.release_holds(py);
                    return Ok(None);
                }
                Some(Some(Ok(item))) => return item_to_py(py, &item).map(Some),
                Some(Some(Err(e))) => {
                    // The run ends with its error.
                    self.release_holds(py);
                    return Err(pipeline_error(py, e));
                }
                None => py.check_signals()?,
            }
        }
    }

    /// Statistics now, as a dict (the engine's `Stats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.with_run(py, |r| r.stats())?;
        let text = serde_json::to_string(&stats)
            .map_err(|e| PyRuntimeError::new_err(format!("statistics: {e}")))?;
        json_loads(py, &text)
    }

    /// The profile of the run so far (the engine's `Run::profile`) as a dict: the verdict
    /// (input-bound or not, the bottleneck, its cause, ranked recommendations), the
    /// timeline, each operator's cost, the store's requests, the consumer's wait and step.
    /// With `out`, also writes `profile.json`, `report.html` and `trace.json` (the spans
    /// kept since `trace_start()`) into that directory.
    #[pyo3(signature = (out=None))]
    fn profile<'py>(
        &self,
        py: Python<'py>,
        out: Option<std::path::PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let prof = self.with_run(py, |r| r.profile())?;
        if let Some(dir) = out {
            let spans = stoker_core::trace::snapshot();
            py.detach(|| prof.write(&dir, &spans)).map_err(|e| {
                pyo3::exceptions::PyOSError::new_err(format!(
                    "cannot write the profile into {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let text = serde_json::to_string(&prof)
            .map_err(|e| PyRuntimeError::new_err(format!("profile: {e}")))?;
        json_loads(py, &text)
    }

    /// The plan this run runs, with the optimizer's reasons, then what each operator measured
    /// so far against what it declared (the engine's `Run::explain`).
    fn explain(&self, py: Python<'_>) -> PyResult<String> {
        self.with_run(py, |r| r.explain())
    }

    /// The position after the last item this run yielded, as JSON-able Python objects;
    /// `Pipeline.resume` continues from it.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self
            .with_run(py, |r| r.state())?
            .map_err(|e| pipeline_error(py, e))?;
        json_loads(py, &state.to_json())
    }

    /// The number of shards (objects) the run reads.
    #[getter]
    fn shards(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_run(py, |r| r.shards())
    }

    /// Whether the source reads columns straight into batches (the columnar path).
    #[getter]
    fn columnar(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_run(py, |r| r.columnar())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.run.lock().is_none()
    }

    /// Stops the run and frees what it holds (its threads finish in the background).
    /// Iterating a closed run ends at once.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.check_process()?;
        if let Some(run) = py.detach(|| self.run.lock().take()) {
            drop_in_background(run);
        }
        self.release_holds(py);
        Ok(())
    }

    /// Keeps `obj` until the run ends (see `holds`): its `release()` is called then.
    fn _hold(&self, obj: Py<PyAny>) {
        self.holds.lock().push(obj);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.run.lock().as_ref() {
            Some(r) => format!("<stoker Run {r:?}>"),
            None => "<stoker Run (closed)>".into(),
        }
    }
}

/// Starts keeping the trace's spans (the profiled samples' operators, the stages' work, the
/// store's requests), process-wide; `Run.profile(out)` writes them as `trace.json`.
#[pyfunction]
pub(crate) fn trace_start() {
    stoker_core::trace::start();
}

/// Stops keeping spans and forgets them; returns how many were kept.
#[pyfunction]
pub(crate) fn trace_stop() -> usize {
    stoker_core::trace::stop().0.len()
}
