//! `stoker._native`: the native module of Stoker's Python package.
//!
//! The Python package (`python/stoker`) is a thin layer of pure Python over this module,
//! which exposes:
//!
//! - [`pipeline::PyPipeline`] (`_native.Pipeline`): an immutable handle on a
//!   [`stoker_pipeline::Pipeline`]; every builder method returns a new handle. Sources come
//!   from a spec (JSON text of a [`stoker_pipeline::PipelineSpec`], which is how
//!   `stoker.from_url` and `stoker.from_spec` build them) or from samples in memory.
//!   Per-sample operators are added as JSON objects of the spec's `OpSpec` form
//!   (`{"op": "decode_utf8", "field": "txt"}`), so every native operator the spec knows is
//!   reachable from Python without a change here.
//! - [`run::PyRun`] (`_native.Run`): a running pipeline, a Python iterator of dicts, with
//!   `stats()` and `state_dict()`. Iteration releases the GIL and waits on the engine in
//!   short slices, checking for signals in between, so Ctrl-C interrupts a blocked
//!   iteration; the run sits behind a mutex, so several Python threads may iterate it.
//! - [`buffer::Buffer`] (`_native.Buffer`): the owner of a Stoker byte buffer, exported
//!   through the buffer protocol (read-only). Bytes fields reach Python as `memoryview`s of
//!   it and tensors as NumPy arrays over it, without a copy (see `buffer`). It also
//!   exports its memory over DLPack (`__dlpack__`, see [`dlpack`]), which is how tensors
//!   reach torch and JAX without a copy.
//! - [`io::ObjectFile`] (`_native.ObjectFile`): a seekable reader over one object with the
//!   store's ranged reads, read-ahead and cache; `stoker.io.open` wraps it in `io` classes.
//! - Python functions as operators ([`pymap`]): `Pipeline.py_op` adds a function (run on
//!   the engine's threads) or a process pool's stage (`stoker._pymap`) as a per-sample
//!   operator.
//! - Errors mapped once, in [`error`], to Python exception classes by kind.
//!
//! Why the engine is not exposed object by object: the engine already has one thread-safe,
//! self-contained entry point (a pipeline that runs), so the binding converts at the two
//! ends (spec in, samples out) and never holds the GIL while the engine works.

mod buffer;
mod convert;
mod dlpack;
mod error;
mod io;
mod pipeline;
mod pymap;
mod run;
mod wait;

use pyo3::prelude::*;

/// The engine's batch-buffer recycler ([`stoker_core::recycle`]): how many batches were
/// stacked into a collected batch's memory, and the bytes kept idle now. For tests and
/// diagnostics.
#[pyfunction]
fn batch_buffers() -> (u64, usize) {
    let r = &stoker_core::recycle::GLOBAL;
    (r.reused(), r.idle_bytes())
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<pipeline::PyPipeline>()?;
    m.add_class::<run::PyRun>()?;
    m.add_class::<io::ObjectFile>()?;
    m.add_function(wrap_pyfunction!(pymap::close_python_calls, m)?)?;
    m.add_function(wrap_pyfunction!(batch_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(io::clear_stores, m)?)?;
    m.add_function(wrap_pyfunction!(io::list_objects, m)?)?;
    m.add_function(wrap_pyfunction!(run::trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(run::trace_stop, m)?)?;
    m.add("DataError", py.get_type::<error::DataError>())?;
    let keys: Vec<&str> = stoker_store::OPTION_KEYS.iter().map(|(k, _)| *k).collect();
    m.add("STORE_OPTION_KEYS", keys)?;
    let formats: std::collections::HashMap<&str, &str> = stoker_pipeline::spec::FORMAT_OPTION_KEYS
        .iter()
        .copied()
        .collect();
    m.add("FORMAT_OPTION_KEYS", formats)?;
    m.add(
        "OPTIMIZER_PASSES",
        stoker_pipeline::OPTIMIZER_PASSES.to_vec(),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
