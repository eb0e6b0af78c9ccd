//! The `stoker-testserver` binary, as a script would run it.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::raw;

#[test]
fn prints_endpoint_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stoker-testserver"))
        .arg("--root")
        .arg(&root)
        .args([
            "--port",
            "0",
            "--latency-ms",
            "0",
            "--bucket",
            "alpha",
            "--bucket",
            "beta",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let endpoint = line
        .trim_end()
        .strip_prefix("STOKER_TESTSERVER_ENDPOINT=")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let addr: SocketAddr = endpoint.strip_prefix("http://").unwrap().parse().unwrap();
    assert!(addr.ip().is_loopback());
    assert!(root.join("alpha").is_dir() && root.join("beta").is_dir());

    let stats = raw(addr, "GET", "/__stoker/stats");
    assert_eq!(stats.status, 200);
    assert!(stats.text().contains(r#""requests":0"#), "{}", stats.text());
    assert_eq!(
        raw(addr, "GET", "/alpha/x").status,
        403,
        "unsigned S3 requests are refused"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the server did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(root.join("alpha").is_dir(), "a given root is kept");
}
