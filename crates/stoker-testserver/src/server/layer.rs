//! The hyper service in front of s3s: request counting, latency, faults, control endpoint.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use s3s::service::S3Service;
use s3s::{S3Error, S3ErrorCode, StdError};

use super::control;
use crate::fault::{Fault, FaultInjector};

/// Path prefix of the control endpoint (see the crate docs); never an S3 path, since bucket
/// names cannot contain `_`.
pub const CONTROL_PREFIX: &str = "/__stoker/";

/// How much of a request body is read (and discarded) before an injected error status is
/// sent, so the connection can be reused.
const DRAIN_LIMIT: u64 = 16 << 20;

/// State shared by the server handle, the service, and the control endpoint.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) faults: FaultInjector,
    latency_ns: AtomicU64,
    requests: AtomicU64,
}

impl Shared {
    pub(crate) fn new(latency: Duration) -> Self {
        let shared = Self::default();
        shared.set_latency(latency);
        shared
    }

    pub(crate) fn latency(&self) -> Duration {
        Duration::from_nanos(self.latency_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency_ns.store(ns, Ordering::Relaxed);
    }

    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// The connection-level service: S3 requests go to s3s (with latency and faults applied),
/// `/__stoker/` requests to the control endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    s3: S3Service,
    shared: Arc<Shared>,
}

/// Why a connection was closed on purpose.
#[derive(Debug)]
struct InjectedFault(&'static str);

impl std::fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "injected fault: {}", self.0)
    }
}

impl std::error::Error for InjectedFault {}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Layer {
    pub(crate) fn new(s3: S3Service, shared: Arc<Shared>) -> Self {
        Self { s3, shared }
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<s3s::Body>, StdError> {
        if req.uri().path().starts_with(CONTROL_PREFIX) {
            return Ok(control::handle(&self.shared, req).await);
        }
        self.shared.requests.fetch_add(1, Ordering::Relaxed);

        let fault = {
            let raw = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
            let decoded =
                percent_encoding::percent_decode_str(req.uri().path()).decode_utf8_lossy();
            self.shared
                .faults
                .take(req.method().as_str(), &decoded, raw)
        };
        if let Some(f) = &fault {
            tracing::debug!(fault = ?f, method = %req.method(), uri = %req.uri(), "injecting fault");
        }

        let latency = self.shared.latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }

        let mut truncate_after = None;
        let mut stall = None;
        match fault {
            None => {}
            Some(Fault::Reset) => return Err(Box::new(InjectedFault("connection reset"))),
            Some(Fault::Status { status, code }) => {
                let path = req.uri().path().to_owned();
                drain(req.into_body()).await;
                return Ok(error_response(status, &code, &path));
            }
            Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
            Some(Fault::ShortBody { after_bytes }) => truncate_after = Some(after_bytes),
            Some(Fault::Stall { after_bytes, pause }) => stall = Some((after_bytes, pause)),
        }

        let resp = self
            .s3
            .call(req.map(s3s::Body::from))
            .await
            .map_err(StdError::from)?;
        Ok(match (truncate_after, stall) {
            (Some(n), _) => resp.map(|body| s3s::Body::http_body(ShortBody::new(body, n))),
            (None, Some((n, pause))) => {
                resp.map(|body| s3s::Body::http_body(StallBody::new(body, n, pause)))
            }
            (None, None) => resp,
        })
    }
}

impl hyper::service::Service<Request<Incoming>> for Layer {
    type Response = Response<s3s::Body>;
    type Error = StdError;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        Box::pin(self.clone().handle(req))
    }
}

/// Reads and discards up to [`DRAIN_LIMIT`] bytes of a request body.
async fn drain(mut body: Incoming) {
    let mut seen = 0u64;
    while seen < DRAIN_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => {
                seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            _ => break,
        }
    }
}

/// An S3 error response: the status, and an XML body naming `code`.
pub(crate) fn error_response(status: u16, code: &str, resource: &str) -> Response<s3s::Body> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let code = S3ErrorCode::from_str(code).unwrap_or_else(|e: Infallible| match e {});
    let mut err = S3Error::with_message(
        code,
        format!("Injected by stoker-testserver for {resource}"),
    );
    err.set_status_code(status);
    err.set_request_id("stoker-testserver-fault");
    err.to_http_response().unwrap_or_else(|_| {
        let mut resp = Response::new(s3s::Body::empty());
        *resp.status_mut() = status;
        resp
    })
}

/// A response body that delivers only the first `remaining` bytes of `inner` and then
/// fails, which makes hyper abort the connection mid-body. The size hint (and so the
/// `Content-Length` hyper sends) stays the real one.
struct ShortBody {
    inner: s3s::Body,
    remaining: u64,
    /// Started once the last byte is handed over: hyper buffers writes, and failing the body
    /// at once would discard the buffered headers and bytes instead of sending them. Waiting
    /// lets hyper flush them before the connection is aborted.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long a cut-short body waits, after its last byte, before aborting the connection.
const SHORT_BODY_LINGER: Duration = Duration::from_millis(20);

impl ShortBody {
    fn new(inner: s3s::Body, after_bytes: u64) -> Self {
        Self {
            inner,
            remaining: after_bytes,
            linger: None,
        }
    }
}

impl http_body::Body for ShortBody {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        if self.remaining == 0 {
            let linger = self
                .linger
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(SHORT_BODY_LINGER)));
            if linger.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            return Poll::Ready(Some(Err(Box::new(InjectedFault("short body")))));
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        match frame.into_data() {
            Ok(mut data) => {
                let len = data.len() as u64;
                if len > self.remaining {
                    let keep = usize::try_from(self.remaining).unwrap_or(usize::MAX);
                    data.truncate(keep);
                    self.remaining = 0;
                } else {
                    self.remaining -= len;
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Err(frame) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that delivers the first `remaining` bytes of `inner`, then nothing for
/// `pause`, then the rest: a stall mid-body. The size hint stays the real one.
struct StallBody {
    inner: s3s::Body,
    remaining: u64,
    pause: Duration,
    /// Started when the first `remaining` bytes are out; `None` again never (one stall).
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    stalled: bool,
}

impl StallBody {
    fn new(inner: s3s::Body, after_bytes: u64, pause: Duration) -> Self {
        Self {
            inner,
            remaining: after_bytes,
            pause,
            sleep: None,
            stalled: false,
        }
    }
}

impl http_body::Body for StallBody {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        if self.remaining == 0 && !self.stalled {
            let pause = self.pause;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.stalled = true;
            self.sleep = None;
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if self.stalled {
            return Poll::Ready(Some(Ok(frame)));
        }
        match frame.into_data() {
            Ok(mut data) => {
                let len = data.len() as u64;
                if len > self.remaining {
                    // Split the chunk: the head now, the tail after the pause.
                    let keep = usize::try_from(self.remaining).unwrap_or(usize::MAX);
                    let tail = data.split_off(keep);
                    self.remaining = 0;
                    self.inner = s3s::Body::http_body(Prepend {
                        head: Some(tail),
                        inner: std::mem::take(&mut self.inner),
                    });
                    if data.is_empty() {
                        // Nothing before the pause: go straight to it.
                        return self.poll_frame(cx);
                    }
                } else {
                    self.remaining -= len;
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Err(frame) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stalled && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `head`, then `inner`.
struct Prepend {
    head: Option<Bytes>,
    inner: s3s::Body,
}

impl http_body::Body for Prepend {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        if let Some(head) = self.head.take() {
            if !head.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(head))));
            }
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.as_ref().is_none_or(Bytes::is_empty) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + head);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + head);
        }
        hint
    }
}
