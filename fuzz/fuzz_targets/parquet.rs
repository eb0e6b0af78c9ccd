//! Parquet: the footer (Thrift metadata), then pages, rows and columns, read by range.
#![no_main]
use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use stoker_formats::parquet::Parquet;
use stoker_formats::{Format, Input, RandomAccess};

fuzz_target!(|data: &[u8]| {
    stoker_fuzz::abort_on_panics_except_in(&["/parquet-", "/arrow-"]);
    let file: Arc<dyn RandomAccess> = Arc::new(Bytes::copy_from_slice(data));
    let shard = stoker_fuzz::shard("table.parquet");
    let p = Parquet::default();
    let count = p.count_records(&shard, Input::Random(file.clone()));
    let rows = match p.open(&shard, Input::Random(file.clone())) {
        Ok(mut r) => stoker_fuzz::drain(&mut *r),
        Err(_) => return,
    };
    if let Ok(n) = count {
        // Failed rows take their places too, but a failed row group may end the reading
        // early: never more records than the footer counts.
        assert!(
            rows.len() as u64 <= n.max(1) || n == 0,
            "{} rows read, footer says {n}",
            rows.len()
        );
    }
    if let Ok(mut c) = p.open_columns(&shard, Input::Random(file)) {
        for _ in 0..stoker_fuzz::MAX_RECORDS {
            match c.next_columns(1000) {
                Ok(Some(_)) | Err(_) => {}
                Ok(None) => break,
            }
        }
    }
});
