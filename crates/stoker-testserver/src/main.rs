//! `stoker-testserver`: serve a directory as S3 on loopback, for tests and benchmarks in other
//! processes.
//!
//! Prints exactly one line to stdout, `STOKER_TESTSERVER_ENDPOINT=http://127.0.0.1:PORT`, once
//! the server accepts connections, then serves until SIGINT or SIGTERM. Logs go to stderr
//! (`RUST_LOG`, default `warn`). Faults and latency can be changed while it runs through the
//! `/__stoker/` control endpoint (see the library docs).

use std::io::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use stoker_testserver::{ServerOptions, TestServer};

/// Serve a directory as an S3-compatible endpoint (each subdirectory is a bucket).
#[derive(Debug, Parser)]
#[command(name = "stoker-testserver", version)]
struct Cli {
    /// Directory to serve; created if missing. Default: a temporary directory removed on exit.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0 = pick a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Sleep this many milliseconds before answering each S3 request.
    #[arg(long, default_value_t = 0.0)]
    latency_ms: f64,
    /// Access key clients sign with.
    #[arg(long, default_value = stoker_testserver::DEFAULT_ACCESS_KEY)]
    access_key: String,
    /// Secret key clients sign with.
    #[arg(long, default_value = stoker_testserver::DEFAULT_SECRET_KEY)]
    secret_key: String,
    /// Region reported in the startup log.
    #[arg(long, default_value = stoker_testserver::DEFAULT_REGION)]
    region: String,
    /// Bucket to create at start (repeatable).
    #[arg(long = "bucket")]
    buckets: Vec<String>,
    /// Derive the ETags of files placed in the root directly from their size and modification
    /// time instead of hashing their content (for large benchmark data sets).
    #[arg(long)]
    fast_etags: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    if !cli.latency_ms.is_finite() || cli.latency_ms < 0.0 {
        anyhow::bail!("--latency-ms must be a non-negative number");
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut opts = ServerOptions::new()
        .host(cli.host)
        .port(cli.port)
        .latency(Duration::from_secs_f64(cli.latency_ms / 1000.0))
        .access_key(cli.access_key)
        .secret_key(cli.secret_key)
        .region(cli.region)
        .buckets(cli.buckets)
        .fast_etags(cli.fast_etags);
    if let Some(root) = cli.root {
        opts = opts.root(root);
    }
    let server = TestServer::start(opts).await?;
    tracing::info!(
        endpoint = %server.endpoint(),
        root = %server.root().display(),
        access_key = server.access_key(),
        region = server.region(),
        "serving"
    );
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "STOKER_TESTSERVER_ENDPOINT={}", server.endpoint())?;
        out.flush()?;
    }
    shutdown_signal().await?;
    tracing::info!(
        requests = server.requests(),
        faults = server.faults().hits(),
        "stopping"
    );
    drop(server);
    Ok(())
}

#[cfg(unix)]
async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn shutdown_signal() -> anyhow::Result<()> {
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")
}
