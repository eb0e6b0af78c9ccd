//! The S3 implementation: s3s-fs's `FileSystem`, with its defects fixed.
//!
//! [`Backend`] implements [`s3s::S3`] by delegating to `s3s_fs::FileSystem` for writes,
//! multipart uploads, copies and bucket operations, and by answering these itself:
//!
//! * **GET and HEAD**: a key naming a directory is `NoSuchKey` (s3s-fs answers 500); the ETag
//!   comes from a cached MD5 instead of hashing the whole file on every request (s3s-fs does,
//!   even for a one-byte ranged GET); the body is read in 1 MiB chunks (s3s-fs uses 4 KiB);
//!   an empty object with a suffix range is 416 (s3s-fs panics on overflow); `If-Match`,
//!   `If-None-Match`, `If-Modified-Since` and `If-Unmodified-Since` are honoured (s3s-fs
//!   ignores them on GET and HEAD).
//! * **ListObjectsV2 / ListObjects**: our own walk in key order ([`list`]; s3s-fs walks the
//!   whole bucket per page through a thread hand-off per entry); an empty `delimiter=` means
//!   no delimiter (s3s-fs groups on the empty string); every object carries the ETag HEAD
//!   would return (s3s-fs sends none); `encoding-type=url` encodes keys and prefixes as S3 does (s3s-fs echoes the
//!   parameter but sends keys raw, which breaks boto3 on keys with `+` or `%`). V1 listings
//!   go through the fixed V2 path (s3s-fs routes them to its own, unfixed one).
//! * **DeleteObject(s)**: deleting a key that names a directory is a no-op success (s3s-fs
//!   answers 500, failing a whole DeleteObjects batch); the object's sidecar files and the directories it leaves empty are removed,
//!   so a later object may take the directory's name.
//! * **Keys are confined to their bucket.** s3s-fs resolves `BUCKET/KEY` against the root
//!   without checking that the result stays inside the bucket, so a PUT of
//!   `x/../../../etc/passwd` would write outside it. Every operation that hands a key to s3s-fs
//!   (PutObject, CopyObject's source and destination, the multipart operations, deletes) first
//!   maps it with [`object_path`] and answers `400 InvalidArgument` naming the key when it
//!   cannot name a file under the bucket's directory (a `..` segment, a NUL, nothing but `/`).

mod list;
mod meta;
mod paths;
#[cfg(test)]
mod tests;

use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};

pub(crate) use meta::hex;
pub(crate) use meta::ContentEtags;
pub(crate) use paths::{object_path, record_etag, remove_sidecars, valid_bucket, write_atomically};

/// Body chunk size for GET.
const READ_CHUNK: usize = 1024 * 1024;

/// The S3 implementation the server runs: s3s-fs plus fixes.
#[derive(Debug)]
pub(crate) struct Backend {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
    etags: Arc<ContentEtags>,
    dirs: Arc<list::DirCache>,
}

impl Backend {
    /// Serves `root`, which must exist and be canonical.
    pub(crate) fn new(root: PathBuf, etags: Arc<ContentEtags>) -> anyhow::Result<Self> {
        let fs = s3s_fs::FileSystem::new(&root)
            .map_err(|e| anyhow::anyhow!("s3s-fs cannot serve {}: {e:?}", root.display()))?;
        Ok(Self {
            fs,
            root,
            etags,
            dirs: Arc::default(),
        })
    }

    async fn lookup(&self, bucket: &str, key: &str) -> S3Result<meta::ObjectInfo> {
        let (root, bucket, key) = (self.root.clone(), bucket.to_owned(), key.to_owned());
        let etags = Arc::clone(&self.etags);
        let res = tokio::task::spawn_blocking(move || meta::lookup(&root, &bucket, &key, &etags))
            .await
            .map_err(S3Error::internal_error)?;
        match res {
            Ok(info) => Ok(info),
            Err(meta::LookupError::NoSuchKey) => Err(s3_error!(NoSuchKey)),
            Err(meta::LookupError::NoSuchBucket) => Err(s3_error!(NoSuchBucket)),
            Err(meta::LookupError::Io(e)) => Err(S3Error::internal_error(e)),
        }
    }

    /// Refuses a key that cannot name a file under `bucket`'s directory, before s3s-fs
    /// (which does not confine keys to their bucket) turns it into a path.
    fn confined(&self, bucket: &str, key: &str) -> S3Result<PathBuf> {
        object_path(&self.root, bucket, key).ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "object key {key:?} cannot name a file under bucket {bucket:?} \
                 (empty, a '..' segment or a NUL)"
            )
        })
    }

    /// The source of a copy, confined as [`confined`](Self::confined) does.
    fn confined_source(&self, source: &CopySource) -> S3Result<()> {
        match source {
            CopySource::Bucket { bucket, key, .. } => self.confined(bucket, key).map(drop),
            // Access points and outposts: s3s-fs answers NotImplemented itself.
            _ => Ok(()),
        }
    }

    /// Removes an object's sidecars and the directories its deletion left empty.
    fn after_delete(&self, bucket: &str, key: &str) {
        if let Err(e) = remove_sidecars(&self.root, bucket, key) {
            tracing::warn!(bucket, key, error = %e, "cannot remove sidecar files");
        }
        if let Some(path) = object_path(&self.root, bucket, key) {
            self.etags.forget(&path);
            prune_empty_dirs(&self.root.join(bucket), &path);
        }
    }

    /// One page of a listing (see [`list`]), each object with the ETag HEAD would return.
    async fn list_page(
        &self,
        bucket: &str,
        prefix: String,
        delimiter: Option<String>,
        after: Option<String>,
        max_keys: usize,
    ) -> S3Result<(Vec<Object>, Vec<String>, Option<String>)> {
        if !valid_bucket(bucket) || !self.root.join(bucket).is_dir() {
            return Err(s3_error!(NoSuchBucket));
        }
        let (root, bucket) = (self.root.clone(), bucket.to_owned());
        let etags = Arc::clone(&self.etags);
        let dirs = Arc::clone(&self.dirs);
        tokio::task::spawn_blocking(move || -> io::Result<_> {
            let q = list::Query {
                prefix: &prefix,
                delimiter: delimiter.as_deref(),
                after: after.as_deref(),
                max_keys,
            };
            let page = list::list(&root.join(&bucket), &q, &dirs)?;
            let mut objects = Vec::with_capacity(page.objects.len());
            for (key, path, m) in page.objects {
                let e_tag = meta::etag_of(&root, &bucket, &key, &path, &m, &etags)
                    .ok()
                    .map(|(e, _)| ETag::Strong(e));
                objects.push(Object {
                    e_tag,
                    size: i64::try_from(m.len()).ok(),
                    last_modified: m.modified().ok().map(Timestamp::from),
                    key: Some(key),
                    ..Default::default()
                });
            }
            let next = page.truncated.then_some(page.last).flatten();
            Ok((objects, page.common_prefixes, next))
        })
        .await
        .map_err(S3Error::internal_error)?
        .map_err(S3Error::internal_error)
    }
}

/// Removes `path`'s parent directories while they are empty, stopping at `stop`.
pub(crate) fn prune_empty_dirs(stop: &Path, path: &Path) {
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == stop || !d.starts_with(stop) || std::fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// Whole seconds, the precision of HTTP dates.
fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn etag_matches(cond: &ETagCondition, e_tag: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(tag) => tag.value() == e_tag,
    }
}

/// Evaluates conditional request headers as S3 does; `Err` is 412 or 304.
fn check_conditions(
    e_tag: &str,
    modified: SystemTime,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let modified = Timestamp::from(whole_seconds(modified));
    if let Some(cond) = if_match {
        if !etag_matches(cond, e_tag) {
            return Err(s3_error!(PreconditionFailed));
        }
    } else if let Some(t) = if_unmodified_since {
        if modified > *t {
            return Err(s3_error!(PreconditionFailed));
        }
    }
    if let Some(cond) = if_none_match {
        if etag_matches(cond, e_tag) {
            return Err(s3_error!(NotModified));
        }
    } else if let Some(t) = if_modified_since {
        if modified <= *t {
            return Err(s3_error!(NotModified));
        }
    }
    Ok(())
}

/// A stream of `len` bytes read from `file`'s current position, on the blocking pool.
fn file_body(file: std::fs::File, len: u64) -> StreamingBlob {
    let stream = futures::stream::try_unfold((Some(file), len), |(file, remaining)| async move {
        let Some(file) = file else { return Ok(None) };
        if remaining == 0 {
            return Ok(None);
        }
        let want = usize::try_from(remaining).map_or(READ_CHUNK, |r| r.min(READ_CHUNK));
        let (file, buf) = tokio::task::spawn_blocking(move || -> io::Result<_> {
            let mut file = file;
            let mut buf = vec![0u8; want];
            let mut filled = 0;
            while filled < want {
                match file.read(&mut buf[filled..]) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "object shrank while it was being read",
                        ))
                    }
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok((file, buf))
        })
        .await
        .map_err(io::Error::other)??;
        let next = remaining - buf.len() as u64;
        Ok::<_, io::Error>(Some((Bytes::from(buf), (Some(file), next))))
    });
    StreamingBlob::wrap(stream)
}

/// What S3 percent-encodes in listings with `encoding-type=url`: all but unreserved
/// characters and `/`.
const URL_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

fn url_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, URL_ENCODE).to_string()
}

fn wants_url_encoding(encoding: Option<&EncodingType>) -> bool {
    encoding.is_some_and(|e| e.as_str().eq_ignore_ascii_case(EncodingType::URL))
}

fn s3_ok<T>(output: T) -> S3Result<S3Response<T>> {
    Ok(S3Response::new(output))
}

fn content_range(start: u64, end_exclusive: u64, size: u64) -> String {
    format!("bytes {start}-{}/{size}", end_exclusive - 1)
}

#[async_trait::async_trait]
impl S3 for Backend {
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let obj = self.lookup(&input.bucket, &input.key).await?;
        check_conditions(
            &obj.e_tag,
            obj.modified,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let size = obj.size;
        let (start, len, range) = match &input.range {
            None => (0, size, None),
            Some(r) => {
                let rg = r.check(size).map_err(|_| s3_error!(InvalidRange))?;
                if rg.is_empty() {
                    return Err(s3_error!(InvalidRange));
                }
                (
                    rg.start,
                    rg.end - rg.start,
                    Some(content_range(rg.start, rg.end, size)),
                )
            }
        };
        let mut file = obj.file;
        if start > 0 {
            file.seek(SeekFrom::Start(start))
                .map_err(S3Error::internal_error)?;
        }
        let whole = len == size;
        let info = obj.info.unwrap_or_default();
        let attrs = obj.attributes.unwrap_or_default();
        let expires = attrs.expires_timestamp();
        let output = GetObjectOutput {
            body: Some(file_body(file, len)),
            accept_ranges: Some("bytes".to_owned()),
            content_length: Some(i64::try_from(len).map_err(S3Error::internal_error)?),
            content_range: range,
            last_modified: Some(Timestamp::from(obj.modified)),
            e_tag: Some(ETag::Strong(obj.e_tag)),
            metadata: attrs.user_metadata,
            content_encoding: attrs.content_encoding,
            content_type: attrs.content_type,
            content_disposition: attrs.content_disposition,
            content_language: attrs.content_language,
            cache_control: attrs.cache_control,
            expires,
            website_redirect_location: attrs.website_redirect_location,
            // S3 omits checksums for a range smaller than the object.
            checksum_crc32: info.checksum_crc32.filter(|_| whole),
            checksum_crc32c: info.checksum_crc32c.filter(|_| whole),
            checksum_sha1: info.checksum_sha1.filter(|_| whole),
            checksum_sha256: info.checksum_sha256.filter(|_| whole),
            checksum_crc64nvme: info.checksum_crc64nvme.filter(|_| whole),
            ..Default::default()
        };
        s3_ok(output)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let obj = self.lookup(&input.bucket, &input.key).await?;
        check_conditions(
            &obj.e_tag,
            obj.modified,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let info = obj.info.unwrap_or_default();
        let attrs = obj.attributes.unwrap_or_default();
        let expires = attrs.expires_timestamp();
        let output = HeadObjectOutput {
            accept_ranges: Some("bytes".to_owned()),
            content_length: Some(i64::try_from(obj.size).map_err(S3Error::internal_error)?),
            last_modified: Some(Timestamp::from(obj.modified)),
            e_tag: Some(ETag::Strong(obj.e_tag)),
            metadata: attrs.user_metadata,
            content_encoding: attrs.content_encoding,
            content_type: attrs.content_type,
            content_disposition: attrs.content_disposition,
            content_language: attrs.content_language,
            cache_control: attrs.cache_control,
            expires,
            website_redirect_location: attrs.website_redirect_location,
            checksum_crc32: info.checksum_crc32,
            checksum_crc32c: info.checksum_crc32c,
            checksum_sha1: info.checksum_sha1,
            checksum_sha256: info.checksum_sha256,
            checksum_crc64nvme: info.checksum_crc64nvme,
            ..Default::default()
        };
        s3_ok(output)
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        // An empty `delimiter=` means none.
        let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
        let prefix = input.prefix.clone().unwrap_or_default();
        let max_keys = input.max_keys.unwrap_or(1000).clamp(0, 1000);
        // Resume after the later of the token (the last entry of the previous page) and
        // start-after.
        let after = match (input.continuation_token.clone(), input.start_after.clone()) {
            (Some(t), Some(s)) => Some(t.max(s)),
            (t, s) => t.or(s),
        };
        let (objects, prefixes, next) = self
            .list_page(
                &input.bucket,
                prefix,
                delimiter.clone(),
                after,
                usize::try_from(max_keys).unwrap_or(0),
            )
            .await?;
        let key_count = i32::try_from(objects.len() + prefixes.len()).unwrap_or(i32::MAX);
        let encode = wants_url_encoding(input.encoding_type.as_ref());
        let code = |s: String| if encode { url_encode(&s) } else { s };
        let out = ListObjectsV2Output {
            key_count: Some(key_count),
            max_keys: Some(max_keys),
            is_truncated: Some(next.is_some()),
            contents: (!objects.is_empty()).then(|| {
                objects
                    .into_iter()
                    .map(|o| Object {
                        key: o.key.map(code),
                        ..o
                    })
                    .collect()
            }),
            common_prefixes: (!prefixes.is_empty()).then(|| {
                prefixes
                    .into_iter()
                    .map(|p| CommonPrefix {
                        prefix: Some(code(p)),
                    })
                    .collect()
            }),
            continuation_token: input.continuation_token,
            next_continuation_token: next,
            delimiter: input.delimiter.map(code),
            encoding_type: input.encoding_type,
            name: Some(input.bucket),
            prefix: input.prefix.map(code),
            start_after: input.start_after.map(code),
            ..Default::default()
        };
        s3_ok(out)
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let marker = req.input.marker.clone();
        let v2 = self.list_objects_v2(req.map_input(Into::into)).await?;
        Ok(v2.map_output(|v2| {
            let encode = wants_url_encoding(v2.encoding_type.as_ref());
            let code = |s: String| if encode { url_encode(&s) } else { s };
            ListObjectsOutput {
                contents: v2.contents,
                common_prefixes: v2.common_prefixes,
                delimiter: v2.delimiter,
                encoding_type: v2.encoding_type,
                name: v2.name,
                prefix: v2.prefix,
                max_keys: v2.max_keys,
                is_truncated: v2.is_truncated,
                marker: marker.map(code),
                next_marker: v2.next_continuation_token.map(code),
                ..Default::default()
            }
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let path = self.confined(&bucket, &key)?;
        if !key.ends_with('/') && path.is_dir() {
            return s3_ok(DeleteObjectOutput::default());
        }
        let resp = self.fs.delete_object(req).await?;
        self.after_delete(&bucket, &key);
        Ok(resp)
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let bucket = req.input.bucket.clone();
        // Keys naming directories are answered here: s3s-fs would fail the whole batch.
        // Keys that cannot name a file in the bucket are refused one by one, as S3 reports
        // a key it cannot delete, before s3s-fs turns them into paths outside the bucket.
        let mut req = req;
        let mut dir_keys = Vec::new();
        let mut refused = Vec::new();
        req.input.delete.objects.retain(|o| {
            let Ok(path) = self.confined(&bucket, &o.key) else {
                refused.push(Error {
                    code: Some("InvalidArgument".to_owned()),
                    key: Some(o.key.clone()),
                    message: Some(format!(
                        "object key {:?} cannot name a file under bucket {bucket:?}",
                        o.key
                    )),
                    version_id: o.version_id.clone(),
                });
                return false;
            };
            let is_dir = !o.key.ends_with('/') && path.is_dir();
            if is_dir {
                dir_keys.push(DeletedObject {
                    key: Some(o.key.clone()),
                    version_id: o.version_id.clone(),
                    ..Default::default()
                });
            }
            !is_dir
        });
        let mut resp = self.fs.delete_objects(req).await?;
        for deleted in resp.output.deleted.iter().flatten() {
            if let Some(key) = deleted.key.as_deref() {
                self.after_delete(&bucket, key);
            }
        }
        if !dir_keys.is_empty() {
            resp.output
                .deleted
                .get_or_insert_with(Vec::new)
                .extend(dir_keys);
        }
        if !refused.is_empty() {
            resp.output
                .errors
                .get_or_insert_with(Vec::new)
                .extend(refused);
        }
        Ok(resp)
    }

    // Everything else is s3s-fs's own behaviour.

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.fs.create_bucket(req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.fs.delete_bucket(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.fs.head_bucket(req).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.fs.get_bucket_location(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.fs.list_buckets(req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.put_object(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.confined_source(&req.input.copy_source)?;
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.copy_object(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.upload_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.confined_source(&req.input.copy_source)?;
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.upload_part_copy(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.list_parts(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.complete_multipart_upload(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.confined(&req.input.bucket, &req.input.key)?;
        self.fs.abort_multipart_upload(req).await
    }
}
