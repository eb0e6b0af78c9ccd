//! Errors cross into Python here, and only here, as the exception class their kind calls
//! for:
//!
//! | Stoker error | Python exception |
//! |---|---|
//! | a bad record, an operator failing on a sample | [`DataError`] (a `ValueError`) |
//! | a missing object or an empty prefix | `FileNotFoundError` |
//! | credentials refused | `PermissionError` |
//! | any other storage failure (after the store's retries) | `OSError` |
//! | a mistake in the pipeline, a spec or an option | `ValueError` |
//!
//! The message is the engine's, which names the object, the byte offset, the record and the
//! format or operator; the same context is set as attributes (`kind`, `object`, `offset`,
//! `record`, `stage`; `None` when unknown).
//!
//! The class comes from the error's kind, never from its wording: `stoker_core::Error` has a
//! `NotFound` and a `PermissionDenied` kind, which the store's errors get from their variant
//! when they become pipeline errors (directly, or through the `io::Error` a reader passes on),
//! and the store classifies a missing or refused object, bucket or listing by its HTTP status
//! (404, 401/403) or the S3 error code of a refusal, and a local file it may not open as
//! refused. Errors from `stoker.io` are the store's own, classified by variant
//! ([`store_class`]). The `kind` attribute stays coarse: `record`, `operator`, `storage` (a
//! missing or refused object too) or `invalid`.

use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use stoker_core::ErrorKind;

use crate::pymap::PyCause;

// Named `stoker.DataError`, where the package exports it, so that pickle finds the class:
// a DataLoader worker sends its exception to the main process pickled.
pyo3::create_exception!(
    stoker,
    DataError,
    PyValueError,
    "A bad record or an operator that failed on a sample. The message and the attributes \
     `object`, `offset`, `record` and `stage` say where."
);

#[derive(Clone, Copy)]
enum Class {
    Data,
    NotFound,
    Permission,
    Os,
    Value,
}

fn raise(
    py: Python<'_>,
    class: Class,
    message: String,
    kind: &str,
    ctx: (Option<&str>, Option<u64>, Option<u64>, Option<&str>),
) -> PyErr {
    let err = match class {
        Class::Data => DataError::new_err(message),
        Class::NotFound => PyFileNotFoundError::new_err(message),
        Class::Permission => PyPermissionError::new_err(message),
        Class::Os => PyOSError::new_err(message),
        Class::Value => PyValueError::new_err(message),
    };
    let v = err.value(py);
    // Attributes are a convenience: an exception that refuses them still says it all in its
    // message.
    let _ = v.setattr("kind", kind);
    let _ = v.setattr("object", ctx.0);
    let _ = v.setattr("offset", ctx.1);
    let _ = v.setattr("record", ctx.2);
    let _ = v.setattr("stage", ctx.3);
    err
}

/// The class of a store error (from `stoker.io`), by its kind; a range outside the object is
/// the caller's mistake there.
fn store_class(e: &stoker_store::Error) -> Class {
    match e {
        stoker_store::Error::RangeOutOfBounds { .. } => Class::Value,
        e => kind_class(e.kind()).0,
    }
}

/// The class of a pipeline error's kind, and the `kind` attribute.
fn kind_class(kind: ErrorKind) -> (Class, &'static str) {
    match kind {
        ErrorKind::Record => (Class::Data, "record"),
        ErrorKind::Operator => (Class::Data, "operator"),
        ErrorKind::NotFound => (Class::NotFound, "storage"),
        ErrorKind::PermissionDenied => (Class::Permission, "storage"),
        ErrorKind::Storage => (Class::Os, "storage"),
        ErrorKind::Invalid => (Class::Value, "invalid"),
        _ => (Class::Os, "other"),
    }
}

/// A pipeline error as a Python exception.
pub(crate) fn pipeline_error(py: Python<'_>, e: stoker_core::Error) -> PyErr {
    let (class, kind) = kind_class(e.kind);
    let ctx = (e.object.as_deref(), e.offset, e.record, e.stage.as_deref());
    let err = raise(py, class, e.to_string(), kind, ctx);
    // A Python function's own exception becomes the cause: `except KeyError` sees it
    // through `__cause__`, and the traceback shows both.
    if let Some(c) = e.cause.as_ref().and_then(|c| c.downcast_ref::<PyCause>()) {
        err.set_cause(py, Some(PyErr::from_value(c.0.bind(py).clone())));
    }
    err
}

/// A store error (from `stoker.io`) as a Python exception.
pub(crate) fn store_error(py: Python<'_>, e: stoker_store::Error) -> PyErr {
    use stoker_store::Error as E;
    let (url, range) = match &e {
        E::NotFound { url }
        | E::PermissionDenied { url, .. }
        | E::InvalidUrl { url, .. }
        | E::Changed { url, .. }
        | E::Request { url, .. }
        | E::Open { url, .. } => (Some(url.as_str()), None),
        E::RangeOutOfBounds { url, range, .. }
        | E::Read { url, range, .. }
        | E::ShortRead { url, range, .. } => (Some(url.as_str()), Some(range.start)),
        _ => (None, None),
    };
    let class = store_class(&e);
    raise(
        py,
        class,
        e.to_string(),
        "storage",
        (url, range, None, None),
    )
}

/// An internal failure (a thread that could not start, a channel closed early).
pub(crate) fn internal(message: impl Into<String>) -> PyErr {
    PyRuntimeError::new_err(message.into())
}
