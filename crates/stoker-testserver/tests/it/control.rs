//! The `/__stoker/` control endpoint, over raw HTTP as another process would use it.

use std::time::{Duration, Instant};

use stoker_testserver::{ServerOptions, TestServer};

use crate::support::raw;

fn server() -> TestServer {
    let server = TestServer::start_blocking(ServerOptions::new().bucket("data")).unwrap();
    server.put_object("data", "obj", &[b'x'; 5000]).unwrap();
    server
}

#[test]
fn injected_status_has_an_s3_error_body() {
    let server = server();
    let addr = server.addr();
    let r = raw(
        addr,
        "POST",
        "/__stoker/fault?kind=status&status=503&code=SlowDown&method=GET&path=obj",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(r#""pending":1"#), "{}", r.text());

    // Faults come before authentication, so even an unsigned request sees them.
    let r = raw(addr, "GET", "/data/obj");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("<Code>SlowDown</Code>"), "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some("application/xml"));
    // Used up: the next request reaches S3, which refuses an unsigned request.
    assert_eq!(raw(addr, "GET", "/data/obj").status, 403);

    let stats = raw(addr, "GET", "/__stoker/stats");
    assert_eq!(stats.status, 200);
    assert_eq!(
        stats.header("content-type").as_deref(),
        Some("application/json")
    );
    let text = stats.text();
    assert!(text.starts_with(r#"{"requests":2,"faults":1,"#), "{text}");
    assert_eq!(server.requests(), 2);
}

#[test]
fn reset_short_and_delay() {
    let server = server();
    let addr = server.addr();

    assert_eq!(raw(addr, "POST", "/__stoker/fault?kind=reset").status, 200);
    let r = raw(addr, "GET", "/data/obj");
    assert_eq!(
        (r.status, r.body.len()),
        (0, 0),
        "nothing at all is answered"
    );

    // The body of whatever the server answers is cut after 5 bytes.
    assert_eq!(
        raw(addr, "POST", "/__stoker/fault?kind=short&after=5").status,
        200
    );
    let r = raw(addr, "GET", "/data/obj");
    assert_ne!(r.status, 0);
    let declared: usize = r.header("content-length").unwrap().parse().unwrap();
    assert_eq!(r.body.len(), 5);
    assert!(declared > 5);

    assert_eq!(
        raw(addr, "POST", "/__stoker/fault?kind=delay&ms=200").status,
        200
    );
    let t = Instant::now();
    assert_eq!(raw(addr, "GET", "/data/obj").status, 403);
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert_eq!(server.faults().hits(), 3);
}

#[test]
fn latency_clear_and_errors() {
    let server = server();
    let addr = server.addr();

    assert_eq!(raw(addr, "POST", "/__stoker/latency?ms=150").status, 200);
    assert_eq!(server.latency(), Duration::from_millis(150));
    let t = Instant::now();
    raw(addr, "GET", "/data/obj");
    assert!(t.elapsed() >= Duration::from_millis(150));
    // Control requests themselves are not delayed (under a latency far longer than any
    // machine's hiccup).
    assert_eq!(raw(addr, "POST", "/__stoker/latency?ms=60000").status, 200);
    let t = Instant::now();
    assert_eq!(raw(addr, "POST", "/__stoker/latency?ms=0").status, 200);
    assert!(t.elapsed() < Duration::from_secs(30));

    let add = "/__stoker/fault?kind=status&status=500&times=forever";
    assert_eq!(raw(addr, "POST", add).status, 200);
    assert_eq!(raw(addr, "GET", "/data/obj").status, 500);
    assert_eq!(raw(addr, "GET", "/data/obj").status, 500);
    assert_eq!(raw(addr, "POST", "/__stoker/clear").status, 200);
    assert_eq!(server.faults().pending(), 0);
    assert_eq!(raw(addr, "GET", "/data/obj").status, 403);

    assert_eq!(raw(addr, "POST", "/__stoker/fault?kind=bogus").status, 400);
    assert_eq!(raw(addr, "POST", "/__stoker/fault?kind=delay").status, 400);
    assert_eq!(raw(addr, "GET", "/__stoker/fault?kind=reset").status, 405);
    assert_eq!(raw(addr, "GET", "/__stoker/nothing").status, 404);
    assert_eq!(server.faults().pending(), 0);
}

#[test]
fn chaos_over_http_and_stats_per_kind() {
    let server = server();
    let addr = server.addr();
    let r = raw(
        addr,
        "POST",
        "/__stoker/chaos?p=1&kinds=reset&seed=5&method=GET",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..3 {
        assert_eq!(raw(addr, "GET", "/data/obj").status, 0, "reset");
    }
    // HEAD is not hit: S3 refuses the unsigned request.
    assert_eq!(raw(addr, "HEAD", "/data/obj").status, 403);
    let stats = raw(addr, "GET", "/__stoker/stats").text();
    assert!(stats.contains(r#""faults":3"#), "{stats}");
    assert!(
        stats.contains(r#""faults_by_kind":{"status":0,"reset":3,"short":0,"delay":0,"stall":0}"#),
        "{stats}"
    );
    assert!(stats.contains(r#""kinds":["reset"]"#), "{stats}");
    assert!(stats.contains(r#""seed":5"#), "{stats}");
    // p=0 stops it; so does clear.
    assert_eq!(raw(addr, "POST", "/__stoker/chaos?p=0").status, 200);
    assert_eq!(raw(addr, "GET", "/data/obj").status, 403);
    assert!(raw(addr, "GET", "/__stoker/stats")
        .text()
        .contains(r#""chaos":null"#));
    assert_eq!(
        raw(
            addr,
            "POST",
            "/__stoker/chaos?p=1&kinds=status&statuses=503"
        )
        .status,
        200
    );
    assert_eq!(raw(addr, "GET", "/data/obj").status, 503);
    assert_eq!(raw(addr, "POST", "/__stoker/clear").status, 200);
    assert_eq!(raw(addr, "GET", "/data/obj").status, 403);
    assert_eq!(raw(addr, "POST", "/__stoker/chaos?p=1.5").status, 400);
    assert_eq!(
        raw(addr, "POST", "/__stoker/chaos?p=0.1&kinds=nope").status,
        400
    );
    assert_eq!(raw(addr, "GET", "/__stoker/chaos?p=0.1").status, 405);
    // A stall rule over HTTP.
    let r = raw(addr, "POST", "/__stoker/fault?kind=stall&after=0&ms=300");
    assert_eq!(r.status, 200, "{}", r.text());
    let t = Instant::now();
    assert_eq!(raw(addr, "GET", "/data/obj").status, 403);
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(raw(addr, "GET", "/__stoker/stats")
        .text()
        .contains(r#""stall":1"#));
}
