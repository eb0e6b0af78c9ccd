//! Local files: symbolic links stay inside the root, and names that cannot be keys are
//! skipped, not fatal.
//!
//! `object_store`'s `LocalFileSystem` follows every symbolic link, wherever it points: a
//! link in a mounted directory to `/etc/shadow` was read (as root, for anyone, through a
//! mount with `--allow-other`), and a pipeline over a directory read wherever its links
//! led. Here a link is followed only when it resolves inside the **root** (store option
//! `follow_symlinks=true` follows every link, as before):
//!
//! * Opens and reads (`get`, `head`) of a store opened on a directory or file: the root is
//!   that directory (or file). A path that goes through a link out of it is refused
//!   ([`object_store::Error::PermissionDenied`], naming the path). The check is made on the
//!   path before opening and again on the file actually opened (its path as the kernel has
//!   it, `/proc/self/fd`), so a link swapped in between the two is caught.
//! * Listings: the root is the store's root, or, for a store over the whole file system
//!   (`file:///`, as pipelines share), the prefix being listed. A link out of it is left out
//!   and counted ([`SkipReason::SymlinkOutOfRoot`]), like a name that cannot be a key
//!   (control characters, not UTF-8): one entry never fails the directory.
//!
//! A path that goes through no link at all is never refused (a store over `/` reads any
//! file its process may read, by name). Links that stay inside the root work as before:
//! listed with what they point to, read through. Broken links, and entries that are neither
//! files nor directories (sockets, FIFOs, devices), are left out silently, as
//! `LocalFileSystem` does (a FIFO would hang a reader).

use std::fs::Metadata;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::keys::{key_problem, SkipReason, Skipped};
use crate::store::ObjectInfo;

/// A path refused because it leaves the root through a symbolic link.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} is reached through a symbolic link out of {} (to {}); the store option \
     follow_symlinks=true follows such links",
    crate::keys::Escaped(&path.display().to_string()),
    crate::keys::Escaped(&root.display().to_string()),
    crate::keys::Escaped(&target.display().to_string())
)]
pub(crate) struct OutOfRoot {
    path: PathBuf,
    root: PathBuf,
    target: PathBuf,
}

/// One directory's entries.
#[derive(Debug, Default)]
pub(crate) struct Level {
    pub objects: Vec<ObjectInfo>,
    /// Sub-directories, each ending in `/`.
    pub prefixes: Vec<String>,
    pub skipped: Vec<Skipped>,
}

/// Local files under a root (see the module docs).
#[derive(Debug)]
pub(crate) struct LocalFiles {
    inner: LocalFileSystem,
    /// The store's root as a key (`tmp/data`, `""` for the whole file system).
    root: String,
    follow_symlinks: bool,
}

impl std::fmt::Display for LocalFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalFiles(/{})", self.root)
    }
}

/// The file system path of a key (keys of local stores are absolute paths without their
/// leading `/`).
pub(crate) fn fs_path(key: &str) -> PathBuf {
    PathBuf::from(format!("/{}", key.trim_end_matches('/')))
}

/// The root's real path: its canonical form, or for a root that does not exist (yet), that
/// of its nearest existing ancestor.
fn real_root(root: &FsPath) -> PathBuf {
    let mut p = root;
    loop {
        if let Ok(c) = std::fs::canonicalize(p) {
            return c;
        }
        match p.parent() {
            Some(up) => p = up,
            None => return PathBuf::from("/"),
        }
    }
}

/// The ETag `LocalFileSystem` gives a file, so that a listing's version matches what a read
/// of the same file reports.
fn etag(m: &Metadata) -> String {
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("\"{:x}-{:x}-{:x}\"", m.ino(), mtime, m.len())
}

fn info_of(key: String, m: &Metadata) -> ObjectInfo {
    let ms = match m.modified().map(|t| t.duration_since(UNIX_EPOCH)) {
        Ok(Ok(d)) => d.as_millis() as i64,
        Ok(Err(before)) => -(before.duration().as_millis() as i64),
        Err(_) => 0,
    };
    ObjectInfo {
        key,
        size: m.len(),
        etag: Some(etag(m)),
        version: None,
        last_modified_ms: ms,
    }
}

/// Names `LocalFileSystem` keeps for its own unfinished uploads (`name#123`): not listed.
fn is_staged_upload(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl LocalFiles {
    pub(crate) fn new(root_key: &str, follow_symlinks: bool) -> Self {
        LocalFiles {
            inner: LocalFileSystem::new(),
            root: root_key.trim_matches('/').to_string(),
            follow_symlinks,
        }
    }

    /// The store's root as a key.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// Whether `real` (what `lexical` resolves to) may be used under the root `root`.
    fn allowed(&self, lexical: &FsPath, real: &FsPath, root: &FsPath) -> bool {
        self.follow_symlinks || real.starts_with(root) || real == lexical
    }

    fn refuse(&self, lexical: PathBuf, root: PathBuf, target: PathBuf) -> object_store::Error {
        object_store::Error::PermissionDenied {
            path: lexical.display().to_string(),
            source: Box::new(OutOfRoot {
                path: lexical,
                root,
                target,
            }),
        }
    }

    /// Refuses `key` if it is reached through a link out of the store's root. A path that
    /// does not resolve is let through (the operation then reports it as missing).
    pub(crate) fn check(&self, key: &str) -> object_store::Result<()> {
        // A store over the whole file system: everything resolves inside `/`.
        if self.follow_symlinks || self.root.is_empty() {
            return Ok(());
        }
        let lexical = fs_path(key);
        let Ok(real) = std::fs::canonicalize(&lexical) else {
            return Ok(());
        };
        let root = real_root(&fs_path(&self.root));
        if self.allowed(&lexical, &real, &root) {
            Ok(())
        } else {
            Err(self.refuse(lexical, root, real))
        }
    }

    /// Checks the file actually opened for `key`: its path as the kernel has it must still
    /// be inside the root (a link swapped in after [`LocalFiles::check`] is caught here).
    fn check_opened(&self, key: &str, file: &std::fs::File) -> object_store::Result<()> {
        if self.follow_symlinks || self.root.is_empty() {
            return Ok(());
        }
        let Ok(real) = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) else {
            return Ok(()); // no /proc: the check before opening stands
        };
        let lexical = fs_path(key);
        let root = real_root(&fs_path(&self.root));
        if self.allowed(&lexical, &real, &root) {
            Ok(())
        } else {
            Err(self.refuse(lexical, root, real))
        }
    }

    /// Metadata of the file or directory `key` names, following links only inside the
    /// store's root.
    pub(crate) fn metadata(&self, key: &str) -> std::io::Result<Metadata> {
        self.check(key).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string())
        })?;
        std::fs::metadata(fs_path(key))
    }

    /// One level of the directory `dir` (a key, `""` or ending in `/`), with links followed
    /// only inside `root` (a key). Blocking. A directory that does not exist is empty; one
    /// reached through a link out of `root` is refused.
    pub(crate) fn list_dir(&self, dir: &str, root: &str) -> object_store::Result<Level> {
        let dir_path = fs_path(dir);
        let root_real = real_root(&fs_path(root));
        if !self.follow_symlinks {
            match std::fs::canonicalize(&dir_path) {
                Ok(real) if !self.allowed(&dir_path, &real, &root_real) => {
                    return Err(self.refuse(dir_path, root_real, real));
                }
                Ok(_) => {}
                Err(_) => return Ok(Level::default()),
            }
        }
        let entries = match std::fs::read_dir(&dir_path) {
            Ok(e) => e,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(Level::default());
            }
            Err(e) => return Err(io_error(&dir_path, e)),
        };
        let mut level = Level::default();
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&dir_path, e)),
            };
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                level.skipped.push(Skipped {
                    key: format!("{dir}{}", name.to_string_lossy()),
                    reason: SkipReason::NotUtf8,
                });
                continue;
            };
            let key = format!("{dir}{name}");
            if let Some(reason) = key_problem(name) {
                level.skipped.push(Skipped { key, reason });
                continue;
            }
            let Ok(ft) = entry.file_type() else {
                continue; // gone meanwhile
            };
            let path = entry.path();
            let meta = if ft.is_symlink() {
                let Ok(real) = std::fs::canonicalize(&path) else {
                    continue; // broken
                };
                if !self.allowed(&path, &real, &root_real) {
                    let dir_mark = if real.is_dir() { "/" } else { "" };
                    level.skipped.push(Skipped {
                        key: format!("{key}{dir_mark}"),
                        reason: SkipReason::SymlinkOutOfRoot,
                    });
                    continue;
                }
                match std::fs::metadata(&path) {
                    Ok(m) => m,
                    Err(_) => continue,
                }
            } else if ft.is_dir() {
                level.prefixes.push(format!("{key}/"));
                continue;
            } else if ft.is_file() {
                match entry.metadata() {
                    Ok(m) => m,
                    Err(_) => continue,
                }
            } else {
                continue;
            };
            if meta.is_dir() {
                level.prefixes.push(format!("{key}/"));
            } else if meta.is_file() && !is_staged_upload(name) {
                level.objects.push(info_of(key, &meta));
            }
        }
        level.objects.sort_by(|a, b| a.key.cmp(&b.key));
        level.prefixes.sort();
        level.skipped.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(level)
    }
}

fn io_error(path: &FsPath, e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", crate::keys::Escaped(&path.display().to_string())),
        )),
    }
}

#[async_trait]
impl ObjectStore for LocalFiles {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let key = location.as_ref().to_string();
        self.check(&key)?;
        let res = self.inner.get_opts(location, options).await?;
        if let GetResultPayload::File(file, _) = &res.payload {
            self.check_opened(&key, file)?;
        }
        Ok(res)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        // The store lists local directories itself (`LocalFiles::list_dir`); this is for
        // callers of the raw backend.
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// The local backend for a store opened at `root_key`.
pub(crate) fn open(root_key: &str, follow_symlinks: bool) -> Arc<LocalFiles> {
    Arc::new(LocalFiles::new(root_key, follow_symlinks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(p: &FsPath) -> String {
        p.to_str().unwrap().trim_start_matches('/').to_string()
    }

    #[test]
    fn symlinks_out_of_the_root_are_left_out_of_a_level() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::fs::create_dir(outside.path().join("dir")).unwrap();
        let src = tempfile::tempdir().unwrap();
        let root = src.path().canonicalize().unwrap();
        std::fs::write(root.join("plain"), b"p").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/inner"), b"i").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("dir"), root.join("outdir")).unwrap();
        std::os::unix::fs::symlink("sub/inner", root.join("in")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("indir")).unwrap();
        std::os::unix::fs::symlink("nowhere", root.join("broken")).unwrap();
        let rk = key_of(&root);
        let dir = format!("{rk}/");

        let local = LocalFiles::new(&rk, false);
        let level = local.list_dir(&dir, &rk).unwrap();
        let names: Vec<&str> = level.objects.iter().map(|o| &o.key[dir.len()..]).collect();
        assert_eq!(names, ["in", "plain"]);
        assert_eq!(
            level.prefixes,
            [format!("{dir}indir/"), format!("{dir}sub/")]
        );
        let skipped: Vec<(&str, SkipReason)> = level
            .skipped
            .iter()
            .map(|s| (&s.key[dir.len()..], s.reason))
            .collect();
        assert_eq!(
            skipped,
            [
                ("out", SkipReason::SymlinkOutOfRoot),
                ("outdir/", SkipReason::SymlinkOutOfRoot)
            ]
        );
        // Direct opens: refused through the link, with the path; fine inside.
        let e = local.check(&format!("{dir}out")).unwrap_err();
        assert!(
            matches!(e, object_store::Error::PermissionDenied { .. }),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("out") && text.contains("follow_symlinks"),
            "{text}"
        );
        assert!(
            local.check(&format!("{dir}outdir/x")).is_ok(),
            "missing: let through"
        );
        std::fs::write(outside.path().join("dir/x"), b"x").unwrap();
        assert!(local.check(&format!("{dir}outdir/x")).is_err());
        assert!(local.list_dir(&format!("{dir}outdir/"), &rk).is_err());
        local.check(&format!("{dir}in")).unwrap();
        local.check(&format!("{dir}indir/inner")).unwrap();
        assert!(local.metadata(&format!("{dir}out")).is_err());
        // A store over the whole file system confines each listing to what it lists.
        let whole = LocalFiles::new("", false);
        let level = whole.list_dir(&dir, &rk).unwrap();
        assert_eq!(level.skipped.len(), 2);
        whole.check(&format!("{dir}out")).unwrap();
        // follow_symlinks=true: every link, as before.
        let follow = LocalFiles::new(&rk, true);
        let level = follow.list_dir(&dir, &rk).unwrap();
        assert!(level.skipped.is_empty());
        assert_eq!(level.objects.len(), 3);
        follow.check(&format!("{dir}out")).unwrap();
    }

    #[test]
    fn the_file_opened_is_checked_too() {
        // As if a link out of the root was swapped in between the check and the open.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let src = tempfile::tempdir().unwrap();
        let root = src.path().canonicalize().unwrap();
        std::fs::write(root.join("x"), b"x").unwrap();
        let rk = key_of(&root);
        let local = LocalFiles::new(&rk, false);
        let swapped = std::fs::File::open(outside.path().join("secret")).unwrap();
        let e = local
            .check_opened(&format!("{rk}/x"), &swapped)
            .unwrap_err();
        assert!(
            matches!(e, object_store::Error::PermissionDenied { .. }),
            "{e}"
        );
        let real = std::fs::File::open(root.join("x")).unwrap();
        local.check_opened(&format!("{rk}/x"), &real).unwrap();
        LocalFiles::new(&rk, true)
            .check_opened(&format!("{rk}/x"), &swapped)
            .unwrap();
    }

    #[test]
    fn names_that_cannot_be_keys_are_skipped_not_fatal() {
        let src = tempfile::tempdir().unwrap();
        let root = src.path().canonicalize().unwrap();
        std::fs::write(root.join("ok"), b"o").unwrap();
        std::fs::write(root.join("bad\u{1}name"), b"b").unwrap();
        std::fs::write(root.join("esc\u{1b}[31m"), b"e").unwrap();
        std::fs::write(root.join("x#12"), b"staged").unwrap();
        use std::os::unix::ffi::OsStrExt;
        std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"latin1-\xe9")), b"l").unwrap();
        let rk = key_of(&root);
        let dir = format!("{rk}/");
        let level = LocalFiles::new(&rk, false).list_dir(&dir, &rk).unwrap();
        assert_eq!(level.objects.len(), 1);
        assert_eq!(level.objects[0].key, format!("{dir}ok"));
        let reasons: Vec<SkipReason> = level.skipped.iter().map(|s| s.reason).collect();
        assert_eq!(
            reasons,
            [
                SkipReason::ControlCharacter,
                SkipReason::ControlCharacter,
                SkipReason::NotUtf8
            ]
        );
    }
}
