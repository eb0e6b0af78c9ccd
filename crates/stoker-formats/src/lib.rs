//! `stoker-formats`: record formats over byte streams.
//!
//! A [`Format`] turns one object into samples through a [`RecordReader`]. Streaming
//! formats read the object's chunks in order through a [`ChunkCursor`], which slices
//! fields out of the chunks storage returned without copying them; Parquet reads by
//! range. Every error names the object, the byte offset, the record and the format.
//!
//! | format | module | one object is |
//! |---|---|---|
//! | plain files | [`files::Files`] | one sample (`__key__`, `__url__`, the bytes under its extension) |
//! | ImageFolder | [`files::ImageFolder`] | one sample plus `label` (class index, sorted like torchvision) |
//! | WebDataset tar | [`tar::Tar`] | samples of consecutive members sharing a key (`__key__`, `__url__`, one field per suffix) |
//! | TFRecord | [`tfrecord::TfRecord`] | one sample per record (`data`, or the features of a `tf.train.Example`) |
//! | Parquet | [`parquet::Parquet`] | one sample per row, read by range one row group at a time, columns projected |
//! | JSON Lines | [`jsonl::Jsonl`] | one sample per non-empty line (a JSON object; keys are fields) |
//! | CSV | [`csv::Csv`] | one sample per row (fields named by the header, types inferred) |

pub mod csv;
pub mod files;
mod format;
mod input;
pub mod jsonl;
pub mod parquet;
pub mod tar;
pub mod tfrecord;

pub use format::{locate, Access, ColumnReader, Format, RecordReader, ShardInfo};
pub use input::{ByteSource, ChunkCursor, Input, IterSource, RandomAccess};
