//! `stoker demo`: the whole read path on an embedded default, no server to set up.
//!
//! Generates a dataset (many ~110 KB "images" in class directories and one large blob) in a
//! local directory, serves it over S3 from an embedded test server on loopback that adds
//! object-store-like latency to every request, and reads it back through the engine: an
//! ImageFolder pipeline (shuffled every epoch, labelled, batched) for two epochs, the first
//! cold and the second from the cache, and the large object as parallel ranged reads.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use stoker_store::{Store, StoreOptions};
use stoker_testserver::{ServerOptions, TestServer};

use crate::args::DemoArgs;
use crate::bench::{cpu_seconds, measure, progress_bar, targets, EpochReport};

const BUCKET: &str = "demo";

#[derive(Debug, Serialize)]
struct DemoReport {
    endpoint: String,
    latency_ms: u64,
    small_objects: usize,
    small_epochs: Vec<EpochReport>,
    pipeline_stages: Vec<stoker_pipeline::StageStats>,
    large_bytes: u64,
    large: EpochReport,
    requests: u64,
    cache_hits: u64,
    cpu_seconds: f64,
}

fn generate(root: &Path, a: &DemoArgs) -> anyhow::Result<()> {
    let bucket = root.join(BUCKET);
    let marker = bucket.join(format!(
        ".generated-{}-{}-{}",
        a.objects,
        a.object_size.bytes(),
        a.large_size.bytes()
    ));
    if marker.exists() {
        return Ok(());
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let base = a.object_size.bytes().max(1);
    for i in 0..a.objects {
        let dir = bucket.join(format!("images/class_{:02}", i % 10));
        std::fs::create_dir_all(&dir)?;
        // Sizes vary by +-10% around the mean, like real JPEGs.
        let size = (base as f64 * rng.random_range(0.9..1.1)) as usize;
        let mut data = vec![0u8; size.max(1)];
        rng.fill_bytes(&mut data);
        std::fs::write(dir.join(format!("img_{i:05}.jpg")), &data)?;
    }
    let large = bucket.join("large");
    std::fs::create_dir_all(&large)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(large.join("blob.bin"))?);
    let mut left = a.large_size.bytes();
    let mut chunk = vec![0u8; 1 << 20];
    while left > 0 {
        rng.fill_bytes(&mut chunk);
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    std::fs::write(marker, b"")?;
    Ok(())
}

pub async fn run(a: DemoArgs) -> anyhow::Result<()> {
    let tmp;
    let root = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    if !a.json {
        eprintln!(
            "generating {} objects of ~{} and one of {} in {}",
            a.objects,
            a.object_size,
            a.large_size,
            root.display()
        );
    }
    let gen_root = root.clone();
    let args_copy = DemoArgs {
        dir: None,
        json: a.json,
        ..a
    };
    let args_back =
        tokio::task::spawn_blocking(move || generate(&gen_root, &args_copy).map(|_| args_copy))
            .await??;
    let a = DemoArgs {
        dir: Some(root.clone()),
        ..args_back
    };
    let server = TestServer::start(
        ServerOptions::new()
            .root(&root)
            .latency(Duration::from_millis(a.latency_ms))
            .bucket(BUCKET),
    )
    .await
    .context("starting the embedded S3 server")?;
    if !a.json {
        eprintln!(
            "serving it over S3 at {} with {} ms added to every request",
            server.endpoint(),
            a.latency_ms
        );
    }
    let opts = StoreOptions::default()
        .with_endpoint(server.endpoint())
        .with_credentials(server.access_key(), server.secret_key())
        .with_region(server.region());
    let cpu0 = cpu_seconds();
    let popts = opts.clone();
    let (small_epochs, pipeline_stages, sm) =
        tokio::task::spawn_blocking(move || image_pipeline(popts)).await??;
    let pb = progress_bar(a.json);
    let large = Store::open(&format!("s3://{BUCKET}/large/blob.bin"), opts)?;
    let large_targets = targets(&large, None).await?;
    let large_report = measure(&large, &large_targets, 1, &pb).await?.remove(0);
    let lm = large.metrics();
    let report = DemoReport {
        endpoint: server.endpoint(),
        latency_ms: a.latency_ms,
        small_objects: small_epochs.first().map_or(0, |e| e.objects as usize),
        small_epochs,
        pipeline_stages,
        large_bytes: large_report.bytes,
        large: large_report,
        requests: sm.http_requests + lm.http_requests,
        cache_hits: sm.cache.hits + lm.cache.hits,
        cpu_seconds: cpu_seconds() - cpu0,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "stoker demo: {} ms per request, like object storage",
        a.latency_ms
    );
    for e in &report.small_epochs {
        println!(
            "  ImageFolder pipeline over {} objects, epoch {} ({}): {:>8.1} samples/s {:>8.1} MiB/s  ({:.2} s)",
            report.small_objects,
            e.epoch,
            if e.epoch == 1 {
                "cold"
            } else {
                "warm, from cache"
            },
            e.objects_per_s,
            e.mib_per_s,
            e.seconds
        );
    }
    println!(
        "  one {} object, parallel ranged reads:  {:>8.1} MiB/s  ({:.2} s)",
        stoker_core::ByteSize(report.large_bytes),
        report.large.mib_per_s,
        report.large.seconds
    );
    println!(
        "  {} HTTP requests, {} cache hits, client CPU {:.2} s",
        report.requests, report.cache_hits, report.cpu_seconds
    );
    println!("  pipeline stages (shuffled every epoch, labelled, batches of 64):");
    for st in &report.pipeline_stages {
        println!(
            "    {:<28} {:>8} items  busy {:>6.2} s  waiting {:>6.2} s",
            st.name, st.items_out, st.busy_s, st.wait_s
        );
    }
    drop(server);
    Ok(())
}

/// Two epochs of an ImageFolder pipeline over the generated images: shuffled, labelled,
/// batched. Returns each epoch's throughput, the stages, and the store's metrics.
fn image_pipeline(
    opts: StoreOptions,
) -> anyhow::Result<(
    Vec<EpochReport>,
    Vec<stoker_pipeline::StageStats>,
    stoker_store::MetricsSnapshot,
)> {
    use stoker_pipeline::{Builtin, FormatChoice, Pipeline};
    let p = Pipeline::from_url(
        &format!("s3://{BUCKET}/images/"),
        opts,
        FormatChoice::ImageFolder,
    )
    .shuffle_shards(true)
    .map(Builtin::Len {
        field: "jpg".into(),
        to: "bytes".into(),
    })
    .batch(64, false)
    .epochs(Some(2))
    .seed(42);
    let mut run = p.run()?;
    let mut epochs = Vec::new();
    let mut t = std::time::Instant::now();
    let (mut samples, mut bytes) = (0u64, 0u64);
    // Every object is one sample: an epoch is one sample per object.
    let per_epoch = run.shards() as u64;
    for item in run.by_ref() {
        let b = item?.into_batch().expect("batches");
        samples += b.len() as u64;
        if let Some(stoker_core::Value::Tensor(n)) = b.get("bytes") {
            bytes += n.to_vec::<i64>().unwrap_or_default().iter().sum::<i64>() as u64;
        }
        if samples == per_epoch {
            let seconds = t.elapsed().as_secs_f64();
            epochs.push(EpochReport::new(epochs.len() + 1, samples, bytes, seconds));
            samples = 0;
            bytes = 0;
            t = std::time::Instant::now();
        }
    }
    let st = run.stats();
    Ok((epochs, st.stages, st.storage.unwrap_or_default()))
}
