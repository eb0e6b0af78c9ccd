//! Shared test fixtures: a real S3 test server with sharded line files, and a small
//! line-per-record format (the real formats have their own tests in stoker-formats).
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use stoker_core::{Error, Sample, Value};
use stoker_formats::{Format, Input, RecordReader, ShardInfo};
use stoker_pipeline::{FormatChoice, Item, Pipeline};
use stoker_store::StoreOptions;
use stoker_testserver::{ServerOptions, TestServer};

pub const BUCKET: &str = "pipe";

/// Text shards, one record per line; a line `BAD` is a malformed record.
#[derive(Debug)]
pub struct Lines;

struct LinesReader {
    cursor: stoker_formats::ChunkCursor,
    shard: ShardInfo,
    record: u64,
}

impl Format for Lines {
    fn name(&self) -> &'static str {
        "lines"
    }
    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        match input {
            Input::Stream(cursor) => Ok(Box::new(LinesReader {
                cursor,
                shard: shard.clone(),
                record: 0,
            })),
            Input::Random(_) => Err(Error::invalid("lines streams")),
        }
    }
}

impl RecordReader for LinesReader {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        let offset = self.cursor.offset();
        let Some(line) = self.cursor.read_until(b'\n')? else {
            return Ok(None);
        };
        let rec = self.record;
        self.record += 1;
        let text = std::str::from_utf8(&line).unwrap().trim_end();
        if text == "BAD" {
            return Err(stoker_formats::locate(
                Error::record("malformed line"),
                "lines",
                &self.shard,
                offset,
                rec,
            ));
        }
        let mut s = Sample::new();
        s.insert("__key__", format!("{}:{rec}", self.shard.key));
        s.insert("txt", Value::Bytes(line.slice(..text.len())));
        Ok(Some(s))
    }
    fn record(&self) -> u64 {
        self.record
    }
}

/// The server, with `shards/s{i}.txt` for i in 0..7, of uneven lengths (total 203 lines),
/// `bad/` with a malformed line, and `files/` with 57 small objects.
pub fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let s = TestServer::start_blocking(ServerOptions::new().bucket(BUCKET)).unwrap();
        let lens = [40usize, 1, 33, 0, 57, 29, 43];
        for (i, n) in lens.iter().enumerate() {
            let body: String = (0..*n).map(|j| format!("s{i}-{j}\n")).collect();
            s.put_object(BUCKET, &format!("shards/s{i}.txt"), body.as_bytes())
                .unwrap();
        }
        s.put_object(BUCKET, "bad/a.txt", b"a0\na1\nBAD\na3\n")
            .unwrap();
        s.put_object(BUCKET, "bad/b.txt", b"b0\nb1\n").unwrap();
        for i in 0..57 {
            s.put_object(
                BUCKET,
                &format!("files/{:03}.txt", i),
                format!("file {i}").as_bytes(),
            )
            .unwrap();
        }
        s
    })
}

pub fn store_options() -> StoreOptions {
    let s = server();
    StoreOptions::default()
        .with_endpoint(s.endpoint())
        .with_credentials(s.access_key(), s.secret_key())
        .with_region(s.region())
        .with_memory_limit(256 << 20)
}

/// The line shards.
pub fn shards() -> Pipeline {
    Pipeline::from_url(
        &format!("s3://{BUCKET}/shards/"),
        store_options(),
        FormatChoice::Fixed(Arc::new(Lines)),
    )
}

/// The small files.
pub fn files() -> Pipeline {
    Pipeline::from_url(
        &format!("s3://{BUCKET}/files/"),
        store_options(),
        FormatChoice::Files,
    )
}

/// Keys of the samples of an item, in order.
pub fn keys(item: &Item) -> Vec<String> {
    match item {
        Item::Sample(s) => vec![s.key().unwrap().to_string()],
        Item::Batch(b) => match b.get("__key__").unwrap() {
            Value::List(l) => l.iter().map(|v| v.as_str().unwrap().to_string()).collect(),
            v => panic!("{v:?}"),
        },
    }
}

/// All keys of a run.
pub fn all_keys(p: &Pipeline) -> Vec<String> {
    p.run().unwrap().flat_map(|i| keys(&i.unwrap())).collect()
}

/// In-memory samples `m0..m{n}` with an integer field.
pub fn memory(n: usize) -> Pipeline {
    Pipeline::from_samples(
        (0..n as i64)
            .map(|i| {
                let mut s = Sample::new();
                s.insert("__key__", format!("m{i}"));
                s.insert("x", i);
                s
            })
            .collect(),
    )
}
