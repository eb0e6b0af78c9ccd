//! The one error type of `stoker-store`. Every variant names the object (as a URL) and, for
//! reads, the byte range and the number of attempts, so a failure deep inside a pipeline can
//! be traced to the exact request that caused it.
//!
//! Keys and URLs in messages are escaped ([`crate::escape_key`]): a key with control
//! characters cannot reach a terminal or a log raw through an error.
//!
//! Errors are `Clone` (sources are behind `Arc`) because one failed fetch is delivered to every
//! reader that joined it through the cache's single-flight.

use std::ops::Range;
use std::sync::Arc;

use crate::keys::{Escaped, EscapedError};

/// What went wrong, with the URL and range it went wrong on.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The object (or prefix) does not exist.
    #[error("object not found: {}", Escaped(url))]
    NotFound {
        /// The object's URL.
        url: String,
    },

    /// A read asked for bytes past the end of the object.
    #[error("range {}-{} is outside {}, which has {size} bytes", range.start, range.end, Escaped(url))]
    RangeOutOfBounds {
        /// The object's URL.
        url: String,
        /// The requested range.
        range: Range<u64>,
        /// The object's size.
        size: u64,
    },

    /// A request failed and stayed failed through the retry budget.
    #[error("reading {} bytes {}-{} failed after {attempts} attempt(s): {}", Escaped(url), range.start, range.end, EscapedError(source))]
    Read {
        /// The object's URL.
        url: String,
        /// The byte range being read.
        range: Range<u64>,
        /// How many requests were made for this range.
        attempts: u32,
        /// The last underlying error.
        source: Arc<object_store::Error>,
    },

    /// The server returned fewer (or more) bytes than the range holds.
    #[error("short read of {} bytes {}-{}: expected {expected} bytes, got {got} (after {attempts} attempt(s))", Escaped(url), range.start, range.end)]
    ShortRead {
        /// The object's URL.
        url: String,
        /// The byte range being read.
        range: Range<u64>,
        /// Bytes expected.
        expected: u64,
        /// Bytes received.
        got: u64,
        /// How many requests were made.
        attempts: u32,
    },

    /// The object changed (a different ETag/version) while it was being read; the parts read so
    /// far are discarded rather than spliced with parts of the new version.
    #[error(
        "{} changed while being read (version {} became {})",
        Escaped(url),
        Escaped(expected),
        Escaped(actual)
    )]
    Changed {
        /// The object's URL.
        url: String,
        /// The version the read started with.
        expected: String,
        /// The version the server now reports.
        actual: String,
    },

    /// Metadata (HEAD) or listing failed.
    #[error("{op} {} failed: {}", Escaped(url), EscapedError(source))]
    Request {
        /// `"head"`, `"list"`, ...
        op: &'static str,
        /// The object or prefix URL.
        url: String,
        /// The underlying error.
        source: Arc<object_store::Error>,
    },

    /// The credentials were refused.
    #[error("access denied to {}: {}", Escaped(url), EscapedError(source))]
    PermissionDenied {
        /// The object or prefix URL.
        url: String,
        /// The underlying error.
        source: Arc<object_store::Error>,
    },

    /// A URL that Stoker cannot open.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was rejected.
        reason: String,
    },

    /// An option with a bad value or an unknown key.
    #[error("invalid option {key}={value:?}: {reason}")]
    InvalidOption {
        /// The option key.
        key: String,
        /// The value given.
        value: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The backend could not be configured (missing bucket, bad endpoint, ...).
    #[error("cannot open {}: {}", Escaped(url), EscapedError(source))]
    Open {
        /// The URL being opened.
        url: String,
        /// The underlying error.
        source: Arc<object_store::Error>,
    },

    /// Local I/O (the disk cache) failed.
    #[error("I/O error on {}: {source}", Escaped(path))]
    Io {
        /// The local path.
        path: String,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
}

impl Error {
    /// True for a missing object or prefix.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Classifies an `object_store` error from operation `op` on `url`.
    pub(crate) fn from_backend(op: &'static str, url: &str, e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                url: url.to_string(),
            },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Error::PermissionDenied {
                url: url.to_string(),
                source: Arc::new(e),
            },
            // A local file the process may not read: object_store's local store reports it
            // as a generic error around the `io::Error`. (Elsewhere such an error is the
            // machine's, a socket refused, not a refusal of the credentials.)
            other
                if matches!(
                    other,
                    object_store::Error::Generic {
                        store: "LocalFileSystem",
                        ..
                    }
                ) && io_kind(&other) == Some(std::io::ErrorKind::PermissionDenied) =>
            {
                Error::PermissionDenied {
                    url: url.to_string(),
                    source: Arc::new(other),
                }
            }
            // object_store reports some requests' HTTP status only inside a generic error
            // (a listing of a bucket that does not exist is a 404 NoSuchBucket there).
            other => match http_status(&other) {
                Some(404) => Error::NotFound {
                    url: url.to_string(),
                },
                _ if s3_refusal(&other) => Error::PermissionDenied {
                    url: url.to_string(),
                    source: Arc::new(other),
                },
                Some(401 | 403) => Error::PermissionDenied {
                    url: url.to_string(),
                    source: Arc::new(other),
                },
                _ => Error::Request {
                    op,
                    url: url.to_string(),
                    source: Arc::new(other),
                },
            },
        }
    }
}

/// Whether `e`'s chain of sources carries an S3 error code that refuses the credentials
/// (a server that answers such a request with a status object_store does not report as one).
fn s3_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    const CODES: [&str; 3] = [
        "<Code>AccessDenied</Code>",
        "<Code>SignatureDoesNotMatch</Code>",
        "<Code>InvalidAccessKeyId</Code>",
    ];
    let mut next = Some(e);
    while let Some(err) = next {
        let msg = err.to_string();
        if CODES.iter().any(|c| msg.contains(c)) {
            return true;
        }
        next = err.source();
    }
    false
}

/// The HTTP status a failed request got, found in `e`'s chain of sources. object_store's
/// type for it is private, so it is read from the message it writes
/// (`Server returned non-2xx status code: 404 Not Found: ...`).
fn http_status(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    const MARK: &str = "non-2xx status code: ";
    let mut next = Some(e);
    while let Some(err) = next {
        let msg = err.to_string();
        if let Some(at) = msg.find(MARK) {
            let code = msg[at + MARK.len()..].get(..3)?;
            return code.parse().ok();
        }
        next = err.source();
    }
    None
}

/// The kind of the first `io::Error` in `e`'s chain of sources.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        next = err.source();
    }
    None
}

impl Error {
    /// The pipeline's kind of this failure: a missing object, bucket or prefix
    /// ([`stoker_core::ErrorKind::NotFound`]), a refusal (`PermissionDenied`), a bad URL or
    /// option (`Invalid`), or another storage failure (`Storage`).
    pub fn kind(&self) -> stoker_core::ErrorKind {
        use stoker_core::ErrorKind as K;
        match self {
            Error::NotFound { .. } => K::NotFound,
            Error::PermissionDenied { .. } => K::PermissionDenied,
            Error::InvalidUrl { .. } | Error::InvalidOption { .. } => K::Invalid,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
                K::PermissionDenied
            }
            _ => K::Storage,
        }
    }
}

/// A store error as a pipeline error: the store's message, of the kind its variant is
/// ([`Error::kind`]), with the store's error kept as its cause and source, so that a caller
/// (the Python package) tells a missing object from a refused one by the kind, never by the
/// wording.
impl From<Error> for stoker_core::Error {
    fn from(e: Error) -> stoker_core::Error {
        stoker_core::Error::new(e.kind(), e.to_string()).with_source(e)
    }
}

/// A store error passed on by a reader (`io::Read`-like sources of the formats): an
/// `io::Error` of the matching kind (`NotFound`, `PermissionDenied`, else `Other`) that
/// wraps it, so that the pipeline error made of it has the same kind.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = match e.kind() {
            stoker_core::ErrorKind::NotFound => std::io::ErrorKind::NotFound,
            stoker_core::ErrorKind::PermissionDenied => std::io::ErrorKind::PermissionDenied,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_file_refused_is_a_permission_error() {
        // What object_store's local store gives for a file the process may not open (root,
        // which the tests run as, may open any file, so a real one cannot show it).
        #[derive(Debug, thiserror::Error)]
        #[error("Unable to open file /data/x.jpg: {source}")]
        struct Open {
            source: std::io::Error,
        }
        let denied = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(Open {
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            }),
        };
        let e = Error::from_backend("get", "file:///data/x.jpg", denied);
        assert!(matches!(e, Error::PermissionDenied { .. }), "{e}");
        // Nor is a refused socket under another store; any other local failure stays a
        // failed request.
        let socket = object_store::Error::Generic {
            store: "S3",
            source: Box::new(Open {
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            }),
        };
        assert!(matches!(
            Error::from_backend("get", "s3://b/x.jpg", socket),
            Error::Request { .. }
        ));
        let other = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(Open {
                source: std::io::Error::other("disk on fire"),
            }),
        };
        assert!(matches!(
            Error::from_backend("get", "file:///data/x.jpg", other),
            Error::Request { .. }
        ));
        // A pipeline error made of a store error keeps it, for a caller that classifies.
        let core: stoker_core::Error = Error::NotFound {
            url: "s3://b/k".into(),
        }
        .into();
        assert_eq!(core.kind, stoker_core::ErrorKind::NotFound);
        assert_eq!(core.message, "object not found: s3://b/k");
        let kept = core.cause.as_ref().and_then(|c| c.downcast_ref::<Error>());
        assert!(kept.is_some_and(Error::is_not_found));
        // And so does one a reader passed on as an `io::Error` (the formats read objects
        // through `io::Read`-like sources).
        let io = std::io::Error::other(Error::NotFound {
            url: "s3://b/k".into(),
        });
        let core = stoker_core::Error::from(io);
        let io = core
            .cause
            .as_ref()
            .and_then(|c| c.downcast_ref::<std::io::Error>());
        let inner = io
            .and_then(|e| e.get_ref())
            .and_then(|e| e.downcast_ref::<Error>());
        assert!(inner.is_some_and(Error::is_not_found));
        // One a reader passes on through `From` keeps its kind all the way.
        let io = std::io::Error::from(Error::NotFound {
            url: "s3://b/k".into(),
        });
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(
            stoker_core::Error::from(io).kind,
            stoker_core::ErrorKind::NotFound
        );
        let bad = Error::InvalidOption {
            key: "part_size".into(),
            value: "x".into(),
            reason: "not a size".into(),
        };
        assert_eq!(
            stoker_core::Error::from(bad).kind,
            stoker_core::ErrorKind::Invalid
        );
        // And the store's error is the pipeline error's source.
        let core: stoker_core::Error = Error::NotFound {
            url: "s3://b/k".into(),
        }
        .into();
        let source = std::error::Error::source(&core).expect("a source");
        assert!(source
            .downcast_ref::<Error>()
            .is_some_and(Error::is_not_found));
    }

    #[test]
    fn statuses_are_found_in_a_generic_error_s_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("Server returned non-2xx status code: 404 Not Found: <Error>NoSuchBucket</Error>")]
        struct Inner;
        #[derive(Debug, thiserror::Error)]
        #[error("Error performing list request")]
        struct Outer(#[source] Inner);
        let generic = object_store::Error::Generic {
            store: "S3",
            source: Box::new(Outer(Inner)),
        };
        assert_eq!(http_status(&generic), Some(404));
        let e = Error::from_backend("list", "s3://nope/", generic);
        assert!(e.is_not_found(), "{e}");
        let other = object_store::Error::Generic {
            store: "S3",
            source: "connection refused".into(),
        };
        assert_eq!(http_status(&other), None);
        assert!(matches!(
            Error::from_backend("list", "s3://b/", other),
            Error::Request { .. }
        ));
    }
}
