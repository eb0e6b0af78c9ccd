//! Categorical transforms: hashing into buckets, vocabulary lookup.
//!
//! Both take strings (`Str`, or `Bytes` compared byte for byte) and integers, and treat an
//! integer as its decimal text (`123` and `"123"` are the same category), so a column read
//! as ints from Parquet and as strings from CSV maps alike.

use std::collections::HashMap;
use std::path::Path;

use stoker_core::{Error, Value};
use twox_hash::XxHash64;

use super::cells::{self, Cell, Layout, Site};
use super::ColumnOp;

/// Calls `f` with the bytes of each categorical cell (ints as decimal text).
fn each_key(
    site: Site<'_>,
    v: &Value,
    mut f: impl FnMut(&[u8]) -> i64,
) -> Result<(Layout, Vec<i64>), Error> {
    let (layout, cells) = cells::read(v)?;
    let mut out = Vec::with_capacity(cells.len());
    let mut digits = itoa_buf();
    for (row, c) in cells.iter().enumerate() {
        out.push(match *c {
            Cell::Text(b) => f(b),
            Cell::Int(i) => f(decimal(i, &mut digits)),
            Cell::Null => return Err(site.err(&layout, row, "is null (put fill_null before it)")),
            other => {
                return Err(site.err(
                    &layout,
                    row,
                    format!("is {}, expected a string or an integer", other.kind()),
                ))
            }
        });
    }
    Ok((layout, out))
}

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// The decimal text of `i` (as `i.to_string()`, without allocating).
fn decimal(i: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut n = i.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

/// Hashes categories into `num_buckets` buckets: `xxh64(bytes, seed) % num_buckets`, where
/// `bytes` is the UTF-8 of a string or the decimal text of an integer.
///
/// XXH64 is fixed by its specification, so buckets are the same on every run, machine
/// and platform, and reproducible elsewhere: in Python,
/// `xxhash.xxh64_intdigest(str(x).encode(), seed=seed) % num_buckets`.
#[derive(Debug, Clone, PartialEq)]
pub struct HashBucket {
    field: String,
    num_buckets: u64,
    seed: u64,
}

impl HashBucket {
    /// Hashes `field` into `num_buckets` (at least 1) buckets with seed 0.
    pub fn new(field: impl Into<String>, num_buckets: u64) -> Result<HashBucket, Error> {
        if num_buckets == 0 || i64::try_from(num_buckets).is_err() {
            return Err(Error::invalid(format!(
                "hash_bucket: num_buckets must be in 1..=2^63-1, not {num_buckets}"
            )));
        }
        Ok(HashBucket {
            field: field.into(),
            num_buckets,
            seed: 0,
        })
    }
    /// Sets the hash seed (a different seed, a different assignment).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// The bucket of one category's bytes.
    pub fn bucket(&self, key: &[u8]) -> i64 {
        (XxHash64::oneshot(self.seed, key) % self.num_buckets) as i64
    }
}

impl ColumnOp for HashBucket {
    fn name(&self) -> &'static str {
        "hash_bucket"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let site = Site {
            op: "hash_bucket",
            field: &self.field,
        };
        let (layout, out) = each_key(site, value, |k| self.bucket(k))?;
        cells::ints(&layout, &out)
    }
}

/// Maps categories to indices with a fixed vocabulary: the `i`-th token gets `i`, anything
/// else the OOV index (by default `len`, one past the last token).
#[derive(Debug, Clone, PartialEq)]
pub struct VocabLookup {
    field: String,
    index: HashMap<Vec<u8>, i64>,
    oov: i64,
}

impl VocabLookup {
    /// A vocabulary of `tokens` in order; duplicates are refused.
    pub fn new<T: AsRef<str>>(
        field: impl Into<String>,
        tokens: impl IntoIterator<Item = T>,
    ) -> Result<VocabLookup, Error> {
        let mut index = HashMap::new();
        for (i, t) in tokens.into_iter().enumerate() {
            let t = t.as_ref();
            if index.insert(t.as_bytes().to_vec(), i as i64).is_some() {
                return Err(Error::invalid(format!(
                    "vocab_lookup: token {t:?} appears twice (again at index {i})"
                )));
            }
        }
        let oov = index.len() as i64;
        Ok(VocabLookup {
            field: field.into(),
            index,
            oov,
        })
    }

    /// A vocabulary from a UTF-8 file of one token per line (`\n` or `\r\n`; a last
    /// newline is optional). An empty line or a duplicate is refused, naming the line.
    pub fn from_file(
        field: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Result<VocabLookup, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(format!("vocab_lookup: cannot read {}: {e}", path.display()))
        })?;
        let body = text.strip_suffix('\n').unwrap_or(&text);
        let lines: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('\n')
                .map(|l| l.strip_suffix('\r').unwrap_or(l))
                .collect()
        };
        if let Some(i) = lines.iter().position(|l| l.is_empty()) {
            return Err(Error::invalid(format!(
                "vocab_lookup: {} line {} is empty",
                path.display(),
                i + 1
            )));
        }
        VocabLookup::new(field, lines)
            .map_err(|e| Error::invalid(format!("{} (in {})", e.message, path.display())))
    }

    /// Sets the index of out-of-vocabulary categories (default: the vocabulary size).
    pub fn oov_index(mut self, i: i64) -> Self {
        self.oov = i;
        self
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the vocabulary is empty (everything is OOV).
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The index of one category's bytes.
    pub fn lookup(&self, key: &[u8]) -> i64 {
        self.index.get(key).copied().unwrap_or(self.oov)
    }
}

impl ColumnOp for VocabLookup {
    fn name(&self) -> &'static str {
        "vocab_lookup"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let site = Site {
            op: "vocab_lookup",
            field: &self.field,
        };
        let (layout, out) = each_key(site, value, |k| self.lookup(k))?;
        cells::ints(&layout, &out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_matches_to_string() {
        let mut b = itoa_buf();
        for i in [0, 7, -7, 10, 123_456, i64::MIN, i64::MAX] {
            assert_eq!(decimal(i, &mut b), i.to_string().as_bytes());
        }
    }
}
