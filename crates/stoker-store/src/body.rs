//! [`Body`]: one ranged GET read chunk by chunk, with Stoker's body handling. The length is
//! checked against the range, and a body cut short (a reset, a timeout, a server that stops
//! early) is resumed from the last byte received, with `If-Match` on the ETag so bytes of two
//! versions are never spliced.
//!
//! Opening a body waits for the response's headers only: the body stays in the socket until
//! it is read. A stream of parts opens several bodies ahead (their latency overlaps) and reads
//! only the oldest, so bytes go from the socket to the caller through memory that is reused at
//! once, instead of piling up in buffers for the parts behind it.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::{GetOptions, GetRange, GetResultPayload, ObjectStore};

use crate::error::{Error, Result};
use crate::store::{to_path, ObjectInfo, Store};

/// A ranged GET being read. Cut bodies are resumed; a response that makes progress (see
/// [`PROGRESS`]) restores the retry budget, so only failures in a row without progress count
/// against it. A server that trickles a few bytes per request before each cut makes no
/// progress by that measure, and fails after the budget like one that sends nothing.
pub(crate) struct Body {
    store: Store,
    key: String,
    /// The range asked for; `end` is clamped to the object's size when metadata is wanted.
    range: Range<u64>,
    received: u64,
    etag: Option<String>,
    want_meta: bool,
    info: Option<ObjectInfo>,
    /// Requests made since the last one that made progress.
    attempts: u32,
    /// Bytes received since the last request was sent.
    since_request: u64,
    /// What the last request must deliver to count as progress.
    progress: u64,
    /// When resuming stops: set at the first cut without progress since.
    deadline: Option<Instant>,
    stream: Option<BoxStream<'static, object_store::Result<Bytes>>>,
    local: bool,
}

/// What one response must deliver to count as progress and restore the retry budget: this
/// many bytes, or a quarter of what was left of the range when it was asked for, whichever is
/// less. So a read makes at most about one progressing request per 64 KiB plus a few dozen
/// near the end, however the server cuts it.
const PROGRESS: u64 = 64 * 1024;

impl Body {
    /// Sends the GET for `range` of `key` and waits for its headers. `etag` pins the version
    /// (when `None`, the first response's ETag does); `want_meta` also keeps the object's
    /// metadata from the response and clamps a range past the end to the object's size.
    pub(crate) async fn open(
        store: &Store,
        key: &str,
        range: Range<u64>,
        etag: Option<String>,
        want_meta: bool,
    ) -> Result<Body> {
        let mut body = Body {
            store: store.clone(),
            key: key.to_string(),
            range,
            received: 0,
            etag,
            want_meta,
            info: None,
            attempts: 0,
            since_request: 0,
            progress: 0,
            deadline: None,
            stream: None,
            local: false,
        };
        body.request().await?;
        Ok(body)
    }

    /// The bytes this body will deliver in all.
    pub(crate) fn expected(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// The object's metadata from the first response (when asked for).
    pub(crate) fn take_info(&mut self) -> Option<ObjectInfo> {
        self.info.take()
    }

    fn url(&self) -> String {
        self.store.object_url(&self.key)
    }

    /// One GET from the first byte not yet received to the end of the range.
    async fn request(&mut self) -> Result<()> {
        let inner = self.store.inner();
        let m = &inner.metrics;
        self.attempts += 1;
        self.since_request = 0;
        self.stream = None;
        let start = self.range.start + self.received;
        self.progress = PROGRESS.min((self.range.end - start).div_ceil(4));
        let opts = GetOptions {
            range: Some(GetRange::Bounded(start..self.range.end)),
            if_match: self.etag.clone(),
            ..Default::default()
        };
        m.get_requests.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let res = match inner.backend.get_opts(&to_path(&self.key), opts).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::NotFound { url: self.url() });
            }
            Err(object_store::Error::Precondition { .. }) => {
                return Err(Error::Changed {
                    url: self.url(),
                    expected: self.etag.clone().unwrap_or_default(),
                    actual: "(a newer version)".into(),
                });
            }
            Err(e) => {
                m.failed_reads.fetch_add(1, Ordering::Relaxed);
                return Err(match Error::from_backend("get", &self.url(), e) {
                    Error::Request { source, .. } => Error::Read {
                        url: self.url(),
                        range: start..self.range.end,
                        attempts: self.attempts,
                        source,
                    },
                    other => other,
                });
            }
        };
        m.op_latency.record(t0.elapsed());
        if stoker_core::trace::enabled() {
            let name = format!("GET {} bytes={}-{}", self.url(), start, self.range.end);
            let track = "store".into();
            stoker_core::trace::record("store", name.into(), track, t0, Instant::now());
        }
        // The response fixes the version (first request) or must match it (resumes).
        let actual = res.meta.e_tag.as_deref().map(crate::store::entity_tag);
        match (&self.etag, actual) {
            (Some(expected), Some(actual)) if *expected != actual => {
                return Err(Error::Changed {
                    url: self.url(),
                    expected: expected.clone(),
                    actual,
                });
            }
            (None, Some(actual)) => self.etag = Some(actual),
            _ => {}
        }
        if self.want_meta && self.received == 0 && self.info.is_none() {
            self.info = Some(ObjectInfo {
                key: self.key.clone(),
                ..ObjectInfo::from_meta(&res.meta)
            });
            // The server clamps a range that runs past the end.
            self.range.end = self.range.end.min(res.meta.size.max(self.range.start));
        }
        if res.range.start != start {
            return Err(self.short(self.received));
        }
        self.local = matches!(res.payload, GetResultPayload::File(..));
        self.stream = Some(match res.payload {
            GetResultPayload::File(file, path) => file_stream(file, path, res.range),
            GetResultPayload::Stream(_) => res.into_stream(),
        });
        Ok(())
    }

    /// Whether the bytes come from a local file (each chunk then is one allocation of its
    /// own, read by [`file_stream`]).
    pub(crate) fn is_local(&self) -> bool {
        self.local
    }

    fn short(&self, got: u64) -> Error {
        Error::ShortRead {
            url: self.url(),
            range: self.range.clone(),
            expected: self.expected(),
            got,
            attempts: self.attempts,
        }
    }

    /// The next chunk as the network delivered it, `None` once every byte of the range has
    /// arrived. A cut body is resumed within the retry budget; a body longer than the range,
    /// or one that cannot be resumed, is an error naming the object, range and attempts.
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        loop {
            let expected = self.expected();
            let cut = match self.stream.as_mut() {
                Some(s) => match s.next().await {
                    Some(Ok(c)) => {
                        let got = self.received + c.len() as u64;
                        if got > expected {
                            self.stream = None;
                            return Err(self.short(got));
                        }
                        self.received = got;
                        self.since_request += c.len() as u64;
                        if self.since_request >= self.progress {
                            self.attempts = 1;
                            self.deadline = None;
                        }
                        let m = &self.store.inner().metrics;
                        m.bytes_read.fetch_add(c.len() as u64, Ordering::Relaxed);
                        return Ok(Some(c));
                    }
                    Some(Err(e)) => Some(e),
                    None if self.received == expected => {
                        self.stream = None;
                        return Ok(None);
                    }
                    None => None,
                },
                // Ended (or failed) before: nothing more comes.
                None if self.received == expected => return Ok(None),
                None => None,
            };
            self.resume(cut).await?;
        }
    }

    /// After a cut: waits out the backoff and asks for the rest, or reports the failure once
    /// the budget is spent.
    async fn resume(&mut self, cut: Option<object_store::Error>) -> Result<()> {
        self.stream = None;
        let inner = self.store.inner();
        let max_attempts = inner.opts.max_retries as u32 + 1;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + inner.opts.retry_timeout);
        if self.attempts >= max_attempts || Instant::now() >= deadline {
            inner.metrics.failed_reads.fetch_add(1, Ordering::Relaxed);
            return Err(match cut {
                Some(e) => Error::Read {
                    url: self.url(),
                    range: self.range.clone(),
                    attempts: self.attempts,
                    source: Arc::new(e),
                },
                None => self.short(self.received),
            });
        }
        inner.metrics.resumes.fetch_add(1, Ordering::Relaxed);
        if cut.is_some() && !self.local {
            inner
                .metrics
                .resumes_after_transport_error
                .fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(url = %crate::escape_key(&self.url()), got = self.received, expected = self.expected(), "body cut short; resuming");
        tokio::time::sleep(backoff(self.attempts)).await;
        self.request().await
    }

    /// The rest of the body as a stream of chunks (ends after the first error).
    pub(crate) fn into_stream(self) -> BoxStream<'static, Result<Bytes>> {
        stream::unfold(Some(self), |body| async move {
            let mut body = body?;
            match body.next_chunk().await {
                Ok(Some(c)) => Some((Ok(c), Some(body))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }
}

/// The largest chunk [`file_stream`] reads at once.
const FILE_CHUNK: u64 = 4 << 20;

/// `range` of a local file as a stream of chunks of up to [`FILE_CHUNK`] bytes, each read
/// by one positioned read on the blocking pool. object_store's own stream reads 8 KiB per
/// blocking task: 14 thread hand-offs (and as many wake-ups and small copies) for a 110 KB
/// image. A file that ends early ends the stream; the [`Body`] reports it as cut short.
fn file_stream(
    file: std::fs::File,
    path: std::path::PathBuf,
    range: Range<u64>,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    let file = Arc::new((file, path));
    stream::try_unfold(range.start, move |pos| {
        let file = file.clone();
        let end = range.end;
        async move {
            if pos >= end {
                return Ok(None);
            }
            let n = (end - pos).min(FILE_CHUNK) as usize;
            // Allocated here, on the runtime's thread, not on a blocking-pool thread: a
            // per-thread allocator (mimalloc in the CLI) would otherwise strand the freed
            // buffers in the heaps of blocking threads that have gone idle. Not zeroed:
            // the read fills it (zeroing was 1.4% of an ImageNet run's CPU).
            let buf = Vec::with_capacity(n);
            let buf = tokio::task::spawn_blocking(move || {
                read_at(&file.0, pos, buf, n).map_err(|e| object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: format!("read {} at {pos}: {e}", file.1.display()).into(),
                })
            })
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })??;
            if buf.is_empty() {
                return Ok(None);
            }
            let next = pos + buf.len() as u64;
            Ok(Some((Bytes::from(buf), next)))
        }
    })
    .boxed()
}

/// Reads `n` bytes of `file` at `pos` into `buf` (empty, with room for them); fewer only at
/// the end of the file.
fn read_at(file: &std::fs::File, pos: u64, mut buf: Vec<u8>, n: usize) -> std::io::Result<Vec<u8>> {
    buf.clear();
    buf.reserve_exact(n);
    while buf.len() < n {
        let got = buf.len();
        match read_into(file, &mut buf, n - got, pos + got as u64) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

/// One positioned read of at most `max` bytes (no more than `buf` has room for) appended to
/// `buf`, without zeroing the room first.
#[cfg(unix)]
fn read_into(
    file: &std::fs::File,
    buf: &mut Vec<u8>,
    max: usize,
    at: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let spare = &mut buf.spare_capacity_mut()[..max];
    let offset = libc::off_t::try_from(at)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: `pread` writes at most `spare.len()` bytes into `spare`, memory this Vec owns
    // and does not use; the length grows by exactly what it wrote, so every byte within it
    // is initialized.
    let k = unsafe {
        libc::pread(
            file.as_raw_fd(),
            spare.as_mut_ptr().cast::<libc::c_void>(),
            spare.len(),
            offset,
        )
    };
    if k < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let k = k as usize;
    // SAFETY: see above; `k <= spare.len()`.
    unsafe { buf.set_len(buf.len() + k) };
    Ok(k)
}

#[cfg(not(unix))]
fn read_into(
    file: &std::fs::File,
    buf: &mut Vec<u8>,
    max: usize,
    at: u64,
) -> std::io::Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let got = buf.len();
    buf.resize(got + max, 0);
    let mut f = file;
    let r = f
        .seek(SeekFrom::Start(at))
        .and_then(|_| f.read(&mut buf[got..]));
    buf.truncate(got + *r.as_ref().unwrap_or(&0));
    r
}

/// Exponential backoff with full jitter: uniform in [0, min(2 s, 25 ms * 2^attempt)].
pub(crate) fn backoff(attempt: u32) -> Duration {
    let cap = Duration::from_millis(25u64 << attempt.min(7)).min(Duration::from_secs(2));
    cap.mul_f64(rand::random::<f64>())
}
