//! Property tests of the read path: any interleaving of reads (whole gets, ranged gets,
//! streams, readers seeking anywhere, concurrent readers) returns exactly the object's bytes,
//! and memory never exceeds the budget, whatever the part size and cache size.

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use proptest::prelude::*;
use stoker_store::{Store, StoreOptions};

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    Range(usize, u64, u64),
    Stream(usize, u64, u64),
    ReadAt(usize, u64, u64),
    ReaderScan(usize, u64),
    Concurrent(usize, u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let obj = 0usize..3;
    prop_oneof![
        obj.clone().prop_map(Op::Get),
        (obj.clone(), any::<u64>(), any::<u64>()).prop_map(|(o, a, b)| Op::Range(o, a, b)),
        (obj.clone(), any::<u64>(), any::<u64>()).prop_map(|(o, a, b)| Op::Stream(o, a, b)),
        (obj.clone(), any::<u64>(), any::<u64>()).prop_map(|(o, a, b)| Op::ReadAt(o, a, b)),
        (obj.clone(), 1u64..5000).prop_map(|(o, c)| Op::ReaderScan(o, c)),
        (obj, any::<u64>(), any::<u64>()).prop_map(|(o, a, b)| Op::Concurrent(o, a, b)),
    ]
}

fn span(a: u64, b: u64, size: u64) -> (u64, u64) {
    if size == 0 {
        return (0, 0);
    }
    let x = a % (size + 1);
    let y = b % (size + 1);
    (x.min(y), x.max(y))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn reads_return_exactly_the_objects_bytes(
        sizes in proptest::collection::vec(0usize..20_000, 3),
        part in 512u64..4096,
        cache in 0u64..40_000,
        budget in 8_192u64..200_000,
        ops in proptest::collection::vec(op(), 1..24),
        seed in any::<u32>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let opts = StoreOptions::default()
                .with_part_size(part)
                .with_cache_memory(cache)
                .with_memory_limit(budget)
                .with_read_ahead(256, 8192)
                .with_max_concurrency(4);
            let store = Store::open(&format!("memory://prop-{seed}"), opts).unwrap();
            let mut objects = Vec::new();
            for (i, n) in sizes.iter().enumerate() {
                let data: Vec<u8> = (0..*n).map(|j| (j as u32 ^ seed ^ (i as u32 * 7919)) as u8).collect();
                store
                    .backend()
                    .put(&Path::from(format!("o{i}")), PutPayload::from(data.clone()))
                    .await
                    .unwrap();
                objects.push(data);
            }
            for op in ops {
                match op {
                    Op::Get(o) => {
                        let got = store.get(&format!("o{o}")).await.unwrap();
                        assert_eq!(&got[..], &objects[o][..]);
                    }
                    Op::Range(o, a, b) => {
                        let (s, e) = span(a, b, objects[o].len() as u64);
                        let got = store.get_range(&format!("o{o}"), s..e).await.unwrap();
                        assert_eq!(&got[..], &objects[o][s as usize..e as usize]);
                    }
                    Op::Stream(o, a, b) => {
                        let (s, e) = span(a, b, objects[o].len() as u64);
                        let parts: Vec<bytes::Bytes> = store
                            .read_stream(&format!("o{o}"), Some(s..e))
                            .await
                            .unwrap()
                            .try_collect()
                            .await
                            .unwrap();
                        assert_eq!(parts.concat(), &objects[o][s as usize..e as usize]);
                    }
                    Op::ReadAt(o, a, b) => {
                        let (s, e) = span(a, b, objects[o].len() as u64);
                        let mut r = store.reader(&format!("o{o}")).await.unwrap();
                        let got = r.read_at(s, (e - s) as usize).await.unwrap();
                        assert_eq!(&got[..], &objects[o][s as usize..e as usize]);
                        // Then continue sequentially from there to the end.
                        let mut rest = Vec::new();
                        loop {
                            let b = r.read(777).await.unwrap();
                            if b.is_empty() { break; }
                            rest.extend_from_slice(&b);
                        }
                        assert_eq!(&rest[..], &objects[o][e as usize..]);
                    }
                    Op::ReaderScan(o, chunk) => {
                        let mut r = store.reader(&format!("o{o}")).await.unwrap();
                        let mut all = Vec::new();
                        loop {
                            let b = r.read(chunk as usize).await.unwrap();
                            if b.is_empty() { break; }
                            all.extend_from_slice(&b);
                        }
                        assert_eq!(&all[..], &objects[o][..]);
                    }
                    Op::Concurrent(o, a, b) => {
                        let (s, e) = span(a, b, objects[o].len() as u64);
                        let key = format!("o{o}");
                        let tasks: Vec<_> = (0..4)
                            .map(|_| {
                                let st = store.clone();
                                let k = key.clone();
                                tokio::spawn(async move { st.get_range(&k, s..e).await })
                            })
                            .collect();
                        for t in tasks {
                            let got = t.await.unwrap().unwrap();
                            assert_eq!(&got[..], &objects[o][s as usize..e as usize]);
                        }
                    }
                }
                let m = store.metrics();
                assert!(m.memory_used <= m.memory_limit, "{m:?}");
                assert!(m.cache.memory_bytes <= cache, "cache over its budget: {m:?}");
            }
        });
    }
}
