//! `stoker mount` against the real S3 test server, read with real tools (`cat`,
//! `sha256sum`, `ls`, Python) through a real FUSE mount.
//!
//! Each test named `claim_*` checks one claim of docs/mount.md; `every_claim_has_a_test`
//! keeps the document and the tests in step.
//!
//! These tests need FUSE: /dev/fuse and fusermount3 (Debian: `apt-get install fuse3`), as
//! root or with access to /dev/fuse. Without it they fail with a message saying so; set
//! STOKER_SKIP_FUSE_TESTS=1 to run the rest of the suite on a machine that has no FUSE (CI
//! does not set it).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stoker_testserver::{Fault, FaultRule, ServerOptions, TestServer};

mod common;
use common::mounted::{is_mounted, signal, stoker_process as stoker, wait_timeout, Mounted};

const BUCKET: &str = "mnt";
const MIB: usize = 1 << 20;

/// Deterministic bytes, different for every (seed, position).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Whether FUSE tests can run here; panics with what is missing unless told to skip.
fn fuse_or_skip() -> bool {
    if let Err(e) = stoker_mount::check_fuse() {
        if std::env::var_os("STOKER_SKIP_FUSE_TESTS").is_some() {
            eprintln!("STOKER_SKIP_FUSE_TESTS is set: not running a FUSE test ({e})");
            return false;
        }
        panic!("{e} (set STOKER_SKIP_FUSE_TESTS=1 to run the other tests without FUSE)");
    }
    true
}

fn server_with(latency: Duration) -> TestServer {
    let s =
        TestServer::start_blocking(ServerOptions::new().bucket(BUCKET).latency(latency)).unwrap();
    for (i, size) in [0usize, 1, 4095, 4096, 110_000, MIB + 7].iter().enumerate() {
        s.put_object(BUCKET, &format!("data/f{i}.bin"), &pattern(i as u64, *size))
            .unwrap();
    }
    s.put_object(BUCKET, "data/big.bin", &pattern(99, 24 * MIB + 123))
        .unwrap();
    s.put_object(BUCKET, "data/sub/deep/x.txt", b"deep\n")
        .unwrap();
    s.put_object(BUCKET, "data/with space é.txt", b"unicode\n")
        .unwrap();
    s
}

fn server() -> TestServer {
    server_with(Duration::from_millis(1))
}

/// Mount flags for a disk cache in `dir` and no memory cache.
fn disk_cache_args(dir: &tempfile::TempDir) -> [String; 4] {
    [
        "--cache-dir".into(),
        dir.path().to_str().unwrap().into(),
        "--cache-memory".into(),
        "0".into(),
    ]
}

/// Runs `f` on its own thread; fails the test if it takes longer than `t` (a hung mount
/// must fail a test, not hang it).
fn within<T: Send + 'static>(t: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(t).expect("operation on the mount hung")
}

fn source(s: &TestServer, key: &str) -> Vec<u8> {
    std::fs::read(s.object_path(BUCKET, key).unwrap()).unwrap()
}

fn tool(cmd: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn claim_read_whole_files() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let data = m.path().join("data");
    for i in 0..6 {
        let key = format!("data/f{i}.bin");
        let got = std::fs::read(data.join(format!("f{i}.bin"))).unwrap();
        assert_eq!(got, source(&s, &key), "{key}");
    }
    // `cat` and `sha256sum` agree with the same tools on the server's own files.
    let big = data.join("big.bin");
    let cat = Command::new("cat").arg(&big).output().unwrap();
    assert_eq!(cat.stdout, source(&s, "data/big.bin"));
    let sum = |p: &Path| {
        tool("sha256sum", &[p.as_os_str()])
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        sum(&big),
        sum(&s.object_path(BUCKET, "data/big.bin").unwrap())
    );
    assert_eq!(
        std::fs::read(data.join("with space é.txt")).unwrap(),
        b"unicode\n"
    );
    assert_eq!(
        std::fs::read(data.join("sub/deep/x.txt")).unwrap(),
        b"deep\n"
    );
}

#[test]
fn claim_read_at_any_offset() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let src = source(&s, "data/big.bin");
    let f = std::fs::File::open(m.path().join("data/big.bin")).unwrap();
    let n = src.len() as u64;
    // Edges, block boundaries, the last byte, past the end; then pseudo-random offsets.
    let mut offsets = vec![0, 1, MIB as u64 - 1, MIB as u64, n - 1, n - 4096, n, n + 10];
    let mut x = 12345u64;
    for _ in 0..200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        offsets.push((x >> 16) % n);
    }
    for off in offsets {
        let mut buf = vec![0u8; 70_000];
        let got = f.read_at(&mut buf, off).unwrap();
        let want = src
            .get(off as usize..)
            .map_or(0, |r| r.len().min(buf.len()));
        assert_eq!(got, want, "length at offset {off}");
        let want_bytes = src.get(off as usize..off as usize + got).unwrap_or(&[]);
        assert_eq!(&buf[..got], want_bytes, "bytes at {off}");
    }
    // Python: open(), seek(), read(), as a training script would.
    let script = r#"
import hashlib, sys
with open(sys.argv[1], "rb") as f:
    out = []
    for off, n in [(0, 10), (5000000, 100000), (1048575, 2), (25165824, 200)]:
        f.seek(off)
        out.append(hashlib.sha256(f.read(n)).hexdigest())
    f.seek(-7, 2)
    out.append(f.read().hex())
print(" ".join(out))
"#;
    let got = tool(
        "python3",
        &[
            "-c".as_ref(),
            script.as_ref(),
            m.path().join("data/big.bin").as_os_str(),
        ],
    );
    let want_py = within(Duration::from_secs(60), {
        let p = s.object_path(BUCKET, "data/big.bin").unwrap();
        move || tool("python3", &["-c".as_ref(), script.as_ref(), p.as_os_str()])
    });
    assert_eq!(got, want_py);
}

#[test]
fn claim_concurrent_readers() {
    if !fuse_or_skip() {
        return;
    }
    let s = server_with(Duration::from_millis(5));
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let mut handles = Vec::new();
    // 16 readers of the same file and 16 of different files, at once.
    for r in 0..32usize {
        let path = if r < 16 {
            m.path().join("data/big.bin")
        } else {
            m.path().join(format!("data/f{}.bin", r % 6))
        };
        let key = format!("data/{}", path.file_name().unwrap().to_str().unwrap());
        let want = source(&s, &key);
        handles.push(std::thread::spawn(move || {
            let mut f = std::fs::File::open(&path).unwrap();
            let mut got = Vec::new();
            // Different read sizes per reader, so the kernel's requests interleave.
            let mut buf = vec![0u8; 4096 * (1 + r % 7)];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == want, "reader {r} of {key}: bytes differ");
        }));
    }
    within(Duration::from_secs(120), move || {
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn claim_directories_from_listings() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    // 10,000 keys over nested "directories": 10 top-level x 10 second-level x 100 files.
    let mut want = Vec::new();
    for a in 0..10 {
        for b in 0..10 {
            for c in 0..100 {
                let key = format!("many/d{a}/e{b}/k{c:03}");
                std::fs::create_dir_all(s.root().join(BUCKET).join(format!("many/d{a}/e{b}")))
                    .unwrap();
                std::fs::write(s.root().join(BUCKET).join(&key), key.as_bytes()).unwrap();
                want.push(key.trim_start_matches("many/").to_string());
            }
        }
    }
    want.sort();
    let m = Mounted::start(&s, "s3://mnt/many/", &[]);
    let root = m.path().to_path_buf();
    let got = within(Duration::from_secs(300), move || {
        let mut got = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    let rel = e.path().strip_prefix(&root).unwrap().to_owned();
                    got.push(rel.to_str().unwrap().to_string());
                }
            }
        }
        got.sort();
        got
    });
    assert_eq!(got.len(), 10_000);
    assert_eq!(got, want);
    // `ls -R` (a real tool) sees the same number of files.
    let ls = tool("ls", &["-R".as_ref(), m.path().as_os_str()]);
    assert_eq!(ls.lines().filter(|l| l.starts_with('k')).count(), 10_000);
    // Sizes come from the listing.
    let meta = std::fs::metadata(m.path().join("d3/e4/k005")).unwrap();
    assert_eq!(meta.len(), "many/d3/e4/k005".len() as u64);
    assert!(meta.is_file());
    assert!(std::fs::metadata(m.path().join("d3")).unwrap().is_dir());
}

#[test]
fn claim_read_only() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let p = m.path();
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(
        std::fs::write(p.join("data/new.bin"), b"x").map(drop),
        "create",
    );
    erofs(
        std::fs::OpenOptions::new()
            .write(true)
            .open(p.join("data/f1.bin"))
            .map(drop),
        "open for writing",
    );
    erofs(std::fs::create_dir(p.join("data/newdir")), "mkdir");
    erofs(std::fs::remove_file(p.join("data/f1.bin")), "unlink");
    erofs(std::fs::remove_dir(p.join("data/sub")), "rmdir");
    erofs(
        std::fs::rename(p.join("data/f1.bin"), p.join("data/f1-renamed.bin")),
        "rename",
    );
    erofs(
        std::fs::set_permissions(
            p.join("data/f1.bin"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        ),
        "chmod",
    );
    // Nothing changed on the server.
    assert_eq!(source(&s, "data/f1.bin"), pattern(1, 1));
}

#[test]
fn claim_missing_is_enoent() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    for missing in [
        "data/nope.bin",
        "nope/",
        "data/sub/deep/nope",
        "data/f1.bin/x",
    ] {
        let e = std::fs::metadata(m.path().join(missing)).unwrap_err();
        let code = e.raw_os_error();
        assert!(
            code == Some(libc::ENOENT) || code == Some(libc::ENOTDIR),
            "{missing}: {e}"
        );
    }
    let e = std::fs::File::open(m.path().join("data/nope.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
}

#[test]
fn claim_changes_seen_after_ttl() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &["--metadata-ttl", "1"]);
    let f = m.path().join("data/f4.bin");
    assert_eq!(std::fs::read(&f).unwrap(), source(&s, "data/f4.bin"));
    // Replaced by a different object of another size.
    let new = pattern(1234, 50_000);
    s.put_object(BUCKET, "data/f4.bin", &new).unwrap();
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 50_000);
    assert_eq!(std::fs::read(&f).unwrap(), new);
    // And a new object appears in its directory.
    s.put_object(BUCKET, "data/appeared.txt", b"new\n").unwrap();
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(
        std::fs::read(m.path().join("data/appeared.txt")).unwrap(),
        b"new\n"
    );
}

#[test]
fn claim_disk_cache_reused_by_a_later_mount() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let cache = tempfile::tempdir().unwrap();
    let args = disk_cache_args(&cache);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let want = source(&s, "data/big.bin");
    {
        let mut m = Mounted::start(&s, "s3://mnt/", &args);
        assert_eq!(std::fs::read(m.path().join("data/big.bin")).unwrap(), want);
        assert!(m.stop().success());
    }
    // A second mount of the same bucket reads from the disk cache: every GET of the
    // object fails from now on (lookups and listings still work).
    s.faults().add(
        FaultRule::new(Fault::internal_error())
            .method("GET")
            .path_contains("/mnt/data/big.bin")
            .forever(),
    );
    let m = Mounted::start(&s, "s3://mnt/", &args);
    assert_eq!(std::fs::read(m.path().join("data/big.bin")).unwrap(), want);
    assert_eq!(
        s.faults().hits(),
        0,
        "the second mount fetched the object's data"
    );
}

#[test]
fn claim_disk_cache_shared_by_concurrent_mounts() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let cache = tempfile::tempdir().unwrap();
    let args = disk_cache_args(&cache);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mounts: Vec<Mounted> = (0..3)
        .map(|_| Mounted::start(&s, "s3://mnt/", &args))
        .collect();
    let want = source(&s, "data/big.bin");
    let paths: Vec<PathBuf> = mounts
        .iter()
        .map(|m| m.path().join("data/big.bin"))
        .collect();
    within(Duration::from_secs(120), move || {
        let readers: Vec<_> = paths
            .into_iter()
            .flat_map(|p| [p.clone(), p])
            .map(|p| std::thread::spawn(move || std::fs::read(p).unwrap()))
            .collect();
        for r in readers {
            assert!(r.join().unwrap() == want, "a mount read wrong bytes");
        }
    });
}

#[test]
fn claim_memory_stays_under_the_limit() {
    if !fuse_or_skip() {
        return;
    }
    let s = server_with(Duration::from_millis(5));
    let m = Mounted::start(&s, "s3://mnt/", &["--memory-limit", "32MiB"]);
    let pid = m.pid();
    let path = m.path().join("data/big.bin");
    let want_len = source(&s, "data/big.bin").len();
    // 24 handles reading 24 MiB each: 576 MiB if each buffered its object.
    within(Duration::from_secs(240), move || {
        let readers: Vec<_> = (0..24)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || std::fs::read(p).unwrap().len())
            })
            .collect();
        for r in readers {
            assert_eq!(r.join().unwrap(), want_len);
        }
    });
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    // The budget covers cache and read-ahead; the rest is the program itself (measured
    // about 30 MiB idle) and transient network buffers.
    assert!(
        hwm_kib < (32 + 96) * 1024,
        "peak RSS {} MiB with a 32 MiB limit",
        hwm_kib / 1024
    );
}

#[test]
fn claim_sigterm_unmounts() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let mut m = Mounted::start(&s, "s3://mnt/", &[]);
    assert!(is_mounted(m.path()));
    let st = m.stop();
    assert!(st.success(), "{st}");
    assert!(!is_mounted(m.path()));
}

#[test]
fn claim_killed_daemon_does_not_hang() {
    if !fuse_or_skip() {
        return;
    }
    // Slow responses, so the kill lands mid-read.
    let s = server_with(Duration::from_millis(300));
    let mut m = Mounted::start(&s, "s3://mnt/", &["--max-concurrency", "1"]);
    // A file that stays open across the death (a training job holds its files): the mount
    // is busy when the daemon dies.
    let held = std::fs::File::open(m.path().join("data/f1.bin")).unwrap();
    let path = m.path().join("data/big.bin");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::fs::File::open(&path).and_then(|mut f| {
            let mut sink = Vec::new();
            f.read_to_end(&mut sink).map(|_| sink.len())
        });
        let _ = tx.send(r);
    });
    std::thread::sleep(Duration::from_millis(800));
    let mut child = m.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL: no chance to unmount
    child.wait().unwrap();
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a read on a dead mount hung");
    let e = r.expect_err("a read of a killed mount cannot complete");
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::EIO) | Some(libc::ECONNABORTED)
        ),
        "unexpected error {e}"
    );
    // The watcher unmounts the dead mount (lazily, so the file held open above does not
    // keep it there).
    let p = m.path().to_path_buf();
    let end = Instant::now() + Duration::from_secs(10);
    while is_mounted(&p) {
        assert!(
            Instant::now() < end,
            "the dead mount was not unmounted: {:?}",
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter(|l| l.contains(p.to_str().unwrap()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The file held open gets an error too, not a hang.
    let mut held = held;
    let r = within(Duration::from_secs(10), move || held.read(&mut [0u8; 16]));
    assert!(r.is_err(), "a read of a dead mount returned {r:?}");
}

#[test]
fn claim_errors_name_what_is_wrong() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    // A mount point that does not exist.
    let out = stoker(&s)
        .args([
            "mount",
            "s3://mnt/",
            "/nonexistent/stoker-mnt",
            "--foreground",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/stoker-mnt"), "{err}");
    // A bucket that does not exist: the store's error, before anything is mounted.
    let dir = tempfile::tempdir().unwrap();
    let out = stoker(&s)
        .args(["mount", "s3://no-such-bucket/"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-bucket"), "{err}");
    assert!(!is_mounted(dir.path()));
}

#[test]
fn claim_background_mount_and_unmount() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    let out = stoker(&s)
        .args(["mount", "s3://mnt/"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(is_mounted(dir.path()));
    assert_eq!(
        std::fs::read(dir.path().join("data/f2.bin")).unwrap(),
        pattern(2, 4095)
    );
    let out = stoker(&s).arg("unmount").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let end = Instant::now() + Duration::from_secs(10);
    while is_mounted(dir.path()) {
        assert!(Instant::now() < end, "still mounted after stoker unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the server has seen no new request for a while (prefetches done).
fn settle(s: &TestServer) -> u64 {
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = s.requests();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = s.requests();
        if now == last || Instant::now() > end {
            return now;
        }
        last = now;
    }
}

#[test]
fn claim_in_order_opens_fetch_ahead() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    for i in 0..300 {
        let body = pattern(1000 + i, 1000);
        s.put_object(BUCKET, &format!("seq/f{i:03}"), &body)
            .unwrap();
        s.put_object(BUCKET, &format!("rnd/f{i:03}"), &body)
            .unwrap();
    }
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let read = |dir: &str, i: u64| {
        let got = std::fs::read(m.path().join(format!("{dir}/f{i:03}"))).unwrap();
        assert_eq!(got, pattern(1000 + i, 1000), "{dir}/f{i:03}");
    };
    // Counts the GETs of seq/ (a rule that delays by nothing).
    s.faults().add(
        FaultRule::new(Fault::Delay(Duration::ZERO))
            .method("GET")
            .path_contains("/seq/")
            .forever(),
    );
    // In listing order: after a few opens, the next files are already cached.
    for i in 0..3 {
        read("seq", i);
    }
    // Wait for the fetches ahead to have reached the server (however slow the machine):
    // the 3 files read and at least the 37 read below.
    let end = Instant::now() + Duration::from_secs(60);
    while s.faults().hits() < 40 {
        assert!(
            Instant::now() < end,
            "only {} GETs of seq/ after 60 s",
            s.faults().hits()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    settle(&s);
    s.faults().clear();
    // From now on the server fails every GET in seq/: the next files must come from what
    // was fetched ahead (reads keep fetching further ahead; those fetches fail, harmlessly).
    s.faults().add(
        FaultRule::new(Fault::internal_error())
            .method("GET")
            .path_contains("/seq/")
            .forever(),
    );
    for i in 3..40 {
        read("seq", i);
    }
    s.faults().clear();
    // Far apart (shuffled): nothing is fetched ahead, one GET per file.
    read("rnd", 0);
    let before = settle(&s);
    let order = [150, 10, 200, 60, 280, 120, 290];
    for i in order {
        read("rnd", i);
    }
    assert_eq!(settle(&s) - before, order.len() as u64);
}

#[test]
fn claim_random_reads_warm_a_file_that_fits() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &["--cache-memory", "256MiB"]);
    let src = source(&s, "data/big.bin");
    let f = std::fs::File::open(m.path().join("data/big.bin")).unwrap();
    let read_at = |off: usize| {
        let mut buf = vec![0u8; 4096];
        f.read_exact_at(&mut buf, off as u64).unwrap();
        assert_eq!(buf, &src[off..off + 4096], "bytes at {off}");
    };
    // Two reads far apart: random access to a 24 MiB file, which fits.
    read_at(20 * MIB + 5);
    read_at(3 * MIB + 77);
    settle(&s);
    // Every GET of it fails from now on: the rest must come from the cache.
    s.faults().add(
        FaultRule::new(Fault::internal_error())
            .method("GET")
            .path_contains("big.bin")
            .forever(),
    );
    for i in 0..40usize {
        read_at((i * 7919 * 613) % (src.len() - 4096));
    }
    s.faults().clear();
}

/// How many of `path`'s pages are in the kernel's page cache (`mincore` over a shared
/// mapping, which reports residency without reading anything).
fn pages_cached(path: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096;
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; mincore
    // writes one byte per page into a vector of that many bytes.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED, "mmap of {}", path.display());
        let mut vec = vec![0u8; len.div_ceil(page)];
        let r = libc::mincore(addr, len, vec.as_mut_ptr());
        libc::munmap(addr, len);
        assert_eq!(r, 0, "mincore of {}", path.display());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }
}

#[test]
fn claim_large_files_bypass_the_page_cache() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let big_src = source(&s, "data/big.bin");
    let small_src = source(&s, "data/f5.bin");
    // big.bin is 24 MiB, f5.bin 1 MiB: a 16 MiB threshold puts them on either side.
    let m = Mounted::start(&s, "s3://mnt/", &["--direct-io-min", "16MiB"]);
    let big = m.path().join("data/big.bin");
    let small = m.path().join("data/f5.bin");
    assert_eq!(std::fs::read(&big).unwrap(), big_src);
    assert_eq!(std::fs::read(&small).unwrap(), small_src);
    assert_eq!(
        pages_cached(&big),
        0,
        "a file above --direct-io-min was read through the page cache (does this kernel \
         have FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6+?)"
    );
    assert!(
        pages_cached(&small) > 0,
        "a small file skipped the page cache"
    );
    // The large file still maps: its bytes through mmap are the object's.
    {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(&big).unwrap();
        let len = big_src.len();
        // SAFETY: a read-only private mapping of an open file, read within its length and
        // unmapped before the file is closed.
        unsafe {
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(addr, libc::MAP_FAILED, "mmap of a direct-I/O file");
            let mapped = std::slice::from_raw_parts(addr as *const u8, len);
            assert!(
                mapped == &big_src[..],
                "mapped bytes differ from the object"
            );
            libc::munmap(addr, len);
        }
    }
    drop(m);
    // With `off`, the same read fills the page cache.
    let m = Mounted::start(&s, "s3://mnt/", &["--direct-io-min", "off"]);
    let big = m.path().join("data/big.bin");
    assert_eq!(std::fs::read(&big).unwrap(), big_src);
    assert!(
        pages_cached(&big) > 0,
        "--direct-io-min off still skipped the page cache"
    );
}

/// `stat -f`'s count of inodes: the mount reports how many it holds.
fn inodes_held(p: &Path) -> u64 {
    tool(
        "stat",
        &["-f".as_ref(), "-c".as_ref(), "%c".as_ref(), p.as_os_str()],
    )
    .trim()
    .parse()
    .unwrap()
}

#[test]
fn claim_lookup_is_one_round_trip() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    // 10,000 keys in one directory: listing it takes 10 LIST pages.
    let dir = s.root().join(BUCKET).join("huge");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..10_000 {
        std::fs::write(dir.join(format!("k{i:05}")), format!("{i}")).unwrap();
    }
    // A name that is both an object and a "directory": the directory wins.
    std::fs::write(dir.join("sub/inner"), b"x").unwrap();
    std::fs::write(s.root().join(BUCKET).join("huge-sub-twin"), b"y").unwrap();
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let before = settle(&s);
    let meta = std::fs::metadata(m.path().join("huge/k04321")).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.len(), "4321".len() as u64);
    // `huge` then `k04321`: a HEAD and a one-page LIST each, sent together.
    let used = settle(&s) - before;
    assert!(
        used <= 4,
        "{used} requests to look up one name (10 LIST pages would be 11+)"
    );
    let before = settle(&s);
    let missing = std::fs::metadata(m.path().join("huge/nope"));
    assert_eq!(missing.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    assert!(std::fs::metadata(m.path().join("huge/sub"))
        .unwrap()
        .is_dir());
    assert!(settle(&s) - before <= 4);
    // A walk over many names: after a few lookups the directory is listed in the
    // background, and then lookups in it send nothing.
    for i in 0..12 {
        assert!(std::fs::metadata(m.path().join(format!("huge/k{i:05}"))).is_ok());
    }
    let before = settle(&s);
    for i in (100..10_000).step_by(997) {
        assert!(std::fs::metadata(m.path().join(format!("huge/k{i:05}"))).is_ok());
    }
    assert_eq!(
        settle(&s) - before,
        0,
        "lookups after a listing send nothing"
    );
    let listed = std::fs::read_dir(m.path().join("huge")).unwrap().count();
    assert_eq!(listed, 10_001);
}

#[test]
fn claim_forgotten_inodes_are_dropped() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let dir = s.root().join(BUCKET).join("many-names");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..500 {
        std::fs::write(dir.join(format!("f{i:03}")), b"z").unwrap();
    }
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let base = inodes_held(m.path());
    // Listing alone keeps nothing once the directory is closed.
    assert_eq!(
        std::fs::read_dir(m.path().join("many-names"))
            .unwrap()
            .count(),
        500
    );
    assert!(
        inodes_held(m.path()) <= base + 1,
        "listing left inodes behind"
    );
    // Names looked up stay while the kernel caches them...
    for i in 0..500 {
        assert!(std::fs::metadata(dir_path(&m, i)).unwrap().is_file());
    }
    assert!(inodes_held(m.path()) >= base + 500);
    // ...and go when it forgets them.
    std::fs::write("/proc/sys/vm/drop_caches", "2")
        .expect("this test drops the kernel's dentry cache and must run as root, as CI does");
    let end = Instant::now() + Duration::from_secs(10);
    while inodes_held(m.path()) > base + 1 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        inodes_held(m.path()) <= base + 1,
        "{} inodes held after the kernel forgot them (base {base})",
        inodes_held(m.path())
    );
    // A forgotten name is looked up anew and reads as before.
    assert_eq!(std::fs::read(dir_path(&m, 7)).unwrap(), b"z");
}

fn dir_path(m: &Mounted, i: usize) -> PathBuf {
    m.path().join(format!("many-names/f{i:03}"))
}

#[test]
fn every_claim_has_a_test() {
    let doc = include_str!("../../../docs/mount.md");
    let tests = include_str!("mount.rs");
    let claimed: Vec<&str> = doc
        .match_indices("[claim: ")
        .map(|(i, _)| {
            let rest = &doc[i + "[claim: ".len()..];
            &rest[..rest.find(']').expect("claim tag closes")]
        })
        .collect();
    assert!(claimed.len() >= 10, "docs/mount.md lists its claims");
    for c in &claimed {
        assert!(
            tests.contains(&format!("fn {}{c}()", "claim_")),
            "docs/mount.md claims [{c}] but no test `claim_{c}` checks it"
        );
    }
    // Built at run time, so this test's own source does not match.
    let needle = ["fn ", "claim_"].concat();
    for (i, _) in tests.match_indices(needle.as_str()) {
        let rest = &tests[i + needle.len()..];
        let name = &rest[..rest.find('(').unwrap()];
        assert!(
            claimed.contains(&name),
            "test claim_{name} checks a claim docs/mount.md does not make"
        );
    }
}

#[test]
fn file_seek_and_read_match() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let src = source(&s, "data/f5.bin");
    let mut f = std::fs::File::open(m.path().join("data/f5.bin")).unwrap();
    f.seek(SeekFrom::Start(1000)).unwrap();
    let mut buf = [0u8; 5000];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf[..], &src[1000..6000]);
    f.seek(SeekFrom::End(-3)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, &src[src.len() - 3..]);
}

/// A source directory with entries of different modes and owners, readable by everyone
/// down to its files (so that another user can reach what the modes allow).
fn local_source() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let src = tempfile::tempdir().unwrap();
    let p = src.path();
    let set = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    set(p, 0o755);
    std::fs::write(p.join("public.txt"), b"public\n").unwrap();
    set(&p.join("public.txt"), 0o644);
    std::fs::write(p.join("secret.txt"), b"root only\n").unwrap();
    set(&p.join("secret.txt"), 0o600);
    std::fs::write(p.join("nobodys.txt"), b"nobody's\n").unwrap();
    set(&p.join("nobodys.txt"), 0o600);
    std::os::unix::fs::chown(p.join("nobodys.txt"), Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::create_dir(p.join("private")).unwrap();
    std::fs::write(p.join("private/inner.txt"), b"inner\n").unwrap();
    set(&p.join("private/inner.txt"), 0o644);
    set(&p.join("private"), 0o700);
    src
}

const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid only reads the process's credentials.
    unsafe { libc::geteuid() == 0 }
}

/// `cat path` as user `nobody`: its output, or the error it printed.
fn cat_as_nobody(path: &Path) -> Result<String, String> {
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            &NOBODY.to_string(),
            "--regid",
            &NOBODY.to_string(),
            "--clear-groups",
            "cat",
        ])
        .arg(path)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8(out.stderr).unwrap())
    }
}

#[test]
fn local_mount_shows_source_modes_and_owner() {
    use std::os::unix::fs::MetadataExt;
    if !fuse_or_skip() || !is_root() {
        return;
    }
    let s = server();
    let src = local_source();
    let m = Mounted::start(&s, src.path().to_str().unwrap(), &[]);
    for rel in ["", "public.txt", "secret.txt", "nobodys.txt", "private"] {
        let want = std::fs::metadata(src.path().join(rel)).unwrap();
        let got = std::fs::metadata(m.path().join(rel)).unwrap();
        assert_eq!(
            (got.mode() & 0o7777, got.uid(), got.gid()),
            (want.mode() & 0o7777, want.uid(), want.gid()),
            "{rel:?}"
        );
    }
    // Also through a listing (readdir, then stat of each entry).
    let long = tool("ls", &["-ln".as_ref(), m.path().as_os_str()]);
    let line = long.lines().find(|l| l.ends_with("nobodys.txt")).unwrap();
    assert!(
        line.starts_with("-rw-------") && line.contains(" 65534 65534 "),
        "{line}"
    );
}

#[test]
fn allow_other_lets_the_kernel_check_permissions() {
    if !fuse_or_skip() || !is_root() {
        return;
    }
    let s = server();
    let src = local_source();
    let m = Mounted::start(&s, src.path().to_str().unwrap(), &["--allow-other"]);
    let p = m.path();
    assert!(std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.contains(p.to_str().unwrap()) && l.contains("default_permissions")));
    assert_eq!(cat_as_nobody(&p.join("public.txt")).unwrap(), "public\n");
    assert_eq!(cat_as_nobody(&p.join("nobodys.txt")).unwrap(), "nobody's\n");
    let e = cat_as_nobody(&p.join("secret.txt")).unwrap_err();
    assert!(e.contains("Permission denied"), "{e}");
    let e = cat_as_nobody(&p.join("private/inner.txt")).unwrap_err();
    assert!(e.contains("Permission denied"), "{e}");
    // Root still reads everything.
    assert_eq!(std::fs::read(p.join("secret.txt")).unwrap(), b"root only\n");
}

#[test]
fn a_local_mount_does_not_follow_a_symlink_out_of_its_source() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"outside\n").unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("real.txt"), b"real\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), src.path().join("escape")).unwrap();
    std::os::unix::fs::symlink(outside.path(), src.path().join("escdir")).unwrap();
    std::os::unix::fs::symlink("real.txt", src.path().join("inside")).unwrap();
    let m = Mounted::start(&s, src.path().to_str().unwrap(), &[]);
    // Without a listing first (one lookup), then listed.
    assert!(std::fs::read(m.path().join("escape")).is_err());
    assert!(std::fs::read(m.path().join("escdir/secret")).is_err());
    let mut names: Vec<String> = std::fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["inside", "real.txt"]);
    assert!(std::fs::read(m.path().join("escape")).is_err());
    assert_eq!(std::fs::read(m.path().join("inside")).unwrap(), b"real\n");
}

#[test]
fn a_control_character_key_does_not_break_a_mounted_directory() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    s.put_object(BUCKET, "top\u{1b}[2J", b"x").unwrap();
    s.put_object(BUCKET, "data/bad\u{1}key", b"x").unwrap();
    s.put_object(BUCKET, "data/esc\u{1b}[31m/y", b"y").unwrap();
    // Mounting checks the root's listing first: it must not refuse.
    let m = Mounted::start(&s, "s3://mnt/", &[]);
    let names: Vec<String> = std::fs::read_dir(m.path().join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&"f1.bin".to_string()), "{names:?}");
    assert!(
        names.iter().all(|n| !n.chars().any(char::is_control)),
        "{names:?}"
    );
    let top: Vec<String> = std::fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(top, ["data"]);
    assert_eq!(
        std::fs::read(m.path().join("data/f2.bin")).unwrap(),
        pattern(2, 4095)
    );
}

#[test]
fn unmount_of_a_path_not_mounted_says_so() {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    let out = stoker(&s).arg("unmount").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{} is not a mount point", dir.path().display())),
        "{err}"
    );
    let out = stoker(&s)
        .args(["unmount", "/nonexistent/stoker-mnt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/stoker-mnt"), "{err}");
}

/// Pids of the processes whose command line holds every one of `words`.
fn pids_with(words: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                words.iter().all(|w| c.contains(w))
            })
        })
        .collect()
}

/// Whether process `pid` is gone or a zombie (it holds nothing any more).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(st) => st
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Runs `cmd` to completion, its output collected; fails the test (killing it) if it has
/// not exited within `t`, with what it printed so far and the mount table.
fn output_within(cmd: &mut Command, t: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if wait_timeout(&mut child, t).is_none() {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "{cmd:?} did not exit within {t:?}; it printed {out:?}; mounts: {:?}",
            std::fs::read_to_string("/proc/self/mountinfo").unwrap()
        );
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_stale_mount_point_says_how_to_fix_it() {
    if !fuse_or_skip() {
        return;
    }
    let s = server();
    let mut m = Mounted::start(&s, "s3://mnt/", &[]);
    let p = m.path().to_path_buf();
    // The watcher first, then the daemon: nothing is left to unmount the dead mount. The
    // watcher is the daemon's child; it must be dead before the daemon dies, or it would
    // unmount (and a mount started on the then plain directory would run for ever).
    let daemon = m.pid() as i32;
    let children_watching = || -> Vec<i32> {
        pids_with(&["stoker-mount-watcher"])
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
                    st.lines()
                        .any(|l| l.split_whitespace().eq(["PPid:", &daemon.to_string()]))
                })
            })
            .collect()
    };
    // A listing of /proc can miss a process while others start and exit (the tests beside
    // this one start and stop mounts): look again before concluding it is not there.
    let mut watchers = children_watching();
    let end = Instant::now() + Duration::from_secs(5);
    while watchers.len() != 1 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        watchers = children_watching();
    }
    assert_eq!(
        watchers.len(),
        1,
        "the daemon's watcher: {watchers:?}; every watcher: {:?}",
        pids_with(&["stoker-mount-watcher"])
    );
    signal(watchers[0] as u32, libc::SIGKILL);
    let end = Instant::now() + Duration::from_secs(20);
    while !is_dead(watchers[0]) {
        assert!(Instant::now() < end, "the watcher outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let e = within(Duration::from_secs(30), {
        let p = p.clone();
        move || std::fs::metadata(&p).unwrap_err()
    });
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    let out = output_within(
        stoker(&s)
            .args(["mount", "s3://mnt/"])
            .arg(&p)
            .args(["--foreground"]),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stale mount")
            && err.contains(&format!("run `stoker unmount {}` first", p.display())),
        "{err}"
    );
    // And that is what fixes it.
    let out = output_within(stoker(&s).arg("unmount").arg(&p), Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::metadata(&p).unwrap().is_dir());
    assert!(!is_mounted(&p));
}
