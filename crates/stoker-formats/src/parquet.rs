//! Parquet: one row is one sample, read one row group at a time by range.
//!
//! Opening a file reads its last 8 bytes (footer length and magic), then exactly the
//! footer's metadata: two ranged reads, whatever the file's size. Each row group is then
//! fetched on its own, and only the column chunks of the projected columns (adjacent
//! chunks in one read), so memory holds one row group's projected bytes at a time, never
//! the whole file. [`RecordReader::skip`] passes over whole row groups using the row counts
//! in the footer, without fetching them, and over rows inside a group without turning them
//! into values.
//!
//! Columns become fields of the same name:
//!
//! | Arrow type (as the `parquet` crate maps the file's schema) | value |
//! |---|---|
//! | `int8/16/32/64`, `uint8/16/32`, `uint64` up to `i64::MAX` | `Int` (a larger `uint64` is a record error) |
//! | `float16/32/64` | `Float` |
//! | `bool` | `Int` 0 or 1 |
//! | `utf8`, `large_utf8`, `utf8_view` | `Str` |
//! | `binary`, `large_binary`, `fixed_size_binary` | `Bytes`, a zero-copy slice of the decoded Arrow buffer (`binary_view` is copied) |
//! | `timestamp[s/ms/us/ns]` (with or without a time zone) | `Int`: **nanoseconds** since the Unix epoch, whatever the stored unit (UTC for zoned columns, wall-clock for naive ones); a value outside the years 1677-2262 is a record error |
//! | `date32` | `Int`: days since the Unix epoch |
//! | `list`, `large_list`, `fixed_size_list` of `int64/int32/int16/uint8/float32/float64` | a 1-D `Tensor` of that dtype, a zero-copy view of the Arrow buffer; a list holding a null becomes a `List` |
//! | any other list | `List` of the element values |
//! | `dictionary` of any supported type | the value type's value |
//! | a null | `Null` |
//!
//! Read as columns ([`Format::open_columns`], what a pipeline's columnar path uses), each
//! decoded Arrow batch becomes [`Columns`] instead of samples: integer, boolean, date and
//! float columns without nulls as plain `i64`/`f64` vectors, any other column as the values
//! above. The rows, values and errors are those of the row reader (the same decoder and
//! batches; a test checks it).
//!
//! Any other type (structs, maps, decimals, times, durations) in a projected column is an
//! [`Error::invalid`] when the reader opens, naming the column and type; project the
//! columns you need with [`Parquet::columns`].

use std::fmt;
use std::io;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Date32Type, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type,
    Int64Type, Int8Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, OffsetSizeTrait, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use bytes::{Buf, Bytes};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};
use stoker_core::{Column, Columns, DType, Error, Sample, Tensor, Value};

use crate::format::{locate, Access, ColumnReader, Format, RecordReader, ShardInfo};
use crate::input::{Input, RandomAccess};

/// Rows decoded into Arrow arrays at a time (then into values, row by row).
const BATCH_ROWS: usize = 1024;

/// Apache Parquet files: one row is one sample.
#[derive(Debug, Clone, Default)]
pub struct Parquet {
    /// The columns to read, in the order the sample's fields should have (`None`: all, in
    /// the file's order). Only their bytes are fetched. A name the file does not have is an
    /// [`Error::invalid`] listing the columns it has.
    pub columns: Option<Vec<String>>,
}

impl Parquet {
    /// A reader of `shard` (rows, or Arrow batches as columns when `columnar`); errors name
    /// the stage and the object.
    fn reader(
        &self,
        shard: &ShardInfo,
        input: Input,
        columnar: bool,
    ) -> Result<ParquetReader, Error> {
        let Input::Random(file) = input else {
            return Err(Error::invalid(
                "parquet reads by range and needs random access (Input::Random), not a stream",
            )
            .with_stage("parquet")
            .with_object(shard.url.clone()));
        };
        ParquetReader::open(shard, file, self.columns.as_deref())
            .map(|mut r| {
                r.columnar = columnar;
                r
            })
            .map_err(|e| e.with_stage("parquet").with_object(shard.url.clone()))
    }
}

impl Format for Parquet {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn access(&self) -> Access {
        Access::Random
    }

    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        self.reader(shard, input, false)
            .map(|r| Box::new(r) as Box<dyn RecordReader>)
    }

    fn counts_from_metadata(&self) -> bool {
        true
    }

    /// The rows the footer gives its row groups: the footer is read, no column data.
    fn count_records(&self, shard: &ShardInfo, input: Input) -> Result<u64, Error> {
        Ok(self.reader(shard, input, false)?.group_rows.iter().sum())
    }

    fn reads_columns(&self) -> bool {
        true
    }

    /// The same reader, but each decoded Arrow batch becomes [`Columns`]: integer, boolean,
    /// date and float columns without nulls as plain vectors (no value per row), others as
    /// the values the row path makes.
    fn open_columns(
        &self,
        shard: &ShardInfo,
        input: Input,
    ) -> Result<Box<dyn ColumnReader>, Error> {
        self.reader(shard, input, true)
            .map(|r| Box::new(r) as Box<dyn ColumnReader>)
    }
}

/// Reads a Parquet file row group by row group.
struct ParquetReader {
    shard: ShardInfo,
    file: Arc<dyn RandomAccess>,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    /// Field names, in output order (one `Arc` per column, shared by every row).
    names: Vec<Arc<str>>,
    /// For each output field, its column in the decoded (file-ordered) batches.
    order: Vec<usize>,
    /// Rows of each row group, from the footer.
    group_rows: Vec<u64>,
    /// Where the column data ends (the footer starts).
    data_end: u64,
    /// The next row group to open.
    next_group: usize,
    /// Rows returned, skipped or failed so far.
    record: u64,
    group: Option<Group>,
    /// Decode into [`Columns`] (for [`ColumnReader`]) rather than values per row.
    columnar: bool,
}

/// The open row group.
struct Group {
    index: usize,
    /// The record index of its first row.
    first: u64,
    rows: u64,
    /// Its fetched column chunks (kept to restart the decoder when skipping inside it).
    data: Fetched,
    decoder: ParquetRecordBatchReader,
    /// The current batch, column-major in output order, and the next row in it.
    batch: Vec<Vec<Value>>,
    /// The current batch as columns (columnar reading), its first `batch_row` rows gone.
    cols: Option<Columns>,
    batch_len: usize,
    batch_row: usize,
}

impl ParquetReader {
    fn open(
        shard: &ShardInfo,
        file: Arc<dyn RandomAccess>,
        columns: Option<&[String]>,
    ) -> Result<ParquetReader, Error> {
        let len = file.len();
        if len < 12 {
            return Err(Error::record(format!(
                "{len} bytes is too short for a Parquet file (at least 12: magic, footer \
                 length, magic)"
            ))
            .with_offset(0));
        }
        let tail = read(&*file, len - 8, len)?;
        match &tail[4..8] {
            b"PAR1" => {}
            b"PARE" => {
                return Err(
                    Error::record("the footer is encrypted, which is not supported")
                        .with_offset(len - 4),
                )
            }
            m => {
                return Err(Error::record(format!(
                    "the last 4 bytes are {m:?}, not the Parquet magic \"PAR1\": not a \
                     Parquet file, or a truncated one"
                ))
                .with_offset(len - 4))
            }
        }
        let meta_len = u64::from(u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")));
        if meta_len + 12 > len {
            return Err(Error::record(format!(
                "the footer says its metadata is {meta_len} bytes, but the file has only {} \
                 bytes before it: truncated or corrupt",
                len - 12
            ))
            .with_offset(len - 8));
        }
        let data_end = len - 8 - meta_len;
        let raw = read(&*file, data_end, len - 8)?;
        let meta = ParquetMetaDataReader::decode_metadata(&raw).map_err(|e| {
            Error::record(format!("cannot decode the footer's metadata: {e}")).with_offset(data_end)
        })?;
        let group_rows = meta
            .row_groups()
            .iter()
            .enumerate()
            .map(|(i, g)| {
                u64::try_from(g.num_rows()).map_err(|_| {
                    Error::record(format!(
                        "the footer gives row group {i} {} rows",
                        g.num_rows()
                    ))
                    .with_offset(data_end)
                })
            })
            .collect::<Result<Vec<u64>, Error>>()?;
        let meta = ArrowReaderMetadata::try_new(Arc::new(meta), ArrowReaderOptions::new())
            .map_err(|e| {
                Error::record(format!("cannot map the file's schema to Arrow types: {e}"))
                    .with_offset(data_end)
            })?;

        let schema = meta.schema().clone();
        let wanted: Vec<usize> = match columns {
            None => (0..schema.fields().len()).collect(),
            Some(cols) => {
                let mut idx = Vec::with_capacity(cols.len());
                for c in cols {
                    let i = schema.index_of(c).map_err(|_| {
                        Error::invalid(format!(
                            "no column {c:?} in this Parquet file; it has: {}",
                            schema
                                .fields()
                                .iter()
                                .map(|f| f.name().as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })?;
                    if !idx.contains(&i) {
                        idx.push(i);
                    }
                }
                idx
            }
        };
        if wanted.is_empty() {
            return Err(Error::invalid("no columns to read (an empty projection)"));
        }
        for &i in &wanted {
            let f = schema.field(i);
            if !supported(f.data_type()) {
                return Err(Error::invalid(format!(
                    "column {:?} has type {}, which has no Stoker value (project the columns \
                     you need)",
                    f.name(),
                    f.data_type()
                )));
            }
        }
        // Decoded batches hold the projected columns in file order.
        let mut sorted = wanted.clone();
        sorted.sort_unstable();
        let order = wanted
            .iter()
            .map(|i| sorted.binary_search(i).expect("present"))
            .collect();
        let names = wanted
            .iter()
            .map(|&i| Arc::<str>::from(schema.field(i).name().as_str()))
            .collect();
        let mask = ProjectionMask::roots(meta.parquet_schema(), sorted.iter().copied());
        Ok(ParquetReader {
            shard: shard.clone(),
            file,
            meta,
            mask,
            names,
            order,
            group_rows,
            data_end,
            next_group: 0,
            record: 0,
            group: None,
            columnar: false,
        })
    }

    /// The byte where row group `g`'s column data starts (for error offsets).
    fn group_offset(&self, g: usize) -> u64 {
        self.meta
            .metadata()
            .row_group(g)
            .columns()
            .iter()
            .filter_map(|c| chunk_range(c).ok())
            .map(|(s, _)| s)
            .min()
            .unwrap_or(0)
    }

    fn locate(&self, e: Error, offset: u64) -> Error {
        locate(e, "parquet", &self.shard, offset, self.record)
    }

    /// Fetches row group `g`'s projected column chunks and starts decoding it, past its
    /// first `skip` rows.
    fn open_group(&self, g: usize, skip: u64) -> Result<Group, Error> {
        let rg = self.meta.metadata().row_group(g);
        let mut ranges = Vec::new();
        for (leaf, col) in rg.columns().iter().enumerate() {
            if !self.mask.leaf_included(leaf) {
                continue;
            }
            let (start, end) = chunk_range(col).map_err(Error::record)?;
            if end > self.data_end {
                return Err(Error::record(format!(
                    "row group {g}, column {}: its chunk spans bytes {start}..{end}, past the \
                     end of the column data at byte {} (truncated or corrupt file)",
                    col.column_path(),
                    self.data_end
                ))
                .with_offset(start));
            }
            ranges.push((start, end));
        }
        ranges.sort_unstable();
        // One read for adjacent chunks (all columns of a group are adjacent).
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let mut parts = Vec::with_capacity(merged.len());
        for (s, e) in merged {
            parts.push((s, read(&*self.file, s, e)?));
        }
        let data = Fetched {
            len: self.file.len(),
            parts: Arc::new(parts),
        };
        let rows = self.group_rows[g];
        let decoder = self.decoder(&data, g, skip, rows)?;
        Ok(Group {
            index: g,
            first: self.record - skip,
            rows,
            data,
            decoder,
            batch: Vec::new(),
            cols: None,
            batch_len: 0,
            batch_row: 0,
        })
    }

    fn decoder(
        &self,
        data: &Fetched,
        g: usize,
        skip: u64,
        rows: u64,
    ) -> Result<ParquetRecordBatchReader, Error> {
        let mut b =
            ParquetRecordBatchReaderBuilder::new_with_metadata(data.clone(), self.meta.clone())
                .with_projection(self.mask.clone())
                .with_row_groups(vec![g])
                .with_batch_size(BATCH_ROWS);
        if skip > 0 {
            b = b.with_row_selection(RowSelection::from(vec![
                RowSelector::skip(skip as usize),
                RowSelector::select((rows - skip) as usize),
            ]));
        }
        b.build()
            .map_err(|e| Error::record(format!("cannot decode row group {g}: {}", e)))
    }

    /// Drops the open group after an error in it, counting its remaining rows as failed.
    fn fail_group(&mut self, e: Error) -> Error {
        let g = self.group.take().expect("open group");
        let offset = self.group_offset(g.index);
        let e = self.locate(e, offset);
        self.record = g.first + g.rows;
        e
    }
}

impl ParquetReader {
    /// Decodes the next Arrow batch of the open row group, opening the next group when it
    /// is done: `Ok(true)` when a batch is ready (`batch` or `cols`), `Ok(false)` at the
    /// end of the file. An error drops the rest of its row group (counted as failed rows).
    fn advance(&mut self) -> Result<bool, Error> {
        loop {
            if let Some(g) = &mut self.group {
                // The parquet crate panics on some malformed pages (a dictionary-encoded page
                // with no dictionary page, found by fuzzing): a bad file is a bad record
                // group here, never a crashed pipeline. The decoder is dropped after it.
                let next =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.decoder.next()));
                let next = match next {
                    Ok(next) => next,
                    Err(panic) => {
                        let e = Error::record(format!(
                            "cannot decode row group {}: malformed data ({})",
                            g.index,
                            stoker_core::panic_message(&*panic)
                        ));
                        return Err(self.fail_group(e));
                    }
                };
                match next {
                    Some(Ok(rb)) => {
                        let at = self.record;
                        let done = if self.columnar {
                            to_columns(&rb, &self.names, &self.order).map(|c| g.cols = Some(c))
                        } else {
                            convert(&rb, &self.names, &self.order).map(|c| g.batch = c)
                        };
                        match done {
                            Ok(()) => {
                                g.batch_len = rb.num_rows();
                                g.batch_row = 0;
                                return Ok(true);
                            }
                            Err(msg) => {
                                let e = Error::record(format!(
                                    "row group {}, rows from {}: {msg}",
                                    g.index,
                                    at - g.first
                                ));
                                return Err(self.fail_group(e));
                            }
                        }
                    }
                    Some(Err(e)) => {
                        let e = Error::record(format!("cannot decode row group {}: {e}", g.index));
                        return Err(self.fail_group(e));
                    }
                    None => {
                        let (index, first, rows) = (g.index, g.first, g.rows);
                        let end = first + rows;
                        self.group = None;
                        if self.record < end {
                            let e = Error::record(format!(
                                "row group {index} decoded to {} rows, but the footer says {rows}",
                                self.record - first,
                            ));
                            let offset = self.group_offset(index);
                            let e = self.locate(e, offset);
                            self.record = end;
                            return Err(e);
                        }
                    }
                }
                continue;
            }
            if self.next_group >= self.group_rows.len() {
                return Ok(false);
            }
            let g = self.next_group;
            self.next_group += 1;
            match self.open_group(g, 0) {
                Ok(group) => self.group = Some(group),
                Err(e) => {
                    let offset = self.group_offset(g);
                    let e = self.locate(e, offset);
                    self.record += self.group_rows[g];
                    return Err(e);
                }
            }
        }
    }
}

impl ColumnReader for ParquetReader {
    fn next_columns(&mut self, max: usize) -> Result<Option<Columns>, Error> {
        loop {
            if let Some(g) = &mut self.group {
                if g.batch_row < g.batch_len {
                    let n = (g.batch_len - g.batch_row).min(max.max(1));
                    let c = g.cols.as_mut().expect("columnar reading").take_front(n);
                    g.batch_row += n;
                    self.record += n as u64;
                    return Ok(Some(c));
                }
            }
            if !self.advance()? {
                return Ok(None);
            }
        }
    }
}

impl RecordReader for ParquetReader {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        loop {
            if let Some(g) = &mut self.group {
                if g.batch_row < g.batch_len {
                    let r = g.batch_row;
                    g.batch_row += 1;
                    self.record += 1;
                    let mut s = Sample::with_capacity(self.names.len());
                    for (name, col) in self.names.iter().zip(&mut g.batch) {
                        s.insert(name.clone(), std::mem::replace(&mut col[r], Value::Null));
                    }
                    return Ok(Some(s));
                }
            }
            if !self.advance()? {
                return Ok(None);
            }
        }
    }

    fn record(&self) -> u64 {
        self.record
    }

    fn skip(&mut self, mut n: u64) -> Result<(), Error> {
        while n > 0 {
            if let Some(g) = &mut self.group {
                let in_batch = ((g.batch_len - g.batch_row) as u64).min(n);
                g.batch_row += in_batch as usize;
                self.record += in_batch;
                n -= in_batch;
                if n == 0 {
                    break;
                }
                // The batch is used up: the decoder stands at the group's row `pos`.
                let pos = self.record - g.first;
                let left = g.rows - pos;
                if n >= left {
                    self.record += left;
                    n -= left;
                    self.group = None;
                    continue;
                }
                let (data, index, rows) = (g.data.clone(), g.index, g.rows);
                match self.decoder(&data, index, pos + n, rows) {
                    Ok(d) => {
                        let g = self.group.as_mut().expect("open group");
                        g.decoder = d;
                        g.batch.clear();
                        g.cols = None;
                        g.batch_len = 0;
                        g.batch_row = 0;
                        self.record += n;
                    }
                    Err(e) => return Err(self.fail_group(e)),
                }
                break;
            }
            let Some(&rows) = self.group_rows.get(self.next_group) else {
                break;
            };
            let g = self.next_group;
            self.next_group += 1;
            if n >= rows {
                self.record += rows;
                n -= rows;
                continue;
            }
            self.record += n;
            match self.open_group(g, n) {
                Ok(group) => self.group = Some(group),
                Err(e) => {
                    let offset = self.group_offset(g);
                    let e = self.locate(e, offset);
                    self.record += rows - n;
                    return Err(e);
                }
            }
            break;
        }
        Ok(())
    }
}

/// `start..end` of a column chunk, checked (the metadata's own accessor panics on
/// negative numbers, which a corrupt footer can hold).
fn chunk_range(c: &ColumnChunkMetaData) -> Result<(u64, u64), String> {
    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
    let len = c.compressed_size();
    match (u64::try_from(start), u64::try_from(len)) {
        (Ok(s), Ok(l)) => Ok((s, s.saturating_add(l))),
        _ => Err(format!(
            "column {}: the footer gives its chunk offset {start} and size {len}",
            c.column_path()
        )),
    }
}

/// A ranged read, with the range in the error.
fn read(file: &dyn RandomAccess, start: u64, end: u64) -> Result<Bytes, Error> {
    let b = file.read_range(start, end).map_err(|e| {
        let kind = e.kind();
        let mut err = Error::from(e);
        err.message = format!("reading bytes {start}..{end}: {}", err.message);
        if kind == io::ErrorKind::UnexpectedEof {
            err.message.push_str(" (truncated file?)");
        }
        err.with_offset(start)
    })?;
    if b.len() as u64 != end - start {
        return Err(Error::record(format!(
            "reading bytes {start}..{end} returned {} bytes (truncated file?)",
            b.len()
        ))
        .with_offset(start));
    }
    Ok(b)
}

/// The byte ranges fetched for one row group, served to the decoder.
#[derive(Clone)]
struct Fetched {
    len: u64,
    /// `(start, bytes)`, sorted and disjoint.
    parts: Arc<Vec<(u64, Bytes)>>,
}

impl fmt::Debug for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetched")
            .field("len", &self.len)
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl Fetched {
    fn from(&self, start: u64, len: usize) -> Result<Bytes, ParquetError> {
        let i = self.parts.partition_point(|(s, _)| *s <= start);
        if i > 0 {
            let (s, b) = &self.parts[i - 1];
            let at = (start - s) as usize;
            if at + len <= b.len() {
                return Ok(b.slice(at..));
            }
        }
        Err(ParquetError::EOF(format!(
            "bytes {start}..{} lie outside the column chunks the footer describes (a page \
             runs past the end of its chunk: truncated or corrupt)",
            start + len as u64
        )))
    }
}

impl Length for Fetched {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Fetched {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T, ParquetError> {
        Ok(self.from(start, 0)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, ParquetError> {
        Ok(self.from(start, length)?.slice(..length))
    }
}

/// Whether a column of type `t` becomes values.
fn supported(t: &DataType) -> bool {
    match t {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_)
        | DataType::Timestamp(_, _)
        | DataType::Date32 => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            supported(f.data_type())
        }
        DataType::Dictionary(_, v) => supported(v),
        _ => false,
    }
}

/// A batch as columns of values, in output order.
fn convert(
    rb: &RecordBatch,
    names: &[Arc<str>],
    order: &[usize],
) -> Result<Vec<Vec<Value>>, String> {
    names
        .iter()
        .zip(order)
        .map(|(name, &i)| values(rb.column(i)).map_err(|m| format!("column {name:?}: {m}")))
        .collect()
}

/// A batch as [`Columns`], in output order (the same values and errors as [`convert`]).
fn to_columns(rb: &RecordBatch, names: &[Arc<str>], order: &[usize]) -> Result<Columns, String> {
    let cols = names
        .iter()
        .zip(order)
        .map(|(name, &i)| column(rb.column(i)).map_err(|m| format!("column {name:?}: {m}")))
        .collect::<Result<Vec<Column>, String>>()?;
    Columns::new(names.to_vec(), cols).map_err(|e| e.message)
}

fn ints<T: ArrowPrimitiveType>(a: &dyn Array, f: impl Fn(T::Native) -> i64) -> Column {
    Column::Ints(
        a.as_primitive::<T>()
            .values()
            .iter()
            .map(|&v| f(v))
            .collect(),
    )
}

fn floats<T: ArrowPrimitiveType>(a: &dyn Array, f: impl Fn(T::Native) -> f64) -> Column {
    Column::Floats(
        a.as_primitive::<T>()
            .values()
            .iter()
            .map(|&v| f(v))
            .collect(),
    )
}

/// One column: a plain vector for integers and floats without nulls (types whose
/// conversion cannot fail), else the values of [`values`].
fn column(a: &ArrayRef) -> Result<Column, String> {
    let arr: &dyn Array = a.as_ref();
    if arr.null_count() == 0 {
        let c = match arr.data_type() {
            DataType::Boolean => {
                Column::Ints(arr.as_boolean().values().iter().map(i64::from).collect())
            }
            DataType::Int8 => ints::<Int8Type>(arr, i64::from),
            DataType::Int16 => ints::<Int16Type>(arr, i64::from),
            DataType::Int32 => ints::<Int32Type>(arr, i64::from),
            DataType::Int64 => ints::<Int64Type>(arr, |v| v),
            DataType::UInt8 => ints::<UInt8Type>(arr, i64::from),
            DataType::UInt16 => ints::<UInt16Type>(arr, i64::from),
            DataType::UInt32 => ints::<UInt32Type>(arr, i64::from),
            DataType::Date32 => ints::<Date32Type>(arr, i64::from),
            DataType::Float16 => floats::<Float16Type>(arr, |v| v.to_f64()),
            DataType::Float32 => floats::<Float32Type>(arr, f64::from),
            DataType::Float64 => floats::<Float64Type>(arr, |v| v),
            _ => return values(a).map(Column::Values),
        };
        return Ok(c);
    }
    values(a).map(Column::Values)
}

fn prim<T: ArrowPrimitiveType>(a: &dyn Array, f: impl Fn(T::Native) -> Value) -> Vec<Value> {
    let p = a.as_primitive::<T>();
    if p.null_count() == 0 {
        p.values().iter().map(|&v| f(v)).collect()
    } else {
        p.iter().map(|v| v.map_or(Value::Null, &f)).collect()
    }
}

fn try_prim<T: ArrowPrimitiveType>(
    a: &dyn Array,
    f: impl Fn(T::Native) -> Result<Value, String>,
) -> Result<Vec<Value>, String> {
    a.as_primitive::<T>()
        .iter()
        .map(|v| v.map_or(Ok(Value::Null), &f))
        .collect()
}

fn nanos<T: ArrowPrimitiveType<Native = i64>>(
    a: &dyn Array,
    per: i64,
) -> Result<Vec<Value>, String> {
    try_prim::<T>(a, |v| {
        v.checked_mul(per)
            .map(Value::Int)
            .ok_or_else(|| format!("timestamp {v} does not fit in i64 nanoseconds"))
    })
}

/// Zero-copy slices of a byte array's buffer.
fn byte_slices<'a>(
    a: &'a dyn Array,
    buffer: &arrow_buffer::Buffer,
    value: impl Fn(usize) -> &'a [u8],
) -> Vec<Value> {
    let base = Bytes::from(buffer.clone());
    (0..a.len())
        .map(|i| {
            if a.is_null(i) {
                Value::Null
            } else {
                Value::Bytes(base.slice_ref(value(i)))
            }
        })
        .collect()
}

fn strings<'a>(a: &dyn Array, iter: impl Iterator<Item = Option<&'a str>>) -> Vec<Value> {
    let mut out = Vec::with_capacity(a.len());
    out.extend(iter.map(|s| s.map_or(Value::Null, |s| Value::Str(s.into()))));
    out
}

/// One value per row of `a`.
fn values(a: &ArrayRef) -> Result<Vec<Value>, String> {
    let a: &dyn Array = a.as_ref();
    Ok(match a.data_type() {
        DataType::Null => vec![Value::Null; a.len()],
        DataType::Boolean => a
            .as_boolean()
            .iter()
            .map(|v| v.map_or(Value::Null, |b| Value::Int(i64::from(b))))
            .collect(),
        DataType::Int8 => prim::<Int8Type>(a, |v| Value::Int(v.into())),
        DataType::Int16 => prim::<Int16Type>(a, |v| Value::Int(v.into())),
        DataType::Int32 => prim::<Int32Type>(a, |v| Value::Int(v.into())),
        DataType::Int64 => prim::<Int64Type>(a, Value::Int),
        DataType::UInt8 => prim::<UInt8Type>(a, |v| Value::Int(v.into())),
        DataType::UInt16 => prim::<UInt16Type>(a, |v| Value::Int(v.into())),
        DataType::UInt32 => prim::<UInt32Type>(a, |v| Value::Int(v.into())),
        DataType::UInt64 => try_prim::<UInt64Type>(a, |v| {
            i64::try_from(v)
                .map(Value::Int)
                .map_err(|_| format!("uint64 value {v} does not fit in an Int (i64)"))
        })?,
        DataType::Float16 => prim::<Float16Type>(a, |v| Value::Float(v.to_f64())),
        DataType::Float32 => prim::<Float32Type>(a, |v| Value::Float(v.into())),
        DataType::Float64 => prim::<Float64Type>(a, Value::Float),
        DataType::Date32 => prim::<Date32Type>(a, |v| Value::Int(v.into())),
        DataType::Timestamp(unit, _) => match unit {
            TimeUnit::Second => nanos::<TimestampSecondType>(a, 1_000_000_000)?,
            TimeUnit::Millisecond => nanos::<TimestampMillisecondType>(a, 1_000_000)?,
            TimeUnit::Microsecond => nanos::<TimestampMicrosecondType>(a, 1_000)?,
            TimeUnit::Nanosecond => nanos::<TimestampNanosecondType>(a, 1)?,
        },
        DataType::Utf8 => strings(a, a.as_string::<i32>().iter()),
        DataType::LargeUtf8 => strings(a, a.as_string::<i64>().iter()),
        DataType::Utf8View => strings(a, a.as_string_view().iter()),
        DataType::Binary => {
            let b = a.as_binary::<i32>();
            byte_slices(a, b.values(), |i| b.value(i))
        }
        DataType::LargeBinary => {
            let b = a.as_binary::<i64>();
            byte_slices(a, b.values(), |i| b.value(i))
        }
        DataType::FixedSizeBinary(_) => {
            let b = a.as_fixed_size_binary();
            byte_slices(a, b.values(), |i| b.value(i))
        }
        DataType::BinaryView => a
            .as_binary_view()
            .iter()
            .map(|v| v.map_or(Value::Null, |v| Value::Bytes(Bytes::copy_from_slice(v))))
            .collect(),
        DataType::List(_) => list_values(a.as_list::<i32>())?,
        DataType::LargeList(_) => list_values(a.as_list::<i64>())?,
        DataType::FixedSizeList(_, _) => {
            let l = a.as_fixed_size_list();
            let n = l.value_length() as usize;
            lists(a, l.values(), |i| {
                let s = l.value_offset_at(i);
                (s, s + n)
            })?
        }
        DataType::Dictionary(_, _) => {
            let d = a.as_any_dictionary();
            let vals = values(d.values())?;
            d.normalized_keys()
                .into_iter()
                .enumerate()
                .map(|(i, k)| {
                    if a.is_null(i) {
                        Value::Null
                    } else {
                        vals.get(k).cloned().unwrap_or(Value::Null)
                    }
                })
                .collect()
        }
        t => return Err(format!("type {t} has no Stoker value")),
    })
}

fn list_values<O: OffsetSizeTrait>(
    l: &arrow_array::GenericListArray<O>,
) -> Result<Vec<Value>, String> {
    let off = l.value_offsets();
    lists(l, l.values(), |i| {
        (off[i].as_usize(), off[i + 1].as_usize())
    })
}

/// The tensor dtype of a list element type, where Stoker has one.
fn tensor_dtype(t: &DataType) -> Option<DType> {
    Some(match t {
        DataType::Int64 => DType::I64,
        DataType::Int32 => DType::I32,
        DataType::Int16 => DType::I16,
        DataType::UInt8 => DType::U8,
        DataType::Float32 => DType::F32,
        DataType::Float64 => DType::F64,
        _ => return None,
    })
}

/// Rows of a list array: `range(i)` is row `i`'s span of `child` (ascending in `i`).
fn lists(
    a: &dyn Array,
    child: &ArrayRef,
    range: impl Fn(usize) -> (usize, usize),
) -> Result<Vec<Value>, String> {
    let n = a.len();
    if let Some(dtype) = tensor_dtype(child.data_type()) {
        // A zero-copy view of the child's values; the buffer starts at the child's row 0.
        let data = child.to_data();
        let size = dtype.size();
        let base = Bytes::from(data.buffers()[0].clone());
        let skip = data.offset() * size;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if a.is_null(i) {
                out.push(Value::Null);
                continue;
            }
            let (s, e) = range(i);
            if child.null_count() > 0 && (s..e).any(|j| child.is_null(j)) {
                let part = values(&child.slice(s, e - s))?;
                out.push(Value::List(part));
                continue;
            }
            let bytes = base.slice(skip + s * size..skip + e * size);
            let t = Tensor::new(dtype, vec![e - s], bytes).map_err(|e| e.message)?;
            out.push(Value::Tensor(t));
        }
        return Ok(out);
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // Other elements: convert the child span once, then hand each row its part.
    let (first, _) = range(0);
    let (_, last) = range(n - 1);
    let mut items = values(&child.slice(first, last - first))?.into_iter();
    let mut at = first;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (s, e) = range(i);
        if s > at {
            items.by_ref().take(s - at).for_each(drop);
        }
        let part: Vec<Value> = items.by_ref().take(e - s).collect();
        at = e;
        out.push(if a.is_null(i) {
            Value::Null
        } else {
            Value::List(part)
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as ranged reads from memory.
    struct Mem(Bytes);

    impl RandomAccess for Mem {
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_range(&self, start: u64, end: u64) -> io::Result<Bytes> {
            Ok(self.0.slice(start as usize..end as usize))
        }
    }

    const TABLE: &[u8] = include_bytes!("../tests/fixtures/table.snappy.parquet");

    /// What the row reader gives: rows and errors (as text), in order.
    fn by_rows(f: &Parquet, data: &Bytes) -> Vec<Result<Sample, String>> {
        let shard = ShardInfo::new("t", "s3://b/t");
        let mut r = match f.open(&shard, Input::Random(Arc::new(Mem(data.clone())))) {
            Ok(r) => r,
            Err(e) => return vec![Err(e.to_string())],
        };
        let mut out = Vec::new();
        for _ in 0..10_000 {
            match r.next() {
                Ok(Some(s)) => out.push(Ok(s)),
                Ok(None) => return out,
                Err(e) => out.push(Err(e.to_string())),
            }
        }
        panic!("no end");
    }

    /// The same through `next_columns(max)`.
    fn by_columns(f: &Parquet, data: &Bytes, max: usize) -> Vec<Result<Sample, String>> {
        let shard = ShardInfo::new("t", "s3://b/t");
        let mut r = match f.open_columns(&shard, Input::Random(Arc::new(Mem(data.clone())))) {
            Ok(r) => r,
            Err(e) => return vec![Err(e.to_string())],
        };
        let mut out = Vec::new();
        for _ in 0..10_000 {
            match r.next_columns(max) {
                Ok(Some(c)) => {
                    assert!(!c.is_empty() && c.len() <= max.max(1));
                    out.extend((0..c.len()).map(|i| Ok(c.row(i))));
                }
                Ok(None) => return out,
                Err(e) => out.push(Err(e.to_string())),
            }
        }
        panic!("no end");
    }

    #[test]
    fn columns_hold_the_rows_and_errors_of_the_row_reader() {
        let table = Bytes::from_static(TABLE);
        // A copy with the second row group's column chunks overwritten: that group fails
        // to decode, the others read.
        let mut broken = TABLE.to_vec();
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&table)
            .unwrap();
        for c in meta.row_group(1).columns() {
            let (start, end) = chunk_range(c).unwrap();
            for b in &mut broken[start as usize..end as usize] {
                *b = 0xff;
            }
        }
        let broken = Bytes::from(broken);
        let projections = [
            None,
            Some(vec!["maybe".to_string(), "id".into(), "name".into()]),
            Some(vec![
                "score".to_string(),
                "flag".into(),
                "vec".into(),
                "ts".into(),
            ]),
        ];
        for columns in projections {
            let f = Parquet {
                columns: columns.clone(),
            };
            for data in [&table, &broken] {
                let want = by_rows(&f, data);
                assert!(
                    want.iter().filter(|r| r.is_ok()).count() >= 30,
                    "{columns:?}"
                );
                for max in [1, 3, 7, 10, 1000] {
                    assert_eq!(by_columns(&f, data, max), want, "{columns:?}, max {max}");
                }
            }
            let want = by_rows(&f, &broken);
            assert!(want.iter().any(|r| r.is_err()), "{want:?}");
        }
    }
}
