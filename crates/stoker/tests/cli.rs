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

/// Keys reach the terminal escaped: `stoker ls` prints keys with control or formatting
/// characters as escapes, names the keys it skips (those that cannot be file names) in one
/// escaped warning, and errors name keys escaped too; `--json` keeps exact keys.
#[test]
fn keys_are_escaped_on_the_terminal() {
    let s = server();
    for k in [
        "odd/bidi\u{202e}txt.exe",
        "odd/c1\u{9b}2J",
        "odd/back\\slash",
        "odd/esc\u{1b}]0;pwned\u{7}",
        "odd/bad\u{1}key",
    ] {
        s.put_object("cli", k, b"x").unwrap();
    }
    // NO_COLOR: the log's own colours are not what this looks for.
    let out = stoker(&s)
        .env("NO_COLOR", "1")
        .args(["ls", "s3://cli/odd/"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text, "odd/back\\\\slash\nodd/bidi\\u{202e}txt.exe\nodd/c1\\u{9b}2J\n",
        "{text:?}"
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("2 keys") && err.contains("odd/esc\\x1b]0;pwned\\x07"),
        "{err:?}"
    );
    assert!(err.contains("odd/bad\\x01key"), "{err:?}");
    for raw in ['\u{1b}', '\u{1}', '\u{7}', '\u{9b}', '\u{202e}'] {
        assert!(
            !text.contains(raw) && !err.contains(raw),
            "{raw:?} reached the terminal"
        );
    }
    assert_eq!(err.lines().count(), 1, "one warning: {err:?}");

    // Recursive listing: the same.
    let out = stoker(&s)
        .args(["ls", "-r", "s3://cli/odd/"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);

    // JSON: exact keys.
    let out = stoker(&s)
        .args(["ls", "--json", "s3://cli/odd/"])
        .output()
        .unwrap();
    let keys: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["key"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        keys,
        [
            "odd/back\\slash",
            "odd/bidi\u{202e}txt.exe",
            "odd/c1\u{9b}2J"
        ]
    );

    // An error naming a key.
    let out = stoker(&s)
        .env("NO_COLOR", "1")
        .args(["cat", "s3://cli/nope\u{1b}[2J"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("nope\\x1b[2J") && !err.contains('\u{1b}'),
        "{err:?}"
    );
}
