//! Fault injection against the real S3 test server: throttling, resets, bodies cut short,
//! slow first bytes. Nothing lost, nothing corrupted; after the retry budget, a clear error.

use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use stoker_store::{Error, Store, StoreOptions};
use stoker_testserver::{Fault, FaultRule, ServerOptions, TestServer};

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

async fn setup(opts: StoreOptions) -> (TestServer, Store) {
    let server = TestServer::start(ServerOptions::new().bucket("faults"))
        .await
        .unwrap();
    let opts = opts
        .with_endpoint(server.endpoint())
        .with_credentials(server.access_key(), server.secret_key())
        .with_region(server.region());
    let store = Store::open("s3://faults/", opts).unwrap();
    for (k, n) in [("obj.bin", 1 << 20), ("small.bin", 100_000)] {
        store
            .backend()
            .put(&Path::from(k), PutPayload::from(data(n)))
            .await
            .unwrap();
    }
    (server, store)
}

/// A store without a block cache, `retries` retries and parts of `part_size`, over a server
/// whose next `times` GETs each deliver `after_bytes` of the body and are then cut.
async fn with_cuts(
    retries: usize,
    part_size: u64,
    after_bytes: u64,
    times: u32,
) -> (TestServer, Store) {
    let opts = StoreOptions::default()
        .with_retries(retries, Duration::from_secs(30))
        .with_part_size(part_size)
        .with_cache_memory(0);
    let (server, store) = setup(opts).await;
    server.faults().add(
        FaultRule::new(Fault::ShortBody { after_bytes })
            .method("GET")
            .times(times),
    );
    (server, store)
}

fn fast_retries() -> StoreOptions {
    StoreOptions::default()
        .with_retries(4, Duration::from_secs(30))
        .with_part_size(256 * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_and_counted() {
    let (server, store) = setup(fast_retries()).await;
    server
        .faults()
        .add(FaultRule::new(Fault::slow_down()).method("GET").times(3));
    let got = store.get("small.bin").await.unwrap();
    assert_eq!(got, data(100_000));
    let m = store.metrics();
    assert_eq!(m.http_throttled, 3, "{m:?}");
    assert!(m.retries >= 3, "{m:?}");
    assert_eq!(m.failed_reads, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_resets_are_retried() {
    let (server, store) = setup(fast_retries()).await;
    server.faults().add(
        FaultRule::new(Fault::internal_error())
            .method("GET")
            .times(1),
    );
    server
        .faults()
        .add(FaultRule::new(Fault::Reset).method("GET").times(2));
    let got = store.get("obj.bin").await.unwrap();
    assert_eq!(got, data(1 << 20));
    let m = store.metrics();
    assert!(m.http_server_errors >= 1, "{m:?}");
    assert!(m.http_transport_errors >= 2, "{m:?}");
    assert_eq!(server.faults().hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_and_retried_by_object_store_is_counted_as_a_retry() {
    // One cut, within object_store's own body retries: it asks for the rest itself, where
    // the metering connector sees a second request but no failed one (found by the chaos
    // soak, tests/chaos.rs in the stoker crate: 121 cuts, 0 retries counted).
    let (server, store) = setup(fast_retries()).await;
    server.faults().add(
        FaultRule::new(Fault::ShortBody {
            after_bytes: 10_000,
        })
        .method("GET"),
    );
    let got = store.get("small.bin").await.unwrap();
    assert_eq!(got, data(100_000));
    let m = store.metrics();
    assert_eq!(server.faults().hits(), 1);
    assert_eq!(m.http_transport_errors, 1, "{m:?}");
    assert_eq!(m.retries, 1, "{m:?}");
    assert_eq!(
        m.resumes, 0,
        "object_store's retry, not Stoker's resume: {m:?}"
    );
    assert_eq!(m.failed_reads, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_bodies_resume_from_the_last_byte() {
    // More cuts than object_store's own body retries allow (2), so Stoker's resume runs too.
    let opts = StoreOptions::default()
        .with_retries(2, Duration::from_secs(30))
        .with_part_size(4 << 20);
    let (server, store) = setup(opts).await;
    server.faults().add(
        FaultRule::new(Fault::ShortBody {
            after_bytes: 100_000,
        })
        .method("GET")
        .times(4),
    );
    let got = store.get_range("obj.bin", 0..(1 << 20)).await.unwrap();
    assert_eq!(got.len(), 1 << 20);
    assert_eq!(
        got,
        data(1 << 20),
        "resumed bytes are spliced in the right place"
    );
    let m = store.metrics();
    assert!(m.resumes >= 1, "Stoker resumed the body itself: {m:?}");
    // Resumed from the last byte: far fewer bytes than refetching from zero each time.
    assert!(m.bytes_read <= (1 << 20) as u64, "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_first_byte_times_out_and_retries() {
    let opts = fast_retries().with_request_timeout(Duration::from_millis(500));
    let (server, store) = setup(opts).await;
    server.faults().add(
        FaultRule::new(Fault::Delay(Duration::from_secs(3)))
            .method("GET")
            .times(1),
    );
    let t = Instant::now();
    let got = store.get("small.bin").await.unwrap();
    assert_eq!(got, data(100_000));
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "did not wait out the slow request"
    );
    assert!(store.metrics().http_transport_errors >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_failure_reports_url_range_and_attempts() {
    let opts = StoreOptions::default().with_retries(2, Duration::from_secs(30));
    let (server, store) = setup(opts).await;
    server
        .faults()
        .add(FaultRule::new(Fault::slow_down()).method("GET").forever());
    let e = store.get("small.bin").await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Read { .. }), "{e:?}");
    assert!(msg.contains("s3://faults/small.bin"), "{msg}");
    assert!(msg.contains("attempt"), "{msg}");
    let m = store.metrics();
    assert_eq!(m.failed_reads, 1, "{m:?}");
    assert_eq!(m.http_throttled, 3, "one try and two retries: {m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_recovers_after_a_failed_read() {
    let opts = StoreOptions::default().with_retries(1, Duration::from_secs(30));
    let (server, store) = setup(opts).await;
    let mut reader = store.reader("obj.bin").await.unwrap();
    server.faults().add(
        FaultRule::new(Fault::internal_error())
            .method("GET")
            .forever(),
    );
    let e = reader.read_at(4096, 1000).await.unwrap_err();
    assert!(matches!(e, Error::Read { .. }), "{e:?}");
    // The same read again fails the same way (it asks again, no stale state)...
    assert!(reader.read_at(4096, 1000).await.is_err());
    // ...and once the server recovers, the same reader reads the right bytes.
    server.faults().clear();
    let got = reader.read_at(4096, 1000).await.unwrap();
    assert_eq!(got, data(1 << 20)[4096..5096]);
    let next = reader.read(500).await.unwrap();
    assert_eq!(next, data(1 << 20)[5096..5596]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_object_is_never_served_from_old_blocks() {
    let opts = fast_retries().with_metadata_ttl(Duration::from_millis(200));
    let (_server, store) = setup(opts).await;
    let first = store.get("small.bin").await.unwrap();
    assert_eq!(first, data(100_000));
    // Replace the object with different bytes of a different length.
    let new: Vec<u8> = vec![9u8; 50_000];
    store
        .backend()
        .put(&Path::from("small.bin"), PutPayload::from(new.clone()))
        .await
        .unwrap();
    // Within the TTL the cached version may be served; after it, never.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.get("small.bin").await.unwrap(), new);
    assert_eq!(
        store.get_range("small.bin", 0..10).await.unwrap(),
        new[..10]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncached_streams_pass_chunks_through_and_resume() {
    // With no cache, parts are streamed as the network's chunks (no copy); cuts still resume.
    let (_server, store) = with_cuts(2, 256 * 1024, 50_000, 4).await;
    let parts: Vec<bytes::Bytes> = futures::TryStreamExt::try_collect(
        store
            .read_stream("obj.bin", Some(1000..(1 << 20) - 7))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(parts.concat(), data(1 << 20)[1000..(1 << 20) - 7]);
    assert_eq!(store.metrics().cache.inserts, 0, "nothing was cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_that_make_progress_do_not_use_up_the_retry_budget() {
    // One retry allowed, eight cuts: each resume delivers 100 KB before the next cut, so the
    // read keeps going (the budget counts failures in a row, not cuts in all).
    let (_server, store) = with_cuts(1, 4 << 20, 100_000, 8).await;
    let got = store.get_range("obj.bin", 0..(1 << 20)).await.unwrap();
    assert_eq!(got, data(1 << 20));
    assert!(store.metrics().resumes >= 4, "{:?}", store.metrics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_without_progress_fail_after_the_budget_naming_the_range() {
    let (_server, store) = with_cuts(2, 256 * 1024, 0, 1000).await;
    let stream = store
        .read_stream("obj.bin", Some(0..(1 << 20)))
        .await
        .unwrap();
    let items: Vec<_> = futures::StreamExt::collect(stream).await;
    let e = items.last().unwrap().as_ref().unwrap_err();
    assert!(items[..items.len() - 1].iter().all(|i| i.is_ok()));
    let msg = e.to_string();
    assert!(msg.contains("s3://faults/obj.bin"), "{msg}");
    assert!(
        msg.contains("bytes 0-262144"),
        "names the part's range: {msg}"
    );
    assert!(store.metrics().failed_reads >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_trickles_bytes_before_each_cut_fails_after_the_budget() {
    // Every response delivers 1,000 bytes and is cut: bytes arrive, but a 256 KiB part would
    // take 262 requests. That is not progress; the read fails after the retry budget.
    let (_server, store) = with_cuts(3, 256 * 1024, 1000, 100_000).await;
    let e = store
        .get_range("obj.bin", 0..(256 * 1024))
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("s3://faults/obj.bin"), "{msg}");
    let m = store.metrics();
    assert!(m.failed_reads >= 1, "{m:?}");
    assert!(m.get_requests <= 8, "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_near_the_end_of_a_small_range_still_make_progress() {
    // One retry allowed; every response delivers 20,000 bytes of a 50,000-byte range. Each
    // is more than a quarter of what was left, so each counts as progress.
    let (_server, store) = with_cuts(1, 4 << 20, 20_000, 100).await;
    let got = store.get_range("small.bin", 0..50_000).await.unwrap();
    assert_eq!(got, data(100_000)[..50_000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_head_does_not_hold_back_the_requests_behind_it() {
    use futures::StreamExt;
    let (server, store) = setup(StoreOptions::default()).await;
    let keys: Vec<String> = (0..12).map(|i| format!("many/{i:02}")).collect();
    for (i, k) in keys.iter().enumerate() {
        store
            .backend()
            .put(&Path::from(k.as_str()), PutPayload::from(data(1000 + i)))
            .await
            .unwrap();
    }
    server.faults().add(
        FaultRule::new(Fault::Delay(Duration::from_millis(800)))
            .method("GET")
            .path_contains("many/00")
            .times(1),
    );
    let before = store.metrics().get_requests;
    let opts = stoker_store::FetchManyOptions::default().with_concurrency(2);
    let mut stream = store.fetch_many(keys.clone(), opts);
    let head = stream.next().await.unwrap().unwrap();
    assert_eq!(head.key, "many/00");
    // Two request slots, each freed as its response ends: while the head was slow, the
    // window (4 objects per slot) filled up behind it. Counting finished-but-unyielded
    // objects as in flight would have stopped at 2 requests.
    let during = store.metrics().get_requests - before;
    assert!(
        during >= 8,
        "only {during} GETs were sent while the head took 800 ms"
    );
    assert_eq!(head.bytes.len(), 1000);
    let rest: Vec<_> = stream.collect().await;
    assert_eq!(rest.len(), 11);
    for (i, r) in rest.into_iter().enumerate() {
        let r = r.unwrap();
        assert_eq!(r.key, keys[i + 1], "delivered in the order asked");
        assert_eq!(r.bytes, data(1001 + i));
    }
}
