//! Helpers every format test uses: chunked input and draining a reader.
#![allow(dead_code)]

use std::io;

use bytes::Bytes;
use stoker_core::{Error, Sample};
use stoker_formats::{ChunkCursor, IterSource, RecordReader};

/// `data` as a stream of `chunk`-byte chunks (0: one chunk), zero-copy slices of it.
pub fn chunked(data: &[u8], chunk: usize) -> ChunkCursor {
    let data = Bytes::copy_from_slice(data);
    chunked_bytes(&data, chunk)
}

/// Like [`chunked`], slicing `data` itself (so zero-copy can be checked).
pub fn chunked_bytes(data: &Bytes, chunk: usize) -> ChunkCursor {
    if chunk == 0 {
        return ChunkCursor::from_bytes(data.clone());
    }
    let parts: Vec<io::Result<Bytes>> = (0..data.len())
        .step_by(chunk)
        .map(|i| Ok(data.slice(i..(i + chunk).min(data.len()))))
        .collect();
    ChunkCursor::new(Box::new(IterSource(parts.into_iter())))
}

/// Every result up to the end (an error is followed by whatever the reader gives after
/// it); fails on a reader that never ends.
pub fn drain(r: &mut dyn RecordReader) -> Vec<Result<Sample, Error>> {
    let mut out = Vec::new();
    loop {
        match r.next() {
            Ok(Some(s)) => out.push(Ok(s)),
            Ok(None) => return out,
            Err(e) => out.push(Err(e)),
        }
        assert!(out.len() < 100_000, "runaway reader");
    }
}
