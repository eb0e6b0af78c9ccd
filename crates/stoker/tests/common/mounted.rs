//! A `stoker mount --foreground` process over a test server, for the FUSE tests and the
//! chaos soak: started, waited for until it says it is mounted, and on drop stopped with
//! SIGTERM (killed after 10 s) and lazily unmounted if anything is left.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stoker_testserver::TestServer;

/// The `stoker` binary as a plain process, with the server's endpoint and credentials in
/// its environment.
pub fn stoker_process(s: &TestServer) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stoker"));
    c.env("AWS_ACCESS_KEY_ID", s.access_key())
        .env("AWS_SECRET_ACCESS_KEY", s.secret_key())
        .env("AWS_REGION", s.region())
        .env("AWS_ENDPOINT_URL", s.endpoint());
    c
}

/// A `stoker mount --foreground` process and its mount point.
pub struct Mounted {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Mounted {
    /// `url` mounted on a new temporary directory, with `extra` flags.
    pub fn start(s: &TestServer, url: &str, extra: &[&str]) -> Mounted {
        Self::start_at(s, url, extra, tempfile::tempdir().unwrap())
    }

    /// `url` mounted on `dir`, with `extra` flags (1 MiB parts unless they say otherwise).
    pub fn start_at(s: &TestServer, url: &str, extra: &[&str], dir: tempfile::TempDir) -> Mounted {
        let mut child = stoker_process(s)
            .args(["mount", url])
            .arg(dir.path())
            .args(["--foreground", "--part-size", "1MiB"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        assert!(
            line.starts_with("stoker: mounted "),
            "mount did not come up: {line:?} (exit: {:?})",
            child.try_wait()
        );
        Mounted {
            child: Some(child),
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        signal(child.id(), libc::SIGTERM);
        wait_timeout(&mut child, Duration::from_secs(20)).expect("mount exits after SIGTERM")
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), libc::SIGTERM);
            if wait_timeout(&mut c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if is_mounted(self.dir.path()) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(self.dir.path())
                .status();
        }
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid we started and a valid signal number.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

pub fn wait_timeout(c: &mut Child, t: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if let Some(st) = c.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub fn is_mounted(p: &Path) -> bool {
    let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(p.to_str().unwrap()))
}
