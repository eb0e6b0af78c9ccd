//! Building the `object_store` backend for a [`StoreUrl`].
//!
//! Every HTTP backend is given a metering connector (so each attempt on the wire is counted),
//! Stoker's retry budget, and timeouts from [`StoreOptions`]. For S3, a custom endpoint turns
//! on path-style addressing and, for `http://`, plain HTTP: the settings MinIO, Ceph and test
//! servers need, without the user having to know them.

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::memory::InMemory;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::error::{Error, Result};
use crate::location::{Scheme, StoreUrl};
use crate::metrics::{MeteredConnector, Metrics};
use crate::options::StoreOptions;

pub(crate) fn build(
    url: &StoreUrl,
    raw: &str,
    o: &StoreOptions,
    metrics: &Arc<Metrics>,
) -> Result<Arc<dyn ObjectStore>> {
    let open_err = |e: object_store::Error| Error::Open {
        url: raw.to_string(),
        source: Arc::new(e),
    };
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: std::time::Duration::from_millis(50),
            max_backoff: std::time::Duration::from_secs(10),
            base: 2.0,
        },
        max_retries: o.max_retries,
        retry_timeout: o.retry_timeout,
    };
    let endpoint = o
        .endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL_S3").ok())
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .filter(|e| !e.is_empty());
    let allow_http = o.allow_http.unwrap_or_else(|| {
        endpoint
            .as_deref()
            .map(|e| e.starts_with("http://"))
            .unwrap_or(false)
    });
    let client = ClientOptions::new()
        .with_allow_http(allow_http)
        .with_timeout(o.request_timeout)
        .with_connect_timeout(o.connect_timeout)
        .with_pool_idle_timeout(std::time::Duration::from_secs(30))
        .with_http1_only();
    let connector = || MeteredConnector {
        metrics: metrics.clone(),
    };
    let store: Arc<dyn ObjectStore> = match url.scheme {
        Scheme::S3 => {
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(&url.bucket)
                .with_retry(retry)
                .with_http_connector(connector());
            if let Some(ep) = &endpoint {
                b = b
                    .with_endpoint(ep)
                    .with_virtual_hosted_style_request(o.virtual_hosted_style.unwrap_or(false));
                if o.region.is_none() && std::env::var("AWS_REGION").is_err() {
                    b = b.with_region("us-east-1");
                }
            } else if let Some(v) = o.virtual_hosted_style {
                b = b.with_virtual_hosted_style_request(v);
            }
            if let Some(r) = &o.region {
                b = b.with_region(r);
            }
            if let Some(k) = &o.access_key_id {
                b = b.with_access_key_id(k);
            }
            if let Some(s) = &o.secret_access_key {
                b = b.with_secret_access_key(s);
            }
            if let Some(t) = &o.session_token {
                b = b.with_token(t);
            }
            if o.skip_signature {
                b = b.with_skip_signature(true);
            }
            for (k, v) in &o.extra {
                if let Ok(key) = k.parse::<AmazonS3ConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
            Arc::new(b.with_client_options(client).build().map_err(open_err)?)
        }
        Scheme::Gcs => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(&url.bucket)
                .with_retry(retry)
                .with_http_connector(connector())
                .with_client_options(client);
            for (k, v) in &o.extra {
                if let Ok(key) = k.parse::<GoogleConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
            Arc::new(b.build().map_err(open_err)?)
        }
        Scheme::Azure => {
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_container_name(&url.bucket)
                .with_retry(retry)
                .with_http_connector(connector())
                .with_client_options(client);
            for (k, v) in &o.extra {
                if let Ok(key) = k.parse::<AzureConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
            Arc::new(b.build().map_err(open_err)?)
        }
        Scheme::Http => {
            let base = url.http_base.clone().unwrap_or_default();
            Arc::new(
                HttpBuilder::new()
                    .with_url(base)
                    .with_retry(retry)
                    .with_http_connector(connector())
                    .with_client_options(client.with_allow_http(true))
                    .build()
                    .map_err(open_err)?,
            )
        }
        Scheme::File => crate::local::open(&url.key, o.follow_symlinks),
        Scheme::Memory => memory_store(&url.bucket),
    };
    Ok(store)
}

/// `memory://NAME` stores are process-wide: every open of the same name sees the same objects,
/// so a test can write through one `Store` and read through another.
fn memory_store(name: &str) -> Arc<dyn ObjectStore> {
    use parking_lot::Mutex;
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    let mut map = STORES.get_or_init(Default::default).lock();
    map.entry(name.to_string())
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone()
}
