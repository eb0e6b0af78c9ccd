//! Tests of the block cache through its public interface.

use std::collections::{BTreeMap, HashMap};
use std::future::pending;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use stoker_core::MemoryBudget;

use super::*;

/// A plain byte-weighted LRU, the baseline the policy is compared with.
pub(super) struct Lru {
    cap: u64,
    used: u64,
    tick: u64,
    map: HashMap<u64, (u64, u64)>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    pub(super) fn new(cap: u64) -> Self {
        Lru {
            cap,
            used: 0,
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// Whether `k` was a hit; inserts it (`w` bytes) on a miss.
    pub(super) fn access(&mut self, k: u64, w: u64) -> bool {
        self.tick += 1;
        if let Some((t, _)) = self.map.get_mut(&k) {
            self.order.remove(t);
            *t = self.tick;
            self.order.insert(self.tick, k);
            return true;
        }
        while self.used + w > self.cap {
            let (_, victim) = self
                .order
                .pop_first()
                .expect("over capacity means non-empty");
            self.used -= self.map.remove(&victim).expect("ordered key is mapped").1;
        }
        self.map.insert(k, (self.tick, w));
        self.order.insert(self.tick, k);
        self.used += w;
        false
    }
}

fn key(object: u64, version: u64, block: u64) -> BlockKey {
    BlockKey::new(
        format!("s3://bucket/data/{object:05}.bin"),
        format!("etag-{version}"),
        block,
    )
}

/// The bytes of a key: distinct for every (object, version, block), of a key-dependent length.
fn content(k: &BlockKey, len: usize) -> Bytes {
    let h = key_hash(k);
    Bytes::from(
        (0..len)
            .map(|i| (h.rotate_left((i % 64) as u32) as u8) ^ (i as u8))
            .collect::<Vec<u8>>(),
    )
}

fn len_of(k: &BlockKey) -> usize {
    (key_hash(k) % 4000) as usize
}

fn memory_cache(bytes: u64, budget: &MemoryBudget) -> BlockCache {
    BlockCache::new(
        CacheOptions::default().with_memory_bytes(bytes),
        budget.clone(),
    )
    .unwrap()
}

#[tokio::test]
async fn get_returns_exactly_the_bytes_inserted_for_that_key() {
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(1 << 20, &budget);
    for o in 0..3 {
        for v in 0..3 {
            for b in 0..3 {
                let k = key(o, v, b);
                cache.insert(k.clone(), content(&k, 100));
            }
        }
    }
    for o in 0..3 {
        for v in 0..3 {
            for b in 0..3 {
                let k = key(o, v, b);
                assert_eq!(cache.get(&k).await.unwrap(), content(&k, 100));
                assert_eq!(cache.get_memory(&k).unwrap(), content(&k, 100));
            }
        }
    }
    assert!(cache.get(&key(0, 9, 0)).await.is_none());
    assert!(cache.get(&key(9, 0, 0)).await.is_none());
    let s = cache.stats();
    assert_eq!(
        (s.hits, s.misses, s.memory_hits, s.inserts),
        (54, 2, 54, 27)
    );
    assert_eq!(s.memory_bytes, 2700);
    assert_eq!(budget.used(), 2700);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["memory_entries"], 27);
    assert!(format!("{cache:?}").contains("memory_bytes"));
}

#[tokio::test]
async fn invalidate_other_versions_drops_only_stale_blocks() {
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(1 << 20, &budget);
    for b in 0..4 {
        for v in 0..2 {
            let k = key(1, v, b);
            cache.insert(k.clone(), content(&k, 10));
        }
        let k = key(2, 0, b);
        cache.insert(k.clone(), content(&k, 10));
    }
    cache.invalidate_other_versions(&key(1, 1, 0).object, "etag-1");
    assert!(cache.get_memory(&key(1, 0, 0)).is_none());
    assert!(cache.get_memory(&key(1, 1, 0)).is_some());
    assert!(cache.get_memory(&key(2, 0, 3)).is_some());
    assert_eq!(cache.stats().memory_entries, 8);
    assert_eq!(budget.used(), 80);
    cache.check_invariants();
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, u64, u64),
    Get(u64, u64, u64),
    Hold(u64),
    /// A waiting reservation (`MemoryBudget::reserve`) that fits beside the held ones.
    Wait(u64),
    Release,
    Invalidate(u64, u64),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u64..6, 0u64..3, 0u64..4).prop_map(|(o, v, b)| Op::Insert(o, v, b)),
        3 => (0u64..6, 0u64..3, 0u64..4).prop_map(|(o, v, b)| Op::Get(o, v, b)),
        1 => (0u64..20_000).prop_map(Op::Hold),
        1 => (0u64..30_000).prop_map(Op::Wait),
        1 => Just(Op::Release),
        1 => (0u64..6, 0u64..3).prop_map(|(o, v)| Op::Invalidate(o, v)),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
    /// Under any sequence of operations the cache stays within its size and the shared
    /// budget, its bytes are exactly the reservations it holds, and a hit returns the bytes
    /// inserted for that key.
    #[test]
    fn never_exceeds_budgets_and_never_returns_wrong_bytes(
        memory in 1_000u64..20_000,
        limit in 2_000u64..30_000,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let budget = MemoryBudget::new(limit);
        let cache = memory_cache(memory, &budget);
        let mut held: Vec<stoker_core::Reservation> = Vec::new();
        for op in ops {
            match op {
                Op::Insert(o, v, b) => {
                    let k = key(o, v, b);
                    let data = content(&k, len_of(&k));
                    cache.insert(k, data);
                }
                Op::Get(o, v, b) => {
                    let k = key(o, v, b);
                    let got = futures::executor::block_on(cache.get(&k));
                    if let Some(got) = got {
                        proptest::prop_assert_eq!(got, content(&k, len_of(&k)));
                    }
                }
                Op::Hold(n) => {
                    if let Some(r) = budget.try_reserve(n) {
                        held.push(r);
                    }
                }
                Op::Wait(n) => {
                    let external: u64 = held.iter().map(|r| r.bytes()).sum();
                    if n.min(limit) + external <= limit {
                        // The cache must give way at once: no one else would free anything.
                        let before = cache.stats().memory_bytes;
                        let r = futures::FutureExt::now_or_never(budget.reserve(n));
                        let r = r.expect("the cache yields its memory to a waiting reserve");
                        let s = cache.stats();
                        proptest::prop_assert!(before - s.memory_bytes <= s.reclaimed_bytes);
                        held.push(r);
                    }
                }
                Op::Release => {
                    held.pop();
                }
                Op::Invalidate(o, v) => {
                    let k = key(o, v, 0);
                    cache.invalidate_other_versions(&k.object, &k.version);
                }
            }
            let s = cache.stats();
            let external: u64 = held.iter().map(|r| r.bytes()).sum();
            proptest::prop_assert!(s.memory_bytes <= memory);
            proptest::prop_assert!(budget.used() <= budget.limit());
            proptest::prop_assert_eq!(budget.used(), external + s.memory_bytes);
            cache.check_invariants();
        }
        drop(held);
        drop(cache);
        proptest::prop_assert_eq!(budget.used(), 0);
    }
}

#[tokio::test]
async fn a_full_cache_yields_to_a_waiting_reserve() {
    const N: u64 = 100_000;
    let budget = MemoryBudget::new(N);
    let cache = memory_cache(N, &budget);
    // Fill the whole budget with cached blocks, hot ones (read again) and cold ones.
    for b in 0..100 {
        let k = key(1, 0, b);
        cache.get_memory(&k);
        cache.insert(k.clone(), content(&k, 1000));
    }
    for b in 0..10 {
        assert!(cache.get(&key(1, 0, b)).await.is_some());
    }
    assert_eq!(cache.stats().memory_bytes, N);
    assert_eq!(budget.available(), 0);
    let held = tokio::time::timeout(Duration::from_secs(10), budget.reserve(N / 2))
        .await
        .expect("a waiting reserve must not wait for a cache that holds the budget");
    assert_eq!(held.bytes(), N / 2);
    let s = cache.stats();
    assert_eq!(
        s.reclaimed, 50,
        "gave back just what was asked, in whole blocks"
    );
    assert_eq!(s.reclaimed_bytes, N / 2);
    assert!(s.evictions >= s.reclaimed);
    assert_eq!(s.memory_bytes, N / 2);
    cache.check_invariants();
    // The blocks read again (protected) were kept; the cold ones went.
    for b in 0..10 {
        assert!(
            cache.get_memory(&key(1, 0, b)).is_some(),
            "hot block {b} was given up"
        );
    }
    // Everything, if asked (an oversized request is clamped to the whole budget).
    drop(held);
    let all = tokio::time::timeout(Duration::from_secs(10), budget.reserve(2 * N))
        .await
        .expect("the cache gives up all it holds");
    assert_eq!(all.bytes(), N);
    assert_eq!(cache.stats().memory_entries, 0);
    cache.check_invariants();
}

#[tokio::test]
async fn the_budget_does_not_keep_a_dropped_cache_alive() {
    let budget = MemoryBudget::new(10_000);
    let cache = memory_cache(10_000, &budget);
    let k = key(1, 0, 0);
    cache.insert(k.clone(), content(&k, 4000));
    assert_eq!(budget.used(), 4000);
    drop(cache);
    assert_eq!(budget.used(), 0, "the cache and its reservations are gone");
    // Its reclaimer is dead: a waiting reserve neither panics nor finds anything to take.
    let r = budget.reserve(10_000).await;
    assert_eq!(r.bytes(), 10_000);
    // A disabled memory tier registers nothing, and two caches share one budget.
    let a = memory_cache(0, &budget);
    let b = memory_cache(6_000, &budget);
    let c = memory_cache(6_000, &budget);
    drop(r);
    for i in 0..5 {
        let kb = key(2, 0, i);
        b.insert(kb.clone(), content(&kb, 1000));
        let kc = key(3, 0, i);
        c.insert(kc.clone(), content(&kc, 1000));
    }
    assert_eq!(budget.used(), 10_000);
    let r = tokio::time::timeout(Duration::from_secs(10), budget.reserve(10_000))
        .await
        .expect("both caches give way");
    assert_eq!(r.bytes(), 10_000);
    assert_eq!(b.stats().memory_bytes + c.stats().memory_bytes, 0);
    assert_eq!(a.stats().reclaimed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_waiting_for_budget_finish_while_the_cache_keeps_inserting() {
    // Readers that wait for budget (as read-ahead does) race writers filling the cache from
    // other threads: every reader must finish, and the budget is never exceeded.
    let budget = MemoryBudget::new(64_000);
    let cache = memory_cache(48_000, &budget);
    for i in 0..48 {
        let k = key(9, 0, i);
        cache.insert(k.clone(), content(&k, 1000));
    }
    assert_eq!(cache.stats().memory_bytes, 48_000, "the cache starts full");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..1)
        .map(|w| {
            let (cache, stop) = (cache.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = key(10 + w, 0, i % 500);
                    cache.get_memory(&k);
                    cache.insert(k.clone(), content(&k, 1 + (i % 3000) as usize));
                    i += 1;
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..6u64)
        .map(|r| {
            let budget = budget.clone();
            tokio::spawn(async move {
                for j in 0..200u64 {
                    // 8 KB to 24 KB each, while only 16 KB are outside the full cache.
                    let held = budget.reserve(8000 + (r * 977 + j * 131) % 16_000).await;
                    assert!(budget.used() <= budget.limit());
                    tokio::task::yield_now().await;
                    drop(held);
                }
            })
        })
        .collect();
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        for r in readers {
            r.await.unwrap();
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    done.expect("every reader got its budget");
    assert!(budget.peak() <= budget.limit());
    assert!(cache.stats().reclaimed > 0);
    cache.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_misses_fetch_once() {
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(1 << 20, &budget);
    let calls = Arc::new(AtomicUsize::new(0));
    let k = key(7, 0, 3);
    let want = content(&k, 5000);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (cache, calls, k, want) = (cache.clone(), calls.clone(), k.clone(), want.clone());
            tokio::spawn(async move {
                cache
                    .get_or_fetch(k, || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, String>(want)
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), want);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = cache.stats();
    assert_eq!(s.misses, 1);
    assert_eq!(s.joins + s.hits, 49);
    assert!(s.joins > 0);
    assert_eq!(cache.inner.flights.len(), 0);
    // Now cached: no fetch at all.
    let again = cache
        .get_or_fetch(k, || async {
            Err::<Bytes, _>("must not fetch".to_string())
        })
        .await;
    assert_eq!(again.unwrap(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fetch_reaches_every_waiter_and_is_not_cached() {
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(1 << 20, &budget);
    let calls = Arc::new(AtomicUsize::new(0));
    let k = key(8, 0, 0);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (cache, calls, k) = (cache.clone(), calls.clone(), k.clone());
            tokio::spawn(async move {
                cache
                    .get_or_fetch(k, || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Err::<Bytes, _>(Arc::<str>::from("503 SlowDown"))
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(&*t.await.unwrap().unwrap_err(), "503 SlowDown");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(cache.stats().joins, 49);
    // The error was not cached: the next call fetches again.
    let k2 = k.clone();
    let got = cache
        .get_or_fetch(k, || async move { Ok::<_, String>(content(&k2, 10)) })
        .await
        .unwrap();
    assert_eq!(got.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_leader_does_not_hang_its_followers() {
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(1 << 20, &budget);
    let k = key(9, 0, 0);
    let want = content(&k, 1234);
    let started = Arc::new(tokio::sync::Notify::new());
    let leader = {
        let (cache, k, started) = (cache.clone(), k.clone(), started.clone());
        tokio::spawn(async move {
            cache
                .get_or_fetch(k, || async move {
                    started.notify_one();
                    pending::<Result<Bytes, String>>().await
                })
                .await
        })
    };
    started.notified().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let followers: Vec<_> = (0..10)
        .map(|_| {
            let (cache, k, want, calls) = (cache.clone(), k.clone(), want.clone(), calls.clone());
            tokio::spawn(async move {
                cache
                    .get_or_fetch(k, || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, String>(want)
                    })
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        followers.iter().all(|f| !f.is_finished()),
        "followers wait for the leader"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    leader.abort();
    let results =
        tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(followers))
            .await
            .expect("followers of a cancelled leader must not hang");
    for r in results {
        assert_eq!(r.unwrap().unwrap(), want);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one follower took over the fetch"
    );
    assert_eq!(cache.inner.flights.len(), 0);

    // The same with the leader's future dropped by a timeout rather than a task abort.
    let k = key(9, 0, 1);
    let slow = cache.get_or_fetch(k.clone(), pending::<Result<Bytes, String>>);
    let follower = {
        let (cache, k) = (cache.clone(), k.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            cache
                .get_or_fetch(k, || async { Ok::<_, String>(Bytes::from_static(b"x")) })
                .await
        })
    };
    assert!(tokio::time::timeout(Duration::from_millis(50), slow)
        .await
        .is_err());
    let got = tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .unwrap();
    assert_eq!(got.unwrap().unwrap(), Bytes::from_static(b"x"));
}

/// Shuffled epochs over a dataset twice the cache, through `get_or_fetch`: the policy keeps a
/// stable half of the dataset, LRU churns.
#[tokio::test]
async fn epochs_over_twice_the_cache_hit_about_half() {
    const BLOCK: u64 = 1024;
    const CACHED: u64 = 1000;
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(CACHED * BLOCK, &budget);
    let mut lru = Lru::new(CACHED * BLOCK);
    let mut order: Vec<u64> = (0..2 * CACHED).collect();
    let mut rng = StdRng::seed_from_u64(11);
    let (mut lru_hits, mut n, mut before) = (0u64, 0u64, CacheStats::default());
    for epoch in 0..10 {
        order.shuffle(&mut rng);
        if epoch == 4 {
            before = cache.stats();
        }
        for &o in &order {
            let k = key(o, 0, 0);
            let data = content(&k, BLOCK as usize);
            let got = cache
                .get_or_fetch(k, || async move { Ok::<_, String>(data) })
                .await
                .unwrap();
            assert_eq!(got.len(), BLOCK as usize);
            let hit = lru.access(o, BLOCK);
            if epoch >= 4 {
                lru_hits += hit as u64;
                n += 1;
            }
        }
    }
    let s = cache.stats();
    let ours = (s.hits - before.hits) as f64 / n as f64;
    let lru = lru_hits as f64 / n as f64;
    println!(
        "block cache, shuffled epochs, dataset = 2x cache: hit ratio {ours:.3} vs LRU {lru:.3} \
         (ideal 0.5)"
    );
    assert!(ours >= 0.40, "hit ratio {ours}");
    assert!(ours > lru + 0.2);
    assert!(s.memory_bytes <= CACHED * BLOCK);
}

/// A hot set re-read between one-off scans of cold blocks stays cached.
#[tokio::test]
async fn a_one_off_scan_does_not_flush_the_hot_set() {
    const BLOCK: u64 = 1024;
    const CACHED: u64 = 1000;
    let budget = MemoryBudget::new(1 << 30);
    let cache = memory_cache(CACHED * BLOCK, &budget);
    let mut lru = Lru::new(CACHED * BLOCK);
    let (mut hot_hits, mut lru_hot_hits, mut hot_n) = (0u64, 0u64, 0u64);
    let mut cold = 100_000u64;
    for round in 0..8 {
        for o in 0..300 {
            let k = key(o, 0, 0);
            let hit = cache.get(&k).await.is_some();
            if !hit {
                cache.insert(k.clone(), content(&k, BLOCK as usize));
            }
            let lru_hit = lru.access(o, BLOCK);
            if round >= 2 {
                hot_hits += hit as u64;
                lru_hot_hits += lru_hit as u64;
                hot_n += 1;
            }
        }
        // One pass over 2x the cache of never-seen blocks.
        for _ in 0..2 * CACHED {
            let k = key(cold, 0, 0);
            let data = content(&k, BLOCK as usize);
            cache
                .get_or_fetch(k, || async move { Ok::<_, String>(data) })
                .await
                .unwrap();
            lru.access(cold, BLOCK);
            cold += 1;
        }
    }
    let ours = hot_hits as f64 / hot_n as f64;
    let lru = lru_hot_hits as f64 / hot_n as f64;
    println!("block cache, hot set between scans: hot hit ratio {ours:.3} vs LRU {lru:.3}");
    assert!(ours >= 0.95, "hot hit ratio {ours}");
    assert!(lru < 0.05);
}

fn disk_cache(dir: &std::path::Path, memory: u64, disk: u64, budget: &MemoryBudget) -> BlockCache {
    BlockCache::new(
        CacheOptions::default()
            .with_memory_bytes(memory)
            .with_disk(dir, disk),
        budget.clone(),
    )
    .unwrap()
}

#[tokio::test]
async fn disk_tier_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let budget = MemoryBudget::new(1 << 30);
    {
        let cache = disk_cache(dir.path(), 1 << 20, 10 << 20, &budget);
        for b in 0..20 {
            let k = key(1, 0, b);
            cache.insert(k.clone(), content(&k, 3000));
        }
        cache.flush().await;
        assert_eq!(cache.stats().disk_entries, 20);
        assert_eq!(cache.stats().disk_writes, 20);
    }
    let cache = disk_cache(dir.path(), 1 << 20, 10 << 20, &budget);
    assert_eq!(cache.stats().disk_entries, 20);
    for b in 0..20 {
        let k = key(1, 0, b);
        assert_eq!(cache.get(&k).await.unwrap(), content(&k, 3000));
    }
    let s = cache.stats();
    assert_eq!((s.disk_hits, s.misses, s.inserts), (20, 0, 20));
    // Promoted into memory: the next read does not touch the disk.
    assert!(cache.get_memory(&key(1, 0, 0)).is_some());
    // get_or_fetch finds disk blocks without fetching.
    let cache = disk_cache(dir.path(), 1 << 20, 10 << 20, &budget);
    let got = cache
        .get_or_fetch(key(1, 0, 5), || async {
            Err::<Bytes, _>("must not fetch".to_string())
        })
        .await;
    assert_eq!(got.unwrap(), content(&key(1, 0, 5), 3000));
    assert_eq!(cache.stats().disk_hits, 1);
    // Another version of the same block is not on disk.
    assert!(cache.get(&key(1, 1, 5)).await.is_none());
}

#[tokio::test]
async fn a_corrupted_disk_file_is_a_miss_never_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let budget = MemoryBudget::new(1 << 30);
    let k = key(2, 0, 0);
    {
        let cache = disk_cache(dir.path(), 1 << 20, 10 << 20, &budget);
        cache.insert(k.clone(), content(&k, 3000));
        cache.flush().await;
    }
    let cache = disk_cache(dir.path(), 1 << 20, 10 << 20, &budget);
    let path = cache.inner.disk.as_ref().unwrap().path_for(key_hash(&k));
    let mut raw = std::fs::read(&path).unwrap();
    let mid = raw.len() - 1500;
    raw[mid] = raw[mid].wrapping_add(1);
    std::fs::write(&path, &raw).unwrap();
    assert!(cache.get(&k).await.is_none());
    assert_eq!(cache.stats().disk_corrupt, 1);
    let calls = AtomicUsize::new(0);
    let got = cache
        .get_or_fetch(k.clone(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(content(&k, 3000))
        })
        .await
        .unwrap();
    assert_eq!(got, content(&k, 3000));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    cache.flush().await;
    // Rewritten whole.
    let cache = disk_cache(dir.path(), 0, 10 << 20, &budget);
    assert_eq!(cache.get(&k).await.unwrap(), content(&k, 3000));
}

#[tokio::test]
async fn disk_budget_is_respected() {
    let dir = tempfile::tempdir().unwrap();
    let budget = MemoryBudget::new(1 << 30);
    let cap = 100_000;
    let cache = disk_cache(dir.path(), 0, cap, &budget);
    for b in 0..200 {
        let k = key(3, 0, b);
        cache.insert(k.clone(), content(&k, 2000));
        if b % 50 == 0 {
            cache.flush().await;
        }
    }
    cache.flush().await;
    let s = cache.stats();
    assert!(s.disk_bytes <= cap, "{} > {cap}", s.disk_bytes);
    assert!(s.disk_evictions > 0);
    let mut on_disk = 0;
    for sub in std::fs::read_dir(dir.path().join("stoker-blocks-v1")).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            on_disk += f.unwrap().metadata().unwrap().len();
        }
    }
    assert_eq!(on_disk, s.disk_bytes);
    // The most recent blocks are the ones kept.
    assert!(cache.get(&key(3, 0, 199)).await.is_some());
    assert!(cache.get(&key(3, 0, 0)).await.is_none());
    assert_eq!(s.memory_bytes, 0);
    assert_eq!(budget.used(), 0);
}

/// Two caches (as two processes would) on one directory, reading and writing the same keys
/// concurrently under eviction pressure, never return another key's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_caches_sharing_a_directory_never_return_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let budget = MemoryBudget::new(1 << 30);
    let a = disk_cache(dir.path(), 0, 150_000, &budget);
    let b = disk_cache(dir.path(), 8_000, 150_000, &budget);
    let mut tasks = Vec::new();
    for (i, cache) in [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
    {
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(i as u64);
            let mut hits = 0;
            for _ in 0..400 {
                let k = key(
                    rng.random_range(0..30),
                    rng.random_range(0..2),
                    rng.random_range(0..2),
                );
                let want = content(&k, 500 + len_of(&k));
                match rng.random_range(0..3) {
                    0 => cache.insert(k, want),
                    1 => {
                        if let Some(got) = cache.get(&k).await {
                            assert_eq!(got, want, "wrong bytes for {k:?}");
                            hits += 1;
                        }
                    }
                    _ => {
                        let w = want.clone();
                        let got = cache
                            .get_or_fetch(k, || async move { Ok::<_, String>(w) })
                            .await
                            .unwrap();
                        assert_eq!(got, want);
                    }
                }
            }
            hits
        }));
    }
    let mut hits = 0;
    for t in tasks {
        hits += t.await.unwrap();
    }
    assert!(hits > 0);
    a.flush().await;
    b.flush().await;
    for o in 0..30 {
        for v in 0..2 {
            for blk in 0..2 {
                let k = key(o, v, blk);
                let want = content(&k, 500 + len_of(&k));
                for c in [&a, &b] {
                    if let Some(got) = c.get(&k).await {
                        assert_eq!(got, want);
                    }
                }
            }
        }
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert!(sa.disk_bytes <= 150_000 && sb.disk_bytes <= 150_000);
    assert!(sa.disk_hits + sb.disk_hits > 0);
    assert_eq!(sa.disk_corrupt + sb.disk_corrupt, 0);
}

#[test]
fn key_hash_is_stable() {
    // File names depend on it: it must never change between releases.
    assert_eq!(
        key_hash(&BlockKey::new("s3://bucket/a/b.jpg", "\"abc\"", 3)),
        key_hash(&BlockKey::new("s3://bucket/a/b.jpg", "\"abc\"", 3))
    );
    assert_ne!(
        key_hash(&BlockKey::new("ab", "c", 0)),
        key_hash(&BlockKey::new("a", "bc", 0))
    );
    assert_eq!(
        key_hash(&BlockKey::new("s3://b/o", "v", 1)),
        15_392_390_356_596_095_021
    );
}
