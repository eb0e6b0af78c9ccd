//! One conformance suite, run against every backend: in-process memory, local files, and the
//! real S3-compatible test server on loopback. The same functions, the same expectations.

use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use stoker_store::{Error, ListOptions, SkipReason, Store, StoreOptions};
use stoker_testserver::{ServerOptions, TestServer};

/// A store plus the prefix the suite may write under.
struct Fixture {
    store: Store,
    prefix: String,
    _keep: Option<Box<dyn std::any::Any + Send>>,
}

impl Fixture {
    async fn put(&self, key: &str, data: &[u8]) {
        let full = format!("{}{key}", self.prefix);
        self.store
            .backend()
            .put(
                &Path::parse(full.as_str()).unwrap(),
                PutPayload::from(data.to_vec()),
            )
            .await
            .unwrap_or_else(|e| panic!("put {full}: {e}"));
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

fn small_parts() -> StoreOptions {
    // Small parts so that multi-part paths are exercised with small objects.
    StoreOptions::default()
        .with_part_size(64 * 1024)
        .with_memory_limit(64 << 20)
        .with_retries(2, Duration::from_secs(10))
}

async fn memory(name: &str) -> Fixture {
    Fixture {
        store: Store::open(&format!("memory://{name}"), small_parts()).unwrap(),
        prefix: "suite/".into(),
        _keep: None,
    }
}

async fn local() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir
        .path()
        .to_str()
        .unwrap()
        .trim_start_matches('/')
        .to_string();
    Fixture {
        // Local files are not block-cached by default (see below); the suite still runs the
        // cached read path over them.
        store: Store::open(
            dir.path().to_str().unwrap(),
            small_parts().with_cache_memory(32 << 20),
        )
        .unwrap(),
        prefix: format!("{root}/suite/"),
        _keep: Some(Box::new(dir)),
    }
}

async fn s3() -> Fixture {
    let server = TestServer::start(ServerOptions::new().bucket("conf"))
        .await
        .unwrap();
    let opts = small_parts()
        .with_endpoint(server.endpoint())
        .with_credentials(server.access_key(), server.secret_key())
        .with_region(server.region());
    Fixture {
        store: Store::open("s3://conf/", opts).unwrap(),
        prefix: "suite/".into(),
        _keep: Some(Box::new(server)),
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn suite(f: Fixture) {
    let big = pattern(300 * 1024 + 7, 1); // several parts, last one partial
    let small = pattern(1000, 2);
    f.put("a/big.bin", &big).await;
    f.put("a/small.bin", &small).await;
    f.put("a/empty.bin", b"").await;
    f.put("b/with space.txt", b"space").await;
    f.put("b/unicod\u{e9}-\u{65e5}\u{672c}.txt", b"unicode")
        .await;
    f.put("b/deeper/c.txt", b"deep").await;

    // Whole objects.
    assert_eq!(f.store.get(&f.key("a/big.bin")).await.unwrap(), big);
    assert_eq!(f.store.get(&f.key("a/small.bin")).await.unwrap(), small);
    assert!(f.store.get(&f.key("a/empty.bin")).await.unwrap().is_empty());
    assert_eq!(
        &f.store.get(&f.key("b/with space.txt")).await.unwrap()[..],
        b"space"
    );
    assert_eq!(
        &f.store
            .get(&f.key("b/unicod\u{e9}-\u{65e5}\u{672c}.txt"))
            .await
            .unwrap()[..],
        b"unicode"
    );
    // Second read comes from the cache and is still right.
    assert_eq!(f.store.get(&f.key("a/big.bin")).await.unwrap(), big);

    // Ranged reads at the edges.
    let k = f.key("a/big.bin");
    let n = big.len() as u64;
    assert_eq!(f.store.get_range(&k, 0..1).await.unwrap(), big[..1]);
    assert_eq!(
        f.store.get_range(&k, n - 1..n).await.unwrap(),
        big[big.len() - 1..]
    );
    assert_eq!(
        f.store.get_range(&k, 65_530..65_540).await.unwrap(),
        big[65_530..65_540],
        "a range across a part boundary"
    );
    assert_eq!(f.store.get_range(&k, 0..n).await.unwrap(), big);
    assert!(f.store.get_range(&k, 5..5).await.unwrap().is_empty());
    let e = f.store.get_range(&k, n - 1..n + 1).await.unwrap_err();
    assert!(matches!(e, Error::RangeOutOfBounds { .. }), "{e}");
    assert!(
        e.to_string().contains("big.bin"),
        "error names the object: {e}"
    );
    let e = f
        .store
        .get_range(&f.key("a/empty.bin"), 0..1)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::RangeOutOfBounds { size: 0, .. }), "{e}");

    // Streams and readers deliver exactly the bytes.
    let parts: Vec<bytes::Bytes> = f
        .store
        .read_stream(&k, Some(1000..n - 1000))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(parts.concat(), big[1000..big.len() - 1000]);
    let mut r = f.store.reader(&k).await.unwrap();
    let mut all = Vec::new();
    loop {
        let b = r.read(10_000).await.unwrap();
        if b.is_empty() {
            break;
        }
        all.extend_from_slice(&b);
    }
    assert_eq!(all, big);
    assert_eq!(r.read_at(12_345, 100).await.unwrap(), big[12_345..12_445]);

    // Missing objects: a not-found error that names the URL.
    let e = f.store.get(&f.key("a/missing.bin")).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(e.to_string().contains("a/missing.bin"), "{e}");
    let e = f.store.head(&f.key("a/missing.bin")).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let e = f.store.get_range(&f.key("nope"), 0..1).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");

    // Listing: flat stream, fan-out, one level, globs.
    let flat: Vec<String> = f
        .store
        .list(&f.prefix, &ListOptions::default())
        .map_ok(|o| o.key)
        .try_collect()
        .await
        .unwrap();
    let mut want: Vec<String> = [
        "a/big.bin",
        "a/empty.bin",
        "a/small.bin",
        "b/deeper/c.txt",
        "b/unicod\u{e9}-\u{65e5}\u{672c}.txt",
        "b/with space.txt",
    ]
    .iter()
    .map(|k| f.key(k))
    .collect();
    want.sort();
    let mut flat_sorted = flat.clone();
    flat_sorted.sort();
    assert_eq!(flat_sorted, want);
    let tree: Vec<String> = f
        .store
        .list_all(&f.prefix, &ListOptions::default())
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(tree, want, "fan-out listing is complete and in key order");
    let level = f.store.list_dir(&f.key("b")).await.unwrap();
    assert_eq!(level.prefixes, vec![f.key("b/deeper/")]);
    assert_eq!(level.objects.len(), 2);
    let sizes: Vec<u64> = f
        .store
        .list_all(&f.key("a/"), &ListOptions::default())
        .await
        .unwrap()
        .iter()
        .map(|o| o.size)
        .collect();
    assert_eq!(sizes, vec![big.len() as u64, 0, small.len() as u64]);
    let txt = f
        .store
        .list_all(&f.prefix, &ListOptions::default().with_glob("**/*.txt"))
        .await
        .unwrap();
    assert_eq!(txt.len(), 3);
    let empty = f
        .store
        .list_all(&f.key("zzz/"), &ListOptions::default())
        .await
        .unwrap();
    assert!(empty.is_empty());

    // fetch_many yields in the order asked, including objects read before and missing ones.
    let keys = vec![
        f.key("a/small.bin"),
        f.key("b/with space.txt"),
        f.key("a/big.bin"),
        f.key("a/empty.bin"),
    ];
    let got: Vec<_> = f
        .store
        .fetch_many(keys.clone(), Default::default())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(got.iter().map(|o| o.key.clone()).collect::<Vec<_>>(), keys);
    assert_eq!(got[2].bytes, big);
    let res: Vec<_> = futures::StreamExt::collect::<Vec<_>>(f.store.fetch_many(
        vec![f.key("a/small.bin"), f.key("a/nothing")],
        Default::default(),
    ))
    .await;
    assert!(res[0].is_ok());
    assert!(res[1].as_ref().unwrap_err().is_not_found());

    let m = f.store.metrics();
    assert!(m.bytes_read >= big.len() as u64);
    assert!(m.cache.hits > 0, "second reads hit the cache: {m:?}");
    assert!(m.memory_used <= m.memory_limit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_memory() {
    suite(memory("conformance").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_local_files() {
    suite(local().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_s3_server() {
    suite(s3().await).await;
}

#[test]
fn local_files_are_not_block_cached_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    assert!(!Store::open(path, StoreOptions::default()).unwrap().caches());
    let asked = StoreOptions::default().with_cache_memory(1 << 20);
    assert!(Store::open(path, asked).unwrap().caches());
    assert!(Store::open("memory://c", StoreOptions::default())
        .unwrap()
        .caches());
    let s3 = StoreOptions::default().with_endpoint("http://127.0.0.1:1");
    assert!(Store::open("s3://bucket/", s3).unwrap().caches());
}

/// Local files are read in chunks of several MiB, each one positioned read: a part larger
/// than a chunk, ranges across a chunk's end, and whole small files all come back intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_reads_span_chunks_and_parts() {
    let dir = tempfile::tempdir().unwrap();
    let big = pattern((9 << 20) + 123, 3); // more than two 4 MiB chunks in one 16 MiB part
    let small = pattern(110_000, 4);
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    std::fs::write(dir.path().join("small.bin"), &small).unwrap();
    let root = dir.path().to_str().unwrap().trim_start_matches('/');
    for part in [16 << 20, 3 << 20] {
        let store = Store::open(
            dir.path().to_str().unwrap(),
            StoreOptions::default().with_part_size(part),
        )
        .unwrap();
        let k = format!("{root}/big.bin");
        assert_eq!(store.get(&k).await.unwrap(), big, "part size {part}");
        let edge = 4u64 << 20;
        assert_eq!(
            store.get_range(&k, edge - 5..edge + 5).await.unwrap(),
            big[edge as usize - 5..edge as usize + 5]
        );
        let n = big.len() as u64;
        assert_eq!(
            store.get_range(&k, n - 70_000..n).await.unwrap(),
            big[big.len() - 70_000..]
        );
        let s = store.get(&format!("{root}/small.bin")).await.unwrap();
        assert_eq!(s, small);
    }
}

/// A listing of a bucket the server does not have is "not found" (S3 answers 404
/// NoSuchBucket), the same kind of error as a missing object, not a generic request failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_a_missing_bucket_is_not_found() {
    let server = TestServer::start(ServerOptions::new().bucket("conf"))
        .await
        .unwrap();
    let opts = StoreOptions::default()
        .with_endpoint(server.endpoint())
        .with_credentials(server.access_key(), server.secret_key())
        .with_region(server.region())
        .with_retries(1, Duration::from_secs(5));
    let store = Store::open("s3://no-such-bucket/", opts).unwrap();
    let e = store
        .list_all("data/", &ListOptions::default())
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(e.to_string().contains("s3://no-such-bucket/data/"), "{e}");
}

async fn keys_of(store: &Store, prefix: &str) -> Vec<String> {
    store
        .list(prefix, &ListOptions::default())
        .map_ok(|o| o.key)
        .try_collect()
        .await
        .unwrap()
}

/// Keys with control characters (and a sub-prefix holding one) are left out of every kind
/// of listing, each named in `skipped`, and the rest of the prefix lists and reads as
/// before: one such key used to fail the whole listing (object_store cannot parse it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_character_key_does_not_break_its_prefix() {
    let server = TestServer::start(ServerOptions::new().bucket("keys"))
        .await
        .unwrap();
    for k in [
        "d/ok.txt",
        "d/bad\u{1}key",
        "d/esc\u{1b}]0;pwned\u{7}",
        "d/sub/x.txt",
        "d/new\nline/y.txt",
    ] {
        server.put_object("keys", k, k.as_bytes()).unwrap();
    }
    let opts = small_parts()
        .with_endpoint(server.endpoint())
        .with_credentials(server.access_key(), server.secret_key())
        .with_region(server.region());
    let store = Store::open("s3://keys/", opts).unwrap();

    let level = store.list_dir("d/").await.unwrap();
    let objects: Vec<&str> = level.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(objects, ["d/ok.txt"]);
    assert_eq!(level.prefixes, ["d/sub/"]);
    let mut skipped: Vec<(&str, SkipReason)> = level
        .skipped
        .iter()
        .map(|s| (s.key.as_str(), s.reason))
        .collect();
    skipped.sort_by_key(|(k, _)| *k);
    assert_eq!(
        skipped,
        [
            ("d/bad\u{1}key", SkipReason::ControlCharacter),
            ("d/esc\u{1b}]0;pwned\u{7}", SkipReason::ControlCharacter),
            ("d/new\nline/", SkipReason::ControlCharacter),
        ]
    );

    let (all, skipped) = store
        .list_all_and_skipped("d/", &ListOptions::default())
        .await
        .unwrap();
    let all: Vec<&str> = all.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(all, ["d/ok.txt", "d/sub/x.txt"]);
    assert_eq!(skipped.len(), 3);
    assert_eq!(keys_of(&store, "d/").await, ["d/ok.txt", "d/sub/x.txt"]);
    assert!(store.dir_exists("d/sub/").await.unwrap());
    assert_eq!(&store.get("d/ok.txt").await.unwrap()[..], b"d/ok.txt");

    // The root of the bucket too (the mount checks it before mounting).
    let top = store.list_dir("").await.unwrap();
    assert_eq!(top.prefixes, ["d/"]);
}

/// The same for local directories: names that cannot be keys are skipped and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_character_file_name_does_not_break_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("ok.txt"), b"ok").unwrap();
    std::fs::write(root.join("bad\u{1}key"), b"bad").unwrap();
    std::fs::create_dir(root.join("esc\u{1b}[31m")).unwrap();
    std::fs::write(root.join("esc\u{1b}[31m/inside"), b"in").unwrap();
    let store = Store::open(root.to_str().unwrap(), StoreOptions::default()).unwrap();
    let rk = format!("{}/", root.to_str().unwrap().trim_start_matches('/'));
    let level = store.list_dir(&rk).await.unwrap();
    assert_eq!(level.objects.len(), 1);
    assert_eq!(level.skipped.len(), 2);
    let (all, skipped) = store
        .list_all_and_skipped(&rk, &ListOptions::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(skipped.len(), 2);
    assert_eq!(keys_of(&store, &rk).await, [format!("{rk}ok.txt")]);
}

/// Local symbolic links: followed inside the root, left out (and counted) when they lead
/// out of it, refused with the path when opened directly; `follow_symlinks=true` follows
/// them all. A store over the whole file system (as pipelines share) keeps each listing
/// inside what it lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_out_of_the_root_is_not_followed() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"secret").unwrap();
    std::fs::create_dir(outside.path().join("dir")).unwrap();
    std::fs::write(outside.path().join("dir/more"), b"more").unwrap();
    let src = tempfile::tempdir().unwrap();
    let root = src.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/real"), b"real").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), root.join("sub/out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("dir"), root.join("outdir")).unwrap();
    std::os::unix::fs::symlink("../sub/real", root.join("sub/in")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("indir")).unwrap();
    let rk = root.to_str().unwrap().trim_start_matches('/').to_string();
    let k = |rel: &str| format!("{rk}/{rel}");

    for store in [
        Store::open(root.to_str().unwrap(), StoreOptions::default()).unwrap(),
        Store::open("/", StoreOptions::default()).unwrap(),
    ] {
        let (all, skipped) = store
            .list_all_and_skipped(&k(""), &ListOptions::default())
            .await
            .unwrap();
        let all: Vec<String> = all.into_iter().map(|o| o.key).collect();
        assert_eq!(
            all,
            [
                k("indir/in"),
                k("indir/out"),
                k("indir/real"),
                k("sub/in"),
                k("sub/real")
            ]
            .iter()
            .filter(|key| !key.ends_with("/out"))
            .cloned()
            .collect::<Vec<_>>()
        );
        let skipped: Vec<(String, SkipReason)> =
            skipped.into_iter().map(|s| (s.key, s.reason)).collect();
        assert!(
            skipped.contains(&(k("outdir/"), SkipReason::SymlinkOutOfRoot))
                && skipped.contains(&(k("sub/out"), SkipReason::SymlinkOutOfRoot)),
            "{skipped:?}"
        );
        let mut flat = keys_of(&store, &k("")).await;
        flat.sort();
        assert_eq!(flat, all);
        assert_eq!(&store.get(&k("sub/in")).await.unwrap()[..], b"real");
        assert_eq!(&store.get(&k("indir/real")).await.unwrap()[..], b"real");
    }
    // Opened directly through the store of the directory: refused, naming the path.
    let store = Store::open(root.to_str().unwrap(), StoreOptions::default()).unwrap();
    for rel in ["sub/out", "outdir/more"] {
        let e = store.get(&k(rel)).await.unwrap_err();
        assert!(matches!(e, Error::PermissionDenied { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(rel) && text.contains("symbolic link"),
            "{text}"
        );
        assert!(store.head(&k(rel)).await.is_err());
    }
    assert!(store.list_dir(&k("outdir/")).await.is_err());
    // Allowed explicitly.
    let follow = Store::open(
        root.to_str().unwrap(),
        StoreOptions::from_pairs([("follow_symlinks", "true")]).unwrap(),
    )
    .unwrap();
    assert_eq!(&follow.get(&k("sub/out")).await.unwrap()[..], b"secret");
    let (all, skipped) = follow
        .list_all_and_skipped(&k(""), &ListOptions::default())
        .await
        .unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert!(all.iter().any(|o| o.key == k("outdir/more")));
}
