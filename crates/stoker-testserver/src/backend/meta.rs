//! An object's metadata as GET, HEAD and listings report it, above all its ETag.
//!
//! The ETag rule is the one s3s-fs applies on GET and HEAD: the ETag recorded in the
//! internal-info sidecar when the object was written through S3 (a plain MD5 for single
//! uploads, `MD5-N` for multipart ones), otherwise the hex MD5 of the content. Two changes:
//!
//! * a sidecar older than the object's file is ignored, because then the file was replaced
//!   behind s3s-fs's back (a test writing into the root directly) and the recorded ETag
//!   describes bytes that are gone;
//! * the MD5 of content is cached by (path, modification time, size), so a ranged GET on a
//!   large object, or a listing of ten thousand keys, does not hash whole files each time;
//! * in *fast* mode (for benchmarks over large data sets written straight into the root) an
//!   object without a sidecar gets an ETag derived from its size and modification time, so
//!   no file is read just to name its version.
//!
//! Everything here is blocking file I/O; callers run it on tokio's blocking pool.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use parking_lot::Mutex;
use s3s::crypto::{Checksum, Md5};
use s3s::dto;
use serde::Deserialize;

use super::paths;

/// The parts of s3s-fs's internal-info sidecar that responses carry.
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct InternalInfo {
    pub e_tag: Option<String>,
    pub checksum_crc32: Option<String>,
    pub checksum_crc32c: Option<String>,
    pub checksum_sha1: Option<String>,
    pub checksum_sha256: Option<String>,
    pub checksum_crc64nvme: Option<String>,
}

/// s3s-fs's attributes sidecar.
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct Attributes {
    pub user_metadata: Option<dto::Metadata>,
    pub content_encoding: Option<String>,
    pub content_type: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    pub expires: Option<String>,
    pub website_redirect_location: Option<String>,
}

impl Attributes {
    pub(crate) fn expires_timestamp(&self) -> Option<dto::Timestamp> {
        let s = self.expires.as_deref()?;
        dto::Timestamp::parse(dto::TimestampFormat::DateTime, s).ok()
    }
}

/// What GET and HEAD need to know about an existing object.
#[derive(Debug)]
pub(crate) struct ObjectInfo {
    /// The object's file, open for reading.
    pub file: File,
    pub size: u64,
    pub modified: SystemTime,
    /// The ETag value, without quotes.
    pub e_tag: String,
    /// Present when the object was written through S3 and not replaced since.
    pub info: Option<InternalInfo>,
    pub attributes: Option<Attributes>,
}

/// Why an object could not be looked up.
#[derive(Debug)]
pub(crate) enum LookupError {
    NoSuchKey,
    NoSuchBucket,
    Io(io::Error),
}

#[derive(Debug)]
struct CachedMd5 {
    modified: SystemTime,
    size: u64,
    md5_hex: String,
}

/// ETags of objects without a sidecar: content MD5s cached by file, valid while the file's
/// modification time and size are unchanged, or (fast mode) a digest of those two.
#[derive(Debug, Default)]
pub(crate) struct ContentEtags {
    fast: bool,
    map: Mutex<HashMap<PathBuf, CachedMd5>>,
}

/// Past this many entries the cache starts over rather than grow without bound.
const MD5_CACHE_MAX: usize = 200_000;

impl ContentEtags {
    /// Content MD5s, or with `fast`, digests of size and modification time.
    pub(crate) fn new(fast: bool) -> Self {
        Self {
            fast,
            map: Mutex::default(),
        }
    }

    /// Drops what is known about `path` (its content was just replaced).
    pub(crate) fn forget(&self, path: &Path) {
        self.map.lock().remove(path);
    }

    /// The ETag value for the file at `path`, whose current metadata is `meta`: the hex MD5
    /// of its content, or in fast mode of its size and modification time.
    pub(crate) fn content_etag(&self, path: &Path, meta: &Metadata) -> io::Result<String> {
        let modified = meta.modified()?;
        let size = meta.len();
        if self.fast {
            let nanos = modified
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            return Ok(hex(&Md5::checksum(format!("{size}:{nanos}").as_bytes())));
        }
        if let Some(hit) = self.map.lock().get(path) {
            if hit.modified == modified && hit.size == size {
                return Ok(hit.md5_hex.clone());
            }
        }
        let mut file = File::open(path)?;
        let mut md5 = Md5::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            md5.update(&buf[..n]);
        }
        let md5_hex = hex(&md5.finalize());
        // Cache only if the file did not change while it was read.
        let after = file.metadata()?;
        if after.modified()? == modified && after.len() == size {
            let mut map = self.map.lock();
            if map.len() >= MD5_CACHE_MAX {
                map.clear();
            }
            let entry = CachedMd5 {
                modified,
                size,
                md5_hex: md5_hex.clone(),
            };
            map.insert(path.to_owned(), entry);
        }
        Ok(md5_hex)
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> io::Result<Option<(T, Metadata)>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = std::fs::metadata(path)?;
    Ok(serde_json::from_slice(&bytes).ok().map(|v| (v, meta)))
}

/// The internal-info sidecar of an object, unless missing or older than the object's file.
pub(crate) fn load_internal_info(
    root: &Path,
    bucket: &str,
    key: &str,
    object_modified: SystemTime,
) -> io::Result<Option<InternalInfo>> {
    let path = paths::internal_info_path(root, bucket, key);
    let Some((info, meta)) = read_json::<InternalInfo>(&path)? else {
        return Ok(None);
    };
    let fresh = meta.modified().is_ok_and(|m| m >= object_modified);
    Ok(fresh.then_some(info))
}

/// The ETag value (unquoted) of the object at `path` with metadata `meta`, and its internal
/// info when that is what the ETag came from.
pub(crate) fn etag_of(
    root: &Path,
    bucket: &str,
    key: &str,
    path: &Path,
    meta: &Metadata,
    etags: &ContentEtags,
) -> io::Result<(String, Option<InternalInfo>)> {
    let info = load_internal_info(root, bucket, key, meta.modified()?)?;
    if let Some(e_tag) = info.as_ref().and_then(|i| i.e_tag.clone()) {
        return Ok((e_tag, info));
    }
    Ok((etags.content_etag(path, meta)?, info))
}

fn is_missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::InvalidFilename
            | io::ErrorKind::InvalidInput
    )
}

/// Opens an object and gathers what GET and HEAD report about it. A key naming a directory
/// is no object (`NoSuchKey`).
pub(crate) fn lookup(
    root: &Path,
    bucket: &str,
    key: &str,
    etags: &ContentEtags,
) -> Result<ObjectInfo, LookupError> {
    let bucket_missing = || match std::fs::metadata(root.join(bucket)) {
        Ok(m) if m.is_dir() => LookupError::NoSuchKey,
        _ => LookupError::NoSuchBucket,
    };
    if !paths::valid_bucket(bucket) {
        return Err(LookupError::NoSuchBucket);
    }
    let Some(path) = paths::object_path(root, bucket, key) else {
        return Err(bucket_missing());
    };
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if is_missing(&e) => return Err(bucket_missing()),
        Err(e) => return Err(LookupError::Io(e)),
    };
    let meta = file.metadata().map_err(LookupError::Io)?;
    if !meta.is_file() {
        return Err(LookupError::NoSuchKey);
    }
    let (e_tag, info) = etag_of(root, bucket, key, &path, &meta, etags).map_err(LookupError::Io)?;
    let attributes = read_json::<Attributes>(&paths::attributes_path(root, bucket, key))
        .map_err(LookupError::Io)?
        .map(|(a, _)| a);
    Ok(ObjectInfo {
        file,
        size: meta.len(),
        modified: meta.modified().map_err(LookupError::Io)?,
        e_tag,
        info,
        attributes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_of_content_is_cached_and_invalidated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let cache = ContentEtags::new(false);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            cache.content_etag(&path, &meta).unwrap(),
            "5d41402abc4b2a76b9719d911017c592"
        );
        assert_eq!(cache.map.lock().len(), 1);
        std::fs::write(&path, b"hello, world").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            cache.content_etag(&path, &meta).unwrap(),
            hex(&Md5::checksum(b"hello, world"))
        );
        std::fs::write(&path, b"").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            cache.content_etag(&path, &meta).unwrap(),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
    }

    #[test]
    fn fast_etags_follow_metadata_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let fast = ContentEtags::new(true);
        let meta = std::fs::metadata(&path).unwrap();
        let a = fast.content_etag(&path, &meta).unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, "5d41402abc4b2a76b9719d911017c592");
        assert_eq!(fast.content_etag(&path, &meta).unwrap(), a);
        std::fs::write(&path, b"hello!").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_ne!(fast.content_etag(&path, &meta).unwrap(), a);
    }
}
