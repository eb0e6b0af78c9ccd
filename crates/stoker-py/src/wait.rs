//! Waiting on the engine without holding the GIL, and without becoming deaf to Ctrl-C.
//!
//! Python handles SIGINT by setting a flag that only the thread holding the GIL acts on,
//! when it next runs Python code or calls `PyErr_CheckSignals`. A thread blocked in Rust
//! with the GIL released would notice nothing until the engine answers, which for a slow
//! bucket may be minutes. So every wait here is cut into slices of [`SLICE`]: between
//! slices the thread takes the GIL back, checks for signals (raising `KeyboardInterrupt`),
//! and releases it again.
//!
//! Work that cannot itself wait in slices (starting a run, which lists the bucket; one read
//! of `stoker.io`) runs on another thread or on the I/O runtime, and the caller waits for
//! its answer in slices. If the caller is interrupted, the work finishes on its own and its
//! answer is dropped.

use crossbeam_channel::{bounded as sync_channel, Receiver, RecvTimeoutError};
use std::time::Duration;

use pyo3::prelude::*;

use crate::error::internal;

/// How long one wait lasts before the thread checks for signals.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// Waits for the one answer on `rx`.
pub(crate) fn recv<T: Send>(py: Python<'_>, rx: &Receiver<T>) -> PyResult<T> {
    loop {
        match py.detach(|| rx.recv_timeout(SLICE)) {
            Ok(v) => return Ok(v),
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(internal("a Stoker worker thread ended without an answer"))
            }
        }
    }
}

/// Runs `f` on a new thread and waits for its result.
pub(crate) fn on_thread<T, F>(py: Python<'_>, name: &str, f: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| internal(format!("cannot start a thread: {e}")))?;
    recv(py, &rx)
}

/// Runs `fut` on `rt` and waits for its result.
pub(crate) fn on_runtime<T, F>(py: Python<'_>, rt: &tokio::runtime::Runtime, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let (tx, rx) = sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    recv(py, &rx)
}
