//! CSV (and other delimiter-separated values): every row is one sample.
//!
//! Parsed with `csv-core`, fed the object's chunks as they arrive (a quoted field may span
//! chunks and lines). Quoting follows RFC 4180: a field in double quotes may hold the
//! delimiter, newlines and doubled quotes (`""` for `"`). Rows end with `\n`, `\r\n` or
//! `\r`; empty lines are skipped. A UTF-8 byte order mark at the start is ignored.
//!
//! Field names come from the header row (an empty or repeated name becomes `c<index>`),
//! or are `c0`, `c1`, ... without one; one `Arc<str>` per column serves every row. With
//! [`Csv::infer_types`] a field that parses as `i64` is an `Int`, one that parses as `f64`
//! (including `nan` and `inf`) a `Float`, an empty one (quoted or not) `Null`, anything
//! else a `Str`; without it every field is a `Str`. A row whose number of fields differs
//! from the header's (or, without a header, the first row's) is an [`Error::record`] naming
//! its byte offset and record index, and so is a field that is not UTF-8; the next call
//! goes on with the next row. A quoted field whose closing quote never comes (the object
//! ends inside it) is an [`Error::record`] naming the byte offset and line where the field
//! began, and ends the object: everything after the opening quote would otherwise be
//! taken silently as one field (Python's `csv` in strict mode, Arrow and pandas raise too).

use std::sync::Arc;

use bytes::Bytes;
use csv_core::{ReadRecordResult, Reader, ReaderBuilder};
use stoker_core::{Error, Sample, Value};

use crate::format::{locate, Format, RecordReader, ShardInfo};
use crate::input::{ChunkCursor, Input};

/// Bytes asked of the cursor at a time (chunks are handed over whole when smaller).
const READ: usize = 64 * 1024;

/// Delimiter-separated values.
#[derive(Debug, Clone, Copy)]
pub struct Csv {
    /// The field separator (`b','`, `b'\t'`, `b';'`).
    pub delimiter: u8,
    /// Whether the first row names the fields.
    pub has_header: bool,
    /// Whether fields become `Int`, `Float` and `Null` where they parse so (else all `Str`).
    pub infer_types: bool,
}

impl Default for Csv {
    fn default() -> Csv {
        Csv {
            delimiter: b',',
            has_header: true,
            infer_types: true,
        }
    }
}

impl Format for Csv {
    fn name(&self) -> &'static str {
        "csv"
    }

    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        match input {
            Input::Stream(cursor) => Ok(Box::new(CsvReader {
                shard: shard.clone(),
                cursor,
                parser: ReaderBuilder::new().delimiter(self.delimiter).build(),
                opts: *self,
                buf: Bytes::new(),
                pos: 0,
                eof: false,
                out: vec![0; 1024],
                ends: vec![0; 64],
                fields: 0,
                consumed: 0,
                names: None,
                record: 0,
                quotes: QuoteScan::default(),
                done: false,
            })),
            Input::Random(_) => Err(Error::invalid("csv reads a stream, not random access")
                .with_stage("csv")
                .with_object(shard.url.clone())),
        }
    }
}

struct CsvReader {
    shard: ShardInfo,
    cursor: ChunkCursor,
    parser: Reader,
    opts: Csv,
    /// The chunk being parsed, and how far.
    buf: Bytes,
    pos: usize,
    eof: bool,
    /// The current row: unescaped field bytes, and where each field ends.
    out: Vec<u8>,
    ends: Vec<usize>,
    fields: usize,
    /// Bytes of the object handed to the parser.
    consumed: u64,
    names: Option<Vec<Arc<str>>>,
    record: u64,
    /// Where quoted fields open and close, to tell an unterminated one at the end.
    quotes: QuoteScan,
    /// An unterminated quote ended the object.
    done: bool,
}

impl CsvReader {
    /// Parses the next row into `out`/`ends`; its byte offset, or `None` at the end.
    fn read_row(&mut self) -> Result<Option<u64>, Error> {
        let mut nout_total = 0;
        let mut start = None;
        self.fields = 0;
        loop {
            if self.pos == self.buf.len() && !self.eof {
                let at = self.cursor.offset();
                self.buf = self
                    .cursor
                    .read_up_to(READ)
                    .map_err(|e| locate(e.into(), "csv", &self.shard, at, self.record))?;
                self.pos = 0;
                if at == 0 && self.buf.starts_with(b"\xEF\xBB\xBF") {
                    self.pos = 3;
                    self.consumed = 3;
                }
                self.eof = self.buf.is_empty();
            }
            if start.is_none() {
                // The row starts at its first byte that is not a line end (csv-core takes
                // the `\n` of a `\r\n` as the start of the next row, and skips empty lines).
                let input = &self.buf[self.pos..];
                if let Some(k) = input.iter().position(|&b| b != b'\r' && b != b'\n') {
                    start = Some(self.consumed + k as u64);
                }
            }
            let (res, nin, nout, nend) = self.parser.read_record(
                &self.buf[self.pos..],
                &mut self.out[nout_total..],
                &mut self.ends[self.fields..],
            );
            self.quotes.scan(
                &self.buf[self.pos..self.pos + nin],
                self.consumed,
                self.opts.delimiter,
            );
            self.pos += nin;
            self.consumed += nin as u64;
            nout_total += nout;
            self.fields += nend;
            match res {
                ReadRecordResult::InputEmpty => {}
                ReadRecordResult::OutputFull => {
                    let n = self.out.len() * 2;
                    self.out.resize(n, 0);
                }
                ReadRecordResult::OutputEndsFull => {
                    let n = self.ends.len() * 2;
                    self.ends.resize(n, 0);
                }
                ReadRecordResult::Record => return Ok(Some(start.unwrap_or(self.consumed))),
                ReadRecordResult::End => return Ok(None),
            }
        }
    }

    fn field(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.out[start..self.ends[i]]
    }

    fn header(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = Vec::with_capacity(self.fields);
        for i in 0..self.fields {
            let raw = String::from_utf8_lossy(self.field(i));
            let name = raw.trim();
            let name: Arc<str> = if name.is_empty() || names.iter().any(|n| &**n == name) {
                format!("c{i}").into()
            } else {
                name.into()
            };
            names.push(name);
        }
        names
    }
}

impl RecordReader for CsvReader {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        loop {
            if self.done {
                return Ok(None);
            }
            let Some(start) = self.read_row()? else {
                return Ok(None);
            };
            if self.eof {
                if let Some((at, line)) = self.quotes.open_at() {
                    let record = self.record;
                    self.record += 1;
                    self.done = true;
                    let e = Error::record(format!(
                        "unterminated quote: the quoted field that begins at byte {at} \
                         (line {line}) has no closing quote before the end of the object"
                    ))
                    .with_offset(at);
                    return Err(locate(e, "csv", &self.shard, start, record));
                }
            }
            if self.names.is_none() {
                if self.opts.has_header {
                    self.names = Some(self.header());
                    continue;
                }
                self.names = Some((0..self.fields).map(|i| format!("c{i}").into()).collect());
            }
            let names = self.names.as_ref().expect("set above");
            let record = self.record;
            self.record += 1;
            let bad = |msg: String| locate(Error::record(msg), "csv", &self.shard, start, record);
            if self.fields != names.len() {
                return Err(bad(format!(
                    "the row has {} fields, {} has {}",
                    self.fields,
                    if self.opts.has_header {
                        "the header"
                    } else {
                        "the first row"
                    },
                    names.len()
                )));
            }
            let mut s = Sample::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                let raw = self.field(i);
                let text = std::str::from_utf8(raw)
                    .map_err(|e| bad(format!("field {name:?} is not UTF-8 text ({e})")))?;
                s.insert(name.clone(), typed(text, self.opts.infer_types));
            }
            return Ok(Some(s));
        }
    }

    fn record(&self) -> u64 {
        self.record
    }
}

/// Follows the input the parser was given, as csv-core's state machine does (RFC 4180,
/// doubled quotes, any line end ends a row), to know whether the object ended inside a
/// quoted field and where that field began.
#[derive(Debug, Clone, Copy)]
struct QuoteScan {
    state: QuoteState,
    /// Offset and 1-based line of the last opening quote.
    open: (u64, u64),
    /// Line of the next byte (`\n`, `\r\n` and a lone `\r` each end one).
    line: u64,
    after_cr: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuoteState {
    /// At the start of a field: a quote here opens a quoted field.
    FieldStart,
    /// In an unquoted field (or after a quoted one's closing quote).
    Field,
    Quoted,
    /// A quote inside a quoted field: closes it, or escapes the next quote.
    QuoteInQuoted,
}

impl Default for QuoteScan {
    fn default() -> QuoteScan {
        QuoteScan {
            state: QuoteState::FieldStart,
            open: (0, 1),
            line: 1,
            after_cr: false,
        }
    }
}

impl QuoteScan {
    /// Follows `bytes`, found at offset `base` of the object.
    fn scan(&mut self, bytes: &[u8], base: u64, delimiter: u8) {
        use QuoteState::*;
        for (i, &b) in bytes.iter().enumerate() {
            let line_end = b == b'\n' || b == b'\r';
            self.state = match (self.state, b) {
                (FieldStart, b'"') => {
                    self.open = (base + i as u64, self.line);
                    Quoted
                }
                (Quoted, b'"') => QuoteInQuoted,
                (Quoted, _) => Quoted,
                (QuoteInQuoted, b'"') => Quoted,
                (_, _) if b == delimiter || line_end => FieldStart,
                _ => Field,
            };
            if b == b'\r' || (b == b'\n' && !self.after_cr) {
                self.line += 1;
            }
            self.after_cr = b == b'\r';
        }
    }

    /// Where the quoted field the input ended in began, if it ended in one.
    fn open_at(&self) -> Option<(u64, u64)> {
        (self.state == QuoteState::Quoted).then_some(self.open)
    }
}

/// A field's value.
fn typed(text: &str, infer: bool) -> Value {
    if !infer {
        return Value::Str(text.into());
    }
    if text.is_empty() {
        return Value::Null;
    }
    if let Ok(i) = text.parse::<i64>() {
        return Value::Int(i);
    }
    if let Ok(f) = text.parse::<f64>() {
        return Value::Float(f);
    }
    Value::Str(text.into())
}
