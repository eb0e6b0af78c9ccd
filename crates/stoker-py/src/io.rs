//! `_native.ObjectFile`: one object read through the store (ranged reads, growing
//! read-ahead on sequential reads, the block cache), for `stoker.io.open`, which wraps it in
//! an `io.RawIOBase` and usually an `io.BufferedReader`.
//!
//! Objects are read through one store per bucket (or host, or the local file system) and
//! set of store options, shared by every `open` in the process and by pipeline runs with
//! `share_store` (`stoker_pipeline::shared`): one block cache, one memory budget, one
//! connection pool and one metadata cache, so a second `open` of an object, or of another
//! range of it, reads what is cached. `stoker.io.clear_cache()` lets the shared stores go
//! (files still open keep theirs).
//!
//! Reads run on that module's process-wide I/O runtime (two threads), created on first use
//! and created again in a child after `fork()` (the parent's threads do not exist there; its
//! runtime is forgotten, not shut down; the shared stores likewise). The caller waits for
//! each read in slices, so Ctrl-C interrupts it; an interrupted read finishes in the background, and the next read waits
//! for it and then moves the reader back to the position Python last saw.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use stoker_store::ObjectReader;

use crate::error::{internal, store_error};
use crate::pipeline::store_options;
use crate::wait;

/// This process's I/O runtime (the one shared stores read on).
fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    stoker_pipeline::shared::shared_runtime()
        .map_err(|e| internal(format!("cannot start the I/O runtime: {e}")))
}

/// Lets the shared stores go (`stoker.io.clear_cache()`), with the samples cached for later
/// runs over them: later opens and runs start with empty caches. Files still open and runs still going keep theirs until they end.
#[pyfunction]
pub(crate) fn clear_stores() -> usize {
    stoker_pipeline::shared::clear_shared_stores()
}

/// Lists `url` through the shared store for its bucket and options (`stoker.io.ls`, as
/// `stoker ls --json` does): one level (objects, and sub-prefixes as `{"prefix": ...}`) or,
/// `recursive` or with a `glob`, every object below; a URL that names one object lists it
/// (without a glob).
/// JSON text of `{"entries": [...], "skipped": [...]}`: the entries, each object with its
/// key, URL, size, ETag, version and modification time; the keys left out (they cannot be
/// file names), each with its key, its escaped form and why.
#[pyfunction]
#[pyo3(signature = (url, store, recursive, glob=None))]
pub(crate) fn list_objects(
    py: Python<'_>,
    url: String,
    store: Vec<(String, String)>,
    recursive: bool,
    glob: Option<String>,
) -> PyResult<String> {
    let options = store_options(py, &store)?;
    let rt = runtime()?;
    let (store, prefix) = {
        let _guard = rt.enter();
        stoker_pipeline::shared::shared_store(&url, &options).map_err(|e| store_error(py, e))?
    };
    let globbed = glob.is_some();
    let listed = wait::on_runtime(py, &rt, async move {
        let entry = |o: &stoker_store::ObjectInfo| {
            let mut v = serde_json::to_value(o).expect("serialisable");
            v["url"] = store.object_url(&o.key).into();
            v
        };
        let (objects, prefixes, skipped) = if recursive || globbed {
            let mut lo = stoker_store::ListOptions::default();
            if let Some(g) = glob {
                lo = lo.with_glob(g);
            }
            let (all, skipped) = store.list_all_and_skipped(&prefix, &lo).await?;
            (all, Vec::new(), skipped)
        } else {
            let level = store.list_dir(&prefix).await?;
            (
                level.objects.clone(),
                level.prefixes.clone(),
                level.skipped.clone(),
            )
        };
        let skipped: Vec<serde_json::Value> = skipped
            .iter()
            .map(|s| {
                serde_json::json!({
                    "key": s.key,
                    "escaped": stoker_store::escape_key(&s.key),
                    "reason": s.reason.to_string(),
                })
            })
            .collect();
        let mut out: Vec<serde_json::Value> = prefixes
            .iter()
            .map(|p| serde_json::json!({ "prefix": p, "url": store.object_url(p) }))
            .collect();
        let named = !prefix.is_empty() && !prefix.ends_with('/') && !globbed;
        if objects.is_empty() && prefixes.is_empty() && named {
            // Maybe the URL names one object (a glob matches keys below the URL only).
            if let Ok(info) = store.head(&prefix).await {
                out.push(entry(&info));
            }
        }
        out.extend(objects.iter().map(entry));
        Ok::<_, stoker_store::Error>(serde_json::json!({ "entries": out, "skipped": skipped }))
    })?
    .map_err(|e| store_error(py, e))?;
    Ok(listed.to_string())
}

/// A seekable, read-only view of one object (see the module docs).
#[pyclass(frozen, module = "stoker._native")]
#[derive(Debug)]
pub struct ObjectFile {
    url: String,
    size: u64,
    reader: Arc<tokio::sync::Mutex<ObjectReader>>,
    rt: Arc<tokio::runtime::Runtime>,
    /// The position as of the last completed call.
    pos: Mutex<u64>,
}

#[pymethods]
impl ObjectFile {
    /// Opens `url` with store options given as `(key, value)` pairs.
    #[new]
    fn new(py: Python<'_>, url: String, store: Vec<(String, String)>) -> PyResult<Self> {
        let options = store_options(py, &store)?;
        let rt = runtime()?;
        let (store, key) = {
            let _guard = rt.enter();
            stoker_pipeline::shared::shared_store(&url, &options).map_err(|e| store_error(py, e))?
        };
        if key.is_empty() || key.ends_with('/') {
            return Err(PyValueError::new_err(format!(
                "{url} names a prefix, not an object"
            )));
        }
        let reader = wait::on_runtime(py, &rt, async move { store.reader(&key).await })?
            .map_err(|e| store_error(py, e))?;
        Ok(ObjectFile {
            url,
            size: reader.info().size,
            reader: Arc::new(tokio::sync::Mutex::new(reader)),
            rt,
            pos: Mutex::new(0),
        })
    }

    /// The object's URL.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// The object's size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The position.
    fn tell(&self) -> u64 {
        *self.pos.lock()
    }

    /// Moves to absolute position `pos` (past the end is allowed: reads there return
    /// nothing).
    fn seek(&self, pos: u64) -> u64 {
        // The reader moves at the next read (where a seek within its read-ahead window
        // keeps the fetches in flight).
        *self.pos.lock() = pos;
        pos
    }

    /// Reads into a writable buffer; returns the number of bytes read (0 at the end). May
    /// read fewer bytes than the buffer holds, as a raw file may.
    fn readinto(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        let target = PyBuffer::<u8>::get(buf)?;
        if target.readonly() {
            return Err(PyBufferError::new_err("readinto needs a writable buffer"));
        }
        if !target.is_c_contiguous() {
            return Err(PyBufferError::new_err("readinto needs a contiguous buffer"));
        }
        let want = target.len_bytes();
        if want == 0 {
            return Ok(0);
        }
        let reader = self.reader.clone();
        let pos = *self.pos.lock();
        let got = wait::on_runtime(py, &self.rt, async move {
            let mut r = reader.lock().await;
            r.seek(pos);
            let out = r.read(want).await;
            (out, r.position())
        })?;
        let (data, position) = (got.0.map_err(|e| store_error(py, e))?, got.1);
        let n = data.len().min(want);
        // SAFETY: `target` is a writable, C-contiguous buffer of `want` bytes that stays
        // exported (so valid and unmoved) while `target` lives; `n <= want`. The GIL is held.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), target.buf_ptr() as *mut u8, n);
        }
        *self.pos.lock() = position;
        Ok(n)
    }

    /// Reads at most `n` bytes (everything left for a negative `n`) as `bytes`.
    #[pyo3(signature = (n=-1))]
    fn read<'py>(&self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let pos = *self.pos.lock();
        let left = self.size.saturating_sub(pos) as usize;
        let want = if n < 0 { left } else { (n as usize).min(left) };
        let reader = self.reader.clone();
        let got = wait::on_runtime(py, &self.rt, async move {
            let mut r = reader.lock().await;
            r.seek(pos);
            let mut out = Vec::with_capacity(want);
            while out.len() < want {
                match r.read(want - out.len()).await {
                    Ok(b) if b.is_empty() => break,
                    Ok(b) => out.extend_from_slice(&b),
                    Err(e) => return (Err(e), r.position()),
                }
            }
            (Ok(out), r.position())
        })?;
        let data = got.0.map_err(|e| store_error(py, e))?;
        *self.pos.lock() = got.1;
        Ok(pyo3::types::PyBytes::new(py, &data))
    }

    fn __repr__(&self) -> String {
        format!("<stoker ObjectFile {} ({} bytes)>", self.url, self.size)
    }
}
