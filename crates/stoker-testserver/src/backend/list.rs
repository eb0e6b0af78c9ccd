//! ListObjectsV2 over the directory tree, walked in key order.
//!
//! s3s-fs lists by walking the whole bucket (with or without a prefix or delimiter), through
//! one `tokio::fs` call (a thread hand-off) per entry, then sorts and cuts one page; every
//! page walks everything again. A 100,000-key listing then takes minutes, and a 2,000-key
//! one costs the server more CPU than serving the objects. This walk:
//!
//! * visits directories depth-first with entries sorted so that the visit order is key
//!   order (a directory sorts as its name plus `/`), which makes pagination a cut, not a
//!   sort of everything;
//! * starts at the deepest directory the prefix names, and skips directories whose keys all
//!   fall outside the prefix or at or before the resume point;
//! * with a delimiter, rolls a directory up into one common prefix without entering it
//!   (only checking that it holds some file: S3 has no empty directories);
//! * stops once the page is full and one more entry proves it truncated;
//! * keeps each directory's sorted entries while the directory's modification time says
//!   nothing changed (a directory modified within [`RACY`] of reading it is not kept: a
//!   later change within the same clock tick would leave its time unchanged).
//!
//! It runs on one blocking thread, with `std::fs`.

use std::collections::HashMap;
use std::fs::Metadata;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

/// How long after its last change a directory's listing is too fresh to keep.
const RACY: Duration = Duration::from_millis(50);

/// Most directories whose listings are kept.
const MAX_DIRS: usize = 4096;

/// One directory entry, by the name it sorts under.
#[derive(Debug)]
struct DirEntry {
    /// The name, with `/` appended for a directory: sorting these sorts keys.
    sort_name: String,
    is_dir: bool,
}

/// A directory's sorted entries, as of its modification time.
type Listing = (SystemTime, Arc<Vec<DirEntry>>);

/// Sorted directory listings, reused while a directory is unchanged.
#[derive(Debug, Default)]
pub(crate) struct DirCache {
    dirs: Mutex<HashMap<PathBuf, Listing>>,
}

impl DirCache {
    fn entries(&self, dir: &Path) -> io::Result<Arc<Vec<DirEntry>>> {
        let modified = std::fs::metadata(dir)?.modified()?;
        if let Some((m, entries)) = self.dirs.lock().get(dir) {
            if *m == modified {
                return Ok(Arc::clone(entries));
            }
        }
        let read_at = SystemTime::now();
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            // Keys are UTF-8; a file whose name is not cannot be named by any key.
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with(".tmp.") && name.ends_with(".internal.part") {
                continue; // s3s-fs's upload in progress
            }
            let mut ty = entry.file_type()?;
            if ty.is_symlink() {
                match std::fs::metadata(entry.path()) {
                    Ok(m) => ty = m.file_type(),
                    Err(_) => continue, // dangling
                }
            }
            if ty.is_dir() {
                entries.push(DirEntry {
                    sort_name: name + "/",
                    is_dir: true,
                });
            } else if ty.is_file() {
                entries.push(DirEntry {
                    sort_name: name,
                    is_dir: false,
                });
            }
        }
        entries.sort_unstable_by(|a, b| a.sort_name.cmp(&b.sort_name));
        let entries = Arc::new(entries);
        let settled = read_at
            .duration_since(modified)
            .is_ok_and(|age| age >= RACY);
        if settled {
            let mut dirs = self.dirs.lock();
            if dirs.len() >= MAX_DIRS {
                dirs.clear();
            }
            dirs.insert(dir.to_path_buf(), (modified, Arc::clone(&entries)));
        }
        Ok(entries)
    }
}

/// What a listing asks for.
#[derive(Debug)]
pub(crate) struct Query<'a> {
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// List only keys (and common prefixes) after this one.
    pub after: Option<&'a str>,
    pub max_keys: usize,
}

/// One page of a listing.
#[derive(Debug, Default)]
pub(crate) struct Page {
    /// Keys with their files and metadata, in key order.
    pub objects: Vec<(String, PathBuf, Metadata)>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix of the page, where the next page resumes.
    pub last: Option<String>,
}

/// Lists `bucket_dir` (an existing bucket's directory).
pub(crate) fn list(bucket_dir: &Path, q: &Query<'_>, cache: &DirCache) -> io::Result<Page> {
    let mut walk = Walk {
        q,
        cache,
        page: Page::default(),
        count: 0,
    };
    if q.max_keys == 0 {
        return Ok(walk.page);
    }
    // Start in the deepest directory the prefix names in full.
    let start_key = match q.prefix.rfind('/') {
        Some(i) => &q.prefix[..=i],
        None => "",
    };
    // Stored keys have no empty segments (a file path cannot), so none starts with a
    // prefix that has one.
    if start_key.starts_with('/') || start_key.contains("//") {
        return Ok(walk.page);
    }
    let mut start = bucket_dir.to_path_buf();
    for seg in start_key.split('/').filter(|s| !s.is_empty()) {
        start.push(seg);
    }
    if !start_key.is_empty() && !start.is_dir() {
        return Ok(walk.page);
    }
    let _ = walk.dir(&start, start_key)?;
    Ok(walk.page)
}

struct Walk<'a> {
    q: &'a Query<'a>,
    cache: &'a DirCache,
    page: Page,
    count: usize,
}

enum Found {
    Object(String, PathBuf, Metadata),
    Prefix(String),
}

impl Walk<'_> {
    /// Visits the directory `dir`, whose keys start with `dir_key`.
    fn dir(&mut self, dir: &Path, dir_key: &str) -> io::Result<ControlFlow<()>> {
        let entries = match self.cache.entries(dir) {
            Ok(e) => e,
            // Removed while we walked: it holds nothing now.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ControlFlow::Continue(())),
            Err(e) => return Err(e),
        };
        let prefix = self.q.prefix;
        for entry in entries.iter() {
            let key = format!("{dir_key}{}", entry.sort_name);
            let path = dir.join(entry.sort_name.trim_end_matches('/'));
            if entry.is_dir {
                if !(key.starts_with(prefix) || prefix.starts_with(&key)) {
                    continue;
                }
                // Every key under `key` is at or before the resume point.
                if self
                    .q
                    .after
                    .is_some_and(|a| key.as_str() <= a && !a.starts_with(&key))
                {
                    continue;
                }
                if let Some(cp) = self.rolled_up(&key) {
                    if has_file(&path)? && self.found(Found::Prefix(cp)).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                    continue;
                }
                if self.dir(&path, &key)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            } else {
                if !key.starts_with(prefix) || self.q.after.is_some_and(|a| key.as_str() <= a) {
                    continue;
                }
                let found = match self.rolled_up(&key) {
                    Some(cp) => Found::Prefix(cp),
                    None => match std::fs::metadata(&path) {
                        Ok(m) => Found::Object(key, path, m),
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    },
                };
                if self.found(found).is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// The common prefix `key` rolls up into under the delimiter, if any.
    fn rolled_up(&self, key: &str) -> Option<String> {
        let delim = self.q.delimiter?;
        let rest = key.get(self.q.prefix.len()..)?;
        let at = rest.find(delim)?;
        Some(key[..self.q.prefix.len() + at + delim.len()].to_string())
    }

    fn found(&mut self, found: Found) -> ControlFlow<()> {
        if let Found::Prefix(cp) = &found {
            // Keys sharing a common prefix are adjacent in key order: one entry for all.
            if self.page.last.as_ref() == Some(cp) || self.q.after.is_some_and(|a| cp.as_str() <= a)
            {
                return ControlFlow::Continue(());
            }
        }
        if self.count == self.q.max_keys {
            self.page.truncated = true;
            return ControlFlow::Break(());
        }
        self.count += 1;
        match found {
            Found::Object(key, path, meta) => {
                self.page.last = Some(key.clone());
                self.page.objects.push((key, path, meta));
            }
            Found::Prefix(cp) => {
                self.page.last = Some(cp.clone());
                self.page.common_prefixes.push(cp);
            }
        }
        ControlFlow::Continue(())
    }
}

/// Whether some file lies under `dir`, at any depth.
fn has_file(dir: &Path) -> io::Result<bool> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_file() || (meta.is_dir() && has_file(&path)?) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    /// What S3 answers, computed the obvious way: sort every key, cut, group.
    fn reference(keys: &BTreeSet<String>, prefix: &str, delim: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for k in keys.iter().filter(|k| k.starts_with(prefix)) {
            let entry = match delim.and_then(|d| k[prefix.len()..].find(d).map(|i| (i, d))) {
                Some((i, d)) => k[..prefix.len() + i + d.len()].to_string(),
                None => k.clone(),
            };
            if out.last() != Some(&entry) {
                out.push(entry);
            }
        }
        out
    }

    /// Every page of a listing, joined: objects and common prefixes in one sequence.
    fn paged(dir: &Path, prefix: &str, delim: Option<&str>, max_keys: usize) -> Vec<String> {
        let cache = DirCache::default();
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let q = Query {
                prefix,
                delimiter: delim,
                after: after.as_deref(),
                max_keys,
            };
            let page = list(dir, &q, &cache).unwrap();
            let mut entries: Vec<String> = page.objects.into_iter().map(|(k, _, _)| k).collect();
            entries.extend(page.common_prefixes);
            entries.sort();
            assert!(entries.len() <= max_keys);
            all.extend(entries);
            if !page.truncated {
                return all;
            }
            after = page.last;
        }
    }

    fn write_keys(keys: &[String]) -> (tempfile::TempDir, BTreeSet<String>) {
        let tmp = tempfile::tempdir().unwrap();
        let mut written = BTreeSet::new();
        for k in keys {
            let path = tmp.path().join(k);
            // A key whose path crosses an existing file (or names a directory) cannot be
            // stored next to the others on a file system; S3 could, we skip it.
            if std::fs::create_dir_all(path.parent().unwrap()).is_err() || path.is_dir() {
                continue;
            }
            std::fs::write(&path, k.as_bytes()).unwrap();
            written.insert(k.clone());
        }
        (tmp, written)
    }

    #[test]
    fn key_order_is_not_directory_order() {
        // '-' sorts before '/', so the file "a-c" comes before everything under "a/".
        let keys = ["a/b", "a-c", "a/a/x", "a0", "b"].map(String::from);
        let (tmp, _) = write_keys(&keys);
        assert_eq!(
            paged(tmp.path(), "", None, 2),
            ["a-c", "a/a/x", "a/b", "a0", "b"]
        );
        assert_eq!(
            paged(tmp.path(), "", Some("/"), 1),
            ["a-c", "a/", "a0", "b"]
        );
        assert_eq!(paged(tmp.path(), "a/", Some("/"), 10), ["a/a/", "a/b"]);
        assert_eq!(paged(tmp.path(), "a", Some("/"), 10), ["a-c", "a/", "a0"]);
    }

    #[test]
    fn empty_directories_are_not_prefixes() {
        let (tmp, _) = write_keys(&["d/x".to_string()]);
        std::fs::create_dir_all(tmp.path().join("e/f")).unwrap();
        assert_eq!(paged(tmp.path(), "", Some("/"), 10), ["d/"]);
        assert_eq!(paged(tmp.path(), "", None, 10), ["d/x"]);
        assert!(paged(tmp.path(), "e/", None, 10).is_empty());
        assert!(paged(tmp.path(), "zz/", Some("/"), 10).is_empty());
    }

    #[test]
    fn a_changed_directory_is_listed_anew() {
        let (tmp, _) = write_keys(&["k1".to_string()]);
        let cache = DirCache::default();
        let q = Query {
            prefix: "",
            delimiter: None,
            after: None,
            max_keys: 10,
        };
        // Old enough to be kept.
        let old = SystemTime::now() - Duration::from_secs(5);
        std::fs::File::open(tmp.path())
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(list(tmp.path(), &q, &cache).unwrap().objects.len(), 1);
        std::fs::write(tmp.path().join("k2"), b"x").unwrap();
        assert_eq!(list(tmp.path(), &q, &cache).unwrap().objects.len(), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn pages_join_to_the_sorted_grouped_listing(
            keys in proptest::collection::vec("[ab][ab/.-]{0,5}[ab]", 0..40),
            prefix in "[ab/-]{0,3}",
            delim in proptest::option::of(prop_oneof![Just("/"), Just("-"), Just("b/")]),
            max_keys in 1usize..6,
        ) {
            let keys: Vec<String> = keys
                .into_iter()
                .filter(|k| !k.contains("//") && k.split('/').all(|s| s != "." && s != ".."))
                .collect();
            let (tmp, written) = write_keys(&keys);
            let want = reference(&written, &prefix, delim);
            prop_assert_eq!(paged(tmp.path(), &prefix, delim, max_keys), want);
        }
    }
}
