//! Keys are confined to their bucket: a request whose key climbs out of the bucket's
//! directory with `..` segments is refused with `400 InvalidArgument` naming the key, and
//! nothing is written, copied or deleted outside the bucket. Sent as real signed HTTP
//! requests with the paths exactly as written (a client library would normalise them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use stoker_testserver::{ServerOptions, TestServer};

use crate::support::{signed, Raw};

/// A server whose root is `outer/root`, so that anything written next to the root (or
/// above it) shows up in `outer`; with bucket `data` (holding `ok.txt`) and bucket
/// `other` (holding `victim`).
fn server() -> (tempfile::TempDir, TestServer) {
    let outer = tempfile::tempdir().unwrap();
    let opts = ServerOptions::new()
        .root(outer.path().join("root"))
        .bucket("data")
        .bucket("other");
    let server = TestServer::start_blocking(opts).unwrap();
    server.put_object("data", "ok.txt", b"fine\n").unwrap();
    server.put_object("other", "victim", b"keep me\n").unwrap();
    (outer, server)
}

/// Every file and directory under `dir`, relative to it.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.insert(p.strip_prefix(dir).unwrap().to_path_buf());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

fn assert_refused(r: &Raw, key: &str) {
    assert_eq!(r.status, 400, "{key}: {}", r.text());
    assert!(
        r.text().contains("<Code>InvalidArgument</Code>"),
        "{key}: {}",
        r.text()
    );
    assert!(
        r.text().contains(key),
        "names the key {key:?}: {}",
        r.text()
    );
}

/// The escaping keys tried, as sent on the wire and as the server decodes them.
const ESCAPES: [(&str, &str); 4] = [
    ("/data/x/../../../../etc/passwd", "x/../../../../etc/passwd"),
    ("/data/x/../../escape.txt", "x/../../escape.txt"),
    ("/data/../other/planted", "../other/planted"),
    ("/data/x/%2E%2E/%2E%2E/encoded.txt", "x/../../encoded.txt"),
];

#[test]
fn a_put_with_dot_dot_segments_stays_under_the_root() {
    let (outer, server) = server();
    // The signer works: a plain key is stored.
    let r = signed(&server, "PUT", "/data/new.txt", &[], b"hello\n");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        std::fs::read(server.root().join("data/new.txt")).unwrap(),
        b"hello\n"
    );
    let before = tree(outer.path());
    for (path, key) in ESCAPES {
        let r = signed(&server, "PUT", path, &[], b"root::0:0::/:/bin/sh\n");
        assert_refused(&r, key);
    }
    assert_eq!(tree(outer.path()), before, "nothing was written anywhere");
    assert!(!outer.path().join("etc").exists());
}

#[test]
fn copies_with_dot_dot_segments_neither_read_nor_write_outside_the_bucket() {
    let (outer, server) = server();
    let before = tree(outer.path());
    // An escaping destination.
    for (path, key) in ESCAPES {
        let r = signed(
            &server,
            "PUT",
            path,
            &[("x-amz-copy-source", "/data/ok.txt")],
            b"",
        );
        assert_refused(&r, key);
    }
    // An escaping source: another bucket's object must not be copied in through `..`.
    let r = signed(
        &server,
        "PUT",
        "/data/stolen",
        &[("x-amz-copy-source", "/data/x/../../other/victim")],
        b"",
    );
    assert_refused(&r, "x/../../other/victim");
    assert_eq!(tree(outer.path()), before);
    // A copy within the bucket still works.
    let r = signed(
        &server,
        "PUT",
        "/data/copy.txt",
        &[("x-amz-copy-source", "/data/ok.txt")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        std::fs::read(server.root().join("data/copy.txt")).unwrap(),
        b"fine\n"
    );
}

#[test]
fn multipart_uploads_with_dot_dot_segments_are_refused_before_any_write() {
    let (outer, server) = server();
    let before = tree(outer.path());
    let upload_id = "0b5b1c4e-8a3e-4c1e-9f3a-2d3c4b5a6f70";
    for (path, key) in ESCAPES {
        let create = signed(&server, "POST", &format!("{path}?uploads"), &[], b"");
        assert_refused(&create, key);
        let part = format!("{path}?partNumber=1&uploadId={upload_id}");
        assert_refused(&signed(&server, "PUT", &part, &[], b"part"), key);
        let copy = signed(
            &server,
            "PUT",
            &part,
            &[("x-amz-copy-source", "/data/ok.txt")],
            b"",
        );
        assert_refused(&copy, key);
        let complete = signed(
            &server,
            "POST",
            &format!("{path}?uploadId={upload_id}"),
            &[],
            b"<CompleteMultipartUpload></CompleteMultipartUpload>",
        );
        assert_refused(&complete, key);
        let list = signed(
            &server,
            "GET",
            &format!("{path}?uploadId={upload_id}"),
            &[],
            b"",
        );
        assert_refused(&list, key);
        let abort = signed(
            &server,
            "DELETE",
            &format!("{path}?uploadId={upload_id}"),
            &[],
            b"",
        );
        assert_refused(&abort, key);
    }
    assert_eq!(tree(outer.path()), before);
}

#[test]
fn a_delete_with_dot_dot_segments_leaves_other_buckets_alone() {
    let (outer, server) = server();
    let before = tree(outer.path());
    let r = signed(&server, "DELETE", "/data/../other/victim", &[], b"");
    assert_refused(&r, "../other/victim");
    let r = signed(&server, "DELETE", "/data/x/../../other/victim", &[], b"");
    assert_refused(&r, "x/../../other/victim");
    assert_eq!(tree(outer.path()), before);
    assert_eq!(
        std::fs::read(server.root().join("other/victim")).unwrap(),
        b"keep me\n"
    );
}

#[test]
fn a_batch_delete_refuses_escaping_keys_one_by_one() {
    let (outer, server) = server();
    server.put_object("data", "gone.txt", b"bye\n").unwrap();
    let before = tree(outer.path());
    let body = "<Delete>\
        <Object><Key>../other/victim</Key></Object>\
        <Object><Key>gone.txt</Key></Object>\
        </Delete>";
    let r = signed(&server, "POST", "/data?delete", &[], body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("<Deleted><Key>gone.txt</Key></Deleted>"),
        "{text}"
    );
    assert!(
        text.contains("<Key>../other/victim</Key>") && text.contains("InvalidArgument"),
        "{text}"
    );
    assert!(!server.root().join("data/gone.txt").exists());
    assert_eq!(
        std::fs::read(server.root().join("other/victim")).unwrap(),
        b"keep me\n"
    );
    // Only gone.txt and its sidecar (named by the key's base64) went.
    let gone: BTreeSet<PathBuf> = before.difference(&tree(outer.path())).cloned().collect();
    let expected: BTreeSet<PathBuf> = [
        "root/data/gone.txt",
        "root/.bucket-ZGF0YQ.object-Z29uZS50eHQ.internal.json",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(gone, expected);
    assert!(tree(outer.path()).is_subset(&before));
}
