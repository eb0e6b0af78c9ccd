//! An S3-compatible server on loopback for Stoker's tests and benchmarks.
//!
//! Stoker reads training data from object storage, and most of what can go wrong there
//! (latency, throttling, dropped connections, bodies cut short) only shows up against a real
//! HTTP server. This crate provides one that starts in milliseconds, inside the test process
//! or as the `stoker-testserver` binary, so Rust tests, Python tests and benchmarks all talk
//! to the same thing through the same client code (`object_store` with a custom endpoint and
//! path-style addressing) that production uses against S3.
//!
//! # Design
//!
//! **Storage is a directory.** The server is built on [`s3s`] (the S3 protocol: routing,
//! SigV4 authentication, XML) and `s3s-fs` (an S3 implementation over a file system): each
//! top-level subdirectory of the root is a bucket and each file below it an object whose key
//! is its relative path. A test can therefore create data either through S3 or by writing
//! files ([`TestServer::put_object`] does the latter atomically), and a benchmark can point
//! the binary at a prepared data set. With no root given the server makes a temporary one
//! and deletes it on drop.
//!
//! **s3s-fs is wrapped, not trusted.** The server's S3 implementation delegates to s3s-fs
//! for writes, copies, multipart uploads and bucket operations, and answers GET, HEAD,
//! listings and deletes itself, fixing what s3s-fs 0.14.1 gets wrong for a reader like
//! Stoker: a HEAD or GET on a key that names a directory is `404 NoSuchKey` (not 500);
//! an empty `delimiter=` means no delimiter; listings carry the same (quoted) ETag that HEAD
//! and GET return; ETags come from a cache keyed by (path, modification time, size) instead
//! of hashing the whole file on every request, so ranged reads of big objects and listings of
//! many keys stay cheap; conditional GET/HEAD headers are honoured; `encoding-type=url`
//! listings are encoded; GET bodies stream in 1 MiB chunks. Ranged GETs answer 206 with a
//! `Content-Range`, a range past the end `416 InvalidRange`. Keys are confined to their
//! bucket: s3s-fs would resolve `x/../../etc/passwd` to a path outside it, so every write,
//! copy, multipart or delete request whose key has a `..` segment (or cannot name a file
//! for another reason) is refused with `400 InvalidArgument` naming the key. The ETag rule is s3s-fs's own:
//! the ETag recorded when the object was uploaded through S3 (so multipart ETags survive),
//! else the hex MD5 of the content; a record older than the file is ignored as stale.
//!
//! **Faults live in front of S3.** Every connection is served by a small hyper service that
//! wraps s3s's. Per request it counts the request, consults the [`FaultInjector`], sleeps the
//! configured latency, and then either answers with an injected S3 error status, closes the
//! connection without answering, waits longer, or lets s3s answer, optionally cutting the
//! response body short after N bytes while keeping the real `Content-Length`. Because the
//! faults are at the HTTP layer they look to a client exactly like a misbehaving server or
//! network, which is what retry and resume logic must survive. Rules match on method and a
//! path substring and expire after a number of uses, so a test can say "the next two GETs of
//! this object fail with 503" and then check that the reader recovered.
//!
//! **The same controls over HTTP.** A process that started the binary cannot hold a
//! [`FaultInjector`], so requests under [`CONTROL_PREFIX`] (`/__stoker/`) are handled by the
//! layer itself, without authentication (the server is for loopback):
//!
//! | request | effect |
//! |---|---|
//! | `POST /__stoker/fault?kind=status&status=503&code=SlowDown` | inject an error status (`code` defaults from `status`) |
//! | `POST /__stoker/fault?kind=reset` | close the connection without answering |
//! | `POST /__stoker/fault?kind=short&after=1000` | send headers and `after` body bytes, then abort |
//! | `POST /__stoker/fault?kind=delay&ms=2000` | wait before answering (a slow first byte) |
//! | `POST /__stoker/fault?kind=stall&after=1000&ms=500` | send `after` body bytes, pause `ms`, send the rest |
//! | `POST /__stoker/chaos?p=0.2&kinds=status,reset,short,delay,stall&seed=1` | random faults (below); `p=0` stops them |
//! | `POST /__stoker/latency?ms=10` | set the per-request latency |
//! | `POST /__stoker/clear` | remove all fault rules and stop chaos |
//! | `GET /__stoker/stats` | `{"requests":N,"faults":M,"pending":P,"latency_ms":L,"faults_by_kind":{"status":..,"reset":..,"short":..,"delay":..,"stall":..},"chaos":{..}\|null}` |
//!
//! Fault requests also take `times=N` (default 1, or `forever`), `method=GET` and
//! `path=SUBSTRING`. Control requests are neither counted nor subject to latency or faults.
//!
//! **Chaos** ([`Chaos`], [`FaultInjector::set_chaos`]) hits each request that no rule takes
//! with probability `p`, with a fault of a kind drawn uniformly from `kinds`: error statuses
//! (503 `SlowDown` or 500 `InternalError`; `statuses=503,500`), resets, bodies cut after a
//! random offset below `max_offset` (default 256 KiB), slow first bytes and mid-body stalls
//! of `max_delay_ms / 4 ..= max_delay_ms` (default 500), optionally only for one `method`.
//! Draws come from a generator seeded with `seed`, so a soak can be repeated.
//!
//! **Fast on purpose.** Accepted sockets get `TCP_NODELAY` (the stock s3s-fs binary does not
//! set it, and Nagle's algorithm with delayed ACKs then limits a keep-alive connection to
//! about 26 requests a second); connections are HTTP/1.1 keep-alive (or HTTP/2 with prior
//! knowledge), each on its own task, so many clients can hammer the server at once.
//!
//! **Two ways to run it.** [`TestServer::start`] spawns the server onto the caller's tokio
//! runtime, which suits `#[tokio::test]`. [`TestServer::start_blocking`] gives the server its
//! own thread and two-worker runtime, which suits sync tests, tests on another runtime, and
//! servers shared between tests. Either way, dropping the [`TestServer`] stops it.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stoker_testserver::{Fault, FaultRule, ServerOptions, TestServer};
//!
//! let server = TestServer::start_blocking(ServerOptions::new().bucket("data"))?;
//! server.put_object("data", "shard-0000.tar", &[0u8; 4096])?;
//!
//! // The next two GETs of that object are throttled.
//! server.faults().add(
//!     FaultRule::new(Fault::slow_down()).method("GET").path_contains("shard-0000").times(2),
//! );
//! server.set_latency(Duration::from_millis(1));
//!
//! // Point a client at it:
//! let (endpoint, key, secret) = (server.endpoint(), server.access_key(), server.secret_key());
//! # let _ = (endpoint, key, secret);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! The binary: `stoker-testserver --root DIR [--port 0] [--latency-ms 0] [--bucket NAME]...`
//! prints `STOKER_TESTSERVER_ENDPOINT=http://127.0.0.1:PORT` on one line and serves until
//! SIGINT or SIGTERM.

mod backend;
mod fault;
mod options;
mod server;

pub use fault::{Chaos, Fault, FaultCounts, FaultInjector, FaultKind, FaultRule};
pub use options::{ServerOptions, DEFAULT_ACCESS_KEY, DEFAULT_REGION, DEFAULT_SECRET_KEY};
pub use server::{TestServer, CONTROL_PREFIX};
