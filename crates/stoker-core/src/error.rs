//! The error every pipeline layer returns: what went wrong, and where.
//!
//! A bad record names the object, the byte offset and the operator (or format) that
//! rejected it; layers add what they know as the error travels up ([`Error::with_object`],
//! [`Error::with_stage`]). The kind tells a skip policy what may be skipped: a bad record
//! may, a configuration mistake may not.

use std::fmt;

/// What kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A record is malformed (truncated tar, bad CRC, undecodable field). Skippable.
    Record,
    /// An operator failed on a sample (wrong field type, decode failure). Skippable.
    Operator,
    /// Reading from storage failed (after the store's retries).
    Storage,
    /// An object, bucket or prefix that is not there (a 404, an empty listing, a missing
    /// local file). Skippable, as any storage failure.
    NotFound,
    /// Storage refused the credentials or the request (a 401 or 403, a local file the
    /// process may not read). Skippable, as any storage failure.
    PermissionDenied,
    /// The pipeline or an argument is wrong (unknown field, bad spec). Never skipped.
    Invalid,
}

/// What a caught panic said (its `&str` or `String` payload), for an error that replaces
/// it: kernels and third-party decoders that panic on hostile bytes are caught where they
/// are called, and the panic becomes an error naming the object.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}

impl ErrorKind {
    /// Whether a skip policy may skip the sample (or the rest of the shard) and go on.
    pub fn skippable(self) -> bool {
        matches!(
            self,
            ErrorKind::Record
                | ErrorKind::Operator
                | ErrorKind::Storage
                | ErrorKind::NotFound
                | ErrorKind::PermissionDenied
        )
    }

    /// Whether storage failed (of any kind: missing, refused, or another failure).
    pub fn is_storage(self) -> bool {
        matches!(
            self,
            ErrorKind::Storage | ErrorKind::NotFound | ErrorKind::PermissionDenied
        )
    }

    fn label(self) -> &'static str {
        match self {
            ErrorKind::Record => "bad record",
            ErrorKind::Operator => "operator failed",
            ErrorKind::Storage => "storage error",
            ErrorKind::NotFound => "not found",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Invalid => "invalid",
        }
    }
}

/// A pipeline error with its context.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// The object (URL or key) being read, when known.
    pub object: Option<String>,
    /// Byte offset in the object, when known.
    pub offset: Option<u64>,
    /// Record index in the object, when known.
    pub record: Option<u64>,
    /// The format or operator that failed (`tar`, `tfrecord`, `map(decode_utf8)`).
    pub stage: Option<String>,
    /// What is wrong.
    pub message: String,
    /// What raised it, for a caller that knows the type (the Python package keeps a Python
    /// function's exception here, to chain it as `__cause__`); carried, never shown.
    pub cause: Option<Cause>,
}

/// An opaque cause of an [`Error`] (see [`Error::cause`]). Two causes are equal when they
/// are the same value. (A thin pointer: errors travel in every `Result` of the engine.)
/// A cause that is itself an error ([`Error::with_source`]) is also the error's
/// [`std::error::Error::source`].
#[derive(Clone)]
pub struct Cause(std::sync::Arc<CauseValue>);

/// The value of a [`Cause`], and how to see it as an error when it is one.
struct CauseValue {
    value: Box<dyn std::any::Any + Send + Sync>,
    as_error: Option<AsError>,
}

/// Gives a cause's value as the error it is (set by [`Error::with_source`], which knows the
/// type).
type AsError = fn(&(dyn std::any::Any + Send + Sync)) -> Option<&(dyn std::error::Error + 'static)>;

fn as_error<E: std::error::Error + 'static>(
    v: &(dyn std::any::Any + Send + Sync),
) -> Option<&(dyn std::error::Error + 'static)> {
    v.downcast_ref::<E>()
        .map(|e| e as &(dyn std::error::Error + 'static))
}

impl Cause {
    /// The cause as a `T`, if it is one.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.0.value.downcast_ref::<T>()
    }

    /// The cause as an error, when it is one.
    pub fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.as_error.and_then(|f| f(&*self.0.value))
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cause(..)")
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            object: None,
            offset: None,
            record: None,
            stage: None,
            message: message.into(),
            cause: None,
        }
    }

    /// Keeps `cause` with the error (see [`Error::cause`]).
    pub fn with_cause(mut self, cause: impl std::any::Any + Send + Sync) -> Error {
        self.cause = Some(Cause(std::sync::Arc::new(CauseValue {
            value: Box::new(cause),
            as_error: None,
        })));
        self
    }

    /// Keeps the error that raised this one as its cause and its
    /// [`std::error::Error::source`].
    pub fn with_source<E: std::error::Error + Send + Sync + 'static>(mut self, e: E) -> Error {
        self.cause = Some(Cause(std::sync::Arc::new(CauseValue {
            value: Box::new(e),
            as_error: Some(as_error::<E>),
        })));
        self
    }

    /// A malformed record.
    pub fn record(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Record, message)
    }

    /// An operator failure.
    pub fn operator(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Operator, message)
    }

    /// A storage failure.
    pub fn storage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Storage, message)
    }

    /// An object, bucket or prefix that is not there.
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::NotFound, message)
    }

    /// A refusal by storage.
    pub fn permission_denied(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::PermissionDenied, message)
    }

    /// A mistake in the pipeline or its arguments.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }

    /// Sets the object, unless already set.
    pub fn with_object(mut self, object: impl Into<String>) -> Error {
        self.object.get_or_insert_with(|| object.into());
        self
    }

    /// Sets the byte offset, unless already set.
    pub fn with_offset(mut self, offset: u64) -> Error {
        self.offset.get_or_insert(offset);
        self
    }

    /// Sets the record index, unless already set.
    pub fn with_record(mut self, record: u64) -> Error {
        self.record.get_or_insert(record);
        self
    }

    /// Sets the failing format or operator, unless already set.
    pub fn with_stage(mut self, stage: impl Into<String>) -> Error {
        self.stage.get_or_insert_with(|| stage.into());
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.label())?;
        if let Some(s) = &self.stage {
            write!(f, " in {s}")?;
        }
        if let Some(o) = &self.object {
            write!(f, ", {o}")?;
        }
        if let Some(r) = self.record {
            write!(f, " record {r}")?;
        }
        if let Some(o) = self.offset {
            write!(f, " at byte {o}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_ref()?.as_error()
    }
}

impl From<std::io::Error> for Error {
    /// The kind follows the I/O error's: a file or object cut short is a bad record, a
    /// missing or refused one is [`ErrorKind::NotFound`] or [`ErrorKind::PermissionDenied`]
    /// (the store gives its errors these I/O kinds when a reader passes them on), anything
    /// else a storage failure. The `io::Error` stays as the cause and the source.
    fn from(e: std::io::Error) -> Error {
        let kind = match e.kind() {
            std::io::ErrorKind::UnexpectedEof => ErrorKind::Record,
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Storage,
        };
        Error::new(kind, e.to_string()).with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_everything_known() {
        let e = Error::record("bad CRC of data")
            .with_stage("tfrecord")
            .with_object("s3://b/train-0.tfrecord")
            .with_offset(1234)
            .with_record(7);
        assert_eq!(
            e.to_string(),
            "bad record in tfrecord, s3://b/train-0.tfrecord record 7 at byte 1234: bad CRC of data"
        );
        // The innermost context wins.
        assert_eq!(e.with_stage("outer").stage.as_deref(), Some("tfrecord"));
    }

    #[test]
    fn io_errors_keep_their_kind_and_are_the_source() {
        use std::error::Error as _;
        let kinds = [
            (std::io::ErrorKind::NotFound, ErrorKind::NotFound),
            (
                std::io::ErrorKind::PermissionDenied,
                ErrorKind::PermissionDenied,
            ),
            (std::io::ErrorKind::UnexpectedEof, ErrorKind::Record),
            (std::io::ErrorKind::ConnectionReset, ErrorKind::Storage),
        ];
        for (io, kind) in kinds {
            let e = Error::from(std::io::Error::new(io, "it failed"));
            assert_eq!(e.kind, kind);
            assert!(kind.skippable());
            let source = e.source().expect("the io::Error is the source");
            let io_err = source
                .downcast_ref::<std::io::Error>()
                .expect("an io::Error");
            assert_eq!(io_err.kind(), io);
            assert!(e
                .cause
                .as_ref()
                .unwrap()
                .downcast_ref::<std::io::Error>()
                .is_some());
        }
        assert!(ErrorKind::NotFound.is_storage() && ErrorKind::PermissionDenied.is_storage());
        assert!(!ErrorKind::Invalid.is_storage() && !ErrorKind::Invalid.skippable());
        // A cause that is not an error (a Python exception, in the package) is no source.
        assert!(Error::invalid("x").with_cause(7u8).source().is_none());
        assert_eq!(
            Error::not_found("no objects under s3://b/p/").to_string(),
            "not found: no objects under s3://b/p/"
        );
    }
}
