//! Clients for the tests.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{ClientOptions, RetryConfig};
use s3s::crypto::{Checksum as _, Md5, Sha256};
use stoker_testserver::TestServer;

/// An `object_store` S3 client for `bucket`, without retries so faults reach the test.
pub fn store(server: &TestServer, bucket: &str) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(server.endpoint())
        .with_virtual_hosted_style_request(false)
        .with_bucket_name(bucket)
        .with_access_key_id(server.access_key())
        .with_secret_access_key(server.secret_key())
        .with_region(server.region())
        .with_client_options(
            ClientOptions::new()
                .with_allow_http(true)
                .with_timeout(Duration::from_secs(10)),
        )
        .with_retry(RetryConfig {
            max_retries: 0,
            ..Default::default()
        })
        .build()
        .expect("building the S3 client")
}

/// The ETag S3 gives a single-part upload of `data`, quotes included.
pub fn md5_etag(data: &[u8]) -> String {
    let digest = Md5::checksum(data);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// Deterministic bytes.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(7) % 251) as u8).collect()
}

/// What a raw HTTP exchange produced.
#[derive(Debug)]
pub struct Raw {
    /// 0 when the connection closed before a status line arrived.
    pub status: u16,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

/// One unsigned HTTP/1.1 request on a fresh connection, read until the server closes it.
pub fn raw(addr: SocketAddr, method: &str, path: &str) -> Raw {
    exchange(addr, method, path, &[], b"")
}

/// One HTTP/1.1 request signed with SigV4 (unsigned payload) for `server`'s credentials,
/// sent with `path` exactly as given (no normalisation of `.` or `..` segments, which any
/// HTTP client library would do), on a fresh connection. `extra` headers are sent unsigned.
pub fn signed(
    server: &TestServer,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> Raw {
    let addr = server.addr();
    let (path_only, query) = path.split_once('?').unwrap_or((path, ""));
    let date = amz_date(std::time::SystemTime::now());
    let day = &date[..8];
    let scope = format!("{day}/{}/s3/aws4_request", server.region());
    let host = addr.to_string();
    // The canonical URI is the decoded path, encoded again the AWS way.
    let decoded = percent_encoding::percent_decode_str(path_only).decode_utf8_lossy();
    let mut canonical_query: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (aws_encode(&dec(k), true), aws_encode(&dec(v), true))
        })
        .collect();
    canonical_query.sort();
    let canonical_query: Vec<String> = canonical_query
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let signed_headers = "host;x-amz-content-sha256;x-amz-date";
    let canonical = format!(
        "{method}\n{}\n{}\nhost:{host}\nx-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{date}\n\n{signed_headers}\nUNSIGNED-PAYLOAD",
        aws_encode(&decoded, false),
        canonical_query.join("&"),
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        hex(&Sha256::checksum(canonical.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", server.secret_key()).as_bytes(),
        day.as_bytes(),
    );
    for part in [server.region(), "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        server.access_key()
    );
    let mut headers = vec![
        ("Authorization", auth),
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD".to_owned()),
        ("x-amz-date", date.clone()),
    ];
    headers.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    exchange(addr, method, path, &headers, body)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::checksum(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let mut inner = pad(0x36);
    inner.extend_from_slice(msg);
    let mut outer = pad(0x5c);
    outer.extend_from_slice(&Sha256::checksum(&inner));
    Sha256::checksum(&outer)
}

/// SigV4's URI encoding: unreserved characters kept, `/` kept unless `slash`, the rest
/// `%XX` in upper case.
fn aws_encode(s: &str, slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (b == b'/' && !slash) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn amz_date(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Sends one HTTP/1.1 request on a fresh connection and reads until the server closes it.
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Raw {
    let mut s = TcpStream::connect(addr).expect("connecting");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut buf = Vec::new();
    // A reset or aborted connection may end the read with an error; keep what arrived.
    let mut chunk = [0u8; 8192];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let Some(split) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Raw {
            status: 0,
            headers: String::new(),
            body: buf,
        };
    };
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Raw {
        status,
        headers: head,
        body: buf[split + 4..].to_vec(),
    }
}
