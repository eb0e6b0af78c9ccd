//! WebDataset tar shards: consecutive members sharing a key make one sample.
//!
//! The tar stream is parsed here, over a [`ChunkCursor`], so that member payloads are
//! zero-copy slices of the chunks storage returned: 512-byte headers in the ustar, GNU and
//! PAX dialects (octal or base-256 numbers, `././@LongLink` long names, `x` extended
//! headers with `path=` and `size=`; `g` global headers are ignored), checked against
//! their checksum. Directories, links and other non-regular members are skipped. The
//! archive ends at a zero block (where Python's `tarfile` stops, which does not require
//! the second one) or at the end of the object.
//!
//! Samples are grouped exactly as the `webdataset` package groups them
//! (`tariterators.tar_file_iterator` and `group_by_keys`):
//!
//! - a member name splits into key and suffix by [`base_plus_ext`] (the key runs to the
//!   first dot of the file name); names without one are skipped;
//! - names matching `__[^/]*__($|/)`, and names without `/` that start and end with `__`,
//!   are metadata and skipped;
//! - the suffix is lowercased and names the field; a new sample starts whenever the key
//!   changes (the same key later in the shard is a new sample);
//! - each sample has `__key__` and `__url__` (the object's URL), then its fields in
//!   member order. A suffix seen twice in one sample is an error.
//!
//! Errors name the object, the offset of the member's first header and the sample index.
//! A damaged or truncated header, or a truncated payload, ends the shard (the framing is
//! lost); when the damaged header follows a sample's members, that sample is returned
//! first and the error next (webdataset yields it too). A duplicate field fails only its
//! sample: the rest of that key's members are dropped and reading goes on.
//!
//! Where this reader is stricter than `tarfile`: a bad header checksum or a header cut
//! short is an error (Python's `tarfile` silently ends the archive there), and GNU sparse
//! members are an error rather than expanded. Names are decoded as UTF-8, with invalid
//! bytes replaced (Python keeps them as surrogate escapes); the ustar `prefix` field is
//! used only under the POSIX `ustar\0` magic (in GNU headers those bytes hold times).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use stoker_core::{Error, Sample, Value};

use crate::format::{locate, Format, RecordReader, ShardInfo};
use crate::input::{ChunkCursor, Input};

const BLOCK: usize = 512;
/// Largest GNU long name or PAX extended header read into memory.
const MAX_EXTENDED: u64 = 1 << 20;
/// How many distinct field names a reader keeps interned.
const MAX_INTERNED: usize = 64;

/// WebDataset tar shards.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tar;

impl Format for Tar {
    fn name(&self) -> &'static str {
        "tar"
    }

    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        match input {
            Input::Stream(cur) => Ok(Box::new(TarReader::new(shard.clone(), cur))),
            Input::Random(_) => Err(Error::invalid("the tar format reads a stream")
                .with_stage("tar")
                .with_object(shard.url.clone())),
        }
    }
}

/// Splits a member name into key and suffix as webdataset's `base_plus_ext` does (the
/// regular expression `^((?:.*/|)[^.]+)[.]([^/]*)$`): the key is the name up to the first
/// dot of the file name, the suffix the rest. A file name that starts with a dot splits
/// after the directory (`dir/.x` is key `dir/`, suffix `x`) when the directory's own name
/// has no dot. `None` when there is no split (no dot in the file name). The suffix is not
/// lowercased here. Names containing a newline may split differently from Python's `re`
/// (whose `.` does not match one).
pub fn base_plus_ext(name: &str) -> Option<(&str, &str)> {
    let dot = split_at(name)?;
    Some((&name[..dot], &name[dot + 1..]))
}

/// Byte index of the dot that separates key and suffix.
fn split_at(name: &str) -> Option<usize> {
    let b = name.as_bytes();
    let slash = b.iter().rposition(|&c| c == b'/');
    let file_start = slash.map_or(0, |s| s + 1);
    let dot = file_start + b[file_start..].iter().position(|&c| c == b'.')?;
    if dot > file_start {
        return Some(dot);
    }
    // The file name starts with a dot: the regex's `[^.]+` must then cover the whole
    // previous path component and its slash, which it can only if that has no dot.
    let slash = slash?;
    let comp_start = b[..slash]
        .iter()
        .rposition(|&c| c == b'/')
        .map_or(0, |s| s + 1);
    (!b[comp_start..slash].contains(&b'.')).then_some(dot)
}

/// Whether webdataset skips a member as metadata.
fn is_meta(name: &str) -> bool {
    // `"/" not in fname and fname.startswith("__") and fname.endswith("__")`
    if !name.contains('/') && name.len() >= 2 && name.starts_with("__") && name.ends_with("__") {
        return true;
    }
    // re.match(r"__[^/]*__($|/)", fname): the first component (or the whole name) is
    // `__...__`.
    let first = name.split('/').next().unwrap_or("");
    first.len() >= 4 && first.starts_with("__") && first.ends_with("__")
}

/// Lowercases like Python's `str.lower`, without allocating when there is nothing to do.
fn lowercase(s: &str) -> Cow<'_, str> {
    if s.is_ascii() && !s.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.to_lowercase())
    }
}

/// Field names seen so far, shared by every sample of the shard.
#[derive(Default)]
pub(crate) struct Interner(Vec<Arc<str>>);

impl Interner {
    pub(crate) fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.iter().find(|a| &***a == s) {
            return a.clone();
        }
        let a: Arc<str> = s.into();
        if self.0.len() < MAX_INTERNED {
            self.0.push(a.clone());
        }
        a
    }
}

/// A member whose header has been read and whose payload has not.
#[derive(Default)]
struct Member {
    /// Its full name.
    name: String,
    /// `name[..split]` is the key, `name[split + 1..]` the suffix.
    split: usize,
    /// Payload size.
    size: u64,
    /// Offset of its first header (extended headers included).
    offset: u64,
}

impl Member {
    fn key(&self) -> &str {
        &self.name[..self.split]
    }
    fn suffix(&self) -> &str {
        &self.name[self.split + 1..]
    }
}

/// Why reading stopped: an error, and whether the shard can go on after it.
struct Fail {
    /// Boxed: errors are rare, results are not.
    error: Box<Error>,
    offset: u64,
    fatal: bool,
}

impl Fail {
    fn fatal(error: Error, offset: u64) -> Fail {
        Fail {
            error: Box::new(error),
            offset,
            fatal: true,
        }
    }
}

/// A read that failed: storage errors stay storage errors, an early end is a bad record.
fn io_fail(e: std::io::Error, what: &str, at: u64) -> Fail {
    let mut error = Error::from(e);
    error.message = format!("{what}: {}", error.message);
    Fail::fatal(error, at)
}

/// Extended-header state that applies to the next member.
#[derive(Default)]
struct Pending {
    name: Option<String>,
    size: Option<u64>,
    offset: Option<u64>,
}

struct TarReader {
    shard: ShardInfo,
    cur: ChunkCursor,
    url: Value,
    key_name: Arc<str>,
    url_name: Arc<str>,
    names: Interner,
    /// A member read ahead (header only), the first of the next sample.
    member: Member,
    has_member: bool,
    /// Members with this key are dropped (the rest of a sample that failed).
    drop_key: Option<String>,
    /// An error met reading ahead, returned after the sample read before it.
    deferred: Option<Fail>,
    /// Fields in the last sample, to size the next one.
    last_fields: usize,
    record: u64,
    done: bool,
}

impl TarReader {
    fn new(shard: ShardInfo, cur: ChunkCursor) -> TarReader {
        TarReader {
            url: Value::Str(shard.url.as_str().into()),
            shard,
            cur,
            key_name: "__key__".into(),
            url_name: "__url__".into(),
            names: Interner::default(),
            member: Member::default(),
            has_member: false,
            drop_key: None,
            deferred: None,
            last_fields: 4,
            record: 0,
            done: false,
        }
    }

    /// Reads headers up to the next member that belongs to a sample, into `self.member`.
    /// False at the end of the archive.
    fn read_member(&mut self) -> Result<bool, Fail> {
        let mut pending = Pending::default();
        loop {
            let at = self.cur.offset();
            let h = self
                .cur
                .peek(BLOCK)
                .map_err(|e| io_fail(e, "reading a tar header", at))?;
            if h.len() < BLOCK {
                if h.is_empty() && pending.offset.is_none() {
                    if at == 0 {
                        return Err(Fail::fatal(
                            Error::record("empty object: not a tar archive"),
                            at,
                        ));
                    }
                    return Ok(false);
                }
                let what = if pending.offset.is_some() {
                    "after an extended header"
                } else {
                    "a tar header"
                };
                return Err(Fail::fatal(
                    Error::record(format!(
                        "truncated tar: {what}, the object ends after {} of 512 header bytes",
                        h.len()
                    )),
                    pending.offset.unwrap_or(at),
                ));
            }
            if h.iter().all(|&b| b == 0) {
                if let Some(o) = pending.offset {
                    return Err(Fail::fatal(
                        Error::record("extended header not followed by a member"),
                        o,
                    ));
                }
                return Ok(false);
            }
            let hdr = Header::parse(&h).map_err(|e| Fail::fatal(e, at))?;
            self.cur
                .skip(BLOCK as u64)
                .map_err(|e| io_fail(e, "reading a tar header", at))?;
            let first = *pending.offset.get_or_insert(at);
            // A PAX size applies to the member, not to further extended headers.
            let size = hdr.size;
            match hdr.typeflag {
                b'L' | b'x' => {
                    if size > MAX_EXTENDED {
                        return Err(Fail::fatal(
                            Error::record(format!(
                                "extended header of {size} bytes (at most {MAX_EXTENDED})"
                            )),
                            at,
                        ));
                    }
                    let data = self
                        .cur
                        .read_exact(size as usize)
                        .map_err(|e| io_fail(e, "truncated extended header", at))?;
                    self.skip_padding(size, at)?;
                    if hdr.typeflag == b'L' {
                        // The first extended header wins, as in Python's tarfile.
                        if pending.name.is_none() {
                            pending.name = Some(String::from_utf8_lossy(nts(&data)).into_owned());
                        }
                    } else {
                        parse_pax(&data, &mut pending).map_err(|e| Fail::fatal(e, at))?;
                    }
                }
                b'g' | b'K' => {
                    // Global headers are ignored; long link names only matter for links.
                    self.skip_payload(size, at)?;
                }
                b'S' => {
                    return Err(Fail::fatal(
                        Error::record("GNU sparse members are not supported"),
                        at,
                    ));
                }
                t => {
                    let size = pending.size.take().unwrap_or(size);
                    let name_field = nts(&h[..100]);
                    let is_dir = t == b'5' || (t == 0 && name_field.last() == Some(&b'/'));
                    let regular = matches!(t, b'0' | 0 | b'7') && !is_dir;
                    // Python's tarfile skips a payload only for regular members and
                    // unknown types; links, directories and devices have none.
                    let has_payload = regular || !matches!(t, b'1'..=b'6');
                    if !regular {
                        if has_payload {
                            self.skip_payload(size, at)?;
                        }
                        pending = Pending::default();
                        continue;
                    }
                    let name = &mut self.member.name;
                    name.clear();
                    match pending.name.take() {
                        Some(n) => name.push_str(&n),
                        None => {
                            if hdr.posix {
                                let prefix = nts(&h[345..500]);
                                if !prefix.is_empty() {
                                    name.push_str(&String::from_utf8_lossy(prefix));
                                    name.push('/');
                                }
                            }
                            name.push_str(&String::from_utf8_lossy(name_field));
                        }
                    }
                    let split = if is_meta(name) { None } else { split_at(name) };
                    let dropped = match (&self.drop_key, split) {
                        (Some(k), Some(s)) => k.as_str() == &name[..s],
                        _ => false,
                    };
                    match split {
                        Some(s) if !dropped => {
                            self.drop_key = None;
                            self.member.split = s;
                            self.member.size = size;
                            self.member.offset = first;
                            return Ok(true);
                        }
                        _ => {
                            self.skip_payload(size, at)?;
                            pending = Pending::default();
                        }
                    }
                }
            }
        }
    }

    fn skip_padding(&mut self, size: u64, at: u64) -> Result<(), Fail> {
        let pad = size.wrapping_neg() % BLOCK as u64;
        // Python's tarfile reads past a payload without requiring the padding: an object
        // that ends inside it ends the archive cleanly.
        let have = self
            .cur
            .fill(pad as usize)
            .map_err(|e| io_fail(e, "reading tar padding", at))?;
        self.cur
            .skip(have as u64)
            .map_err(|e| io_fail(e, "reading tar padding", at))
    }

    fn skip_payload(&mut self, size: u64, at: u64) -> Result<(), Fail> {
        self.cur.skip(size).map_err(|e| {
            io_fail(
                e,
                &format!("truncated tar: member payload of {size} bytes"),
                at,
            )
        })?;
        self.skip_padding(size, at)
    }

    /// The payload of `self.member`.
    fn read_payload(&mut self) -> Result<Bytes, Fail> {
        let size = self.member.size;
        let at = self.member.offset;
        let data = usize::try_from(size)
            .map_err(|_| Fail::fatal(Error::record(format!("member of {size} bytes")), at))
            .and_then(|n| {
                self.cur.read_exact(n).map_err(|e| {
                    io_fail(
                        e,
                        &format!(
                            "truncated tar: member {:?} of {size} bytes",
                            self.member.name
                        ),
                        at,
                    )
                })
            })?;
        self.skip_padding(size, at)?;
        Ok(data)
    }

    fn read_sample(&mut self) -> Result<Option<Sample>, Fail> {
        if !self.has_member && !self.read_member()? {
            return Ok(None);
        }
        self.has_member = false;
        let key: Arc<str> = self.member.key().into();
        let mut s = Sample::with_capacity(self.last_fields);
        s.insert(self.key_name.clone(), Value::Str(key.clone()));
        s.insert(self.url_name.clone(), self.url.clone());
        loop {
            let data = self.read_payload()?;
            let suffix = lowercase(self.member.suffix());
            if s.get(&suffix).is_some() {
                let error = Error::record(format!(
                    "duplicate field {suffix:?} in sample {key:?} (member {:?})",
                    self.member.name
                ));
                self.drop_key = Some(key.to_string());
                return Err(Fail {
                    error: Box::new(error),
                    offset: self.member.offset,
                    fatal: false,
                });
            }
            let name = self.names.get(&suffix);
            s.insert(name, Value::Bytes(data));
            if !self.read_ahead() {
                break;
            }
            if self.member.key() != &*key {
                self.has_member = true;
                break;
            }
        }
        self.last_fields = s.len();
        Ok(Some(s))
    }

    /// Reads the next member's headers after a member of the current sample. A failure
    /// there is kept for the next call, so that the sample read so far is not lost to a
    /// damaged header after it (webdataset yields it too: `tarfile` ends the archive
    /// silently at a damaged header).
    fn read_ahead(&mut self) -> bool {
        match self.read_member() {
            Ok(more) => more,
            Err(f) => {
                self.deferred = Some(f);
                false
            }
        }
    }

    /// Passes over one sample without reading its payloads.
    fn skip_sample(&mut self) -> Result<bool, Fail> {
        if !self.has_member && !self.read_member()? {
            return Ok(false);
        }
        self.has_member = false;
        let mut key = std::mem::take(&mut self.member.name);
        key.truncate(self.member.split);
        loop {
            let (size, at) = (self.member.size, self.member.offset);
            self.skip_payload(size, at)?;
            if !self.read_ahead() {
                break;
            }
            if self.member.key() != key {
                self.has_member = true;
                break;
            }
        }
        Ok(true)
    }

    fn fail(&mut self, f: Fail) -> Error {
        let e = locate(*f.error, "tar", &self.shard, f.offset, self.record);
        self.record += 1;
        if f.fatal {
            self.done = true;
        }
        e
    }
}

impl RecordReader for TarReader {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        if let Some(f) = self.deferred.take() {
            return Err(self.fail(f));
        }
        if self.done {
            return Ok(None);
        }
        match self.read_sample() {
            Ok(Some(s)) => {
                self.record += 1;
                if self.deferred.is_some() {
                    self.done = true;
                }
                Ok(Some(s))
            }
            Ok(None) => {
                self.done = true;
                Ok(None)
            }
            Err(f) => Err(self.fail(f)),
        }
    }

    fn record(&self) -> u64 {
        self.record
    }

    fn skip(&mut self, n: u64) -> Result<(), Error> {
        for _ in 0..n {
            if let Some(f) = self.deferred.take() {
                return Err(self.fail(f));
            }
            if self.done {
                break;
            }
            match self.skip_sample() {
                Ok(true) => {
                    self.record += 1;
                    if self.deferred.is_some() {
                        self.done = true;
                    }
                }
                Ok(false) => self.done = true,
                Err(f) => return Err(self.fail(f)),
            }
        }
        Ok(())
    }
}

/// The fields of a header that matter here.
struct Header {
    typeflag: u8,
    size: u64,
    /// POSIX ustar magic (`ustar\0`): the prefix field holds a name prefix.
    posix: bool,
}

impl Header {
    fn parse(h: &[u8]) -> Result<Header, Error> {
        let stored = parse_octal(&h[148..156])
            .ok_or_else(|| Error::record("bad tar header: unreadable checksum field"))?;
        // The checksum counts the checksum field as spaces; old tars summed signed bytes.
        let field: u32 = h[148..156].iter().map(|&b| u32::from(b)).sum();
        let unsigned: u32 = h.iter().map(|&b| u32::from(b)).sum::<u32>() - field + 8 * 32;
        if stored != u64::from(unsigned) && stored != signed_checksum(h) {
            return Err(Error::record(format!(
                "bad tar header checksum: stored {stored:o}, computed {unsigned:o}"
            )));
        }
        let size = parse_number(&h[124..136]).ok_or_else(|| {
            Error::record(format!(
                "bad tar header: size field {:?}",
                String::from_utf8_lossy(&h[124..136])
            ))
        })?;
        Ok(Header {
            typeflag: h[156],
            size,
            posix: &h[257..263] == b"ustar\0",
        })
    }
}

/// The checksum as old tars computed it, summing signed bytes (as a two's complement
/// octal value can only be compared as a number, negative sums never match).
fn signed_checksum(h: &[u8]) -> u64 {
    let field: i64 = h[148..156].iter().map(|&b| i64::from(b as i8)).sum();
    let sum = h.iter().map(|&b| i64::from(b as i8)).sum::<i64>() - field + 8 * 32;
    u64::try_from(sum).unwrap_or(u64::MAX)
}

/// A NUL-terminated field.
fn nts(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |i| &b[..i])
}

/// An octal field as Python's tarfile reads one: up to the first NUL, surrounding
/// whitespace ignored, empty meaning 0.
fn parse_octal(b: &[u8]) -> Option<u64> {
    let s = nts(b).trim_ascii();
    s.iter().try_fold(0u64, |n, &c| {
        if !(b'0'..=b'7').contains(&c) {
            return None;
        }
        n.checked_mul(8)?.checked_add(u64::from(c - b'0'))
    })
}

/// A numeric field: octal, or GNU base-256 (first byte 0x80 positive, 0xff negative;
/// negative sizes are rejected).
fn parse_number(b: &[u8]) -> Option<u64> {
    match b[0] {
        0x80 => b[1..]
            .iter()
            .try_fold(0u64, |n, &c| n.checked_mul(256)?.checked_add(u64::from(c))),
        0xff => None,
        _ => parse_octal(b),
    }
}

/// PAX records `"<len> <key>=<value>\n"`: takes `path` and `size`.
fn parse_pax(mut data: &[u8], pending: &mut Pending) -> Result<(), Error> {
    let bad = |what: &str| Error::record(format!("bad PAX extended header: {what}"));
    while !data.is_empty() && data[0] != 0 {
        let sp = data
            .iter()
            .position(|&c| c == b' ')
            .ok_or_else(|| bad("a record without a length"))?;
        let len: usize = std::str::from_utf8(&data[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("a record length that is not a number"))?;
        if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad("a record length that does not fit"));
        }
        let rec = &data[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&c| c == b'=')
            .ok_or_else(|| bad("a record without '='"))?;
        let (k, v) = (&rec[..eq], &rec[eq + 1..]);
        match k {
            b"path" if pending.name.is_none() => {
                pending.name = Some(String::from_utf8_lossy(v).into_owned());
            }
            b"size" if pending.size.is_none() => {
                let size = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("a size that is not a number"))?;
                pending.size = Some(size);
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_like_webdataset() {
        assert_eq!(base_plus_ext("a/b.c/.x"), None);
        assert_eq!(base_plus_ext("d/.x.y"), Some(("d/", "x.y")));
        assert_eq!(base_plus_ext("a.b/c"), None);
        assert_eq!(base_plus_ext("x/y.z/w.v"), Some(("x/y.z/w", "v")));
    }

    #[test]
    fn meta_names() {
        assert!(is_meta("__meta__"));
        assert!(is_meta("___"));
        assert!(is_meta("__x__/a.txt"));
        assert!(!is_meta("__a__.txt"));
        assert!(!is_meta("a/__x__"));
        assert!(!is_meta("__x"));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number(b"00000001750\0"), Some(0o1750));
        assert_eq!(parse_number(b" 1750 \0\0\0\0\0\0"), Some(0o1750));
        assert_eq!(parse_number(b"\0\0\0\0\0\0\0\0\0\0\0\0"), Some(0));
        assert_eq!(parse_number(b"0000000175x\0"), None);
        let mut b = [0u8; 12];
        b[0] = 0x80;
        b[7..].copy_from_slice(&[0x02, 0, 0, 0, 0x05]);
        assert_eq!(parse_number(&b), Some((2 << 32) + 5));
        b[0] = 0xff;
        assert_eq!(parse_number(&b), None);
        let mut big = [0xffu8; 12];
        big[0] = 0x80;
        assert_eq!(parse_number(&big), None);
    }

    #[test]
    fn pax_records() {
        let mut p = Pending::default();
        parse_pax(
            b"30 mtime=1700000000.123456789\n17 path=a/\xc3\xa9.txt\n11 size=42\n",
            &mut p,
        )
        .unwrap();
        assert_eq!(p.name.as_deref(), Some("a/\u{e9}.txt"));
        assert_eq!(p.size, Some(42));
        assert!(parse_pax(b"99 path=x\n", &mut Pending::default()).is_err());
        assert!(parse_pax(b"9 pathx\n", &mut Pending::default()).is_err());
    }
}
