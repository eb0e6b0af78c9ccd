//! The format interface: one object in, samples out.

use std::fmt;

use stoker_core::{Columns, Error, Sample};

use crate::input::Input;

/// The object a reader is reading, for sample keys and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// Its key in the store (relative to the bucket).
    pub key: String,
    /// Its full URL (`s3://bucket/key`), used in errors and as `__url__`.
    pub url: String,
    /// Its size in bytes, when known.
    pub size: Option<u64>,
    /// Its version (ETag, version id or modification time), when known: what tells a
    /// cached copy of it from a changed object.
    pub version: Option<String>,
}

impl ShardInfo {
    /// An object known by key and URL.
    pub fn new(key: impl Into<String>, url: impl Into<String>) -> ShardInfo {
        ShardInfo {
            key: key.into(),
            url: url.into(),
            size: None,
            version: None,
        }
    }
}

/// What a format needs to read an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The object's bytes in order ([`Input::Stream`]).
    Stream,
    /// Ranged reads ([`Input::Random`]), e.g. Parquet's footer-first layout.
    Random,
}

/// A record format: turns one object into a sequence of samples.
pub trait Format: Send + Sync + fmt::Debug {
    /// Its name in specs, plans and errors (`tar`, `tfrecord`).
    fn name(&self) -> &'static str;

    /// How it reads.
    fn access(&self) -> Access {
        Access::Stream
    }

    /// Whether every object is exactly one sample (plain files, ImageFolder). The source
    /// then fetches many whole objects ahead in consumption order, rather than streaming a
    /// few shards.
    fn one_sample_per_object(&self) -> bool {
        false
    }

    /// Starts reading `shard` from `input`.
    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error>;

    /// Whether [`Format::count_records`] reads only metadata (Parquet's footer: two small
    /// ranged reads), so that a pipeline may count every shard before it starts.
    fn counts_from_metadata(&self) -> bool {
        false
    }

    /// How many records [`Format::open`]'s reader of `shard` yields: samples and failed
    /// records alike (a failed record takes its place, as it does in a pipeline's
    /// positions). The default reads the whole object; formats that
    /// [`Format::counts_from_metadata`] read only that.
    fn count_records(&self, shard: &ShardInfo, input: Input) -> Result<u64, Error> {
        let mut r = self.open(shard, input)?;
        loop {
            match r.next() {
                Ok(Some(_)) | Err(_) => {}
                Ok(None) => return Ok(r.record()),
            }
        }
    }

    /// Whether [`Format::open_columns`] works: the format decodes whole columns (Parquet),
    /// so a pipeline can batch its rows without making a sample of each.
    fn reads_columns(&self) -> bool {
        false
    }

    /// Starts reading `shard` as columns (see [`ColumnReader`]); an error for formats that
    /// do not [`Format::reads_columns`].
    fn open_columns(
        &self,
        shard: &ShardInfo,
        input: Input,
    ) -> Result<Box<dyn ColumnReader>, Error> {
        let _ = input;
        Err(
            Error::invalid(format!("{} does not read columns", self.name()))
                .with_object(shard.url.clone()),
        )
    }
}

/// Reads the rows of one object as [`Columns`], in order: the same rows, values and errors
/// as [`RecordReader::next`] of the same object, only not one sample at a time. Row `i`
/// of the concatenated chunks is what the `i`-th successful `next` would return
/// ([`Columns::row`]), and an error stands where `next` would return it, for one call of
/// `next` (what it skips after the error, it skips here too).
pub trait ColumnReader: Send {
    /// The next rows, at most `max` (at least one), or `None` at the end of the object.
    /// Chunks may be shorter than `max` (a format returns what it decoded at once).
    fn next_columns(&mut self, max: usize) -> Result<Option<Columns>, Error>;
}

/// Reads the samples of one object, in order.
///
/// Errors name the object, the byte offset and the record (see
/// [`stoker_core::Error`]). After an error, `next` goes on with the following record when
/// the format's framing allows it (a TFRecord whose data CRC is wrong), and returns
/// `Ok(None)` when it does not (a truncated tar): a skip policy loses only what cannot be
/// read.
pub trait RecordReader: Send {
    /// The next sample, or `None` at the end of the object.
    fn next(&mut self) -> Result<Option<Sample>, Error>;

    /// Index of the next record (records returned or failed so far).
    fn record(&self) -> u64;

    /// Skips `n` records (to resume inside an object). The default reads and drops them;
    /// formats that can seek do better.
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        for _ in 0..n {
            if self.next()?.is_none() {
                break;
            }
        }
        Ok(())
    }
}

/// Adds the object, format name and (if missing) offset and record to an error.
pub fn locate(e: Error, format: &str, shard: &ShardInfo, offset: u64, record: u64) -> Error {
    e.with_stage(format)
        .with_object(shard.url.clone())
        .with_offset(offset)
        .with_record(record)
}
