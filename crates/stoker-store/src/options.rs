//! Options for opening a [`Store`](crate::Store). One struct, with the same keys accepted as
//! strings (`endpoint`, `part_size`, `metadata_ttl`, ...) by [`StoreOptions::set`], so the
//! CLI, Python and spec files all speak the same configuration language.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use stoker_core::ByteSize;

use crate::error::{Error, Result};

const MIB: u64 = 1 << 20;

/// What a secret shows in `Debug` output.
fn redacted(v: &Option<String>) -> Option<&'static str> {
    v.as_ref().map(|_| "<redacted>")
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let extra: Vec<(&str, &str)> = self
            .extra
            .iter()
            .map(|(k, _)| (k.as_str(), "<redacted>"))
            .collect();
        f.debug_struct("StoreOptions")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &redacted(&self.secret_access_key))
            .field("session_token", &redacted(&self.session_token))
            .field("allow_http", &self.allow_http)
            .field("virtual_hosted_style", &self.virtual_hosted_style)
            .field("skip_signature", &self.skip_signature)
            .field("part_size", &self.part_size)
            .field("max_concurrency", &self.max_concurrency)
            .field("fetch_concurrency", &self.fetch_concurrency)
            .field("read_ahead_initial", &self.read_ahead_initial)
            .field("read_ahead_max", &self.read_ahead_max)
            .field("memory_limit", &self.memory_limit)
            .field("cache_memory", &self.cache_memory)
            .field("cache_dir", &self.cache_dir)
            .field("cache_disk_bytes", &self.cache_disk_bytes)
            .field("metadata_ttl", &self.metadata_ttl)
            .field("max_retries", &self.max_retries)
            .field("retry_timeout", &self.retry_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("follow_symlinks", &self.follow_symlinks)
            .field("extra", &extra)
            .finish()
    }
}

/// How to reach a store and how hard to drive it.
///
/// Its `Debug` form names which credentials are set, never their values (nor the values of
/// `extra` options, which may be a backend's keys): options are printed in logs and panics.
#[derive(Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Custom S3 endpoint (MinIO, Ceph, a test server). `AWS_ENDPOINT_URL` also works.
    pub endpoint: Option<String>,
    /// Region (`AWS_REGION` also works); `us-east-1` when unset and a custom endpoint is used.
    pub region: Option<String>,
    /// Access key id (`AWS_ACCESS_KEY_ID` also works).
    pub access_key_id: Option<String>,
    /// Secret access key (`AWS_SECRET_ACCESS_KEY` also works).
    pub secret_access_key: Option<String>,
    /// Session token (`AWS_SESSION_TOKEN` also works).
    pub session_token: Option<String>,
    /// Allow plain `http://` endpoints. Defaults to true when the endpoint is `http://`.
    pub allow_http: Option<bool>,
    /// Virtual-hosted-style S3 requests (`bucket.host`); path style when false (the default
    /// with a custom endpoint, which is what MinIO/Ceph/test servers want).
    pub virtual_hosted_style: Option<bool>,
    /// Send unsigned requests (public buckets).
    pub skip_signature: bool,
    /// Size of one ranged GET, and of one cache block. Default 8 MiB.
    pub part_size: u64,
    /// Ranged GETs in flight for one large read. Default 16.
    pub max_concurrency: usize,
    /// Whole-object GETs in flight in [`Store::fetch_many`](crate::Store::fetch_many). Default 64.
    pub fetch_concurrency: usize,
    /// First read-ahead window of a sequential reader. Default 1 MiB.
    pub read_ahead_initial: u64,
    /// Largest read-ahead window of a sequential reader. Default 128 MiB.
    pub read_ahead_max: u64,
    /// The memory budget shared by the cache and all read-ahead; `None` = a quarter of RAM.
    pub memory_limit: Option<u64>,
    /// Memory the block cache may use; `None` = half the memory budget, or none for local
    /// files (the kernel's page cache holds them). Zero disables it.
    pub cache_memory: Option<u64>,
    /// Directory of the disk cache tier (survives restarts); none by default.
    pub cache_dir: Option<PathBuf>,
    /// Byte budget of the disk cache tier. Default 10 GiB.
    pub cache_disk_bytes: u64,
    /// How long listed/HEADed metadata is trusted before it is asked for again. Default 60 s.
    pub metadata_ttl: Duration,
    /// Attempts per request beyond the first (throttling, 5xx, resets, timeouts). Default 10.
    pub max_retries: usize,
    /// Give up retrying a request after this long. Default 180 s.
    pub retry_timeout: Duration,
    /// Per-request timeout. Default 60 s.
    pub request_timeout: Duration,
    /// Connection timeout. Default 5 s.
    pub connect_timeout: Duration,
    /// Local files: follow symbolic links that lead out of the root (the directory the
    /// store was opened on, or the prefix a listing lists). Off by default: such links are
    /// left out of listings and refused on open (`local.rs`); links inside the root always
    /// work.
    pub follow_symlinks: bool,
    /// Extra `object_store` configuration keys passed through unchanged (e.g. `aws_request_payer`).
    pub extra: Vec<(String, String)>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: None,
            virtual_hosted_style: None,
            skip_signature: false,
            part_size: 8 * MIB,
            max_concurrency: 16,
            fetch_concurrency: 64,
            read_ahead_initial: MIB,
            read_ahead_max: 128 * MIB,
            memory_limit: None,
            cache_memory: None,
            cache_dir: None,
            cache_disk_bytes: 10 * 1024 * MIB,
            metadata_ttl: Duration::from_secs(60),
            max_retries: 10,
            retry_timeout: Duration::from_secs(180),
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            follow_symlinks: false,
            extra: Vec::new(),
        }
    }
}

/// The string keys [`StoreOptions::set`] accepts, with a one-line description each.
pub const OPTION_KEYS: &[(&str, &str)] = &[
    ("endpoint", "custom S3 endpoint URL"),
    ("region", "region"),
    ("access_key_id", "access key id"),
    ("secret_access_key", "secret access key"),
    ("session_token", "session token"),
    ("allow_http", "allow http:// endpoints (true/false)"),
    (
        "virtual_hosted_style",
        "virtual-hosted-style requests (true/false)",
    ),
    ("skip_signature", "unsigned requests (true/false)"),
    (
        "part_size",
        "bytes per ranged GET and cache block, e.g. 8MiB",
    ),
    ("max_concurrency", "ranged GETs in flight per large read"),
    (
        "fetch_concurrency",
        "whole-object GETs in flight in fetch_many",
    ),
    ("read_ahead_initial", "first read-ahead window, e.g. 1MiB"),
    ("read_ahead_max", "largest read-ahead window, e.g. 128MiB"),
    (
        "memory_limit",
        "memory budget for cache and read-ahead, e.g. 4GiB",
    ),
    (
        "cache_memory",
        "memory for the block cache, e.g. 2GiB (0 disables)",
    ),
    ("cache_dir", "directory of the disk cache"),
    ("cache_disk_bytes", "disk cache budget, e.g. 50GiB"),
    ("metadata_ttl", "seconds metadata is trusted"),
    ("max_retries", "retries per request"),
    ("retry_timeout", "seconds before retrying stops"),
    ("request_timeout", "seconds per request"),
    ("connect_timeout", "seconds to connect"),
    (
        "follow_symlinks",
        "local files: follow symbolic links out of the root (true/false)",
    ),
];

impl StoreOptions {
    /// Sets one option from its string form. Keys are those of [`OPTION_KEYS`]; a key that
    /// starts with `aws_`, `google_` or `azure_` is passed to `object_store` unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |reason: String| Error::InvalidOption {
            key: key.to_string(),
            value: value.to_string(),
            reason,
        };
        let size = || {
            value
                .parse::<ByteSize>()
                .map(|s| s.bytes())
                .map_err(|e| bad(e.to_string()))
        };
        let count = || {
            value
                .parse::<usize>()
                .map_err(|e| bad(format!("expected a whole number: {e}")))
        };
        let secs = || {
            value
                .trim_end_matches('s')
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| bad("expected seconds, e.g. 60 or 0.5".into()))
        };
        let flag = || match value.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(bad("expected true or false".into())),
        };
        let norm = key.to_ascii_lowercase().replace('-', "_");
        match norm.as_str() {
            "endpoint" | "endpoint_url" => self.endpoint = Some(value.to_string()),
            "region" => self.region = Some(value.to_string()),
            "access_key_id" => self.access_key_id = Some(value.to_string()),
            "secret_access_key" => self.secret_access_key = Some(value.to_string()),
            "session_token" => self.session_token = Some(value.to_string()),
            "allow_http" => self.allow_http = Some(flag()?),
            "virtual_hosted_style" => self.virtual_hosted_style = Some(flag()?),
            "skip_signature" => self.skip_signature = flag()?,
            "part_size" => {
                let v = size()?;
                if v == 0 {
                    return Err(bad("must be positive".into()));
                }
                self.part_size = v
            }
            "max_concurrency" => self.max_concurrency = count()?.max(1),
            "fetch_concurrency" => self.fetch_concurrency = count()?.max(1),
            "read_ahead_initial" => self.read_ahead_initial = size()?.max(1),
            "read_ahead_max" => self.read_ahead_max = size()?.max(1),
            "memory_limit" => self.memory_limit = Some(size()?),
            "cache_memory" => self.cache_memory = Some(size()?),
            "cache_dir" => self.cache_dir = Some(PathBuf::from(value)),
            "cache_disk_bytes" => self.cache_disk_bytes = size()?,
            "metadata_ttl" => self.metadata_ttl = secs()?,
            "max_retries" => self.max_retries = count()?,
            "retry_timeout" => self.retry_timeout = secs()?,
            "request_timeout" => self.request_timeout = secs()?,
            "connect_timeout" => self.connect_timeout = secs()?,
            "follow_symlinks" => self.follow_symlinks = flag()?,
            k if k.starts_with("aws_") || k.starts_with("google_") || k.starts_with("azure_") => {
                self.extra.push((k.to_string(), value.to_string()))
            }
            _ => {
                let known: Vec<&str> = OPTION_KEYS.iter().map(|(k, _)| *k).collect();
                return Err(bad(format!("unknown option; known: {}", known.join(", "))));
            }
        }
        Ok(())
    }

    /// Builds options from `key=value` pairs (see [`StoreOptions::set`]).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self> {
        let mut o = StoreOptions::default();
        for (k, v) in pairs {
            o.set(k, v)?;
        }
        Ok(o)
    }

    /// Sets the custom endpoint.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sets static credentials.
    pub fn with_credentials(
        mut self,
        key_id: impl Into<String>,
        secret: impl Into<String>,
    ) -> Self {
        self.access_key_id = Some(key_id.into());
        self.secret_access_key = Some(secret.into());
        self
    }

    /// Sets the region.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sets the part (ranged GET and cache block) size.
    pub fn with_part_size(mut self, bytes: u64) -> Self {
        self.part_size = bytes.max(1);
        self
    }

    /// Sets the number of ranged GETs in flight per large read.
    pub fn with_max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n.max(1);
        self
    }

    /// Sets the number of whole-object GETs in flight in `fetch_many`.
    pub fn with_fetch_concurrency(mut self, n: usize) -> Self {
        self.fetch_concurrency = n.max(1);
        self
    }

    /// Sets the shared memory budget.
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Sets the memory cache size (0 disables caching in memory).
    pub fn with_cache_memory(mut self, bytes: u64) -> Self {
        self.cache_memory = Some(bytes);
        self
    }

    /// Enables the disk cache tier.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>, bytes: u64) -> Self {
        self.cache_dir = Some(dir.into());
        self.cache_disk_bytes = bytes;
        self
    }

    /// Sets the metadata TTL.
    pub fn with_metadata_ttl(mut self, ttl: Duration) -> Self {
        self.metadata_ttl = ttl;
        self
    }

    /// Sets the retry budget.
    pub fn with_retries(mut self, max_retries: usize, retry_timeout: Duration) -> Self {
        self.max_retries = max_retries;
        self.retry_timeout = retry_timeout;
        self
    }

    /// Sets the per-request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets whether local symbolic links out of the root are followed.
    pub fn with_follow_symlinks(mut self, follow: bool) -> Self {
        self.follow_symlinks = follow;
        self
    }

    /// Sets the read-ahead window bounds.
    pub fn with_read_ahead(mut self, initial: u64, max: u64) -> Self {
        self.read_ahead_initial = initial.max(1);
        self.read_ahead_max = max.max(initial.max(1));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_a_secret() {
        let mut o = StoreOptions::default().with_credentials("AKIDPUBLIC", "s3cr3t-value");
        o.session_token = Some("t0ken-value".into());
        o.extra
            .push(("azure_storage_account_key".into(), "azur3-key".into()));
        let text = format!("{o:?} {o:#?}");
        for secret in ["s3cr3t-value", "t0ken-value", "azur3-key"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(
            text.contains("AKIDPUBLIC") && text.contains("<redacted>"),
            "{text}"
        );
        assert!(text.contains("azure_storage_account_key"), "{text}");
    }

    #[test]
    fn string_keys_set_fields() {
        let o = StoreOptions::from_pairs([
            ("endpoint", "http://127.0.0.1:9000"),
            ("part-size", "4MiB"),
            ("metadata_ttl", "2.5"),
            ("allow_http", "true"),
            ("aws_request_payer", "true"),
        ])
        .unwrap();
        assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(o.part_size, 4 << 20);
        assert_eq!(o.metadata_ttl, Duration::from_millis(2500));
        assert_eq!(o.allow_http, Some(true));
        assert_eq!(o.extra.len(), 1);
    }

    #[test]
    fn bad_values_are_named() {
        let e = StoreOptions::from_pairs([("part_size", "huge")]).unwrap_err();
        assert!(e.to_string().contains("part_size"), "{e}");
        let e = StoreOptions::from_pairs([("colour", "blue")]).unwrap_err();
        assert!(e.to_string().contains("unknown option"), "{e}");
    }
}
