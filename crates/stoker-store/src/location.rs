//! Store URLs: which backend, which bucket, which key or prefix.
//!
//! `s3://bucket/key`, `gs://bucket/key`, `az://container/key` (also `azure://`, `abfs://`),
//! `http(s)://host/path`, `file:///abs/path` or a plain path, and `memory://name/key`.
//! A [`StoreUrl`] splits a URL into the part that selects a backend (scheme + bucket) and the
//! key/prefix inside it; [`Store`](crate::Store) keys are always relative to the bucket.

use crate::error::{Error, Result};

/// The backend a URL selects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scheme {
    /// Amazon S3 or any S3-compatible server.
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azure,
    /// Plain HTTP(S) (WebDAV-style listing).
    Http,
    /// Local files.
    File,
    /// In-process memory (tests).
    Memory,
}

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// The backend.
    pub scheme: Scheme,
    /// Bucket/container (S3, GCS, Azure), host (HTTP), name (memory); empty for files.
    pub bucket: String,
    /// The key or prefix inside the bucket, without a leading `/` (for files: the absolute path
    /// without its leading `/`).
    pub key: String,
    /// For HTTP: `scheme://host[:port]`.
    pub http_base: Option<String>,
}

impl StoreUrl {
    /// Parses a URL or a local path.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            // A plain path: make it absolute.
            if url.is_empty() {
                return Err(bad("empty URL"));
            }
            let p = std::path::Path::new(url);
            let abs = if p.is_absolute() {
                p.to_path_buf()
            } else {
                std::env::current_dir()
                    .map_err(|e| bad(&format!("cannot resolve relative path: {e}")))?
                    .join(p)
            };
            let s = abs.to_string_lossy();
            let trailing = url.ends_with('/');
            let mut key = normalize(&s);
            if trailing && !key.is_empty() {
                key.push('/');
            }
            return Ok(StoreUrl {
                scheme: Scheme::File,
                bucket: String::new(),
                key,
                http_base: None,
            });
        };
        let scheme_l = scheme.to_ascii_lowercase();
        if scheme_l == "file" {
            let path = rest.strip_prefix("localhost").unwrap_or(rest);
            if !path.starts_with('/') {
                return Err(bad("file URLs must be absolute: file:///path"));
            }
            let decoded = percent_decode(path);
            let mut key = normalize(&decoded);
            if decoded.ends_with('/') && !key.is_empty() {
                key.push('/');
            }
            return Ok(StoreUrl {
                scheme: Scheme::File,
                bucket: String::new(),
                key,
                http_base: None,
            });
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(bad("missing bucket (expected scheme://bucket/key)"));
        }
        let scheme =
            match scheme_l.as_str() {
                "s3" | "s3a" => Scheme::S3,
                "gs" | "gcs" => Scheme::Gcs,
                "az" | "azure" | "abfs" | "abfss" | "adl" => Scheme::Azure,
                "http" | "https" => Scheme::Http,
                "memory" | "mem" => Scheme::Memory,
                _ => return Err(bad(
                    "unsupported scheme (use s3://, gs://, az://, http(s)://, file://, memory://)",
                )),
            };
        // Azure abfs URLs carry the container before '@'.
        let bucket = match scheme {
            Scheme::Azure => authority.split('@').next().unwrap_or(authority).to_string(),
            _ => authority.to_string(),
        };
        let http_base = (scheme == Scheme::Http).then(|| format!("{scheme_l}://{authority}"));
        Ok(StoreUrl {
            scheme,
            bucket,
            key: percent_decode(path),
            http_base,
        })
    }

    /// The URL of `key` inside this URL's bucket, for messages and cache keys.
    pub fn object_url(&self, key: &str) -> String {
        match self.scheme {
            Scheme::S3 => format!("s3://{}/{key}", self.bucket),
            Scheme::Gcs => format!("gs://{}/{key}", self.bucket),
            Scheme::Azure => format!("az://{}/{key}", self.bucket),
            Scheme::Http => format!("{}/{key}", self.http_base.as_deref().unwrap_or("")),
            Scheme::File => format!("file:///{key}"),
            Scheme::Memory => format!("memory://{}/{key}", self.bucket),
        }
    }
}

fn normalize(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cloud_urls() {
        let u = StoreUrl::parse("s3://bkt/a/b/c.jpg").unwrap();
        assert_eq!(u.scheme, Scheme::S3);
        assert_eq!(u.bucket, "bkt");
        assert_eq!(u.key, "a/b/c.jpg");
        assert_eq!(u.object_url("x y"), "s3://bkt/x y");
        let u = StoreUrl::parse("s3://bkt").unwrap();
        assert_eq!(u.key, "");
        let u = StoreUrl::parse("gs://b/p/").unwrap();
        assert_eq!((u.scheme, u.key.as_str()), (Scheme::Gcs, "p/"));
        let u = StoreUrl::parse("abfss://cont@acct.dfs.core.windows.net/x").unwrap();
        assert_eq!((u.scheme, u.bucket.as_str()), (Scheme::Azure, "cont"));
        let u = StoreUrl::parse("https://host:8080/data/f").unwrap();
        assert_eq!(u.http_base.as_deref(), Some("https://host:8080"));
        assert_eq!(u.key, "data/f");
    }

    #[test]
    fn parses_paths() {
        let u = StoreUrl::parse("/tmp/x/y").unwrap();
        assert_eq!((u.scheme, u.key.as_str()), (Scheme::File, "tmp/x/y"));
        let u = StoreUrl::parse("file:///tmp/a%20b/").unwrap();
        assert_eq!(u.key, "tmp/a b/");
    }

    #[test]
    fn rejects_bad_urls() {
        assert!(StoreUrl::parse("ftp://x/y").is_err());
        assert!(StoreUrl::parse("s3:///key").is_err());
        assert!(StoreUrl::parse("file://relative").is_err());
        assert!(StoreUrl::parse("").is_err());
    }
}
