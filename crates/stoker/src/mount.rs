//! `stoker mount` and `stoker unmount`.
//!
//! Without `--foreground`, `stoker mount` starts itself again in the foreground as a
//! background process (its own process group, so the shell's Ctrl-C does not reach it),
//! waits until that process says the file system is mounted, prints where, and exits 0; if
//! the mount fails, the error is printed and the exit status is non-zero. The daemon writes
//! nothing to stdout after that line.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use stoker_mount::MountOptions;
use stoker_store::Store;

use crate::args::{MountArgs, UnmountArgs};

/// The line the foreground process prints once mounted.
const READY: &str = "stoker: mounted ";

pub async fn mount(a: MountArgs) -> anyhow::Result<()> {
    if !a.foreground {
        return spawn_daemon();
    }
    let mut opts = a.store.options()?;
    if let Some(p) = a.part_size {
        opts = opts.with_part_size(p.bytes());
    }
    if let Some(n) = a.max_concurrency {
        opts = opts.with_max_concurrency(n);
    }
    if let Some(m) = a.cache_memory {
        opts = opts.with_cache_memory(m.bytes());
    }
    if let Some(s) = a.metadata_ttl {
        anyhow::ensure!(
            s.is_finite() && s >= 0.0,
            "--metadata-ttl must be a number of seconds >= 0"
        );
        opts = opts.with_metadata_ttl(Duration::from_secs_f64(s));
    }
    let ttl = opts.metadata_ttl;
    // Before anything is mounted: a signal that arrives once the ready line is out must
    // unmount, not kill the process with the default action.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    stoker_mount::check_fuse()?;
    let store = Store::open(&a.url, opts)?;
    // Fail now, with the store's message, on a wrong bucket, endpoint or credentials,
    // rather than on the first `ls` of the mount.
    store
        .list_dir(store.url_key())
        .await
        .with_context(|| format!("cannot list {}", a.url))?;
    let options = MountOptions::default()
        .with_fs_name(format!("stoker:{}", a.url))
        .with_metadata_ttl(ttl)
        .with_allow_other(a.allow_other)
        .with_direct_io_min(a.direct_io_min.0);
    let mut m = stoker_mount::mount(
        store.clone(),
        tokio::runtime::Handle::current(),
        &a.mountpoint,
        options,
    )?;
    println!("{READY}{} at {}", a.url, m.path().display());
    if std::env::var_os(DAEMON_ENV).is_some() {
        // The starting process has read the line and is gone: stop writing to its pipes
        // (a caller collecting its output would wait for them to close).
        detach_output(a.log_file.as_deref())?;
    }
    if !m.auto_unmount() {
        eprintln!(
            "stoker: note: if this process is killed, run `stoker unmount {}` (automatic \
             unmounting needs fusermount3, from the fuse3 package)",
            m.path().display()
        );
    }
    let external = tokio::select! {
        _ = int.recv() => false,
        _ = term.recv() => false,
        _ = m.ended() => true,
    };
    let path = m.path().to_path_buf();
    tokio::task::spawn_blocking(move || m.unmount())
        .await?
        .with_context(|| format!("unmounting {}", path.display()))?;
    store.cache().flush().await;
    if !external {
        eprintln!("stoker: unmounted {}", path.display());
    }
    Ok(())
}

/// Set in the environment of the background process.
const DAEMON_ENV: &str = "STOKER_MOUNT_DAEMON";

/// Points stdout and stderr at the log file (or /dev/null).
fn detach_output(log: Option<&std::path::Path>) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let target = match log {
        Some(p) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("cannot open the log file {}", p.display()))?,
        None => std::fs::OpenOptions::new().write(true).open("/dev/null")?,
    };
    for fd in [1, 2] {
        // SAFETY: dup2 onto the standard descriptors of an open file we own.
        if unsafe { libc::dup2(target.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error()).context("dup2");
        }
    }
    Ok(())
}

/// Runs `stoker mount ... --foreground` in the background and waits for it to be mounted.
fn spawn_daemon() -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the stoker executable")?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--foreground")
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .context("cannot start the mount process")?;
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.starts_with(READY) {
        print!("{line}");
        return Ok(());
    }
    let status = child.wait()?;
    anyhow::bail!("the mount process exited ({status}) before mounting")
}

pub async fn unmount(a: UnmountArgs) -> anyhow::Result<()> {
    stoker_mount::unmount(&a.mountpoint).context("cannot unmount")
}
