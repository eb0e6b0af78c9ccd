//! Reads, writes and listings through `object_store`'s S3 client.

use bytes::Bytes;
use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{
    Error, GetOptions, GetRange, ObjectStore as _, ObjectStoreExt as _, PutPayload, WriteMultipart,
};
use stoker_testserver::{ServerOptions, TestServer};

use crate::support::{md5_etag, pattern, store};

async fn server() -> TestServer {
    TestServer::start(ServerOptions::new().bucket("data"))
        .await
        .expect("starting the server")
}

#[tokio::test]
async fn helper_objects_roundtrip_with_consistent_etags() {
    let server = server().await;
    let s = store(&server, "data");
    let objects: Vec<(&str, Vec<u8>)> = vec![
        ("top.txt", b"top".to_vec()),
        ("dir/a b.txt", b"with a space".to_vec()),
        ("dir/ünï cödé/😀.bin", pattern(10_000)),
        ("dir/sub/plus+sign.txt", b"plus".to_vec()),
        ("dir/empty", Vec::new()),
    ];
    for (key, data) in &objects {
        server.put_object("data", key, data).unwrap();
    }
    for (key, data) in &objects {
        let path = Path::parse(*key).unwrap();
        let got = s.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], &data[..], "{key}");
        let head = s.head(&path).await.unwrap();
        assert_eq!(head.size, data.len() as u64);
        assert_eq!(
            head.e_tag.as_deref(),
            Some(md5_etag(data).as_str()),
            "{key}"
        );
    }

    let mut listed: Vec<_> = s.list(None).try_collect().await.unwrap();
    listed.sort_by(|a, b| a.location.cmp(&b.location));
    let mut keys: Vec<&str> = objects.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    let listed_keys: Vec<&str> = listed.iter().map(|m| m.location.as_ref()).collect();
    assert_eq!(listed_keys, keys);
    for meta in &listed {
        let head = s.head(&meta.location).await.unwrap();
        assert_eq!(meta.e_tag, head.e_tag, "{}", meta.location);
        assert_eq!(meta.size, head.size);
        assert!(meta.e_tag.as_deref().is_some_and(|e| e.starts_with('"')));
    }

    let top = s.list_with_delimiter(None).await.unwrap();
    let names: Vec<&str> = top.objects.iter().map(|m| m.location.as_ref()).collect();
    assert_eq!(names, ["top.txt"]);
    let prefixes: Vec<&str> = top.common_prefixes.iter().map(AsRef::as_ref).collect();
    assert_eq!(prefixes, ["dir"]);
    let dir = s
        .list_with_delimiter(Some(&Path::from("dir")))
        .await
        .unwrap();
    let mut names: Vec<&str> = dir.objects.iter().map(|m| m.location.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(names, ["dir/a b.txt", "dir/empty"]);
    let prefixes: Vec<&str> = dir.common_prefixes.iter().map(AsRef::as_ref).collect();
    assert_eq!(prefixes, ["dir/sub", "dir/ünï cödé"]);
}

#[tokio::test]
async fn s3_uploads_roundtrip_with_consistent_etags() {
    let server = server().await;
    let s = store(&server, "data");

    let path = Path::from("up/single.bin");
    let data = Bytes::from(pattern(70_000));
    let put = s.put(&path, PutPayload::from(data.clone())).await.unwrap();
    assert_eq!(put.e_tag.as_deref(), Some(md5_etag(&data).as_str()));
    assert_eq!(
        std::fs::read(server.root().join("data/up/single.bin")).unwrap(),
        data
    );

    // Multipart: the ETag is MD5-of-part-MD5s with a part count, and must survive in
    // HEAD and listings too.
    let big_path = Path::from("up/multi.bin");
    let part = 5 * 1024 * 1024;
    let big = Bytes::from(pattern(part + 1000));
    let mut w =
        WriteMultipart::new_with_chunk_size(s.put_multipart(&big_path).await.unwrap(), part);
    w.put(big.clone());
    let put_multi = w.finish().await.unwrap();
    let multi_etag = put_multi.e_tag.clone().unwrap();
    assert!(multi_etag.ends_with("-2\""), "{multi_etag}");

    let head = s.head(&big_path).await.unwrap();
    assert_eq!(head.e_tag.as_deref(), Some(multi_etag.as_str()));
    assert_eq!(head.size, big.len() as u64);
    assert_eq!(s.get(&big_path).await.unwrap().bytes().await.unwrap(), big);

    let listed: Vec<_> = s.list(Some(&Path::from("up"))).try_collect().await.unwrap();
    assert_eq!(listed.len(), 2);
    for meta in listed {
        let head = s.head(&meta.location).await.unwrap();
        assert_eq!(meta.e_tag, head.e_tag);
    }

    // Replacing an S3-uploaded (multipart) object with the helper records the new ETag.
    server
        .put_object("data", "up/multi.bin", b"replaced")
        .unwrap();
    let head = s.head(&big_path).await.unwrap();
    assert_eq!(head.e_tag.as_deref(), Some(md5_etag(b"replaced").as_str()));
}

#[tokio::test]
async fn ranged_reads() {
    let server = server().await;
    let s = store(&server, "data");
    let data = pattern(100_000);
    server.put_object("data", "r.bin", &data).unwrap();
    let path = Path::from("r.bin");

    assert_eq!(s.get_range(&path, 10..20).await.unwrap(), &data[10..20]);
    assert_eq!(s.get_range(&path, 0..100_000).await.unwrap(), &data[..]);

    let suffix = GetOptions {
        range: Some(GetRange::Suffix(100)),
        ..Default::default()
    };
    let res = s.get_opts(&path, suffix).await.unwrap();
    assert_eq!(res.range, 99_900..100_000);
    assert_eq!(res.meta.size, 100_000);
    assert_eq!(res.bytes().await.unwrap(), &data[99_900..]);

    let offset = GetOptions {
        range: Some(GetRange::Offset(99_990)),
        ..Default::default()
    };
    let res = s.get_opts(&path, offset).await.unwrap();
    assert_eq!(res.range, 99_990..100_000);
    assert_eq!(res.bytes().await.unwrap(), &data[99_990..]);

    // A range running past the end is clipped to the object ...
    let clipped = GetOptions {
        range: Some(GetRange::Bounded(99_990..100_050)),
        ..Default::default()
    };
    let res = s.get_opts(&path, clipped).await.unwrap();
    assert_eq!(res.bytes().await.unwrap(), &data[99_990..]);
    // ... and one starting past the end fails (416 InvalidRange).
    let err = s.get_range(&path, 200_000..200_010).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("416") || msg.contains("Range"), "{msg}");

    // Conditional reads, as used to detect an object changing under a reader.
    let etag = s.head(&path).await.unwrap().e_tag.unwrap();
    let ok = GetOptions {
        if_match: Some(etag.clone()),
        range: Some(GetRange::Bounded(0..4)),
        ..Default::default()
    };
    assert_eq!(
        s.get_opts(&path, ok).await.unwrap().bytes().await.unwrap(),
        &data[..4]
    );
    server.put_object("data", "r.bin", b"changed").unwrap();
    let stale = GetOptions {
        if_match: Some(etag),
        ..Default::default()
    };
    assert!(matches!(
        s.get_opts(&path, stale).await,
        Err(Error::Precondition { .. })
    ));
}

#[tokio::test]
async fn directories_are_not_objects() {
    let server = server().await;
    let s = store(&server, "data");
    server.put_object("data", "dir/inner/a", b"a").unwrap();
    for key in ["dir", "dir/inner"] {
        let path = Path::from(key);
        assert!(
            matches!(s.head(&path).await, Err(Error::NotFound { .. })),
            "head {key}"
        );
        assert!(
            matches!(s.get(&path).await, Err(Error::NotFound { .. })),
            "get {key}"
        );
        s.delete(&path).await.unwrap();
    }
    assert!(matches!(
        s.head(&Path::from("missing")).await,
        Err(Error::NotFound { .. })
    ));
    // Deleting the only object removes its now-empty directories, so the name is free.
    s.delete(&Path::from("dir/inner/a")).await.unwrap();
    s.put(&Path::from("dir"), PutPayload::from_static(b"now a file"))
        .await
        .unwrap();
    assert_eq!(
        s.get(&Path::from("dir"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
        "now a file"
    );
}

#[tokio::test]
async fn listing_pages_through_many_keys() {
    let server = server().await;
    let s = store(&server, "data");
    let n = 1500;
    for i in 0..n {
        server
            .put_object("data", &format!("many/{i:05}"), i.to_string().as_bytes())
            .unwrap();
    }
    server.put_object("data", "other", b"x").unwrap();
    let before = server.requests();
    let listed: Vec<_> = s
        .list(Some(&Path::from("many")))
        .try_collect()
        .await
        .unwrap();
    assert!(server.requests() - before >= 2, "expected several pages");
    assert_eq!(listed.len(), n);
    for (i, meta) in listed.iter().enumerate() {
        assert_eq!(meta.location.as_ref(), format!("many/{i:05}"));
        assert_eq!(
            meta.e_tag.as_deref(),
            Some(md5_etag(i.to_string().as_bytes()).as_str())
        );
    }
    let offset: Vec<_> = s
        .list_with_offset(Some(&Path::from("many")), &Path::from("many/01400"))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(offset.len(), 99);
    assert_eq!(offset[0].location.as_ref(), "many/01401");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_requests_are_fast() {
    let server = server().await;
    server.put_object("data", "small", b"tiny").unwrap();
    let s = std::sync::Arc::new(store(&server, "data"));
    let path = Path::from("small");
    s.head(&path).await.unwrap();
    // One keep-alive connection, one request at a time: Nagle's algorithm without
    // TCP_NODELAY would cost ~40 ms a request here, so at least 4 s for 100; without it
    // they take milliseconds (1.6 s seen on a heavily loaded machine).
    let t = std::time::Instant::now();
    for _ in 0..100 {
        s.get(&path).await.unwrap().bytes().await.unwrap();
    }
    let sequential = t.elapsed();
    eprintln!("100 sequential GETs: {sequential:?}");
    assert!(
        sequential < std::time::Duration::from_secs(4),
        "{sequential:?}"
    );

    // Many connections at once.
    let t = std::time::Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (s, path) = (std::sync::Arc::clone(&s), path.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    assert_eq!(s.get(&path).await.unwrap().bytes().await.unwrap(), "tiny");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    eprintln!("64x5 concurrent GETs: {:?}", t.elapsed());
    assert_eq!(server.requests(), 1 + 100 + 64 * 5);
}

#[tokio::test]
async fn files_placed_directly_get_consistent_etags() {
    for fast in [false, true] {
        let opts = ServerOptions::new().bucket("data").fast_etags(fast);
        let server = TestServer::start(opts).await.unwrap();
        let s = store(&server, "data");
        let dir = server.root().join("data/placed");
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..20 {
            std::fs::write(dir.join(format!("{i}.bin")), pattern(1000 + i)).unwrap();
        }
        let listed: Vec<_> = s
            .list(Some(&Path::from("placed")))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(listed.len(), 20);
        for meta in listed {
            let head = s.head(&meta.location).await.unwrap();
            assert_eq!(meta.e_tag, head.e_tag);
            let got = s.get(&meta.location).await.unwrap();
            assert_eq!(got.meta.e_tag, head.e_tag);
            let data = got.bytes().await.unwrap();
            let is_md5 = head.e_tag.as_deref() == Some(md5_etag(&data).as_str());
            assert_eq!(is_md5, !fast, "fast={fast}");
        }
    }
}
