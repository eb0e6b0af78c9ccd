//! `stoker demo`: the main job on an embedded default, no server to set up.
//!
//! Generates an ImageNet-like dataset (real JPEGs of photograph-like content, 300-500 px on
//! the short side, about 110 KB each, in class directories) and one large object, serves it
//! over S3 from an embedded server on loopback that adds object-store latency to every
//! request, then:
//!
//! 1. runs the ImageNet training pipeline (decode, RandomResizedCrop 224, horizontal flip,
//!    normalize to float32 CHW, batches of 64) through the engine for two shuffled epochs
//!    (the optimizer keeps the decoded images for the second when they fit in the budget);
//! 2. runs a naive loader over the same objects in the same run: per image one GET, then a
//!    full decode and the same transforms, in a thread pool as large as the engine's (what a
//!    `DataLoader` with one worker per core does), with no cache, for the same epochs;
//! 3. reads the large object as parallel ranged GETs (the storage engine alone).
//!
//! Each loader runs in a child process of its own (this binary, `demo --loader NAME`, told
//! the server's address and keys through the environment), so that the peak resident set
//! each reports is its own: neither the generator, nor the server, nor the other loader's
//! freed memory counts. It prints images/s (over the whole run and over the cold first
//! epoch), time to the first batch, bytes fetched, peak memory and the ratio.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use stoker_ops::image as ops;
use stoker_store::{Store, StoreOptions};
use stoker_testserver::{ServerOptions, TestServer};

use crate::args::DemoArgs;
use crate::bench::{cpu_seconds, measure, progress_bar, targets, EpochReport};
use crate::run::peak_rss_bytes;

const BUCKET: &str = "demo";
const BATCH: usize = 64;
const CLASSES: usize = 10;
const QUALITY: u8 = 90;

/// What `stoker demo --json` prints.
#[derive(Debug, Serialize)]
struct DemoReport {
    endpoint: String,
    latency_ms: u64,
    threads: usize,
    dataset: Dataset,
    pipeline: PipelineReport,
    baseline: BaselineReport,
    /// Pipeline images/s over the naive loader's, over every epoch.
    ratio: f64,
    /// The same over the first epoch alone (both cold: nothing cached yet).
    first_epoch_ratio: f64,
    storage: StorageReport,
    /// CPU seconds of the whole run (generation, server, both loaders).
    cpu_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Dataset {
    images: usize,
    classes: usize,
    bytes: u64,
    mean_bytes: u64,
    short_side_min: usize,
    short_side_max: usize,
    jpeg_quality: u8,
}

/// What `--profile` adds to the pipeline's report.
#[derive(Debug, Serialize, Deserialize)]
struct ProfileNote {
    /// The directory with report.html, profile.json and trace.json.
    dir: PathBuf,
    input_bound: bool,
    bottleneck: String,
    cause: String,
    summary: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct PipelineReport {
    /// The pipeline, as `stoker run` takes it.
    spec: String,
    epochs: u64,
    /// Images delivered, every epoch (each decoded in the first; later epochs start from the
    /// optimizer's sample cache of decoded images when the budget holds them).
    images: u64,
    batches: u64,
    seconds: f64,
    images_per_s: f64,
    /// From the start (listing included) to the first batch.
    first_batch_s: f64,
    /// Seconds per epoch (the first cold, the later ones from the cache).
    epoch_seconds: Vec<f64>,
    bytes_fetched: u64,
    requests: u64,
    /// Objects the store's block cache served (instead of the server).
    cache_hits: u64,
    /// Samples that started from the optimizer's cache of decoded images (their objects
    /// were neither fetched nor decoded again).
    #[serde(default)]
    decoded_cache_hits: u64,
    /// The peak resident set of the pipeline's process (the loader alone).
    peak_rss_bytes: u64,
    memory_limit_bytes: u64,
    memory_peak_bytes: u64,
    /// The profiler's verdict and where its report went, with `--profile`.
    #[serde(default)]
    profile: Option<ProfileNote>,
    /// The pipeline's stages, as `stoker run --json` reports them.
    stages: Vec<serde_json::Value>,
    cpu_seconds: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct BaselineReport {
    what: String,
    threads: usize,
    epochs: u64,
    images: u64,
    seconds: f64,
    images_per_s: f64,
    /// From the start (listing included) to the 64th image (a batch).
    first_batch_s: f64,
    epoch_seconds: Vec<f64>,
    bytes_fetched: u64,
    requests: u64,
    /// The peak resident set of the naive loader's process.
    peak_rss_bytes: u64,
    cpu_seconds: f64,
}

#[derive(Debug, Serialize)]
struct StorageReport {
    bytes: u64,
    seconds: f64,
    mib_per_s: f64,
    requests: u64,
}

/// A photograph-like RGB image: smooth large-scale colour fields (sky, ground, walls), a
/// few objects with their own shading and hard edges, mid-frequency texture and sensor
/// noise. Random bytes are not images; flat synthetic ones compress to almost nothing. This
/// lands where ImageNet's JPEGs do (about 4-5 bits per pixel at quality 90).
fn synth_image(rng: &mut impl Rng, w: usize, h: usize) -> Vec<u8> {
    // The colour field: a coarse grid of random colours, bilinearly interpolated.
    const G: usize = 5;
    // The texture's cell, in pixels.
    const TEX: usize = 4;
    let grid: Vec<[f32; 3]> = (0..G * G)
        .map(|_| [0, 1, 2].map(|_| rng.random_range(20.0..235.0f32)))
        .collect();
    // Texture: a finer value-noise grid.
    let tw = w / TEX + 2;
    let th = h / TEX + 2;
    let tex: Vec<f32> = (0..tw * th)
        .map(|_| rng.random_range(-36.0..36.0))
        .collect();
    // Objects: ellipses with a colour and a shading direction.
    let objects: Vec<(f32, f32, f32, f32, [f32; 3], f32)> = (0..rng.random_range(2..6))
        .map(|_| {
            (
                rng.random_range(0.0..w as f32),
                rng.random_range(0.0..h as f32),
                rng.random_range(w as f32 * 0.08..w as f32 * 0.35),
                rng.random_range(h as f32 * 0.08..h as f32 * 0.35),
                [0, 1, 2].map(|_| rng.random_range(10.0..245.0f32)),
                rng.random_range(-0.4..0.4f32),
            )
        })
        .collect();
    let noise = rng.random_range(22.0..36.0f32);
    let mut out = vec![0u8; w * h * 3];
    let lerp = |a: f32, b: f32, t: f32| a + (b - a) * t;
    for y in 0..h {
        let gy = y as f32 / h as f32 * (G - 1) as f32;
        let (y0, fy) = (gy as usize, gy.fract());
        let y1 = (y0 + 1).min(G - 1);
        let ty = y as f32 / TEX as f32;
        let (ty0, fty) = (ty as usize, ty.fract());
        for x in 0..w {
            let gx = x as f32 / w as f32 * (G - 1) as f32;
            let (x0, fx) = (gx as usize, gx.fract());
            let x1 = (x0 + 1).min(G - 1);
            let tx = x as f32 / TEX as f32;
            let (tx0, ftx) = (tx as usize, tx.fract());
            let t = lerp(
                lerp(tex[ty0 * tw + tx0], tex[ty0 * tw + tx0 + 1], ftx),
                lerp(
                    tex[(ty0 + 1) * tw + tx0],
                    tex[(ty0 + 1) * tw + tx0 + 1],
                    ftx,
                ),
                fty,
            );
            let mut px = [0f32; 3];
            for (c, p) in px.iter_mut().enumerate() {
                *p = lerp(
                    lerp(grid[y0 * G + x0][c], grid[y0 * G + x1][c], fx),
                    lerp(grid[y1 * G + x0][c], grid[y1 * G + x1][c], fx),
                    fy,
                );
            }
            for &(cx, cy, rx, ry, col, shade) in &objects {
                let (dx, dy) = ((x as f32 - cx) / rx, (y as f32 - cy) / ry);
                if dx * dx + dy * dy <= 1.0 {
                    let s = 1.0 + shade * (dx + dy);
                    px = col.map(|v| v * s);
                }
            }
            let o = (y * w + x) * 3;
            for c in 0..3 {
                let n = (rng.random::<f32>() - 0.5) * 2.0 * noise;
                out[o + c] = (px[c] + t + n).clamp(0.0, 255.0) as u8;
            }
        }
    }
    out
}

/// Writes the images (in parallel) and the large object under `root/BUCKET`, unless a
/// previous run with the same parameters left them there.
fn generate(root: &Path, a: &DemoArgs, threads: usize) -> anyhow::Result<Dataset> {
    let bucket = root.join(BUCKET);
    let marker = bucket.join(format!(
        ".generated-v2-{}-{}",
        a.images,
        a.large_size.bytes()
    ));
    let images = bucket.join("images");
    if let Ok(text) = std::fs::read_to_string(&marker) {
        if let Ok(d) = serde_json::from_str::<DatasetOnDisk>(&text) {
            return Ok(d.into());
        }
    }
    // Sizes first, from one seed, so the dataset does not depend on the thread count.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let dims: Vec<(usize, usize, u64)> = (0..a.images)
        .map(|_| {
            let short = rng.random_range(300..=500usize);
            let long = (short as f64 * rng.random_range(1.0..1.5)) as usize;
            let seed = rng.random::<u64>();
            // Most photographs are landscape.
            if rng.random_bool(0.7) {
                (long, short, seed)
            } else {
                (short, long, seed)
            }
        })
        .collect();
    for c in 0..CLASSES {
        std::fs::create_dir_all(images.join(format!("class_{c:02}")))?;
    }
    let next = AtomicUsize::new(0);
    let total = AtomicU64::new(0);
    let err = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(w, h, seed)) = dims.get(i) else {
                    return;
                };
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let px = synth_image(&mut rng, w, h);
                let r = ops::encode_jpeg(&px, w, h, QUALITY)
                    .map_err(anyhow::Error::from)
                    .and_then(|jpg| {
                        let path = images
                            .join(format!("class_{:02}", i % CLASSES))
                            .join(format!("img_{i:05}.jpg"));
                        std::fs::write(&path, &jpg)
                            .with_context(|| format!("writing {}", path.display()))?;
                        Ok(jpg.len() as u64)
                    });
                match r {
                    Ok(n) => {
                        total.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        *err.lock().unwrap() = Some(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = err.into_inner().unwrap() {
        return Err(e);
    }
    let large = bucket.join("large");
    std::fs::create_dir_all(&large)?;
    write_large(&large.join("blob.bin"), a.large_size.bytes())?;
    let bytes = total.into_inner();
    let d = DatasetOnDisk {
        images: a.images,
        bytes,
        short_side_min: dims.iter().map(|d| d.0.min(d.1)).min().unwrap_or(0),
        short_side_max: dims.iter().map(|d| d.0.min(d.1)).max().unwrap_or(0),
    };
    std::fs::write(marker, serde_json::to_string(&d)?)?;
    Ok(d.into())
}

#[derive(Serialize, serde::Deserialize)]
struct DatasetOnDisk {
    images: usize,
    bytes: u64,
    short_side_min: usize,
    short_side_max: usize,
}

impl From<DatasetOnDisk> for Dataset {
    fn from(d: DatasetOnDisk) -> Dataset {
        Dataset {
            images: d.images,
            classes: CLASSES,
            bytes: d.bytes,
            mean_bytes: d.bytes / d.images.max(1) as u64,
            short_side_min: d.short_side_min,
            short_side_max: d.short_side_max,
            jpeg_quality: QUALITY,
        }
    }
}

fn write_large(path: &Path, size: u64) -> anyhow::Result<()> {
    use rand::RngCore;
    use std::io::Write;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut left = size;
    let mut chunk = vec![0u8; 1 << 20];
    while left > 0 {
        rng.fill_bytes(&mut chunk);
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// The ImageNet training pipeline over the demo's images, as a `stoker run` spec.
fn pipeline_spec(epochs: u64, threads: usize) -> String {
    format!(
        r#"source = "s3://{BUCKET}/images/"
format = "imagefolder"
seed = 42
epochs = {epochs}
shuffle_shards = true

[[ops]]
op = "decode_image"
field = "jpg"
[[ops]]
op = "random_resized_crop"
field = "jpg"
size = [224, 224]
[[ops]]
op = "random_flip"
field = "jpg"
[[ops]]
op = "image_to_tensor"
field = "jpg"
normalize = "imagenet"
[[ops]]
op = "batch"
size = {BATCH}

[options]
threads = {threads}
"#
    )
}

fn images_bar(hidden: bool, total: u64, what: &str) -> ProgressBar {
    if hidden || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>9} [{elapsed_precise}] {wide_bar} {pos}/{len} images {per_sec}",
        )
        .expect("valid template"),
    );
    pb.set_prefix(what.to_string());
    pb
}

fn run_pipeline(
    opts: StoreOptions,
    epochs: u64,
    threads: usize,
    total: u64,
    quiet: bool,
    profile: Option<PathBuf>,
) -> anyhow::Result<PipelineReport> {
    let spec = pipeline_spec(epochs, threads);
    let parsed: stoker_pipeline::PipelineSpec =
        toml::from_str(&spec).context("the demo's pipeline spec")?;
    let p = parsed.build(opts)?;
    let pb = images_bar(quiet, total, "pipeline");
    if profile.is_some() {
        stoker_core::trace::start();
    }
    let t0 = Instant::now();
    let mut run = p.run()?;
    let per_epoch = run.shards() as u64;
    let (mut images, mut batches, mut in_epoch) = (0u64, 0u64, 0u64);
    let mut first_batch_s = None;
    let mut epoch_seconds = Vec::new();
    let mut te = t0;
    for item in run.by_ref() {
        let b = item?.into_batch().context("the pipeline yields batches")?;
        first_batch_s.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        let n = b.len() as u64;
        images += n;
        in_epoch += n;
        batches += 1;
        pb.inc(n);
        if in_epoch >= per_epoch {
            epoch_seconds.push(te.elapsed().as_secs_f64());
            te = Instant::now();
            in_epoch -= per_epoch;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let peak_rss = peak_rss_bytes();
    let st = run.stats();
    let m = st.storage.clone().unwrap_or_default();
    let profile = match profile {
        Some(dir) => {
            let prof = run.profile();
            let (spans, _) = stoker_core::trace::stop();
            prof.write(&dir, &spans)
                .with_context(|| format!("writing the profile into {}", dir.display()))?;
            let v = prof.verdict;
            Some(ProfileNote {
                dir,
                input_bound: v.input_bound,
                bottleneck: v.bottleneck,
                cause: v.cause.as_str().into(),
                summary: v.summary,
            })
        }
        None => None,
    };
    Ok(PipelineReport {
        profile,
        spec,
        epochs,
        images,
        batches,
        seconds,
        images_per_s: images as f64 / seconds,
        first_batch_s: first_batch_s.unwrap_or(seconds),
        epoch_seconds,
        bytes_fetched: m.bytes_read,
        requests: m.http_requests,
        cache_hits: m.cache.hits,
        decoded_cache_hits: st.sample_cache.as_ref().map_or(0, |c| c.hits),
        peak_rss_bytes: peak_rss,
        memory_limit_bytes: st.memory.limit,
        memory_peak_bytes: st.memory.peak,
        stages: st
            .stages
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?,
        cpu_seconds: cpu_seconds(),
    })
}

/// The naive loader: list, then per image one GET and a full decode followed by the same
/// transforms, one image at a time in each of `threads` threads; no cache (a fresh store,
/// with no cache memory, every epoch), no batching.
fn run_baseline(
    opts: StoreOptions,
    rt: tokio::runtime::Handle,
    epochs: u64,
    threads: usize,
    total: u64,
    quiet: bool,
) -> anyhow::Result<BaselineReport> {
    let pb = images_bar(quiet, total, "naive");
    let t0 = Instant::now();
    let mut epoch_seconds = Vec::new();
    let images = AtomicU64::new(0);
    let (mut bytes, mut requests) = (0u64, 0u64);
    let mut first_batch_s = None;
    let rrc = ops::RandomResizedCrop::new(224, 224);
    let flip = ops::RandomFlip::horizontal();
    let to_tensor = ops::ToTensor::imagenet();
    let decode = ops::DecodeImage::default();
    for epoch in 0..epochs {
        let te = Instant::now();
        let store = Store::open(
            &format!("s3://{BUCKET}/images/"),
            opts.clone().with_cache_memory(0),
        )?;
        let mut keys: Vec<String> = rt
            .block_on(store.list_all(store.url_key(), &stoker_store::ListOptions::default()))?
            .into_iter()
            .map(|o| o.key)
            .collect();
        keys.sort();
        keys.shuffle(&mut rand::rngs::StdRng::seed_from_u64(epoch));
        let next = AtomicUsize::new(0);
        let failed = std::sync::Mutex::new(None::<anyhow::Error>);
        let first = std::sync::Mutex::new(None::<f64>);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (store, rt, keys, next, failed, images, pb, first) =
                    (&store, &rt, &keys, &next, &failed, &images, &pb, &first);
                let (rrc, flip, to_tensor, decode) = (&rrc, &flip, &to_tensor, &decode);
                s.spawn(move || {
                    let mut rng = stoker_core::rng::Rng::from_words(&[epoch, t as u64]);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(key) = keys.get(i) else { return };
                        let r = rt
                            .block_on(store.get(key))
                            .map_err(anyhow::Error::from)
                            .and_then(|data: bytes::Bytes| {
                                let img = ops::decode_image(&data, decode)?;
                                let img = rrc.apply(&img, &mut rng)?;
                                let img = flip.apply(&img, &mut rng)?;
                                Ok(to_tensor.apply(&img)?)
                            });
                        match r {
                            Ok(t) => {
                                drop(t);
                                let n = images.fetch_add(1, Ordering::Relaxed) + 1;
                                if n == BATCH as u64 {
                                    *first.lock().unwrap() = Some(t0.elapsed().as_secs_f64());
                                }
                                pb.inc(1);
                            }
                            Err(e) => {
                                *failed.lock().unwrap() =
                                    Some(e.context(format!("naive loader: {key}")));
                                next.store(usize::MAX / 2, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap() {
            return Err(e);
        }
        if first_batch_s.is_none() {
            first_batch_s = first.into_inner().unwrap();
        }
        let m = store.metrics();
        bytes += m.bytes_read;
        requests += m.http_requests;
        epoch_seconds.push(te.elapsed().as_secs_f64());
    }
    let seconds = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let images = images.into_inner();
    Ok(BaselineReport {
        what: format!(
            "per image one GET, a full decode, RandomResizedCrop 224, flip and normalize, \
             in {threads} threads, no cache"
        ),
        threads,
        epochs,
        images,
        seconds,
        images_per_s: images as f64 / seconds,
        first_batch_s: first_batch_s.unwrap_or(seconds),
        epoch_seconds,
        bytes_fetched: bytes,
        requests,
        peak_rss_bytes: peak_rss_bytes(),
        cpu_seconds: cpu_seconds(),
    })
}

/// Where a loader's process finds the server (set by the parent for `demo --loader`).
const ENV_ENDPOINT: &str = "STOKER_DEMO_ENDPOINT";
const ENV_ACCESS_KEY: &str = "STOKER_DEMO_ACCESS_KEY";
const ENV_SECRET_KEY: &str = "STOKER_DEMO_SECRET_KEY";
const ENV_REGION: &str = "STOKER_DEMO_REGION";

/// Runs one loader in a process of its own and returns the report it prints.
async fn loader_process<T: serde::de::DeserializeOwned + Send + 'static>(
    name: &'static str,
    a: &DemoArgs,
    threads: usize,
    server: &TestServer,
) -> anyhow::Result<T> {
    let exe = std::env::current_exe().context("finding this program to run a loader")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("demo")
        .args(["--loader", name])
        .args(["--images", &a.images.to_string()])
        .args(["--epochs", &a.epochs.to_string()])
        .args(["--threads", &threads.to_string()])
        .env(ENV_ENDPOINT, server.endpoint())
        .env(ENV_ACCESS_KEY, server.access_key())
        .env(ENV_SECRET_KEY, server.secret_key())
        .env(ENV_REGION, server.region())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    if a.json {
        cmd.arg("--json");
    }
    if let (Some(dir), "pipeline") = (&a.profile, name) {
        cmd.arg("--profile").arg(dir);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await?
        .with_context(|| format!("starting the {name} loader's process"))?;
    anyhow::ensure!(
        out.status.success(),
        "the {name} loader's process failed ({}); its error is above",
        out.status
    );
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading the {name} loader's report"))
}

/// `demo --loader NAME`: one loader against the parent's server, its report on stdout.
async fn loader_main(name: &str, a: &DemoArgs) -> anyhow::Result<()> {
    let env = |k: &str| {
        std::env::var(k).with_context(|| format!("`demo --loader` is run by `stoker demo` ({k})"))
    };
    let opts = StoreOptions::default()
        .with_endpoint(env(ENV_ENDPOINT)?)
        .with_credentials(env(ENV_ACCESS_KEY)?, env(ENV_SECRET_KEY)?)
        .with_region(env(ENV_REGION)?);
    let threads = a.threads.unwrap_or(1);
    let (epochs, quiet) = (a.epochs, a.json);
    let total = a.images as u64 * epochs;
    let profile = a.profile.clone();
    let json = match name {
        "pipeline" => {
            let r = tokio::task::spawn_blocking(move || {
                run_pipeline(opts, epochs, threads, total, quiet, profile)
            })
            .await??;
            serde_json::to_string(&r)?
        }
        "naive" => {
            let rt = tokio::runtime::Handle::current();
            let r = tokio::task::spawn_blocking(move || {
                run_baseline(opts, rt, epochs, threads, total, quiet)
            })
            .await??;
            serde_json::to_string(&r)?
        }
        other => anyhow::bail!("no demo loader named {other:?} (pipeline, naive)"),
    };
    println!("{json}");
    Ok(())
}

pub async fn run(a: DemoArgs) -> anyhow::Result<()> {
    if let Some(name) = &a.loader {
        return loader_main(name, &a).await;
    }
    let tmp;
    let root: PathBuf = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let quiet = a.json;
    let say = |s: String| {
        if !quiet {
            eprintln!("{s}");
        }
    };
    say(format!(
        "generating {} JPEGs (photograph-like, 300-500 px short side, quality {QUALITY}) and \
         one object of {} in {}",
        a.images,
        a.large_size,
        root.display()
    ));
    let t_gen = Instant::now();
    let dataset = {
        let (root, a) = (root.clone(), a.clone());
        tokio::task::spawn_blocking(move || generate(&root, &a, threads)).await??
    };
    say(format!(
        "  {} images, {:.1} MiB, {:.0} KB each on average ({:.1} s)",
        dataset.images,
        dataset.bytes as f64 / (1 << 20) as f64,
        dataset.mean_bytes as f64 / 1e3,
        t_gen.elapsed().as_secs_f64()
    ));
    let server = TestServer::start(
        ServerOptions::new()
            .root(&root)
            .latency(Duration::from_millis(a.latency_ms))
            .bucket(BUCKET),
    )
    .await
    .context("starting the embedded S3 server")?;
    say(format!(
        "serving them over S3 at {} with {} ms added to every request, like object storage",
        server.endpoint(),
        a.latency_ms
    ));
    let opts = StoreOptions::default()
        .with_endpoint(server.endpoint())
        .with_credentials(server.access_key(), server.secret_key())
        .with_region(server.region());
    let cpu0 = cpu_seconds();

    say(format!(
        "\nthe ImageNet training pipeline through Stoker: decode, RandomResizedCrop 224, flip, \
         normalize, batches of {BATCH}; {} epochs, {threads} threads",
        a.epochs
    ));
    let pipeline: PipelineReport = loader_process("pipeline", &a, threads, &server).await?;
    say(format!(
        "the same work by a naive loader: one GET then a full decode per image, {threads} \
         threads, no cache"
    ));
    let baseline: BaselineReport = loader_process("naive", &a, threads, &server).await?;

    let pb = progress_bar(a.json);
    let large = Store::open(&format!("s3://{BUCKET}/large/blob.bin"), opts)?;
    let large_targets = targets(&large, None).await?;
    let lr: EpochReport = measure(&large, &large_targets, 1, &pb).await?.remove(0);
    let storage = StorageReport {
        bytes: lr.bytes,
        seconds: lr.seconds,
        mib_per_s: lr.mib_per_s,
        requests: large.metrics().http_requests,
    };
    let report = DemoReport {
        endpoint: server.endpoint(),
        latency_ms: a.latency_ms,
        threads,
        ratio: pipeline.images_per_s / baseline.images_per_s.max(f64::MIN_POSITIVE),
        first_epoch_ratio: match (
            pipeline.epoch_seconds.first(),
            baseline.epoch_seconds.first(),
        ) {
            (Some(p), Some(b)) => b / p.max(f64::MIN_POSITIVE),
            _ => 0.0,
        },
        cpu_seconds: cpu_seconds() - cpu0 + pipeline.cpu_seconds + baseline.cpu_seconds,
        dataset,
        pipeline,
        baseline,
        storage,
    };
    drop(server);
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_report(&report);
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn print_report(r: &DemoReport) {
    let (p, b) = (&r.pipeline, &r.baseline);
    println!();
    println!(
        "stoker demo: {} images x {} epochs over S3 ({} ms per request), {} threads",
        r.dataset.images, p.epochs, r.latency_ms, r.threads
    );
    println!(
        "  {:<22} {:>10} {:>12} {:>12} {:>12}",
        "", "images/s", "first batch", "fetched", "peak RSS"
    );
    println!(
        "  {:<22} {:>10.0} {:>10.2} s {:>8.1} MiB {:>8.0} MiB",
        "Stoker pipeline",
        p.images_per_s,
        p.first_batch_s,
        mib(p.bytes_fetched),
        mib(p.peak_rss_bytes)
    );
    println!(
        "  {:<22} {:>10.0} {:>10.2} s {:>8.1} MiB {:>8.0} MiB",
        "naive loader",
        b.images_per_s,
        b.first_batch_s,
        mib(b.bytes_fetched),
        mib(b.peak_rss_bytes)
    );
    println!(
        "  Stoker is {:.1}x the naive loader ({:.1}x in the first epoch, both cold)",
        r.ratio, r.first_epoch_ratio
    );
    let epochs: Vec<String> = p
        .epoch_seconds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "epoch {} {:.2} s{}",
                i + 1,
                s,
                if i == 0 {
                    " (cold)"
                } else {
                    " (from the cache)"
                }
            )
        })
        .collect();
    println!(
        "  pipeline: {}; {} images in {} batches; {} HTTP requests, {} cache hits; memory \
         budget peak {:.0} of {:.0} MiB",
        epochs.join(", "),
        p.images,
        p.batches,
        p.requests,
        match p.decoded_cache_hits {
            0 => p.cache_hits.to_string(),
            d => format!("{} + {d} decoded images", p.cache_hits),
        },
        mib(p.memory_peak_bytes),
        mib(p.memory_limit_bytes)
    );
    println!("  pipeline stages:");
    for st in &p.stages {
        println!(
            "    {:<34} {:>8} items  busy {:>6.2} s  waiting {:>6.2} s",
            st["name"].as_str().unwrap_or("?"),
            st["items_out"].as_u64().unwrap_or(0),
            st["busy_s"].as_f64().unwrap_or(0.0),
            st["wait_s"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(pr) = &p.profile {
        println!("  profile: {}", pr.summary);
        println!("    report: {}", pr.dir.join("report.html").display());
    }
    println!();
    println!(
        "storage engine alone: one {} object as parallel ranged reads: {:.0} MiB/s ({:.2} s, \
         {} requests)",
        stoker_core::ByteSize(r.storage.bytes),
        r.storage.mib_per_s,
        r.storage.seconds,
        r.storage.requests
    );
    println!("client CPU {:.1} s in all", r.cpu_seconds);
    println!(
        "\nthe pipeline, as a `stoker run` spec:\n{}",
        indent(&p.spec)
    );
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect::<String>()
}
