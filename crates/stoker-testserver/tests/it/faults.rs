//! Latency and injected faults as an S3 client sees them.

use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::ObjectStoreExt as _;
use stoker_testserver::{Chaos, Fault, FaultKind, FaultRule, ServerOptions, TestServer};

use crate::support::{pattern, store};

async fn server_with(key: &str, data: &[u8]) -> TestServer {
    let server = TestServer::start(ServerOptions::new().bucket("data"))
        .await
        .unwrap();
    server.put_object("data", key, data).unwrap();
    server
}

#[tokio::test]
async fn latency_applies_to_every_request() {
    let latency = Duration::from_millis(120);
    let opts = ServerOptions::new().bucket("data").latency(latency);
    let server = TestServer::start(opts).await.unwrap();
    server.put_object("data", "k", b"v").unwrap();
    let s = store(&server, "data");
    for _ in 0..2 {
        let t = Instant::now();
        s.head(&Path::from("k")).await.unwrap();
        assert!(t.elapsed() >= latency, "{:?}", t.elapsed());
    }
    // The last setting wins: after a long latency is set and then none, a request does
    // not wait for the long one (no timing margin to lose on a loaded machine).
    server.set_latency(Duration::from_secs(60));
    server.set_latency(Duration::ZERO);
    let t = Instant::now();
    s.head(&Path::from("k")).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(server.requests(), 3);
}

#[tokio::test]
async fn error_status_is_seen_then_clears() {
    let server = server_with("obj", b"payload").await;
    let s = store(&server, "data");
    let path = Path::from("obj");
    let rule = FaultRule::new(Fault::slow_down())
        .method("GET")
        .path_contains("obj");
    server.faults().add(rule);
    server
        .faults()
        .add(FaultRule::new(Fault::internal_error()).method("GET"));
    // HEAD does not match either rule.
    s.head(&path).await.unwrap();
    let err = s.get(&path).await.unwrap_err().to_string();
    assert!(err.contains("503"), "{err}");
    let err = s.get(&path).await.unwrap_err().to_string();
    assert!(err.contains("500"), "{err}");
    assert_eq!(
        s.get(&path).await.unwrap().bytes().await.unwrap(),
        "payload"
    );
    assert_eq!(server.faults().hits(), 2);
    assert_eq!(server.faults().pending(), 0);
}

#[tokio::test]
async fn reset_fails_the_request() {
    let server = server_with("obj", b"payload").await;
    let s = store(&server, "data");
    let path = Path::from("obj");
    s.head(&path).await.unwrap(); // a pooled keep-alive connection now exists
    server.faults().add(FaultRule::new(Fault::Reset).times(2));
    assert!(s.get(&path).await.is_err());
    assert!(s.head(&path).await.is_err());
    assert_eq!(
        s.get(&path).await.unwrap().bytes().await.unwrap(),
        "payload"
    );
    assert_eq!(server.faults().hits(), 2);
}

#[tokio::test]
async fn short_body_is_cut_off() {
    let data = pattern(200_000);
    let server = server_with("big", &data).await;
    let s = store(&server, "data");
    let path = Path::from("big");
    server
        .faults()
        .add(FaultRule::new(Fault::ShortBody { after_bytes: 1000 }).method("GET"));
    match s.get(&path).await {
        Err(_) => {}
        Ok(res) => {
            assert_eq!(res.meta.size, 200_000, "headers are the real ones");
            match res.bytes().await {
                Err(_) => {}
                Ok(b) => assert!(b.len() < data.len(), "the whole body arrived"),
            }
        }
    }
    assert_eq!(server.faults().hits(), 1);
    assert_eq!(s.get(&path).await.unwrap().bytes().await.unwrap(), data);
}

#[tokio::test]
async fn delay_slows_the_first_byte() {
    let server = server_with("obj", b"payload").await;
    let s = store(&server, "data");
    let path = Path::from("obj");
    // Long enough that an undelayed request on a loaded machine stays well below it.
    let delay = Duration::from_secs(1);
    server.faults().add(FaultRule::new(Fault::Delay(delay)));
    let t = Instant::now();
    assert_eq!(
        s.get(&path).await.unwrap().bytes().await.unwrap(),
        "payload"
    );
    assert!(t.elapsed() >= delay, "{:?}", t.elapsed());
    let t = Instant::now();
    s.get(&path).await.unwrap();
    assert!(t.elapsed() < delay, "{:?}", t.elapsed());
}

#[test]
fn blocking_server_serves_other_runtimes_and_stops_on_drop() {
    let server = TestServer::start_blocking(ServerOptions::new().bucket("data")).unwrap();
    server.put_object("data", "k", b"v").unwrap();
    let root = server.root().to_owned();
    let addr = server.addr();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = store(&server, "data");
        assert_eq!(
            s.get(&Path::from("k"))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
            "v"
        );
    });
    assert_eq!(server.requests(), 1);
    assert!(root.join("data/k").is_file());
    drop(server);
    assert!(!root.exists(), "the temporary root is deleted");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn a_stall_pauses_mid_body_then_delivers_every_byte() {
    use futures::StreamExt as _;
    let data = pattern(3 << 20);
    let server = server_with("big", &data).await;
    let s = store(&server, "data");
    let path = Path::from("big");
    let pause = Duration::from_millis(400);
    // Mid-chunk (the server reads 1 MiB chunks): the chunk is split around the pause.
    let after = (1 << 20) + 4321;
    server.faults().add(
        FaultRule::new(Fault::Stall {
            after_bytes: after,
            pause,
        })
        .method("GET"),
    );
    let t = Instant::now();
    let mut stream = s.get(&path).await.unwrap().into_stream();
    let mut got = Vec::new();
    let mut gap = Duration::ZERO;
    let mut last = Instant::now();
    while let Some(chunk) = stream.next().await {
        let now = Instant::now();
        if got.len() as u64 >= after {
            gap = gap.max(now - last);
        }
        got.extend_from_slice(&chunk.unwrap());
        last = now;
    }
    assert_eq!(got, data, "every byte, in order");
    assert!(t.elapsed() >= pause, "{:?}", t.elapsed());
    assert!(
        gap >= pause / 2,
        "the pause came after the first bytes: {gap:?}"
    );
    assert_eq!(server.faults().counts().stall, 1);
    // A body shorter than the offset is sent whole, at once.
    server.put_object("data", "small", b"tiny").unwrap();
    server.faults().add(FaultRule::new(Fault::Stall {
        after_bytes: 100,
        pause: Duration::from_secs(30),
    }));
    let t = Instant::now();
    let got = s.get(&Path::from("small")).await.unwrap().bytes().await;
    assert_eq!(got.unwrap(), "tiny");
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_hits_requests_at_random_and_counts_by_kind() {
    let data = pattern(300_000);
    let server = server_with("obj", &data).await;
    let s = store(&server, "data");
    let path = Path::from("obj");
    server.faults().set_chaos(Some(
        Chaos::new(0.5, &FaultKind::ALL, 42)
            .max_delay(Duration::from_millis(40))
            .max_offset(200_000),
    ));
    let (mut ok, mut failed) = (0u64, 0u64);
    for _ in 0..120 {
        // A request that fails, or whose body is cut, is an error; a delayed or stalled one
        // is whole.
        match s.get(&path).await {
            Ok(r) => match r.bytes().await {
                Ok(b) => {
                    assert_eq!(b, data, "a body that arrives whole is the right one");
                    ok += 1;
                }
                Err(_) => failed += 1,
            },
            Err(_) => failed += 1,
        }
    }
    let c = server.faults().counts();
    assert_eq!(c.total(), server.faults().hits());
    assert!(
        (30..=90).contains(&c.total()),
        "about half of 120 requests: {c:?}"
    );
    for k in FaultKind::ALL {
        assert!(c.get(k) > 0, "{k:?} never drawn: {c:?}");
    }
    // Errors are exactly the failing kinds (statuses, resets, cuts).
    assert_eq!(failed, c.status + c.reset + c.short, "{c:?}");
    assert_eq!(ok + failed, 120);
    server.faults().clear();
    assert_eq!(s.get(&path).await.unwrap().bytes().await.unwrap(), data);
    assert_eq!(server.faults().counts().total(), c.total());
}
