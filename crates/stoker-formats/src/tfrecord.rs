//! TFRecord files, optionally holding `tf.train.Example` protos.
//!
//! A record is framed as TensorFlow writes it: the data length (u64, little-endian), the
//! masked CRC32C of those 8 bytes (u32), the data, the masked CRC32C of the data (u32),
//! where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8` (wrapping). A bad length CRC
//! or a record cut short ends the object with an error (the framing is lost); a bad data
//! CRC fails that record only, and reading goes on with the next.
//!
//! Without parsing, a record is the sample `{"data": Bytes}`, a zero-copy slice of the
//! chunks. With [`TfRecord::parse_examples`], each record is decoded as a
//! `tf.train.Example` (see [`encode_example`] for the fields and how values map), with
//! bytes values sliced from the record without copying; a malformed proto fails that
//! record only.

mod example;

use bytes::Bytes;
use stoker_core::{Error, Sample, Value};

pub use self::example::{encode_example, FeatureValue};
use crate::format::{locate, Format, RecordReader, ShardInfo};
use crate::input::{ChunkCursor, Input};

/// TFRecord files.
#[derive(Debug, Clone, Copy, Default)]
pub struct TfRecord {
    /// Decode each record as a `tf.train.Example` (one field per feature, sorted by
    /// name) rather than returning it as `data`.
    pub parse_examples: bool,
}

impl Format for TfRecord {
    fn name(&self) -> &'static str {
        "tfrecord"
    }

    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        match input {
            Input::Stream(cur) => Ok(Box::new(TfRecordReader {
                shard: shard.clone(),
                cur,
                examples: self.parse_examples.then(example::Decoder::default),
                data_name: "data".into(),
                record: 0,
                done: false,
            })),
            Input::Random(_) => Err(Error::invalid("the tfrecord format reads a stream")
                .with_stage("tfrecord")
                .with_object(shard.url.clone())),
        }
    }
}

/// TFRecord's masked CRC32C of `data`.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends `data` to `out` framed as one TFRecord record.
pub fn write_record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.reserve(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

struct TfRecordReader {
    shard: ShardInfo,
    cur: ChunkCursor,
    examples: Option<example::Decoder>,
    data_name: std::sync::Arc<str>,
    record: u64,
    done: bool,
}

/// A failed record: the error, and whether the framing is lost.
type Fail = (Box<Error>, bool);

fn fatal(e: Error) -> Fail {
    (Box::new(e), true)
}

fn io_fatal(e: std::io::Error, what: &str) -> Fail {
    let mut error = Error::from(e);
    error.message = format!("{what}: {}", error.message);
    fatal(error)
}

impl TfRecordReader {
    /// Reads one record's framing: the data, with its CRC checked when `check`. `None`
    /// at the end of the object.
    fn frame(&mut self, check: bool) -> Result<Option<Bytes>, Fail> {
        let hdr = self
            .cur
            .peek(12)
            .map_err(|e| io_fatal(e, "reading a record header"))?;
        if hdr.is_empty() {
            return Ok(None);
        }
        if hdr.len() < 12 {
            return Err(fatal(Error::record(format!(
                "truncated record: the object ends after {} of 12 header bytes",
                hdr.len()
            ))));
        }
        let len = u64::from_le_bytes(hdr[..8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes"));
        if masked_crc(&hdr[..8]) != crc {
            return Err(fatal(Error::record(format!(
                "bad CRC of the record length (length field {len}): not a TFRecord, or damaged"
            ))));
        }
        self.cur
            .skip(12)
            .map_err(|e| io_fatal(e, "reading a record header"))?;
        let truncated = |e| io_fatal(e, &format!("truncated record of {len} bytes"));
        let n = usize::try_from(len)
            .map_err(|_| fatal(Error::record(format!("record of {len} bytes"))))?;
        if !check {
            self.cur.skip(len + 4).map_err(truncated)?;
            return Ok(Some(Bytes::new()));
        }
        let data = self.cur.read_exact(n).map_err(truncated)?;
        let crc = self.cur.read_exact(4).map_err(truncated)?;
        let crc = u32::from_le_bytes(crc[..].try_into().expect("4 bytes"));
        if masked_crc(&data) != crc {
            return Err((
                Box::new(Error::record(format!(
                    "bad CRC of the record data ({len} bytes)"
                ))),
                false,
            ));
        }
        Ok(Some(data))
    }

    fn fail(&mut self, (e, fatal): Fail, at: u64) -> Error {
        let e = locate(*e, "tfrecord", &self.shard, at, self.record);
        self.record += 1;
        if fatal {
            self.done = true;
        }
        e
    }
}

impl RecordReader for TfRecordReader {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        if self.done {
            return Ok(None);
        }
        let at = self.cur.offset();
        let data = match self.frame(true) {
            Ok(Some(d)) => d,
            Ok(None) => {
                self.done = true;
                return Ok(None);
            }
            Err(f) => return Err(self.fail(f, at)),
        };
        let sample = match &mut self.examples {
            None => {
                let mut s = Sample::with_capacity(1);
                s.insert(self.data_name.clone(), Value::Bytes(data));
                s
            }
            Some(d) => match d.decode(&data) {
                Ok(s) => s,
                Err(e) => return Err(self.fail((Box::new(e), false), at)),
            },
        };
        self.record += 1;
        Ok(Some(sample))
    }

    fn record(&self) -> u64 {
        self.record
    }

    /// Passes over records without reading or checking their data.
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        for _ in 0..n {
            if self.done {
                break;
            }
            let at = self.cur.offset();
            match self.frame(false) {
                Ok(Some(_)) => self.record += 1,
                Ok(None) => self.done = true,
                Err(f) => return Err(self.fail(f, at)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // The first record header of tests/fixtures/examples.tfrecord.
        let len = 0x40u64.to_le_bytes();
        assert_eq!(masked_crc(&len), 0x95f4_1728);
        let mut out = Vec::new();
        write_record(&mut out, b"");
        assert_eq!(out.len(), 16);
    }
}
