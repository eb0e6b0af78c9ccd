//! Runs that share the process's store (`RunOptions::share_store`): the next run (the next
//! epoch of a loop that starts a run per epoch) reads what the last one cached, against the
//! real S3 test server.

use stoker_pipeline::{shared, FormatChoice, Item, Pipeline, RunOptions};
use stoker_store::StoreOptions;
use stoker_testserver::{ServerOptions, TestServer};

fn server(bucket: &str) -> TestServer {
    let s = TestServer::start_blocking(ServerOptions::new().bucket(bucket)).unwrap();
    for i in 0..20 {
        let body = format!("object {i} ").repeat(100 + i);
        s.put_object(bucket, &format!("d/{i:02}.bin"), body.as_bytes())
            .unwrap();
    }
    s
}

fn pipeline(s: &TestServer, bucket: &str, share: bool, part_size: Option<u64>) -> Pipeline {
    let mut o = StoreOptions::default()
        .with_endpoint(s.endpoint())
        .with_credentials(s.access_key(), s.secret_key())
        .with_region(s.region());
    if let Some(p) = part_size {
        o = o.with_part_size(p);
    }
    Pipeline::from_url(&format!("s3://{bucket}/d/"), o, FormatChoice::Files)
        .shuffle_shards(true)
        .seed(3)
        .options(
            RunOptions::default()
                .with_threads(2)
                .with_memory_limit(256 << 20)
                .with_share_store(share),
        )
}

/// The items of one run and its storage statistics.
fn run(p: &Pipeline, epoch: u64) -> (Vec<Item>, stoker_store::MetricsSnapshot) {
    let mut r = p.clone().first_epoch(epoch).run().unwrap();
    let items = r.by_ref().map(Result::unwrap).collect();
    (items, r.stats().storage.unwrap())
}

#[test]
fn the_next_run_reads_what_the_last_one_cached_with_other_options_apart_until_cleared() {
    let s = server("shared-a");
    let p = pipeline(&s, "shared-a", true, None);
    let (first, m1) = run(&p, 0);
    assert_eq!(first.len(), 20);
    assert_eq!(m1.get_requests, 20, "the first epoch reads every object");
    // The next epoch (a new run, as a PyTorch loop makes) reads nothing from the server,
    // and its statistics count its own reads only.
    let (second, m2) = run(&p, 1);
    assert_eq!(second.len(), 20);
    assert_eq!(m2.get_requests, 0);
    assert!(
        m2.http_requests <= m2.list_requests,
        "at most the listing: {m2:?}"
    );
    assert_eq!(m2.cache.hits, 20);
    assert_eq!(m2.cache.misses, 0);
    // Same items as runs of their own (the cache changes speed, not results).
    let own = pipeline(&s, "shared-a", false, None);
    assert_eq!(run(&own, 0).0, first);
    let (again, m_own) = run(&own, 1);
    assert_eq!(again, second);
    assert_eq!(m_own.get_requests, 20, "a run of its own starts empty");
    // The run's memory budget is the shared store's.
    let r = p.run().unwrap();
    assert_eq!(r.stats().memory.limit, 256 << 20);
    drop(r);
    // Other store options, another store.
    let b = pipeline(&s, "shared-a", true, Some(1 << 20));
    assert_eq!(
        run(&b, 0).1.get_requests,
        20,
        "another part size, another store"
    );
    assert_eq!(run(&b, 1).1.get_requests, 0);
    // Cleared (one test only in this binary: the stores are the process's): the next run reads everything again.
    assert!(shared::clear_shared_stores() >= 2);
    let (_, m3) = run(&p, 2);
    assert_eq!(m3.get_requests, 20);
}
