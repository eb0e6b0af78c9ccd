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
//! `stoker_core::Error` has no "not found" or "permission" kind: a storage failure keeps
//! what raised it as its cause, the store's error (`stoker_store::Error`) or the
//! `io::Error` a reader gave (which may wrap the store's), and the class comes from that
//! error's variant or I/O kind ([`cause_class`]). The store classifies a missing or refused
//! object, bucket or listing by its HTTP status (404, 401/403), and a local file it may not
//! open as refused. An error without such a cause is classified by the store's wording
//! ([`storage_class`]); the S3 error codes of a refusal are recognised there too, for an
//! error that reaches Python with only the server's answer in its message.

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

/// The class of a storage failure, from the store's message.
fn storage_class(message: &str) -> Class {
    if message.starts_with("object not found: ") || message.starts_with("no objects under ") {
        Class::NotFound
    } else if message.starts_with("access denied to ")
        || message.contains("403 Forbidden")
        || message.contains("<Code>AccessDenied</Code>")
        || message.contains("<Code>SignatureDoesNotMatch</Code>")
        || message.contains("<Code>InvalidAccessKeyId</Code>")
    {
        Class::Permission
    } else if message.starts_with("invalid store URL ") || message.starts_with("invalid option ") {
        Class::Value
    } else {
        Class::Os
    }
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

/// The class of a store error, by its variant.
fn store_class(e: &stoker_store::Error) -> Class {
    use stoker_store::Error as E;
    let class = match e {
        E::NotFound { .. } => Class::NotFound,
        E::PermissionDenied { .. } => Class::Permission,
        E::InvalidUrl { .. } | E::InvalidOption { .. } | E::RangeOutOfBounds { .. } => Class::Value,
        // The store's own local files (the disk block cache): refused or failed, never
        // "not found" (that is for the objects).
        E::Io { source, .. } => match io_class(source) {
            Class::Permission => Class::Permission,
            _ => Class::Os,
        },
        _ => Class::Os,
    };
    // A refusal the store only passed on in the server's words.
    match (class, storage_class(&e.to_string())) {
        (Class::Os, Class::Permission) => Class::Permission,
        (c, _) => c,
    }
}

/// The class of an I/O error, by its kind (as Python's `OSError` subclasses go by errno).
fn io_class(e: &std::io::Error) -> Class {
    match e.kind() {
        std::io::ErrorKind::NotFound => Class::NotFound,
        std::io::ErrorKind::PermissionDenied => Class::Permission,
        _ => Class::Os,
    }
}

/// The class of a storage failure from the error the engine kept as its cause: the store's,
/// or an `io::Error` (the store's inside it, when a reader wrapped one). `None` without one.
fn cause_class(e: &stoker_core::Error) -> Option<Class> {
    let cause = e.cause.as_ref()?;
    let io = cause.downcast_ref::<std::io::Error>();
    let store = cause.downcast_ref::<stoker_store::Error>().or_else(|| {
        io.and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<stoker_store::Error>())
    });
    match (store, io) {
        // A read past an object's end that a format asked for: the object is not what its
        // framing says (an `OSError`, as any failed read), not a caller's mistake.
        (Some(stoker_store::Error::RangeOutOfBounds { .. }), _) => Some(Class::Os),
        (Some(s), _) => Some(store_class(s)),
        (None, Some(io)) => Some(io_class(io)),
        (None, None) => None,
    }
}

/// A pipeline error as a Python exception.
pub(crate) fn pipeline_error(py: Python<'_>, e: stoker_core::Error) -> PyErr {
    let (class, kind) = match e.kind {
        ErrorKind::Record => (Class::Data, "record"),
        ErrorKind::Operator => (Class::Data, "operator"),
        ErrorKind::Storage => (
            cause_class(&e).unwrap_or_else(|| storage_class(&e.message)),
            "storage",
        ),
        ErrorKind::Invalid => match storage_class(&e.message) {
            Class::NotFound => (Class::NotFound, "invalid"),
            _ => (Class::Value, "invalid"),
        },
        _ => (Class::Os, "other"),
    };
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
