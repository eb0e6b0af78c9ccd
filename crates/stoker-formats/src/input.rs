//! Bytes in: what a format reads from.
//!
//! Streaming formats (tar, TFRecord, JSONL, CSV) read a [`ByteSource`], a sequence of
//! chunks in object order (the parts the store delivers, or one whole object), through a
//! [`ChunkCursor`], which hands out exact byte ranges as zero-copy slices of the chunks
//! whenever a range lies within one chunk, and copies only ranges that straddle two.
//! Formats that need random access (Parquet's footer comes last) read a [`RandomAccess`].

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// Chunks of one object, in order.
pub trait ByteSource: Send {
    /// The next chunk, or `None` at the end. Chunks may have any length, including 0.
    fn next_chunk(&mut self) -> io::Result<Option<Bytes>>;
}

/// A whole object in memory is a source of one chunk.
impl ByteSource for Option<Bytes> {
    fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        Ok(self.take())
    }
}

/// An iterator of chunks is a source (tests, in-memory pipelines).
#[derive(Debug)]
pub struct IterSource<I>(pub I);

impl<I> ByteSource for IterSource<I>
where
    I: Iterator<Item = io::Result<Bytes>> + Send,
{
    fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        self.0.next().transpose()
    }
}

/// Reads exact ranges out of a [`ByteSource`], zero-copy where it can.
pub struct ChunkCursor {
    src: Box<dyn ByteSource>,
    chunks: VecDeque<Bytes>,
    buffered: usize,
    offset: u64,
    eof: bool,
}

impl std::fmt::Debug for ChunkCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCursor")
            .field("offset", &self.offset)
            .field("buffered", &self.buffered)
            .field("eof", &self.eof)
            .finish()
    }
}

impl ChunkCursor {
    /// A cursor at byte 0 of `src`.
    pub fn new(src: Box<dyn ByteSource>) -> ChunkCursor {
        ChunkCursor {
            src,
            chunks: VecDeque::new(),
            buffered: 0,
            offset: 0,
            eof: false,
        }
    }

    /// A cursor over one in-memory buffer.
    pub fn from_bytes(b: Bytes) -> ChunkCursor {
        ChunkCursor::new(Box::new(Some(b)))
    }

    /// Bytes consumed so far: the object offset of the next byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Buffers until at least `n` bytes are available or the source ends; returns how
    /// many are available (less than `n` only at the end).
    pub fn fill(&mut self, n: usize) -> io::Result<usize> {
        while self.buffered < n && !self.eof {
            match self.src.next_chunk()? {
                Some(c) if c.is_empty() => {}
                Some(c) => {
                    self.buffered += c.len();
                    self.chunks.push_back(c);
                }
                None => self.eof = true,
            }
        }
        Ok(self.buffered.min(n))
    }

    /// True at the end of the object (nothing buffered and the source is done).
    pub fn at_end(&mut self) -> io::Result<bool> {
        Ok(self.fill(1)? == 0)
    }

    /// The next `n` bytes without consuming them (copied only if they straddle chunks).
    /// Fewer at the end of the object.
    pub fn peek(&mut self, n: usize) -> io::Result<Bytes> {
        let have = self.fill(n)?;
        Ok(self.gather(have, false))
    }

    /// Consumes exactly `n` bytes; `UnexpectedEof` (saying how many were missing) if the
    /// object ends first.
    pub fn read_exact(&mut self, n: usize) -> io::Result<Bytes> {
        let have = self.fill(n)?;
        if have < n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "object ends after {} more bytes, {n} needed at byte {}",
                    have, self.offset
                ),
            ));
        }
        Ok(self.gather(n, true))
    }

    /// Consumes up to `n` bytes (fewer only at the end).
    pub fn read_up_to(&mut self, n: usize) -> io::Result<Bytes> {
        let have = self.fill(n)?;
        Ok(self.gather(have, true))
    }

    /// Skips exactly `n` bytes without keeping them; `UnexpectedEof` if the object ends.
    pub fn skip(&mut self, mut n: u64) -> io::Result<()> {
        while n > 0 {
            if self.buffered == 0 {
                if self.fill(1)? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("object ends at byte {}, {n} bytes short", self.offset),
                    ));
                }
                continue;
            }
            let front = self.chunks.front_mut().expect("buffered");
            let take = (front.len() as u64).min(n) as usize;
            let _ = front.split_to(take);
            if front.is_empty() {
                self.chunks.pop_front();
            }
            self.buffered -= take;
            self.offset += take as u64;
            n -= take as u64;
        }
        Ok(())
    }

    /// Consumes bytes up to and including the next `delim` (or to the end of the object);
    /// `None` at the end. The delimiter is included.
    pub fn read_until(&mut self, delim: u8) -> io::Result<Option<Bytes>> {
        let mut scanned = 0usize;
        loop {
            // Search the buffered chunks past what was already scanned.
            let mut pos = 0usize;
            for c in &self.chunks {
                if scanned < pos + c.len() {
                    let from = scanned.saturating_sub(pos);
                    if let Some(i) = c[from..].iter().position(|&b| b == delim) {
                        return Ok(Some(self.gather(pos + from + i + 1, true)));
                    }
                }
                pos += c.len();
            }
            scanned = self.buffered;
            if self.eof || self.fill(self.buffered + 1)? == scanned {
                return Ok((self.buffered > 0).then(|| self.gather(self.buffered, true)));
            }
        }
    }

    fn gather(&mut self, n: usize, consume: bool) -> Bytes {
        if n == 0 {
            return Bytes::new();
        }
        let out = if self.chunks[0].len() >= n {
            self.chunks[0].slice(..n)
        } else {
            let mut b = BytesMut::with_capacity(n);
            let mut left = n;
            for c in &self.chunks {
                let t = c.len().min(left);
                b.extend_from_slice(&c[..t]);
                left -= t;
                if left == 0 {
                    break;
                }
            }
            b.freeze()
        };
        if consume {
            let mut left = n;
            while left > 0 {
                let front = self.chunks.front_mut().expect("buffered");
                if front.len() <= left {
                    left -= front.len();
                    self.chunks.pop_front();
                } else {
                    let _ = front.split_to(left);
                    left = 0;
                }
            }
            self.buffered -= n;
            self.offset += n as u64;
        }
        out
    }
}

/// Random access to one object (Parquet, and formats resumed by byte offset).
pub trait RandomAccess: Send + Sync {
    /// Object size in bytes.
    fn len(&self) -> u64;
    /// True for an empty object.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes `start..end` (blocking; called from the CPU pool, never from async code).
    fn read_range(&self, start: u64, end: u64) -> io::Result<Bytes>;
}

/// An in-memory object has random access.
impl RandomAccess for Bytes {
    fn len(&self) -> u64 {
        Bytes::len(self) as u64
    }
    fn read_range(&self, start: u64, end: u64) -> io::Result<Bytes> {
        if start > end || end > Bytes::len(self) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("range {start}..{end} of a {}-byte object", Bytes::len(self)),
            ));
        }
        Ok(self.slice(start as usize..end as usize))
    }
}

/// How a format wants its object.
pub enum Input {
    /// A stream of chunks.
    Stream(ChunkCursor),
    /// Random access.
    Random(Arc<dyn RandomAccess>),
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Stream(c) => c.fmt(f),
            Input::Random(r) => write!(f, "RandomAccess({} bytes)", r.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(data: &[u8], sizes: &[usize]) -> ChunkCursor {
        let mut parts = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < data.len() {
            let n = sizes[i % sizes.len()].min(data.len() - at);
            parts.push(Ok(Bytes::copy_from_slice(&data[at..at + n])));
            at += n;
            i += 1;
        }
        ChunkCursor::new(Box::new(IterSource(parts.into_iter())))
    }

    proptest::proptest! {
        #[test]
        fn reads_match_the_data(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            sizes in proptest::collection::vec(1usize..40, 1..5),
            reads in proptest::collection::vec((0u8..4, 0usize..50), 0..30),
        ) {
            let mut c = chunked(&data, &sizes);
            let mut at = 0usize;
            for (op, n) in reads {
                let left = data.len() - at;
                match op {
                    0 => {
                        let r = c.read_exact(n);
                        if n <= left {
                            proptest::prop_assert_eq!(&r.unwrap()[..], &data[at..at + n]);
                            at += n;
                        } else {
                            proptest::prop_assert!(r.is_err());
                            break;
                        }
                    }
                    1 => {
                        let p = c.peek(n).unwrap();
                        proptest::prop_assert_eq!(&p[..], &data[at..at + n.min(left)]);
                    }
                    2 => {
                        let r = c.skip(n as u64);
                        if n <= left { at += n; } else { proptest::prop_assert!(r.is_err()); break; }
                    }
                    _ => {
                        let line = c.read_until(b'\n').unwrap();
                        let end = data[at..].iter().position(|&b| b == b'\n').map_or(data.len(), |i| at + i + 1);
                        if at == data.len() {
                            proptest::prop_assert!(line.is_none());
                        } else {
                            proptest::prop_assert_eq!(&line.unwrap()[..], &data[at..end]);
                        }
                        at = end;
                    }
                }
                proptest::prop_assert_eq!(c.offset(), at as u64);
            }
        }
    }

    #[test]
    fn a_range_inside_one_chunk_is_not_copied() {
        let b = Bytes::from(vec![7u8; 100]);
        let mut c = ChunkCursor::from_bytes(b.clone());
        c.skip(10).unwrap();
        let r = c.read_exact(20).unwrap();
        assert_eq!(r.as_ptr(), b[10..].as_ptr());
    }
}
