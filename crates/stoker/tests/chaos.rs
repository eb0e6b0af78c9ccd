//! A chaos soak against the real S3 test server: random faults of every kind (error
//! statuses, resets, bodies cut short, slow first bytes, bodies that stall) on about one
//! request in seven, while a pipeline reads a bucket of small and large objects for
//! several epochs with a memory limit and a slow consumer, and then while `stoker mount`
//! serves the same bucket. Every object must arrive exactly once per epoch and
//! byte-exact, with no error, the budget's peak within its limit, and retries counted.
//!
//! `STOKER_CHAOS_SECS=N` repeats the pipeline's epochs until N seconds have passed
//! (default: one pass of three epochs). The mount part needs FUSE, as in `tests/mount.rs`
//! (STOKER_SKIP_FUSE_TESTS=1 skips it where there is none).

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use stoker_core::Value;
use stoker_pipeline::{FormatChoice, Item, Pipeline, RunOptions};
use stoker_store::StoreOptions;
use stoker_testserver::{Chaos, FaultCounts, FaultKind, ServerOptions, TestServer};

mod common;
use common::mounted::Mounted;

const BUCKET: &str = "chaos";
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const OBJECTS: usize = 200;
const LARGE: usize = 6;
const MEMORY_LIMIT: u64 = 64 << 20;
const PART_SIZE: u64 = 1 << 20;
const EPOCHS: u64 = 3;

/// Deterministic bytes for object `seed`.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn hash(bytes: &[u8]) -> (u64, usize) {
    // SipHash with fixed keys: the same bytes, the same hash, within and across runs.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    h.write(bytes);
    (h.finish(), bytes.len())
}

/// The server with `OBJECTS` objects under `d/`: most 1-64 KiB, `LARGE` of 2-8 MiB (read
/// as ranged parts); their hashes and lengths by sample key (`d/` and `.bin` stripped).
fn server() -> (TestServer, HashMap<String, (u64, usize)>) {
    let s = TestServer::start_blocking(ServerOptions::new().bucket(BUCKET)).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261203);
    let mut want = HashMap::new();
    for i in 0..OBJECTS {
        let len = if i % (OBJECTS / LARGE) == 7 {
            rng.random_range(2 * MIB..=8 * MIB)
        } else {
            rng.random_range(KIB..=64 * KIB)
        };
        let data = content(i as u64 + 1, len);
        let key = format!("{i:03}");
        s.put_object(BUCKET, &format!("d/{key}.bin"), &data)
            .unwrap();
        want.insert(key, hash(&data));
    }
    (s, want)
}

/// Chaos on: p = 0.15 of every kind (`STOKER_CHAOS_KINDS=status,short` for some), seed 1
/// (`STOKER_CHAOS_SEED`), delays and stalls of at most 300 ms, cuts and stalls within the
/// first 16 KiB (so that most bodies, small ones too, are long enough to be hit).
fn chaos_on(s: &TestServer) {
    let kinds: Vec<FaultKind> = match std::env::var("STOKER_CHAOS_KINDS") {
        Ok(v) => v
            .split(',')
            .map(|k| FaultKind::from_name(k.trim()).expect("a fault kind"))
            .collect(),
        Err(_) => FaultKind::ALL.to_vec(),
    };
    let seed = std::env::var("STOKER_CHAOS_SEED").map_or(1, |v| v.parse().expect("a seed"));
    s.faults().set_chaos(Some(
        Chaos::new(0.15, &kinds, seed)
            .max_delay(Duration::from_millis(300))
            .max_offset(16 * KIB as u64),
    ));
}

/// Faults per kind between two counts, e.g. `status=3 reset=1 ...`, and their total.
fn faults_since(before: &FaultCounts, after: &FaultCounts) -> (u64, String) {
    let n = |k: FaultKind| after.get(k) - before.get(k);
    let line = FaultKind::ALL
        .iter()
        .map(|k| format!("{}={}", k.name(), n(*k)))
        .collect::<Vec<_>>()
        .join(" ");
    (FaultKind::ALL.into_iter().map(n).sum(), line)
}

fn pipeline(s: &TestServer) -> Pipeline {
    let o = StoreOptions::default()
        .with_endpoint(s.endpoint())
        .with_credentials(s.access_key(), s.secret_key())
        .with_region(s.region())
        .with_part_size(PART_SIZE);
    Pipeline::from_url(&format!("s3://{BUCKET}/d/"), o, FormatChoice::Files)
        .shuffle_shards(true)
        .shuffle(16)
        .seed(11)
        .epochs(Some(EPOCHS))
        .options(
            RunOptions::default()
                .with_threads(2)
                .with_memory_limit(MEMORY_LIMIT),
        )
}

/// The key and the hash of the bytes of one delivered sample.
fn sample_hash(item: &Item) -> (String, (u64, usize)) {
    let Item::Sample(s) = item else {
        panic!("expected samples, got {item:?}")
    };
    let key = s.key().unwrap().to_string();
    let Some(Value::Bytes(b)) = s.get("bin") else {
        panic!("{key}: no bytes under `bin`: {s:?}")
    };
    (key, hash(b))
}

#[derive(Default)]
struct Totals {
    runs: u64,
    epochs: u64,
    delivered: u64,
    expected: u64,
    mismatches: u64,
    missing_or_repeated: u64,
    errors: Vec<String>,
    retries: u64,
    resumes: u64,
    failed_reads: u64,
    http_requests: u64,
    get_requests: u64,
    peak: u64,
}

/// One run of `EPOCHS` epochs, checked epoch by epoch, into `t`.
fn one_run(s: &TestServer, want: &HashMap<String, (u64, usize)>, first_epoch: u64, t: &mut Totals) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(first_epoch);
    let mut run = pipeline(s).first_epoch(first_epoch).run().unwrap();
    let mut epoch: HashMap<String, u32> = HashMap::new();
    let mut in_epoch = 0usize;
    for item in run.by_ref() {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                t.errors.push(format!("{e:#}"));
                break;
            }
        };
        let (key, got) = sample_hash(&item);
        t.delivered += 1;
        match want.get(&key) {
            Some(w) if *w == got => {}
            w => {
                t.mismatches += 1;
                eprintln!("MISMATCH {key}: want {w:?}, got {got:?}");
            }
        }
        *epoch.entry(key).or_default() += 1;
        in_epoch += 1;
        if in_epoch == want.len() {
            check_epoch(&epoch, want, t);
            epoch.clear();
            in_epoch = 0;
        }
        // A slow consumer.
        std::thread::sleep(Duration::from_millis(rng.random_range(1..=5)));
    }
    if in_epoch != 0 {
        check_epoch(&epoch, want, t);
    }
    let st = run.stats();
    let m = st.storage.expect("a store's metrics");
    if std::env::var_os("STOKER_CHAOS_DEBUG").is_some() {
        eprintln!("{m:?}");
    }
    t.runs += 1;
    t.expected += EPOCHS * want.len() as u64;
    t.retries += m.retries;
    t.resumes += m.resumes;
    t.failed_reads += m.failed_reads;
    t.http_requests += m.http_requests;
    t.get_requests += m.get_requests;
    t.peak = t.peak.max(st.memory.peak);
    assert_eq!(st.memory.limit, MEMORY_LIMIT);
}

fn check_epoch(seen: &HashMap<String, u32>, want: &HashMap<String, (u64, usize)>, t: &mut Totals) {
    t.epochs += 1;
    for k in want.keys() {
        match seen.get(k) {
            Some(1) => {}
            n => {
                t.missing_or_repeated += 1;
                eprintln!("epoch {}: {k} delivered {n:?} times", t.epochs);
            }
        }
    }
    for (k, n) in seen {
        if !want.contains_key(k) {
            t.missing_or_repeated += 1;
            eprintln!("epoch {}: unknown key {k} delivered {n} times", t.epochs);
        }
    }
}

#[test]
fn chaos_soak_pipeline_then_mount() {
    let secs: u64 = std::env::var("STOKER_CHAOS_SECS")
        .ok()
        .map(|v| v.parse().expect("STOKER_CHAOS_SECS is a number of seconds"))
        .unwrap_or(0);
    let (s, want) = server();
    let large = want
        .values()
        .filter(|(_, n)| *n > PART_SIZE as usize)
        .count();
    assert_eq!(large, LARGE);
    chaos_on(&s);
    let start = Instant::now();
    let requests_before = s.requests();
    let mut t = Totals::default();
    loop {
        one_run(&s, &want, t.epochs, &mut t);
        if !t.errors.is_empty() || start.elapsed() >= Duration::from_secs(secs) {
            break;
        }
    }
    let faults = s.faults().counts();
    let (nfaults, by_kind) = faults_since(&FaultCounts::default(), &faults);
    eprintln!(
        "chaos figures (pipeline): {:.1} s, {} runs, {} epochs; server requests {}, faults {} \
         ({}); store http requests {}, GETs {}, retries {}, resumes {}, failed reads {}, \
         errors {}; budget peak {:.1} MiB of {} MiB; samples {}/{}; mismatches {}, missing or \
         repeated {}",
        start.elapsed().as_secs_f64(),
        t.runs,
        t.epochs,
        s.requests() - requests_before,
        nfaults,
        by_kind,
        t.http_requests,
        t.get_requests,
        t.retries,
        t.resumes,
        t.failed_reads,
        t.errors.len(),
        t.peak as f64 / MIB as f64,
        MEMORY_LIMIT >> 20,
        t.delivered,
        t.expected,
        t.mismatches,
        t.missing_or_repeated,
    );
    assert!(t.errors.is_empty(), "the run failed: {:?}", t.errors);
    assert_eq!(t.mismatches, 0, "samples whose bytes differ");
    assert_eq!(
        t.missing_or_repeated, 0,
        "objects not delivered once per epoch"
    );
    assert_eq!(t.delivered, t.expected);
    assert!(
        t.peak <= MEMORY_LIMIT,
        "budget peak {} over the limit {MEMORY_LIMIT}",
        t.peak
    );
    // Every error status and reset is retried (they all hit the pipeline's requests, and a
    // finished run leaves none in flight); cut bodies are retried too, when the cut falls
    // inside the body.
    assert!(
        t.retries >= faults.status + faults.reset,
        "{} error statuses and resets, {} retries counted",
        faults.status + faults.reset,
        t.retries
    );

    mount_reads_every_file_byte_exact(&s, &want);
}

/// Whether FUSE tests can run here; panics with what is missing unless told to skip.
fn fuse_or_skip() -> bool {
    if let Err(e) = stoker_mount::check_fuse() {
        if std::env::var_os("STOKER_SKIP_FUSE_TESTS").is_some() {
            eprintln!("STOKER_SKIP_FUSE_TESTS is set: not running the mount part ({e})");
            return false;
        }
        panic!("{e} (set STOKER_SKIP_FUSE_TESTS=1 to run the other tests without FUSE)");
    }
    true
}

fn mount_reads_every_file_byte_exact(s: &TestServer, want: &HashMap<String, (u64, usize)>) {
    if !fuse_or_skip() {
        return;
    }
    let before = s.faults().counts();
    let requests_before = s.requests();
    let start = Instant::now();
    let m = Mounted::start(s, &format!("s3://{BUCKET}/"), &[]);
    let dir = m.path().join("d");
    let want_owned = want.clone();
    let (mismatches, read) = within(Duration::from_secs(300), move || {
        let mut mismatches = Vec::new();
        let mut read = 0u64;
        let mut keys: Vec<_> = want_owned.keys().cloned().collect();
        keys.sort();
        for k in keys {
            let p = dir.join(format!("{k}.bin"));
            match std::fs::read(&p) {
                Ok(b) => {
                    read += b.len() as u64;
                    if hash(&b) != want_owned[&k] {
                        mismatches.push(format!("{k}: bytes differ (len {})", b.len()));
                    }
                }
                Err(e) => mismatches.push(format!("{k}: {e}")),
            }
        }
        (mismatches, read)
    });
    let (nfaults, by_kind) = faults_since(&before, &s.faults().counts());
    eprintln!(
        "chaos figures (mount): {:.1} s, {} files, {:.1} MiB read; server requests {}, faults \
         {} ({}); mismatches or errors {}",
        start.elapsed().as_secs_f64(),
        want.len(),
        read as f64 / MIB as f64,
        s.requests() - requests_before,
        nfaults,
        by_kind,
        mismatches.len(),
    );
    assert!(mismatches.is_empty(), "through the mount: {mismatches:?}");
    drop(m);
}

/// Runs `f` on its own thread; fails the test if it takes longer than `t` (a hung mount
/// must fail a test, not hang it).
fn within<T: Send + 'static>(t: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(t).expect("reading through the mount hung")
}
