//! `stoker`: the command line.
//!
//! `stoker ls | cat | bench | run | demo | mount | unmount` today; `profile` joins as its engine
//! lands. Raw arguments (clap structs in [`args`]) are kept apart from the resolved store
//! configuration ([`args::StoreArgs::options`]), and every subcommand lives in its own module.
//!
//! `stoker demo` serves its generated data with the embedded S3 test server
//! (`stoker-testserver`), which only the `demo` feature links. The feature is on by default,
//! so that the README's `cargo run --release -p stoker -- demo` works from a clone; a CLI for
//! a machine's PATH is built without it (`cargo install --path crates/stoker
//! --no-default-features`) and has no server in it: its `stoker demo` says how to get one.

mod args;
mod bench;
#[cfg(feature = "demo")]
mod demo;
mod inspect;
mod mount;
mod profile;
mod run;

use clap::Parser;

/// mimalloc instead of glibc malloc: the read path allocates and frees many part-sized buffers
/// from many threads; glibc's arenas serialise on a lock and return memory to the kernel only
/// to fault it back in (measured: see docs/benchmarks-history.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process. Received bytes land in memory the
/// allocator keeps recycling; with THP each recycled region faults back in as a fresh 2 MiB
/// page that the kernel zeroes whole, and zeroing took up to 60% of the CPU of reading a
/// 1 GiB object (about half the runs; 4 KiB pages: every run fast, see docs/benchmarks-history.md).
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// The async runtime a command runs on. Reading commands drive every connection from one
/// thread by default, as curl does: per byte the engine does little beyond the kernel's copy,
/// and on a few shared cores a wake-up of another thread for each chunk cost more than the
/// thread brought (1 GiB object: 0.36 s of CPU on a multi-thread runtime, 0.30 s on one
/// thread; 9,000 context switches against 500). `stoker bench --io-threads N` spreads the
/// I/O over N threads where one core cannot keep up with the network.
fn runtime_for(command: &args::Command) -> tokio::runtime::Builder {
    let threads = match command {
        args::Command::Ls(_) | args::Command::Cat(_) => 1,
        args::Command::Bench(a) => a.io_threads,
        _ => 0,
    };
    match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    }
}

/// An error and its causes on one line, each cause once. Many of the engine's errors
/// already carry their cause's text in their own message (so that a library user who prints
/// only the top error still sees why), and anyhow's `{:#}` appends every cause again after
/// it: a cause whose text is already in what was printed before it is left out.
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || out.contains(text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(text);
    }
    out
}

fn main() -> std::process::ExitCode {
    disable_transparent_huge_pages();
    let cli = args::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STOKER_LOG").unwrap_or_else(|_| {
                // fuser logs every operation a file system leaves to the kernel's
                // default (ioctl, getlk, ...) as a warning.
                tracing_subscriber::EnvFilter::new("warn,fuser=error")
            }),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: in a log file or a pipe they are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match runtime_for(&cli.command).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stoker: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            args::Command::Ls(a) => inspect::ls(a).await,
            args::Command::Cat(a) => inspect::cat(a).await,
            args::Command::Bench(a) => bench::run(a).await,
            #[cfg(feature = "demo")]
            args::Command::Demo(a) => demo::run(a).await,
            #[cfg(not(feature = "demo"))]
            args::Command::Demo(_) => Err(anyhow::anyhow!(
                "this stoker was built without the demo (its embedded S3 server): run \
                 `cargo run --release -p stoker -- demo` in a clone of the repository, or \
                 build with `--features demo`"
            )),
            args::Command::Run(a) => run::run(a).await,
            args::Command::Profile(a) => profile::profile(a).await,
            args::Command::Index(a) => run::index(a).await,
            args::Command::Mount(a) => mount::mount(a).await,
            args::Command::Unmount(a) => mount::unmount(a).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // A closed stdout (`stoker cat ... | head`) is not an error worth a message.
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return std::process::ExitCode::SUCCESS;
                }
            }
            eprintln!("stoker: error: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[derive(Debug)]
    struct Wrapped(&'static str, Option<Box<Wrapped>>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|w| w as _)
        }
    }

    #[test]
    fn an_error_chain_prints_each_cause_once() {
        // What the engine's errors look like: each message already ends with its cause's.
        let inner = Wrapped("connection reset by peer", None);
        let mid = Wrapped(
            "GET s3://b/k bytes 0-99 failed after 3 attempts: connection reset by peer",
            Some(Box::new(inner)),
        );
        let top = Wrapped(
            "reading s3://b/k: GET s3://b/k bytes 0-99 failed after 3 attempts: connection \
             reset by peer",
            Some(Box::new(mid)),
        );
        let e = anyhow::Error::new(top).context("stoker cat s3://b/k");
        let text = describe(&e);
        assert_eq!(
            text.matches("connection reset by peer").count(),
            1,
            "{text}"
        );
        assert_eq!(text.matches("failed after 3 attempts").count(), 1, "{text}");
        assert!(
            text.starts_with("stoker cat s3://b/k: reading s3://b/k"),
            "{text}"
        );
        // Causes that add something are kept, in order.
        let e = anyhow::Error::new(Wrapped("no such file", None)).context("opening spec.toml");
        assert_eq!(describe(&e), "opening spec.toml: no such file");
    }
}
