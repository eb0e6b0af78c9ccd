//! `stoker-mount`: a read-only FUSE file system over a bucket (or a prefix of one).
//!
//! Every read goes through [`stoker_store::Store`]: sequential readers get parallel ranged
//! GETs with read-ahead that grows while they stay sequential; everyone shares the block
//! cache (memory, and disk when configured), with single-flight so concurrent readers of
//! the same blocks cause one GET; all of it within the store's memory budget. Directories
//! are the prefixes of a delimiter listing, listed when first opened or looked up and kept
//! for the metadata TTL. What the mount promises, and the test that checks each promise,
//! are in `docs/mount.md`.
//!
//! **Large files skip the page cache.** A file read through FUSE normally costs two copies
//! on the client after the network: the daemon's reply into the kernel's page cache, then
//! the page cache into the reader's buffer, and the data sits in memory twice (page cache
//! and block cache). Files of at least [`MountOptions::direct_io_min`] (64 MiB by default:
//! shards, Parquet files, arrays, not images or clips) are opened with `FOPEN_DIRECT_IO`:
//! the kernel copies the daemon's reply straight into the reader's buffer, and the block
//! cache is the one cache. On the 1 GiB benchmark file that took a fifth off the client's
//! CPU time per byte (`docs/benchmarks.md`). Such files can still be memory-mapped: the
//! mount asks for `FUSE_DIRECT_IO_ALLOW_MMAP` (Linux 6.6+), and on a kernel without it no
//! file is opened with direct I/O. Smaller files keep the page cache, which serves
//! re-reads of a warm file without a round trip to the daemon.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use stoker_store::{Store, StoreOptions};
//! let store = Store::open("s3://bucket/train/", StoreOptions::default())?;
//! let mut mount = stoker_mount::mount(
//!     store,
//!     tokio::runtime::Handle::current(),
//!     "/mnt/train".as_ref(),
//!     stoker_mount::MountOptions::default(),
//! )?;
//! mount.ended().await; // until unmounted from outside, or:
//! mount.unmount()?;
//! # Ok(()) }
//! ```

mod fs;
mod inode;

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL};
use stoker_store::Store;

/// How to mount.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MountOptions {
    /// The source shown in `mount` and `/proc/mounts` (e.g. the bucket's URL).
    pub fs_name: String,
    /// How long the kernel and the mount trust names and attributes before asking again.
    /// Default: the store's metadata TTL.
    pub metadata_ttl: Option<Duration>,
    /// Let other users (and root) use the mount (`allow_other`; a non-root user needs
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Files of at least this many bytes are read with direct I/O, past the kernel's page
    /// cache (`None`: every file goes through the page cache). Default
    /// [`DEFAULT_DIRECT_IO_MIN`]. See the crate docs.
    pub direct_io_min: Option<u64>,
}

/// Files from this size on are read with direct I/O unless told otherwise: 64 MiB, well
/// above an image, an audio clip or a document, where shards, Parquet files and arrays
/// begin.
pub const DEFAULT_DIRECT_IO_MIN: u64 = 64 << 20;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fs_name: "stoker".into(),
            metadata_ttl: None,
            allow_other: false,
            direct_io_min: Some(DEFAULT_DIRECT_IO_MIN),
        }
    }
}

impl MountOptions {
    /// Sets the source name.
    pub fn with_fs_name(mut self, name: impl Into<String>) -> Self {
        self.fs_name = name.into();
        self
    }

    /// Sets the metadata TTL.
    pub fn with_metadata_ttl(mut self, ttl: Duration) -> Self {
        self.metadata_ttl = Some(ttl);
        self
    }

    /// Sets `allow_other`.
    pub fn with_allow_other(mut self, allow: bool) -> Self {
        self.allow_other = allow;
        self
    }

    /// Sets the size from which files are read with direct I/O (`None`: never).
    pub fn with_direct_io_min(mut self, min: Option<u64>) -> Self {
        self.direct_io_min = min;
        self
    }
}

/// Why a mount could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// FUSE is missing or not usable by this process; the message says what to do.
    #[error("FUSE is not available: {0}")]
    Unavailable(String),
    /// The mount point is unusable.
    #[error("cannot mount at {path}: {reason}")]
    Mountpoint {
        /// The mount point.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The kernel or fusermount refused.
    #[error("mounting at {path} failed: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// A live mount. Dropping it unmounts.
#[derive(Debug)]
pub struct Mount {
    path: PathBuf,
    thread: Option<JoinHandle<io::Result<()>>>,
    ended: Option<tokio::sync::oneshot::Receiver<()>>,
    store: Store,
    watcher: Option<Watcher>,
}

impl Mount {
    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file system is unmounted by itself if this process dies without
    /// unmounting (SIGKILL, a crash): true when `fusermount3` is installed, or for root.
    pub fn auto_unmount(&self) -> bool {
        self.watcher.is_some()
    }

    /// The store the mount reads through (metrics, cache statistics).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Resolves when the file system is no longer mounted (`stoker unmount`, `fusermount3
    /// -u`, `umount`, or [`Mount::unmount`]).
    pub async fn ended(&mut self) {
        if let Some(rx) = self.ended.as_mut() {
            let _ = rx.await;
            self.ended = None;
        }
    }

    /// Unmounts and waits for the session to end. (Pending disk-cache writes are flushed by
    /// `store().cache().flush()`.)
    pub fn unmount(&mut self) -> io::Result<()> {
        if self.thread.is_some() && mount_device(&self.path).is_some() {
            // Lazily: a file still open on the mount must not keep it mounted (a process
            // that holds one gets errors once the session ends). The session's loop ends
            // when the kernel lets go of the connection.
            fusermount_unmount(&self.path, true)?;
        }
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(r) => r?,
                Err(_) => return Err(io::Error::other("the FUSE session thread panicked")),
            }
        }
        if let Some(w) = self.watcher.take() {
            w.dismiss();
        }
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.unmount() {
                tracing::warn!(path = %self.path.display(), error = %e, "unmount failed");
            }
        }
    }
}

/// Checks that this process can make a FUSE mount, with a message that says what is
/// missing when it cannot.
pub fn check_fuse() -> Result<(), MountError> {
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        return Err(MountError::Unavailable(
            "/dev/fuse does not exist: load the kernel module (`modprobe fuse`), or in a \
             container pass the device (`docker run --device /dev/fuse --cap-add SYS_ADMIN`)"
                .into(),
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(dev) {
        return Err(MountError::Unavailable(format!(
            "cannot open /dev/fuse ({e}): run as root or give this user access to the device"
        )));
    }
    if !is_root() && fusermount().is_none() {
        return Err(MountError::Unavailable(
            "fusermount3 is not installed: install the fuse3 package (Debian/Ubuntu: \
             `apt-get install fuse3`), or mount as root"
                .into(),
        ));
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: geteuid only reads the process's credentials.
    unsafe { libc::geteuid() == 0 }
}

/// The fusermount binary on PATH, if any.
fn fusermount() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| [d.join("fusermount3"), d.join("fusermount")])
        .find(|p| p.is_file())
}

/// Mounts `store` read-only at `mountpoint`. Network work runs on `runtime`.
pub fn mount(
    store: Store,
    runtime: tokio::runtime::Handle,
    mountpoint: &Path,
    options: MountOptions,
) -> Result<Mount, MountError> {
    check_fuse()?;
    let bad = |reason: String| MountError::Mountpoint {
        path: mountpoint.to_path_buf(),
        reason,
    };
    match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad("not a directory".into())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(bad(stale_hint(mountpoint)));
        }
        Err(e) => return Err(bad(e.to_string())),
    }
    let path = std::fs::canonicalize(mountpoint).map_err(|e| bad(e.to_string()))?;

    let acl = if options.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    // `default_permissions`: the kernel checks every access against the modes and owners the
    // mount shows (a local source's own; for object stores 0444/0555 owned by whoever
    // mounted), so with `allow_other` another user reads only what those allow; the daemon,
    // which may run as root, is never asked to decide.
    let mount_options = vec![
        MountOption::RO,
        MountOption::FSName(options.fs_name.clone()),
        MountOption::Subtype("stoker".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = acl;
    config.n_threads = Some(1);

    let ttl = options.metadata_ttl.unwrap_or(store.options().metadata_ttl);
    let root_prefix = match store.url_key().trim_matches('/') {
        "" => String::new(),
        p => format!("{p}/"),
    };
    // Started before the mount, so that it holds nothing of it (no /dev/fuse descriptor).
    let watcher = Watcher::start(&path);
    let (fs, _shared) = fs::StokerFs::new(
        store.clone(),
        runtime,
        root_prefix,
        ttl,
        options.direct_io_min,
    );
    let session = match Session::new(fs, &path, &config) {
        Ok(s) => s,
        Err(source) => {
            if let Some(w) = watcher {
                w.dismiss();
            }
            return Err(MountError::Mount { path, source });
        }
    };
    raise_read_ahead(&path, READ_AHEAD_KB);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("stoker-fuse".into())
        .spawn(move || {
            let r = session.run();
            let _ = tx.send(());
            r
        })
        .map_err(|source| MountError::Mount {
            path: path.clone(),
            source,
        })?;
    Ok(Mount {
        path,
        thread: Some(thread),
        ended: Some(rx),
        store,
        watcher,
    })
}

/// Unmounts the file system if this process dies without doing so (SIGKILL, the OOM
/// killer, a crash), so that no "Transport endpoint is not connected" mount point is left
/// behind.
///
/// fusermount's `auto_unmount` option does this too, but only for root or with
/// `user_allow_other`, and it gives up when the system's mount table does not list the
/// mount as it expects; the watcher works for any user who may run `fusermount3 -u`. It is a shell whose standard input is a pipe only this process
/// writes to: the pipe reaches end-of-file when this process is gone, however it died.
/// The shell then unmounts (lazily: files still open on the dead mount get errors, the
/// mount point is free at once) only if the mount point cannot be reached, which is what a
/// mount whose daemon died looks like; after a clean unmount the directory is reachable
/// and the shell does nothing.
#[derive(Debug)]
struct Watcher {
    child: std::process::Child,
}

impl Watcher {
    fn start(path: &Path) -> Option<Watcher> {
        let (prog, lazy) = match fusermount() {
            _ if is_root() => (PathBuf::from("umount"), "-l"),
            Some(fm) => (fm, "-uz"),
            None => return None,
        };
        let child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"read _ ; true 2>/dev/null <"$3" || exec "$1" "$2" "$3""#)
            .arg("stoker-mount-watcher")
            .arg(&prog)
            .arg(lazy)
            .arg(path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // Its own process group: a Ctrl-C meant for the mount must not stop the watcher.
            .process_group(0)
            .spawn();
        match child {
            Ok(child) => Some(Watcher { child }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the unmount watcher");
                None
            }
        }
    }

    /// After a clean unmount: ends the watcher (it finds the directory reachable) and
    /// reaps it.
    fn dismiss(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Kernel read-ahead for the mount, in KiB. The kernel starts a FUSE mount at 128 KiB,
/// which splits a sequential reader's stream into 128 KiB requests, each a round trip to
/// the daemon; 4 MiB lets it send 1 MiB requests, several at a time (measured on a 1 GiB
/// file: 600 MB/s at 128 KiB, 780 MB/s at 4 MiB; docs/benchmarks-history.md).
const READ_AHEAD_KB: u32 = 4096;

/// Sets the kernel's read-ahead for the file system mounted at `path` (its backing device's
/// `read_ahead_kb`). Only root may; for anyone else the kernel's default stays. The device
/// number comes from /proc/self/mountinfo: a `stat` of the mount point would be a FUSE
/// request this process has not started answering yet.
fn raise_read_ahead(path: &Path, kb: u32) {
    let Some(dev) = mount_device(path) else {
        return;
    };
    let knob = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, kb.to_string()) {
        tracing::debug!(knob, error = %e, "cannot raise the kernel's read-ahead");
    }
}

/// `MAJOR:MINOR` of the file system mounted at `path` (the last one, if stacked).
fn mount_device(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_str()?;
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let mount_point = f.nth(1)?;
        (unescape_mountinfo(mount_point) == want).then(|| dev.to_string())
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and tab, newline, backslash).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What to do about a mount point whose file system's daemon is gone (`ENOTCONN`).
fn stale_hint(mountpoint: &Path) -> String {
    format!(
        "it is a stale mount (transport endpoint not connected: the process that served it \
         is gone): run `stoker unmount {}` first",
        mountpoint.display()
    )
}

/// Unmounts whatever FUSE file system is mounted at `mountpoint` (with `fusermount3 -u`,
/// else `umount`), a stale one (its daemon gone) included. Fails with "... is not a mount
/// point" when nothing is mounted there, and with the tool's message if the file system is
/// busy.
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    // A stale mount cannot be resolved (every look at it is ENOTCONN): its path as given,
    // made absolute, is what the mount table lists.
    let path = match std::fs::canonicalize(mountpoint) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => std::path::absolute(mountpoint)?,
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("{}: {e}", mountpoint.display()),
            ))
        }
    };
    if mount_device(&path).is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a mount point", mountpoint.display()),
        ));
    }
    fusermount_unmount(&path, false)
}

fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let (prog, mut args): (PathBuf, Vec<&std::ffi::OsStr>) = match fusermount() {
        Some(fm) => (fm, vec!["-u".as_ref()]),
        None => (PathBuf::from("umount"), vec![]),
    };
    if lazy {
        args.push(if prog.ends_with("umount") { "-l" } else { "-z" }.as_ref());
    }
    args.push(mountpoint.as_os_str());
    let out = std::process::Command::new(&prog).args(&args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{} failed: {}",
            prog.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b\134c"), r"/tmp/a b\c");
        assert_eq!(unescape_mountinfo(r"/plain\04"), r"/plain\04");
    }

    #[test]
    fn the_root_mount_has_a_device() {
        let dev = mount_device(Path::new("/")).expect("/ is mounted");
        let (major, minor) = dev.split_once(':').unwrap();
        assert!(
            major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok(),
            "{dev}"
        );
    }
}
