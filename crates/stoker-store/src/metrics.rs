//! Request metrics, always on and cheap: atomic counters and a log-scale latency histogram.
//!
//! Two levels are counted. *Logical* operations are what Stoker asked for (a GET of a range, a
//! HEAD, a LIST page). *HTTP attempts* are what went on the wire, counted by a connector that
//! wraps the HTTP client `object_store` uses, so the retries `object_store` makes on our
//! behalf (503 SlowDown, 5xx, resets, timeouts) are visible too. Latency is time to response
//! headers (time to first byte) per HTTP attempt, or per logical operation for backends
//! without HTTP (memory, local files).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpResponseBody, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;
use serde::Serialize;

/// Log-linear histogram of durations in microseconds: 8 sub-buckets per power of two, so any
/// percentile is within about 9% of the true value. Lock-free.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: Vec<AtomicU64>,
}

const SUB: u32 = 8;
const POWERS: u32 = 40;

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: (0..(SUB * POWERS)).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl LatencyHistogram {
    fn index(us: u64) -> usize {
        if us < SUB as u64 {
            return us as usize;
        }
        let p = 63 - us.leading_zeros(); // floor(log2)
        let shift = p - 3; // keep 3 bits below the leading one
        let sub = ((us >> shift) & (SUB as u64 - 1)) as u32;
        (((p - 2) * SUB + sub) as usize).min((SUB * POWERS) as usize - 1)
    }

    fn lower_bound(i: usize) -> u64 {
        let i = i as u32;
        if i < SUB {
            return i as u64;
        }
        let p = i / SUB + 2;
        let sub = (i % SUB) as u64;
        (1u64 << p) + (sub << (p - 3))
    }

    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        self.buckets[Self::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Number of recorded durations.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The `q` quantile (0..=1) in milliseconds, or 0 when empty.
    #[cfg(test)]
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.counts(), q)
    }

    fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// The `q` quantile in milliseconds of a histogram's bucket counts, or 0 when empty.
fn quantile_ms(counts: &[u64], q: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            // Midpoint of the bucket.
            let lo = LatencyHistogram::lower_bound(i) as f64;
            let hi = LatencyHistogram::lower_bound(i + 1) as f64;
            return (lo + hi) / 2.0 / 1000.0;
        }
    }
    0.0
}

/// Live counters of one [`Store`](crate::Store); shared by every reader of it.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) get_requests: AtomicU64,
    pub(crate) head_requests: AtomicU64,
    pub(crate) list_requests: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) resumes: AtomicU64,
    /// Resumes after a body that failed mid-way over HTTP: that failure is counted already
    /// (a transport error, by [`MeteredBody`]), so these are not counted twice as retries.
    pub(crate) resumes_after_transport_error: AtomicU64,
    pub(crate) failed_reads: AtomicU64,
    pub(crate) objects_fetched: AtomicU64,
    pub(crate) http: HttpCounters,
    pub(crate) op_latency: LatencyHistogram,
}

/// Counters kept by the metering HTTP connector.
#[derive(Debug, Default)]
pub struct HttpCounters {
    requests: AtomicU64,
    status_2xx: AtomicU64,
    status_4xx: AtomicU64,
    throttled: AtomicU64,
    status_5xx: AtomicU64,
    transport_errors: AtomicU64,
    latency: LatencyHistogram,
}

/// A point-in-time copy of the metrics, serialisable to JSON.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Logical GET operations (whole objects or ranges).
    pub get_requests: u64,
    /// Logical HEAD operations.
    pub head_requests: u64,
    /// LIST pages requested.
    pub list_requests: u64,
    /// Payload bytes received.
    pub bytes_read: u64,
    /// Whole objects delivered by `fetch_many`/`get`.
    pub objects_fetched: u64,
    /// HTTP attempts on the wire (0 for memory/local backends).
    pub http_requests: u64,
    /// HTTP attempts answered 503/429 (throttling).
    pub http_throttled: u64,
    /// HTTP attempts answered with another 5xx.
    pub http_server_errors: u64,
    /// HTTP attempts with a 4xx other than 429 (404 on a probe, 416, 403...).
    pub http_client_errors: u64,
    /// HTTP attempts that failed below HTTP (reset, refused, timeout, a body cut mid-way).
    pub http_transport_errors: u64,
    /// Retries made: failed attempts that were tried again, plus resumed bodies.
    pub retries: u64,
    /// Bodies cut short and resumed from the last byte received.
    pub resumes: u64,
    /// Reads that failed after the retry budget.
    pub failed_reads: u64,
    /// Number of latency samples behind the percentiles.
    pub latency_samples: u64,
    /// Median time to first byte, ms.
    pub latency_p50_ms: f64,
    /// 90th percentile time to first byte, ms.
    pub latency_p90_ms: f64,
    /// 99th percentile time to first byte, ms.
    pub latency_p99_ms: f64,
    /// Block cache counters.
    pub cache: crate::cache::CacheStats,
    /// Memory budget limit, bytes.
    pub memory_limit: u64,
    /// Memory budget in use now, bytes.
    pub memory_used: u64,
    /// Highest memory budget use, bytes.
    pub memory_peak: u64,
    /// The latency histogram's bucket counts, for [`MetricsSnapshot::since`].
    #[serde(skip)]
    latency_buckets: Vec<u64>,
}

impl MetricsSnapshot {
    /// The latency histogram's non-empty buckets: `(from_ms, to_ms, requests)`, fastest
    /// first (the profiler's plot).
    pub fn latency_histogram(&self) -> Vec<(f64, f64, u64)> {
        self.latency_buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| {
                let lo = LatencyHistogram::lower_bound(i) as f64 / 1000.0;
                let hi = LatencyHistogram::lower_bound(i + 1) as f64 / 1000.0;
                (lo, hi, c)
            })
            .collect()
    }

    /// What happened between `earlier` (a snapshot of the same store) and this snapshot:
    /// counters are differences, percentiles are over the requests in between, and the
    /// levels (memory, cache occupancy and sizes) are this snapshot's. The peak is the
    /// budget's highest use ever (it has no history to take a difference of).
    pub fn since(&self, earlier: &MetricsSnapshot) -> MetricsSnapshot {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let buckets: Vec<u64> = if earlier.latency_buckets.len() == self.latency_buckets.len() {
            self.latency_buckets
                .iter()
                .zip(&earlier.latency_buckets)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect()
        } else {
            self.latency_buckets.clone()
        };
        let (c, e) = (&self.cache, &earlier.cache);
        MetricsSnapshot {
            get_requests: d(self.get_requests, earlier.get_requests),
            head_requests: d(self.head_requests, earlier.head_requests),
            list_requests: d(self.list_requests, earlier.list_requests),
            bytes_read: d(self.bytes_read, earlier.bytes_read),
            objects_fetched: d(self.objects_fetched, earlier.objects_fetched),
            http_requests: d(self.http_requests, earlier.http_requests),
            http_throttled: d(self.http_throttled, earlier.http_throttled),
            http_server_errors: d(self.http_server_errors, earlier.http_server_errors),
            http_client_errors: d(self.http_client_errors, earlier.http_client_errors),
            http_transport_errors: d(self.http_transport_errors, earlier.http_transport_errors),
            retries: d(self.retries, earlier.retries),
            resumes: d(self.resumes, earlier.resumes),
            failed_reads: d(self.failed_reads, earlier.failed_reads),
            latency_samples: buckets.iter().sum(),
            latency_p50_ms: quantile_ms(&buckets, 0.50),
            latency_p90_ms: quantile_ms(&buckets, 0.90),
            latency_p99_ms: quantile_ms(&buckets, 0.99),
            cache: crate::cache::CacheStats {
                hits: d(c.hits, e.hits),
                misses: d(c.misses, e.misses),
                memory_hits: d(c.memory_hits, e.memory_hits),
                disk_hits: d(c.disk_hits, e.disk_hits),
                joins: d(c.joins, e.joins),
                inserts: d(c.inserts, e.inserts),
                evictions: d(c.evictions, e.evictions),
                rejections: d(c.rejections, e.rejections),
                reclaimed: d(c.reclaimed, e.reclaimed),
                reclaimed_bytes: d(c.reclaimed_bytes, e.reclaimed_bytes),
                skipped: d(c.skipped, e.skipped),
                disk_writes: d(c.disk_writes, e.disk_writes),
                disk_write_drops: d(c.disk_write_drops, e.disk_write_drops),
                disk_evictions: d(c.disk_evictions, e.disk_evictions),
                disk_corrupt: d(c.disk_corrupt, e.disk_corrupt),
                disk_errors: d(c.disk_errors, e.disk_errors),
                ..c.clone()
            },
            latency_buckets: buckets,
            ..self.clone()
        }
    }
}

impl Metrics {
    pub(crate) fn snapshot(
        &self,
        cache: crate::cache::CacheStats,
        budget: &stoker_core::MemoryBudget,
    ) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let http = &self.http;
        let http_requests = l(&http.requests);
        let hist = if http_requests > 0 {
            &http.latency
        } else {
            &self.op_latency
        };
        let latency_buckets = hist.counts();
        let failed_attempts = l(&http.throttled) + l(&http.status_5xx) + l(&http.transport_errors);
        let resumes = l(&self.resumes);
        MetricsSnapshot {
            get_requests: l(&self.get_requests),
            head_requests: l(&self.head_requests),
            list_requests: l(&self.list_requests),
            bytes_read: l(&self.bytes_read),
            objects_fetched: l(&self.objects_fetched),
            http_requests,
            http_throttled: l(&http.throttled),
            http_server_errors: l(&http.status_5xx),
            http_client_errors: l(&http.status_4xx),
            http_transport_errors: l(&http.transport_errors),
            retries: (failed_attempts + resumes)
                .saturating_sub(l(&self.failed_reads) + l(&self.resumes_after_transport_error)),
            resumes,
            failed_reads: l(&self.failed_reads),
            latency_samples: latency_buckets.iter().sum(),
            latency_p50_ms: quantile_ms(&latency_buckets, 0.50),
            latency_p90_ms: quantile_ms(&latency_buckets, 0.90),
            latency_p99_ms: quantile_ms(&latency_buckets, 0.99),
            cache,
            memory_limit: budget.limit(),
            memory_used: budget.used(),
            memory_peak: budget.peak(),
            latency_buckets,
        }
    }
}

/// An [`HttpConnector`] that counts every HTTP attempt `object_store` makes.
#[derive(Debug)]
pub(crate) struct MeteredConnector {
    pub(crate) metrics: Arc<Metrics>,
}

impl HttpConnector for MeteredConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(MeteredService {
            inner,
            metrics: self.metrics.clone(),
        }))
    }
}

#[derive(Debug)]
struct MeteredService {
    inner: HttpClient,
    metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl HttpService for MeteredService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let start = Instant::now();
        let h = &self.metrics.http;
        h.requests.fetch_add(1, Ordering::Relaxed);
        let listing = crate::keys::list_format(req.method().as_str(), req.uri().query());
        let mut out = self.inner.execute(req).await;
        // A listing with keys object_store cannot parse: stand-ins for them (keys.rs), so
        // one such key does not fail the whole listing.
        if let Some(format) = listing {
            out = match out {
                Ok(resp) if resp.status().is_success() => stand_in_bad_keys(resp, format).await,
                other => other,
            };
        }
        h.latency.record(start.elapsed());
        let out = out.map(|resp| {
            resp.map(|body| {
                HttpResponseBody::new(MeteredBody {
                    inner: body,
                    metrics: self.metrics.clone(),
                })
            })
        });
        match &out {
            Ok(resp) => {
                let s = resp.status().as_u16();
                let c = match s {
                    200..=299 => &h.status_2xx,
                    429 | 503 => &h.throttled,
                    500..=599 => &h.status_5xx,
                    _ => &h.status_4xx,
                };
                c.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                h.transport_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        out
    }
}

/// A response body that counts a failure mid-way (a reset, a body cut short) as a transport
/// error: `object_store` retries those itself, from the next byte, where [`MeteredService`]
/// does not see them, and without this they were counted as neither failed attempts nor
/// retries.
#[derive(Debug)]
struct MeteredBody {
    inner: HttpResponseBody,
    metrics: Arc<Metrics>,
}

impl http_body::Body for MeteredBody {
    type Data = bytes::Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Err(_))) = &r {
            self.metrics
                .http
                .transport_errors
                .fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A successful listing response, its body read whole and with stand-ins for the keys that
/// `object_store` could not parse.
async fn stand_in_bad_keys(
    resp: HttpResponse,
    format: crate::keys::ListFormat,
) -> Result<HttpResponse, HttpError> {
    let (mut parts, body) = resp.into_parts();
    let bytes = body.bytes().await?;
    let body = match crate::keys::rewrite_listing(&bytes, format) {
        Some(b) => {
            parts.headers.remove("content-length");
            HttpResponseBody::from(b)
        }
        None => HttpResponseBody::from(bytes),
    };
    Ok(HttpResponse::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_close() {
        let h = LatencyHistogram::default();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile_ms(0.5);
        let p99 = h.quantile_ms(0.99);
        assert!((45.0..=56.0).contains(&p50), "p50 {p50}");
        assert!((90.0..=110.0).contains(&p99), "p99 {p99}");
        assert_eq!(h.count(), 100);
    }

    #[test]
    fn a_snapshot_since_another_counts_only_what_came_between() {
        let m = Metrics::default();
        let budget = stoker_core::MemoryBudget::new(1 << 20);
        for ms in [100u64, 100, 100] {
            m.op_latency.record(Duration::from_millis(ms));
            m.get_requests.fetch_add(1, Ordering::Relaxed);
        }
        let before = m.snapshot(crate::cache::CacheStats::default(), &budget);
        m.op_latency.record(Duration::from_millis(2));
        m.get_requests.fetch_add(1, Ordering::Relaxed);
        m.bytes_read.fetch_add(10, Ordering::Relaxed);
        let cache = crate::cache::CacheStats {
            hits: 5,
            memory_bytes: 7,
            ..Default::default()
        };
        let after = m.snapshot(cache, &budget);
        assert_eq!(after.get_requests, 4);
        assert!(after.latency_p50_ms > 50.0);
        let d = after.since(&before);
        assert_eq!(
            (d.get_requests, d.bytes_read, d.latency_samples),
            (1, 10, 1)
        );
        assert!(d.latency_p50_ms < 3.0, "{}", d.latency_p50_ms);
        // Counters are differences, levels are the later snapshot's.
        assert_eq!((d.cache.hits, d.cache.memory_bytes), (5, 7));
        assert_eq!(d.memory_limit, 1 << 20);
    }

    #[test]
    fn histogram_index_is_monotonic() {
        let mut last = 0;
        for us in 0..100_000u64 {
            let i = LatencyHistogram::index(us);
            assert!(i >= last);
            assert!(LatencyHistogram::lower_bound(i) <= us, "us {us} i {i}");
            assert!(LatencyHistogram::lower_bound(i + 1) > us, "us {us} i {i}");
            last = i;
        }
    }
}
