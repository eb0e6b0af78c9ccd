//! Latency and injected faults as an S3 client sees them.

use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::ObjectStoreExt as _;
use stoker_testserver::{Fault, FaultRule, ServerOptions, TestServer};

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
