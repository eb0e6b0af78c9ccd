//! The server handle: start, accessors, test helpers, shutdown.

mod control;
mod layer;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::crypto::{Checksum, Md5};
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::backend::{self, Backend, ContentEtags};
use crate::fault::FaultInjector;
use crate::options::ServerOptions;
use layer::{Layer, Shared};

pub use layer::CONTROL_PREFIX;

/// Worker threads of the runtime [`TestServer::start_blocking`] creates.
const BLOCKING_WORKERS: usize = 2;

/// A running S3-compatible server on loopback. Dropping it stops the server (open
/// connections are cut) and deletes the root directory if the server created it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> anyhow::Result<()> {
/// use stoker_testserver::{ServerOptions, TestServer};
///
/// let server = TestServer::start(ServerOptions::new().bucket("data")).await?;
/// server.put_object("data", "train/0001.jpg", b"...")?;
/// assert!(server.endpoint().starts_with("http://127.0.0.1:"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    root: PathBuf,
    access_key: String,
    secret_key: String,
    region: String,
    shared: Arc<Shared>,
    etags: Arc<ContentEtags>,
    runner: Runner,
    /// Dropped after the server has stopped (see `Drop`).
    _temp_root: Option<tempfile::TempDir>,
}

#[derive(Debug)]
enum Runner {
    /// Serving on the caller's runtime; aborting the task cuts every connection.
    Task(tokio::task::JoinHandle<()>),
    /// Serving on a runtime owned by a background thread.
    Thread {
        stop: Option<oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
    /// Already shut down.
    Stopped,
}

/// Everything set up before the accept loop runs.
struct Prepared {
    listener: std::net::TcpListener,
    layer: Layer,
    server: TestServer,
}

impl TestServer {
    /// Starts a server on the current tokio runtime (any flavour). The server's tasks live
    /// on that runtime, so it serves only while the runtime runs: from an async test that
    /// awaits its client, not from blocking code on the same thread. For sync code or
    /// another runtime use [`start_blocking`](Self::start_blocking).
    ///
    /// # Errors
    /// The root cannot be created or served, a bucket name is invalid, or the address
    /// cannot be bound.
    pub async fn start(opts: ServerOptions) -> anyhow::Result<TestServer> {
        let Prepared {
            listener,
            layer,
            mut server,
        } = prepare(opts)?;
        let listener = TcpListener::from_std(listener).context("registering the listener")?;
        let task = tokio::spawn(serve(listener, layer, futures::future::pending()));
        server.runner = Runner::Task(task);
        Ok(server)
    }

    /// Starts a server on its own background thread with its own multi-thread tokio runtime
    /// (2 worker threads). Usable from sync tests and from any other runtime; dropping the
    /// handle stops the server and joins the thread.
    ///
    /// # Errors
    /// As [`start`](Self::start), or the runtime or thread cannot be created.
    pub fn start_blocking(opts: ServerOptions) -> anyhow::Result<TestServer> {
        let Prepared {
            listener,
            layer,
            mut server,
        } = prepare(opts)?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
        let thread = std::thread::Builder::new()
            .name(format!("stoker-testserver-{}", server.addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(BLOCKING_WORKERS)
                    .thread_name("stoker-testserver-worker")
                    .enable_all()
                    .build();
                let rt = match rt {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ =
                            ready_tx.send(Err(anyhow::Error::new(e).context("building runtime")));
                        return;
                    }
                };
                let listener = {
                    let _guard = rt.enter();
                    TcpListener::from_std(listener)
                };
                match listener {
                    Ok(listener) => {
                        let _ = ready_tx.send(Ok(()));
                        rt.block_on(serve(listener, layer, async {
                            let _ = stop_rx.await;
                        }));
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(
                            anyhow::Error::new(e).context("registering the listener")
                        ));
                    }
                }
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .context("spawning the server thread")?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                bail!("the server thread exited before it started serving");
            }
        }
        server.runner = Runner::Thread {
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        Ok(server)
    }

    /// The base URL clients use, `http://127.0.0.1:PORT` (an unspecified listen address
    /// is reported as loopback).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The directory served (canonicalised): buckets are its subdirectories.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The access key clients must sign with.
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The secret key clients must sign with.
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// The region clients should be configured with.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The handle on this server's fault rules; clone it freely.
    pub fn faults(&self) -> &FaultInjector {
        &self.shared.faults
    }

    /// How many S3 requests the server has received (each counts once it is read, whether it
    /// is then answered, failed by a fault, or cut off). Control-endpoint requests are not
    /// counted.
    pub fn requests(&self) -> u64 {
        self.shared.requests()
    }

    /// The current per-request latency.
    pub fn latency(&self) -> Duration {
        self.shared.latency()
    }

    /// Changes the per-request latency; applies to requests that arrive afterwards.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.set_latency(latency);
    }

    /// Creates a bucket (a directory under the root); an existing one is kept.
    ///
    /// # Errors
    /// The name is not a valid S3 bucket name, or the directory cannot be created.
    pub fn create_bucket(&self, name: &str) -> anyhow::Result<()> {
        create_bucket_dir(&self.root, name)
    }

    /// Where `key` of `bucket` is stored, or `None` for a key that cannot name a file
    /// (empty, or containing a `..` segment).
    pub fn object_path(&self, bucket: &str, key: &str) -> Option<PathBuf> {
        backend::object_path(&self.root, bucket, key)
    }

    /// Stores an object by writing its file directly under the root (creating the bucket
    /// and parent directories as needed), atomically replacing any previous version, and
    /// records its ETag, the hex MD5 of `data`, as a single-part S3 upload would. Keys may
    /// contain `/`, spaces and any Unicode.
    ///
    /// # Errors
    /// The bucket name or key is invalid (empty, ending in `/`, containing `..`), a parent
    /// path is an existing object, or the file cannot be written.
    pub fn put_object(&self, bucket: &str, key: &str, data: &[u8]) -> anyhow::Result<()> {
        if key.ends_with('/') {
            bail!("object key {key:?} ends with '/'");
        }
        let path = self.checked_path(bucket, key)?;
        create_bucket_dir(&self.root, bucket)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        // Old sidecars go first; the new record is written after the file, so it is never
        // older than the file (an older one is ignored as stale).
        backend::remove_sidecars(&self.root, bucket, key)?;
        backend::write_atomically(&self.root, &path, data)
            .with_context(|| format!("writing {}", path.display()))?;
        self.etags.forget(&path);
        let md5 = backend::hex(&<Md5 as Checksum>::checksum(data));
        backend::record_etag(&self.root, bucket, key, &md5)
            .with_context(|| format!("recording the ETag of {bucket}/{key}"))?;
        Ok(())
    }

    /// Deletes an object's file (and s3s-fs's sidecars for it); a missing object is not an
    /// error. Directories left empty are removed.
    ///
    /// # Errors
    /// The key is invalid or names a directory, or the file cannot be removed.
    pub fn delete_object(&self, bucket: &str, key: &str) -> anyhow::Result<()> {
        let path = self.checked_path(bucket, key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        backend::remove_sidecars(&self.root, bucket, key)?;
        self.etags.forget(&path);
        backend::prune_empty_dirs(&self.root.join(bucket), &path);
        Ok(())
    }

    fn checked_path(&self, bucket: &str, key: &str) -> anyhow::Result<PathBuf> {
        if !s3s::path::check_bucket_name(bucket) {
            bail!("invalid bucket name {bucket:?}");
        }
        backend::object_path(&self.root, bucket, key)
            .with_context(|| format!("invalid object key {key:?}"))
    }

    fn stop(&mut self) {
        match std::mem::replace(&mut self.runner, Runner::Stopped) {
            Runner::Task(task) => task.abort(),
            Runner::Thread {
                mut stop,
                mut thread,
            } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                if let Some(thread) = thread.take() {
                    let _ = thread.join();
                }
            }
            Runner::Stopped => {}
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
        // `_temp_root` is dropped (and deleted) after this, with the other fields.
    }
}

fn create_bucket_dir(root: &Path, name: &str) -> anyhow::Result<()> {
    if !s3s::path::check_bucket_name(name) || !backend::valid_bucket(name) {
        bail!("invalid bucket name {name:?}");
    }
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating bucket {}", dir.display()))
}

/// Sets up the root, buckets, S3 service and listening socket.
fn prepare(opts: ServerOptions) -> anyhow::Result<Prepared> {
    let (root, temp_root) = match &opts.root {
        Some(root) => {
            std::fs::create_dir_all(root)
                .with_context(|| format!("creating root {}", root.display()))?;
            let root = root
                .canonicalize()
                .with_context(|| format!("resolving root {}", root.display()))?;
            (root, None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("stoker-testserver-")
                .tempdir()
                .context("creating a temporary root")?;
            (temp.path().canonicalize()?, Some(temp))
        }
    };
    for bucket in &opts.buckets {
        create_bucket_dir(&root, bucket)?;
    }

    let etags = Arc::new(ContentEtags::new(opts.fast_etags));
    let backend = Backend::new(root.clone(), Arc::clone(&etags))?;
    let s3 = {
        let mut b = S3ServiceBuilder::new(backend);
        b.set_auth(SimpleAuth::from_single(
            opts.access_key.clone(),
            opts.secret_key.clone(),
        ));
        b.build()
    };
    let shared = Arc::new(Shared::new(opts.latency));
    let layer = Layer::new(s3, Arc::clone(&shared));

    let listener = std::net::TcpListener::bind((opts.host, opts.port))
        .with_context(|| format!("binding {}:{}", opts.host, opts.port))?;
    listener.set_nonblocking(true)?;
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    tracing::info!(%addr, root = %root.display(), "stoker-testserver listening");

    let server = TestServer {
        addr,
        root,
        access_key: opts.access_key,
        secret_key: opts.secret_key,
        region: opts.region,
        shared,
        etags,
        runner: Runner::Stopped,
        _temp_root: temp_root,
    };
    Ok(Prepared {
        listener,
        layer,
        server,
    })
}

/// Accepts connections until `stop` completes, then cuts all of them.
async fn serve(listener: TcpListener, layer: Layer, stop: impl std::future::Future<Output = ()>) {
    let http = ConnBuilder::new(TokioExecutor::new());
    let mut conns = JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    // Without this, Nagle's algorithm and delayed ACKs hold small responses
                    // back ~40 ms, capping one connection at a few dozen requests a second.
                    if let Err(e) = socket.set_nodelay(true) {
                        tracing::warn!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    let conn = http.serve_connection(TokioIo::new(socket), layer.clone()).into_owned();
                    conns.spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    // Typically out of file descriptors; back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut stop => break,
        }
    }
    conns.shutdown().await;
}
