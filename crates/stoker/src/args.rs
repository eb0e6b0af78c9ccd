//! Raw command-line arguments. Resolution into engine options happens in
//! [`StoreArgs::options`], so every subcommand accepts the same store flags.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use stoker_core::ByteSize;
use stoker_store::StoreOptions;

/// Stoker keeps accelerators fed: fast reads from object storage for training jobs.
#[derive(Debug, Parser)]
#[command(name = "stoker", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List objects under a URL (s3://bucket/prefix, gs://, az://, file paths, ...).
    Ls(LsArgs),
    /// Write an object (or a byte range of it) to stdout.
    Cat(CatArgs),
    /// Read every object under a prefix (or one object) and report throughput.
    Bench(BenchArgs),
    /// Generate a dataset, serve it from an embedded S3 server, and read it back.
    Demo(DemoArgs),
    /// Run a pipeline from a spec file (TOML) and report its throughput per stage.
    Run(RunArgs),
    /// Run a pipeline from a spec file and profile it: whether it keeps its consumer waiting,
    /// the bottleneck and its cause, what to change; writes report.html, profile.json and
    /// trace.json (Chrome trace events) into --out.
    Profile(ProfileArgs),
    /// Count the records of every shard under a URL and write a shard index (JSON), for the
    /// contiguous rank split of formats that cannot count from metadata.
    Index(IndexArgs),
    /// Mount a bucket or prefix as a read-only file system (FUSE).
    Mount(MountArgs),
    /// Unmount a file system mounted with `stoker mount`.
    Unmount(UnmountArgs),
}

/// Flags shared by every subcommand that opens a store.
#[derive(Debug, Args, Clone, Default)]
pub struct StoreArgs {
    /// Custom S3 endpoint (MinIO, Ceph, a test server).
    #[arg(long, env = "AWS_ENDPOINT_URL", global = true)]
    pub endpoint: Option<String>,
    /// Region.
    #[arg(long, global = true)]
    pub region: Option<String>,
    /// Access key id (else AWS_ACCESS_KEY_ID).
    #[arg(long, global = true)]
    pub access_key_id: Option<String>,
    /// Secret access key (else AWS_SECRET_ACCESS_KEY).
    #[arg(long, global = true)]
    pub secret_access_key: Option<String>,
    /// Unsigned requests (public buckets).
    #[arg(long, global = true)]
    pub no_sign_request: bool,
    /// Memory budget for cache and read-ahead (e.g. 4GiB). Default: a quarter of RAM.
    #[arg(long, global = true)]
    pub memory_limit: Option<ByteSize>,
    /// Disk cache directory (reused by later runs).
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
    /// Disk cache size.
    #[arg(long, global = true)]
    pub cache_size: Option<ByteSize>,
    /// Any store option as KEY=VALUE (repeatable); see the README for the keys.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE", global = true)]
    pub options: Vec<String>,
    /// Local files: follow symbolic links that lead out of the directory given (by default
    /// they are left out of listings and refused on open). `-o follow_symlinks=true`.
    #[arg(long, global = true)]
    pub follow_symlinks: bool,
}

impl StoreArgs {
    /// Resolves the flags into store options.
    pub fn options(&self) -> anyhow::Result<StoreOptions> {
        let mut o = StoreOptions::default();
        for kv in &self.options {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("option {kv:?} is not KEY=VALUE"))?;
            o.set(k.trim(), v.trim())?;
        }
        if let Some(e) = &self.endpoint {
            if !e.is_empty() {
                o.endpoint = Some(e.clone());
            }
        }
        if let Some(r) = &self.region {
            o.region = Some(r.clone());
        }
        if let Some(k) = &self.access_key_id {
            o.access_key_id = Some(k.clone());
        }
        if let Some(s) = &self.secret_access_key {
            o.secret_access_key = Some(s.clone());
        }
        if self.no_sign_request {
            o.skip_signature = true;
        }
        if let Some(m) = self.memory_limit {
            o.memory_limit = Some(m.bytes());
        }
        if let Some(d) = &self.cache_dir {
            o.cache_dir = Some(d.clone());
        }
        if let Some(s) = self.cache_size {
            o.cache_disk_bytes = s.bytes();
        }
        if self.follow_symlinks {
            o.follow_symlinks = true;
        }
        Ok(o)
    }
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// The URL to list.
    pub url: String,
    /// List every key below, not one level.
    #[arg(short, long)]
    pub recursive: bool,
    /// Only keys matching this glob (relative to the URL), e.g. '**/*.jpg'. Implies -r.
    #[arg(long)]
    pub glob: Option<String>,
    /// Show size, ETag and modification time.
    #[arg(short, long)]
    pub long: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct CatArgs {
    /// The object's URL.
    pub url: String,
    /// Byte range START-END (END exclusive), START- or -SUFFIX_LEN.
    #[arg(long)]
    pub range: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A prefix (every object under it is read) or one object.
    pub url: String,
    /// Requests in flight (objects for small objects, parts for large ones).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Part size for large objects.
    #[arg(long)]
    pub part_size: Option<ByteSize>,
    /// Read everything this many times (later epochs show the cache). With one epoch the
    /// memory cache is off unless `-o cache_memory=SIZE` or `--cache-dir` asks for it.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Only keys matching this glob.
    #[arg(long)]
    pub glob: Option<String>,
    /// Read exactly the keys in this file (one per line, relative to URL, which must then be
    /// a prefix) instead of listing: what a pipeline with a manifest of its samples does.
    #[arg(long, conflicts_with = "glob")]
    pub keys: Option<PathBuf>,
    /// One JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Disable the memory cache (every epoch goes to the server).
    #[arg(long)]
    pub no_cache: bool,
    /// Threads that drive the connections: 1 (default) is one thread for all of them, as
    /// curl does, cheapest on few cores; 0 is one per core; more help only where one core
    /// cannot keep up with the network.
    #[arg(long, default_value_t = 1)]
    pub io_threads: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// The pipeline spec (TOML; see docs/pipeline.md).
    pub spec: PathBuf,
    /// The directory to write report.html, profile.json and trace.json into (made if
    /// missing).
    #[arg(long, default_value = "stoker-profile")]
    pub out: PathBuf,
    /// Profile at most this long (the run stops earlier when the pipeline ends).
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Stand in for a training step: wait this long after each item (batch). Without it
    /// the consumer does nothing between items and the profile measures the pipeline alone.
    #[arg(long, default_value_t = 0.0)]
    pub step_ms: f64,
    /// Stop after this many items.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Override the spec's epochs (0: forever).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Override the spec's worker threads.
    #[arg(long)]
    pub threads: Option<usize>,
    /// No trace.json (the spans of the profiled samples and the store's requests).
    #[arg(long)]
    pub no_trace: bool,
    /// Print profile.json on stdout instead of the verdict.
    #[arg(long)]
    pub json: bool,
    /// Profile a spec that has a `[distribute]` table here, on this machine.
    #[arg(long)]
    pub local: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The pipeline spec (TOML; see docs/pipeline.md).
    pub spec: PathBuf,
    /// Print one JSON object (samples, seconds, samples_per_s, stages, ...) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Stand in for a training step: wait this long after each item (batch), like a
    /// consumer that is busy on the GPU. Shows whether the pipeline keeps up.
    #[arg(long, default_value_t = 0.0)]
    pub step_ms: f64,
    /// Stop after this many items.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print the optimizer's plan and exit.
    #[arg(long)]
    pub explain: bool,
    /// Override the spec's epochs (0: forever).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Override the spec's worker threads.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run a spec that has a `[distribute]` table here, on this machine (its table is
    /// for Ray, from Python).
    #[arg(long)]
    pub local: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The shards: s3://bucket/prefix/ (every object under it), or one object.
    pub url: String,
    /// Their format: tar, tfrecord, parquet, jsonl, csv, or auto (from the extensions).
    #[arg(long, default_value = "auto")]
    pub format: String,
    /// Only keys matching this glob (relative to the prefix).
    #[arg(long)]
    pub glob: Option<String>,
    /// Write the index here instead of stdout (a local path).
    #[arg(long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args, Clone)]
pub struct DemoArgs {
    /// JPEGs to generate (ImageNet-like: photograph-like content, 300-500 px on the short
    /// side, about 110 KB).
    #[arg(long, visible_alias = "objects", default_value_t = 1000)]
    pub images: usize,
    /// Epochs of the pipeline (and of the naive loader).
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    /// Threads of the engine, and of the naive loader's pool (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Size of the one large object (the storage section).
    #[arg(long, default_value = "256MiB")]
    pub large_size: ByteSize,
    /// Latency the embedded server adds to each request, like a real object store.
    #[arg(long, default_value_t = 10)]
    pub latency_ms: u64,
    /// Directory for the generated data, reused by a later run with the same sizes
    /// (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Profile the pipeline's run too, and write its report (report.html, profile.json,
    /// trace.json) into this directory.
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// Internal: run one loader (`pipeline` or `naive`) against the server named in the
    /// environment and print its report as JSON; the demo runs each loader in a process of
    /// its own so that each one's peak memory is its own.
    #[arg(long, hide = true)]
    pub loader: Option<String>,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    /// What to mount: s3://bucket[/prefix], gs://..., az://..., a local path.
    pub url: String,
    /// Where: an existing directory.
    pub mountpoint: PathBuf,
    /// Stay in the foreground until Ctrl-C or SIGTERM (which unmount).
    #[arg(short, long)]
    pub foreground: bool,
    /// Bytes per ranged GET and per cache block (e.g. 8MiB).
    #[arg(long)]
    pub part_size: Option<ByteSize>,
    /// Ranged GETs in flight for one sequential reader.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Seconds names, sizes and versions are trusted before they are asked for again.
    #[arg(long, value_name = "SECONDS")]
    pub metadata_ttl: Option<f64>,
    /// Memory for the block cache (default: half of --memory-limit).
    #[arg(long)]
    pub cache_memory: Option<ByteSize>,
    /// Let other users read the mount (allow_other); the kernel checks the modes and owners
    /// the mount shows (a local source's own; 0444 and the mounting user for object stores).
    #[arg(long)]
    pub allow_other: bool,
    /// Files of at least this size are read with direct I/O, past the kernel's page cache
    /// (one copy less per byte; the block cache still serves re-reads); `off`: never.
    #[arg(long, value_name = "SIZE|off", default_value = "64MiB")]
    pub direct_io_min: DirectIoMin,
    /// Once mounted in the background, write messages here (default: discarded).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `--direct-io-min`: a size, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectIoMin(pub Option<u64>);

impl std::str::FromStr for DirectIoMin {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(DirectIoMin(None));
        }
        s.parse::<ByteSize>()
            .map(|b| DirectIoMin(Some(b.bytes())))
            .map_err(|e| format!("{e}, or `off`"))
    }
}

#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
}
