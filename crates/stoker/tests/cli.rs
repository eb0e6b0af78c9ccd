//! The `stoker` binary against the real S3 test server: ls, cat, bench --json, and errors.

mod common;

use common::stoker;
use stoker_testserver::{ServerOptions, TestServer};

fn server() -> TestServer {
    let s = TestServer::start_blocking(ServerOptions::new().bucket("cli")).unwrap();
    s.put_object("cli", "data/a.bin", &[1u8; 1000]).unwrap();
    s.put_object("cli", "data/sub/b.bin", b"hello world")
        .unwrap();
    s.put_object("cli", "big.bin", &vec![7u8; 3 << 20]).unwrap();
    s
}

#[test]
fn ls_lists_one_level_and_recursively() {
    let s = server();
    let out = stoker(&s).args(["ls", "s3://cli/data/"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, "data/sub/\ndata/a.bin\n");
    let out = stoker(&s).args(["ls", "-r", "s3://cli/"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, "big.bin\ndata/a.bin\ndata/sub/b.bin\n");
}

#[test]
fn cat_writes_bytes_and_ranges() {
    let s = server();
    let out = stoker(&s)
        .args(["cat", "s3://cli/data/sub/b.bin"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"hello world");
    let out = stoker(&s)
        .args(["cat", "s3://cli/data/sub/b.bin", "--range", "6-11"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"world");
    let out = stoker(&s)
        .args(["cat", "s3://cli/big.bin"])
        .output()
        .unwrap();
    assert_eq!(out.stdout.len(), 3 << 20);
}

#[test]
fn bench_json_has_the_documented_fields() {
    let s = server();
    let out = stoker(&s)
        .args(["bench", "s3://cli/", "--json", "--part-size", "1MiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["objects"], 3);
    assert_eq!(v["bytes"], 1000 + 11 + (3 << 20));
    for k in [
        "seconds",
        "objects_per_s",
        "mib_per_s",
        "latency_p50_ms",
        "latency_p99_ms",
    ] {
        assert!(v[k].is_number(), "{k} missing: {v}");
    }
}

#[test]
fn missing_objects_fail_with_the_url() {
    let s = server();
    let out = stoker(&s)
        .args(["cat", "s3://cli/nope.bin"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("s3://cli/nope.bin"), "{err}");
    assert!(err.contains("not found"), "{err}");
}

#[test]
fn bench_reads_a_key_file_without_listing_and_names_a_missing_key() {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, "# a manifest\na.bin\n\nsub/b.bin\n").unwrap();
    let out = stoker(&s)
        .args([
            "bench",
            "s3://cli/data/",
            "--json",
            "--epochs",
            "2",
            "--keys",
        ])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["objects"], 2);
    assert_eq!(v["bytes"], 1000 + 11);
    assert_eq!(v["metrics"]["list_requests"], 0, "{v}");
    assert_eq!(v["epochs"][1]["bytes"], 1000 + 11);

    std::fs::write(&keys, "a.bin\nnope.bin\n").unwrap();
    let out = stoker(&s)
        .args(["bench", "s3://cli/data/", "--keys"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("s3://cli/data/nope.bin"), "{err}");
}
