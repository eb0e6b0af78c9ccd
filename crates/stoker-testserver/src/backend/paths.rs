//! Where buckets, objects and s3s-fs's sidecar files live under the root.
//!
//! s3s-fs 0.14 keeps an object's bytes at `ROOT/BUCKET/KEY` and two sidecar files directly
//! in `ROOT`: `.bucket-B.object-K.internal.json` (the ETag and checksums recorded when the
//! object was written through S3) and `.bucket-B.object-K.metadata.json` (content type and
//! user metadata), where `B` and `K` are the bucket and key in unpadded URL-safe base64.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether `name` can be a bucket directory: one plain path component.
pub(crate) fn valid_bucket(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !name.starts_with('.')
}

/// The file that holds `key` of `bucket` under `root`, or `None` when the key cannot name
/// a file there (empty, or climbing out with `..`). Empty and `.` segments are skipped, as
/// path normalisation in s3s-fs does.
pub(crate) fn object_path(root: &Path, bucket: &str, key: &str) -> Option<PathBuf> {
    if !valid_bucket(bucket) || key.contains('\0') {
        return None;
    }
    let mut path = root.join(bucket);
    let mut segments = 0usize;
    for seg in key.split('/') {
        match seg {
            "" | "." => {}
            ".." => return None,
            s => {
                path.push(s);
                segments += 1;
            }
        }
    }
    (segments > 0).then_some(path)
}

/// Unpadded URL-safe base64, the encoding s3s-fs uses in sidecar file names.
pub(crate) fn base64_url(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let idx = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[idx as usize]));
        }
    }
    out
}

fn sidecar(root: &Path, bucket: &str, key: &str, suffix: &str) -> PathBuf {
    root.join(format!(
        ".bucket-{}.object-{}.{suffix}",
        base64_url(bucket.as_bytes()),
        base64_url(key.as_bytes())
    ))
}

/// s3s-fs's internal-info sidecar (ETag, checksums) for an object.
pub(crate) fn internal_info_path(root: &Path, bucket: &str, key: &str) -> PathBuf {
    sidecar(root, bucket, key, "internal.json")
}

/// s3s-fs's attributes sidecar (content type, user metadata) for an object.
pub(crate) fn attributes_path(root: &Path, bucket: &str, key: &str) -> PathBuf {
    sidecar(root, bucket, key, "metadata.json")
}

/// A fresh temporary file name directly in `root`: next to the buckets, never inside one
/// (where s3s-fs would list it), and on the same file system so it can be renamed into place.
pub(crate) fn temp_path(root: &Path) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    root.join(format!(".stoker-testserver-{}-{n}.tmp", std::process::id()))
}

/// Writes `data` to `dest` atomically, through a temporary file in `root`.
pub(crate) fn write_atomically(root: &Path, dest: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = temp_path(root);
    let res = std::fs::write(&tmp, data).and_then(|()| std::fs::rename(&tmp, dest));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Records `e_tag` (unquoted) as an object's ETag in the internal-info sidecar, as s3s-fs
/// does when an object is uploaded, replacing any attributes sidecar.
pub(crate) fn record_etag(
    root: &Path,
    bucket: &str,
    key: &str,
    e_tag: &str,
) -> std::io::Result<()> {
    remove_sidecars(root, bucket, key)?;
    let json = serde_json::json!({ "e_tag": e_tag }).to_string();
    write_atomically(
        root,
        &internal_info_path(root, bucket, key),
        json.as_bytes(),
    )
}

/// Removes both sidecars of an object, ignoring ones that do not exist.
pub(crate) fn remove_sidecars(root: &Path, bucket: &str, key: &str) -> std::io::Result<()> {
    for path in [
        internal_info_path(root, bucket, key),
        attributes_path(root, bucket, key),
    ] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_reference_vectors() {
        // RFC 4648 test vectors, URL-safe alphabet, no padding.
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, want) in cases {
            assert_eq!(base64_url(input.as_bytes()), want, "{input:?}");
        }
        assert_eq!(base64_url(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn object_paths() {
        let root = Path::new("/r");
        assert_eq!(
            object_path(root, "b", "a/b c/ü"),
            Some(PathBuf::from("/r/b/a/b c/ü"))
        );
        assert_eq!(
            object_path(root, "b", "a//./c"),
            Some(PathBuf::from("/r/b/a/c"))
        );
        assert_eq!(object_path(root, "b", "/x"), Some(PathBuf::from("/r/b/x")));
        assert_eq!(object_path(root, "b", "a/../../etc"), None);
        assert_eq!(object_path(root, "b", ""), None);
        assert_eq!(object_path(root, "b", "/"), None);
        assert_eq!(object_path(root, "..", "x"), None);
        assert_eq!(object_path(root, "a/b", "x"), None);
    }
}
