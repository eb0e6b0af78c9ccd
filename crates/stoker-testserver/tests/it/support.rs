//! Clients for the tests.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{ClientOptions, RetryConfig};
use s3s::crypto::{Checksum as _, Md5};
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
    let mut s = TcpStream::connect(addr).expect("connecting");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
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
