//! The backend's HTTP behaviour, driven through s3s without authentication so requests can
//! be written by hand and every status, header and XML element checked.

use std::sync::Arc;

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use s3s::crypto::{Checksum as _, Md5};
use s3s::service::{S3Service, S3ServiceBuilder};

use super::meta::hex;
use super::{Backend, ContentEtags};

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    s3: S3Service,
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("bkt")).unwrap();
        let backend = Backend::new(root.clone(), Arc::new(ContentEtags::new(false))).unwrap();
        let s3 = S3ServiceBuilder::new(backend).build();
        Self {
            _dir: dir,
            root,
            s3,
        }
    }

    fn file(&self, key: &str, data: &[u8]) {
        let path = self.root.join("bkt").join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }

    async fn call(&self, method: Method, uri: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "localhost");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .s3
            .call(req.body(s3s::Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    async fn get(&self, uri: &str) -> Answer {
        self.call(Method::GET, uri, &[]).await
    }
}

fn quoted_md5(data: &[u8]) -> String {
    format!("\"{}\"", hex(&Md5::checksum(data)))
}

/// Every `<tag>value</tag>` in an XML document, in order.
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let j = rest.find(&close).unwrap();
        out.push(rest[..j].replace("&quot;", "\"").replace("&amp;", "&"));
        rest = &rest[j..];
    }
    out
}

#[tokio::test]
async fn directory_keys_are_not_found() {
    let fx = Fixture::new();
    fx.file("dir/a", b"x");
    let head = fx.call(Method::HEAD, "/bkt/dir", &[]).await;
    assert_eq!(head.status, StatusCode::NOT_FOUND);
    let get = fx.get("/bkt/dir").await;
    assert_eq!(get.status, StatusCode::NOT_FOUND);
    assert!(get.body.contains("<Code>NoSuchKey</Code>"), "{}", get.body);
    assert_eq!(fx.get("/bkt/dir/").await.status, StatusCode::NOT_FOUND);
    assert_eq!(fx.get("/bkt/missing").await.status, StatusCode::NOT_FOUND);
    let no_bucket = fx.get("/nobucket/x").await;
    assert!(
        no_bucket.body.contains("NoSuchBucket"),
        "{}",
        no_bucket.body
    );
    // Deleting a "directory" key is a no-op, as for any missing key.
    assert_eq!(
        fx.call(Method::DELETE, "/bkt/dir", &[]).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(fx.get("/bkt/dir/a").await.body, "x");
}

#[tokio::test]
async fn ranges() {
    let fx = Fixture::new();
    fx.file("r", b"0123456789");
    fx.file("empty", b"");
    let a = fx
        .call(Method::GET, "/bkt/r", &[("range", "bytes=2-5")])
        .await;
    assert_eq!(a.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(a.headers["content-range"], "bytes 2-5/10");
    assert_eq!(a.headers["content-length"], "4");
    assert_eq!(a.body, "2345");
    let a = fx
        .call(Method::GET, "/bkt/r", &[("range", "bytes=7-")])
        .await;
    assert_eq!(
        (a.status, a.body.as_str()),
        (StatusCode::PARTIAL_CONTENT, "789")
    );
    let a = fx
        .call(Method::GET, "/bkt/r", &[("range", "bytes=-3")])
        .await;
    assert_eq!(a.headers["content-range"], "bytes 7-9/10");
    assert_eq!(a.body, "789");
    let a = fx
        .call(Method::GET, "/bkt/r", &[("range", "bytes=8-100")])
        .await;
    assert_eq!(a.headers["content-range"], "bytes 8-9/10");
    assert_eq!(a.body, "89");
    let a = fx
        .call(Method::GET, "/bkt/r", &[("range", "bytes=10-20")])
        .await;
    assert_eq!(a.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert!(a.body.contains("<Code>InvalidRange</Code>"), "{}", a.body);
    let a = fx
        .call(Method::GET, "/bkt/empty", &[("range", "bytes=-5")])
        .await;
    assert_eq!(a.status, StatusCode::RANGE_NOT_SATISFIABLE);
    let a = fx.get("/bkt/empty").await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, ""));
    assert_eq!(a.headers["etag"], quoted_md5(b"").as_str());
    let a = fx.get("/bkt/r").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["accept-ranges"], "bytes");
}

#[tokio::test]
async fn large_body_streams_whole() {
    let fx = Fixture::new();
    let data: Vec<u8> = (0..1_000_003u32).map(|i| b'a' + (i % 26) as u8).collect();
    fx.file("big", &data);
    let a = fx
        .call(Method::GET, "/bkt/big", &[("range", "bytes=300000-700000")])
        .await;
    assert_eq!(a.body.as_bytes(), &data[300_000..=700_000]);
    let a = fx.get("/bkt/big").await;
    assert_eq!(a.headers["etag"], quoted_md5(&data).as_str());
    assert_eq!(a.headers["content-length"], "1000003");
}

#[tokio::test]
async fn conditional_requests() {
    let fx = Fixture::new();
    fx.file("c", b"hello");
    let etag = quoted_md5(b"hello");
    let a = fx.call(Method::GET, "/bkt/c", &[("if-match", &etag)]).await;
    assert_eq!(a.status, StatusCode::OK);
    let a = fx
        .call(Method::GET, "/bkt/c", &[("if-match", "\"nope\"")])
        .await;
    assert_eq!(a.status, StatusCode::PRECONDITION_FAILED);
    let a = fx
        .call(Method::HEAD, "/bkt/c", &[("if-none-match", &etag)])
        .await;
    assert_eq!(a.status, StatusCode::NOT_MODIFIED);
    let a = fx
        .call(Method::GET, "/bkt/c", &[("if-none-match", "\"other\"")])
        .await;
    assert_eq!(a.status, StatusCode::OK);
    let past = "Mon, 01 Jan 2001 00:00:00 GMT";
    let a = fx
        .call(Method::GET, "/bkt/c", &[("if-unmodified-since", past)])
        .await;
    assert_eq!(a.status, StatusCode::PRECONDITION_FAILED);
    let a = fx
        .call(Method::GET, "/bkt/c", &[("if-modified-since", past)])
        .await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn listings_carry_head_etags_and_ignore_empty_delimiter() {
    let fx = Fixture::new();
    fx.file("a/1", b"one");
    fx.file("a/2", b"two");
    fx.file("b", b"bee");
    let all = fx.get("/bkt?list-type=2&delimiter=").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    assert_eq!(xml_values(&all.body, "Key"), ["a/1", "a/2", "b"]);
    assert!(
        xml_values(&all.body, "Prefix").iter().all(String::is_empty),
        "{}",
        all.body
    );
    let etags = xml_values(&all.body, "ETag");
    assert_eq!(etags.len(), 3);
    for (key, etag) in ["a/1", "a/2", "b"].iter().zip(&etags) {
        let head = fx.call(Method::HEAD, &format!("/bkt/{key}"), &[]).await;
        assert_eq!(head.headers["etag"], etag.as_str());
    }
    assert_eq!(etags[2], quoted_md5(b"bee"));

    let grouped = fx.get("/bkt?list-type=2&delimiter=%2F").await;
    assert_eq!(xml_values(&grouped.body, "Key"), ["b"]);
    assert!(grouped
        .body
        .contains("<CommonPrefixes><Prefix>a/</Prefix></CommonPrefixes>"));

    // V1 listings take the same path.
    let v1 = fx.get("/bkt?delimiter=").await;
    assert_eq!(xml_values(&v1.body, "Key"), ["a/1", "a/2", "b"]);
    assert_eq!(xml_values(&v1.body, "ETag"), etags);
}

#[tokio::test]
async fn listing_pagination() {
    let fx = Fixture::new();
    let keys: Vec<String> = (0..7).map(|i| format!("k{i:02}")).collect();
    for k in &keys {
        fx.file(k, k.as_bytes());
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut uri = "/bkt?list-type=2&max-keys=3".to_owned();
        if let Some(t) = &token {
            uri.push_str("&continuation-token=");
            uri.push_str(&percent_encoding::utf8_percent_encode(t, super::URL_ENCODE).to_string());
        }
        let page = fx.get(&uri).await;
        pages += 1;
        seen.extend(xml_values(&page.body, "Key"));
        if page.body.contains("<IsTruncated>true</IsTruncated>") {
            token = xml_values(&page.body, "NextContinuationToken").pop();
            assert!(token.is_some());
        } else {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, keys);
}

#[tokio::test]
async fn url_encoded_listing() {
    let fx = Fixture::new();
    fx.file("p/a+b c%ü", b"x");
    let l = fx
        .get("/bkt?list-type=2&encoding-type=url&prefix=p%2F")
        .await;
    assert_eq!(xml_values(&l.body, "Key"), ["p/a%2Bb%20c%25%C3%BC"]);
    let l = fx.get("/bkt?list-type=2&prefix=p%2F").await;
    assert_eq!(xml_values(&l.body, "Key"), ["p/a+b c%ü"]);
}

#[tokio::test]
async fn stale_sidecar_etag_is_ignored() {
    let fx = Fixture::new();
    fx.file("s", b"new content");
    // A sidecar recorded for earlier content, written before the file changed.
    let sidecar = super::paths::internal_info_path(&fx.root, "bkt", "s");
    std::fs::write(
        &sidecar,
        br#"{"e_tag":"0123456789abcdef0123456789abcdef-2"}"#,
    )
    .unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&sidecar)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let head = fx.call(Method::HEAD, "/bkt/s", &[]).await;
    assert_eq!(head.headers["etag"], quoted_md5(b"new content").as_str());
    // A fresh sidecar wins (multipart ETags are not content MD5s).
    std::fs::write(
        &sidecar,
        br#"{"e_tag":"0123456789abcdef0123456789abcdef-2"}"#,
    )
    .unwrap();
    let head = fx.call(Method::HEAD, "/bkt/s", &[]).await;
    assert_eq!(
        head.headers["etag"],
        "\"0123456789abcdef0123456789abcdef-2\""
    );
    let l = fx.get("/bkt?list-type=2").await;
    assert_eq!(
        xml_values(&l.body, "ETag"),
        ["\"0123456789abcdef0123456789abcdef-2\""]
    );
}

#[tokio::test]
async fn delete_prunes_empty_directories() {
    let fx = Fixture::new();
    fx.file("x/y/z", b"1");
    assert_eq!(
        fx.call(Method::DELETE, "/bkt/x/y/z", &[]).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(!fx.root.join("bkt/x").exists());
    assert!(fx.root.join("bkt").is_dir());
}
