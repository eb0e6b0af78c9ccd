//! What the fuzz targets share: feeding bytes to a [`Format`] the way storage does, and
//! checking what every format promises whatever the bytes.

use bytes::Bytes;
use stoker_core::Error;
use stoker_formats::{ChunkCursor, Format, Input, IterSource, RecordReader, ShardInfo};

/// Most records read from one input (a reader that never ends is a bug, found here as a
/// timeout or this assertion).
pub const MAX_RECORDS: usize = 200_000;

/// libFuzzer's panic hook aborts on every panic, even one the code under test catches (the
/// Parquet reader turns the parquet crate's panics on malformed pages into errors): this
/// hook lets panics raised inside `crate_dirs` (path fragments such as `/parquet-`)
/// unwind to the code that catches them, and aborts on any other, as libFuzzer's does.
pub fn abort_on_panics_except_in(crate_dirs: &'static [&'static str]) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info
                .location()
                .is_some_and(|l| crate_dirs.iter().any(|d| l.file().contains(d)))
            {
                return;
            }
            previous(info);
            std::process::abort();
        }));
    });
}

/// The object the bytes are.
pub fn shard(name: &str) -> ShardInfo {
    let mut s = ShardInfo::new(name, format!("s3://fuzz/{name}"));
    s.size = None;
    s
}

/// `data` as chunks of `chunk` bytes (0: one chunk), as a store's stream hands them over.
pub fn chunked(data: &Bytes, chunk: usize) -> ChunkCursor {
    if chunk == 0 || data.is_empty() {
        return ChunkCursor::from_bytes(data.clone());
    }
    let parts: Vec<std::io::Result<Bytes>> = (0..data.len())
        .step_by(chunk)
        .map(|i| Ok(data.slice(i..(i + chunk).min(data.len()))))
        .collect();
    ChunkCursor::new(Box::new(IterSource(parts.into_iter())))
}

/// A chunk size picked from the data itself (so that a crash reproduces from the file
/// alone): 1 to 4096 bytes.
pub fn chunk_size(data: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data.iter().take(64) {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    [1, 2, 3, 7, 64, 511, 512, 513, 4096][(h % 9) as usize]
}

/// One result, in a form that compares (a NaN field compares equal to itself here).
pub fn outcome(r: &Result<stoker_core::Sample, Error>) -> String {
    match r {
        Ok(s) => format!("{s:?}"),
        Err(e) => format!("error {:?} at {:?} record {:?}", e.kind, e.offset, e.record),
    }
}

/// Every result of `r` up to its end, checking that the record count follows.
pub fn drain(r: &mut dyn RecordReader) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let before = r.record();
        match r.next() {
            Ok(None) => return out,
            res => {
                assert!(r.record() >= before, "the record index went back");
                out.push(outcome(&res.map(|s| s.expect("not None"))));
            }
        }
        assert!(out.len() < MAX_RECORDS, "runaway reader");
    }
}

/// Reads `data` with `format` as a stream, whole and in chunks, and checks that chunk
/// boundaries change nothing and that counting agrees with reading.
pub fn check_stream(format: &dyn Format, name: &str, data: &[u8]) {
    let data = Bytes::copy_from_slice(data);
    let shard = shard(name);
    let whole = match format.open(&shard, Input::Stream(chunked(&data, 0))) {
        Ok(mut r) => drain(&mut *r),
        Err(_) => return,
    };
    let chunk = chunk_size(&data);
    let mut r = format
        .open(&shard, Input::Stream(chunked(&data, chunk)))
        .expect("opened whole, so opens chunked");
    let parts = drain(&mut *r);
    assert_eq!(whole, parts, "chunks of {chunk} bytes read differently");
    if let Ok(n) = format.count_records(&shard, Input::Stream(chunked(&data, chunk))) {
        assert_eq!(
            n as usize,
            whole.len(),
            "count_records disagrees with reading"
        );
    }
    // Skipping to the middle, then reading, gives the rest (as a resume does).
    if whole.len() > 1 {
        let half = whole.len() / 2;
        let mut r = format
            .open(&shard, Input::Stream(chunked(&data, chunk)))
            .expect("opens");
        if r.skip(half as u64).is_ok() {
            let _ = drain(&mut *r);
        }
    }
}
