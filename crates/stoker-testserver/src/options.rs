//! How a test server is configured.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// The access key a server accepts unless told otherwise.
pub const DEFAULT_ACCESS_KEY: &str = "stoker-test";
/// The secret key a server accepts unless told otherwise.
pub const DEFAULT_SECRET_KEY: &str = "stoker-test-secret";
/// The region a server reports unless told otherwise.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Options for [`TestServer::start`](crate::TestServer::start) and
/// [`TestServer::start_blocking`](crate::TestServer::start_blocking).
///
/// Build with [`ServerOptions::default`] (or [`ServerOptions::new`]) and the chained setters:
///
/// ```
/// use std::time::Duration;
/// use stoker_testserver::ServerOptions;
///
/// let opts = ServerOptions::new()
///     .bucket("data")
///     .latency(Duration::from_millis(5));
/// assert_eq!(opts.buckets, ["data"]);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerOptions {
    /// The directory served: each top-level subdirectory is a bucket, each file below it an
    /// object. `None` (the default) makes a fresh temporary directory that the server owns and
    /// deletes when it is dropped. A directory that does not exist yet is created.
    pub root: Option<PathBuf>,
    /// The address to listen on; loopback (127.0.0.1) by default.
    pub host: IpAddr,
    /// The port to listen on; 0 (the default) picks a free ephemeral port.
    pub port: u16,
    /// How long the server sleeps before answering each S3 request; zero by default.
    /// Changeable at run time with [`TestServer::set_latency`](crate::TestServer::set_latency).
    pub latency: Duration,
    /// The access key clients must sign with.
    pub access_key: String,
    /// The secret key clients must sign with.
    pub secret_key: String,
    /// The region clients should sign for. The server verifies signatures for whatever region
    /// the client names; this value is what [`TestServer::region`](crate::TestServer::region)
    /// reports so clients can be configured consistently.
    pub region: String,
    /// Buckets created at start (existing ones are kept).
    pub buckets: Vec<String>,
    /// How to name the version of an object that was placed in the root directly (not
    /// uploaded through S3 or [`TestServer::put_object`](crate::TestServer::put_object),
    /// which record an MD5 ETag). `false` (the default): the hex MD5 of its content, as S3
    /// would have it, computed on first use and cached. `true`: a digest of its size and
    /// modification time, so that no file is read just to answer HEAD, GET or a listing; for
    /// benchmarks over large data sets written straight into the root.
    pub fast_etags: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            root: None,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            latency: Duration::ZERO,
            access_key: DEFAULT_ACCESS_KEY.to_owned(),
            secret_key: DEFAULT_SECRET_KEY.to_owned(),
            region: DEFAULT_REGION.to_owned(),
            buckets: Vec::new(),
            fast_etags: false,
        }
    }
}

impl ServerOptions {
    /// The defaults: temporary root, 127.0.0.1, ephemeral port, no latency, test credentials.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves this directory instead of a temporary one.
    #[must_use]
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    /// Listens on this address.
    #[must_use]
    pub fn host(mut self, host: IpAddr) -> Self {
        self.host = host;
        self
    }

    /// Listens on this port (0 = ephemeral).
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Sleeps this long before answering each S3 request.
    #[must_use]
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Sets the access key clients must sign with.
    #[must_use]
    pub fn access_key(mut self, access_key: impl Into<String>) -> Self {
        self.access_key = access_key.into();
        self
    }

    /// Sets the secret key clients must sign with.
    #[must_use]
    pub fn secret_key(mut self, secret_key: impl Into<String>) -> Self {
        self.secret_key = secret_key.into();
        self
    }

    /// Sets the region reported to clients.
    #[must_use]
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = region.into();
        self
    }

    /// Adds one bucket to create at start.
    #[must_use]
    pub fn bucket(mut self, name: impl Into<String>) -> Self {
        self.buckets.push(name.into());
        self
    }

    /// Chooses metadata-derived ETags for objects placed in the root directly
    /// (see [`fast_etags`](Self::fast_etags)).
    #[must_use]
    pub fn fast_etags(mut self, fast: bool) -> Self {
        self.fast_etags = fast;
        self
    }

    /// Adds several buckets to create at start.
    #[must_use]
    pub fn buckets<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.buckets.extend(names.into_iter().map(Into::into));
        self
    }
}
