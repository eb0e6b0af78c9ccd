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

#[test]
fn demo_json_decodes_every_image_of_every_epoch_and_reports_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["demo", "--json", "--images", "40", "--large-size", "2MiB"])
        .args(["--latency-ms", "2", "--threads", "2", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Two epochs of 40 images, each decoded, cropped, flipped and normalized.
    assert_eq!(v["pipeline"]["images"], 80, "{v}");
    assert_eq!(v["pipeline"]["epochs"], 2);
    assert_eq!(
        v["pipeline"]["batches"], 2,
        "40 images are one batch of 64 per epoch"
    );
    assert_eq!(v["baseline"]["images"], 80, "{v}");
    for k in ["images_per_s", "first_batch_s"] {
        for side in ["pipeline", "baseline"] {
            let x = v[side][k].as_f64().unwrap();
            assert!(x.is_finite() && x > 0.0, "{side}.{k} = {x}");
        }
    }
    let ratio = v["ratio"].as_f64().unwrap();
    let want = v["pipeline"]["images_per_s"].as_f64().unwrap()
        / v["baseline"]["images_per_s"].as_f64().unwrap();
    assert!((ratio - want).abs() < 1e-9 * want, "{ratio} {want}");
    assert!(v["first_epoch_ratio"].as_f64().unwrap() > 0.0, "{v}");
    for side in ["pipeline", "baseline"] {
        assert_eq!(v[side]["epoch_seconds"].as_array().unwrap().len(), 2, "{v}");
        // Each loader runs in a process of its own: its peak is its own, not the
        // generator's or the server's (a few hundred MiB for 40 small images is not).
        let rss = v[side]["peak_rss_bytes"].as_u64().unwrap();
        assert!(rss > 0 && rss < 400 << 20, "{side}: {rss}");
    }
    // The first epoch fetched every image once; the second came from a cache: the
    // optimizer's of decoded images (neither fetched nor decoded again), or, for one that
    // did not fit, the store's block cache.
    let bytes = v["dataset"]["bytes"].as_u64().unwrap();
    assert_eq!(v["pipeline"]["bytes_fetched"], bytes, "{v}");
    let hits = |k: &str| v["pipeline"][k].as_u64().unwrap();
    assert_eq!(hits("cache_hits") + hits("decoded_cache_hits"), 40, "{v}");
    // The naive loader has no cache: both epochs fetched everything.
    assert_eq!(v["baseline"]["bytes_fetched"], 2 * bytes);
    // Real JPEGs of ImageNet's sizes.
    let mean = v["dataset"]["mean_bytes"].as_u64().unwrap();
    assert!((70_000..160_000).contains(&mean), "{mean}");
    assert!(v["dataset"]["short_side_min"].as_u64().unwrap() >= 300);
    assert!(v["dataset"]["short_side_max"].as_u64().unwrap() <= 500);
    assert_eq!(v["storage"]["bytes"], 2 << 20);
    let jpg = std::fs::read(dir.path().join("demo/images/class_00/img_00000.jpg")).unwrap();
    assert_eq!(&jpg[..3], &[0xFF, 0xD8, 0xFF], "a JPEG");
    // A second run reuses the generated images.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["demo", "--json", "--images", "40", "--large-size", "2MiB"])
        .args(["--latency-ms", "2", "--epochs", "1", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    let w: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(w["dataset"]["bytes"], bytes);
    assert_eq!(w["pipeline"]["images"], 40);
}
