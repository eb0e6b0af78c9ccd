//! The inode table: which key each inode number stands for.
//!
//! S3 has no directories; a directory here is a key prefix ending in `/` (the root is the
//! mount's prefix). A node is created the first time a listing or lookup shows its name and
//! lives as long as the mount: keys are cheap (about 200 bytes each, 20 MB for 100,000) and
//! a stable number per (parent, name, kind) keeps the kernel's caches coherent. A name that
//! changes kind (an object replaced by a "directory" of the same name) gets a new inode.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use stoker_store::ObjectInfo;

/// Inode number of the mount's root.
pub(crate) const ROOT: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
}

/// What the mount last learnt about a file, and when.
#[derive(Debug, Clone)]
pub(crate) struct FileState {
    pub info: ObjectInfo,
    pub checked: Instant,
    /// The version the last open saw: an open of the same version keeps the kernel's page
    /// cache, a new version drops it.
    pub opened_version: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub ino: u64,
    pub parent: u64,
    /// For a file, its key; for a directory, its prefix with a trailing `/` (`""` at the
    /// bucket's root).
    pub key: String,
    pub kind: Kind,
    /// Files only.
    pub file: Mutex<Option<FileState>>,
}

impl Node {
    /// The prefix a directory's children share (the key itself for a directory).
    pub fn dir_prefix(&self) -> &str {
        &self.key
    }
}

#[derive(Debug)]
pub(crate) struct Inodes {
    nodes: RwLock<HashMap<u64, Arc<Node>>>,
    children: RwLock<HashMap<(u64, String), u64>>,
    next: AtomicU64,
}

impl Inodes {
    /// A table holding only the root, the directory `root_prefix` (`""` or ending in `/`).
    pub fn new(root_prefix: String) -> Self {
        let root = Arc::new(Node {
            ino: ROOT,
            parent: ROOT,
            key: root_prefix,
            kind: Kind::Dir,
            file: Mutex::new(None),
        });
        Inodes {
            nodes: RwLock::new(HashMap::from([(ROOT, root)])),
            children: RwLock::new(HashMap::new()),
            next: AtomicU64::new(ROOT + 1),
        }
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Node>> {
        self.nodes.read().get(&ino).cloned()
    }

    pub fn len(&self) -> usize {
        self.nodes.read().len()
    }

    /// The node for `name` in directory `parent` with this kind, created if new. A file's
    /// metadata is updated to `info` (as of now).
    pub fn child(
        &self,
        parent: &Node,
        name: &str,
        kind: Kind,
        info: Option<&ObjectInfo>,
    ) -> Arc<Node> {
        let map_key = (parent.ino, name.to_string());
        let existing = self
            .children
            .read()
            .get(&map_key)
            .and_then(|ino| self.get(*ino))
            .filter(|n| n.kind == kind);
        let node = match existing {
            Some(n) => n,
            None => {
                let mut children = self.children.write();
                // Another thread may have made it meanwhile.
                if let Some(n) = children
                    .get(&map_key)
                    .and_then(|ino| self.get(*ino))
                    .filter(|n| n.kind == kind)
                {
                    n
                } else {
                    let ino = self.next.fetch_add(1, Ordering::Relaxed);
                    let key = match kind {
                        Kind::File => format!("{}{name}", parent.dir_prefix()),
                        Kind::Dir => format!("{}{name}/", parent.dir_prefix()),
                    };
                    let node = Arc::new(Node {
                        ino,
                        parent: parent.ino,
                        key,
                        kind,
                        file: Mutex::new(None),
                    });
                    self.nodes.write().insert(ino, Arc::clone(&node));
                    children.insert(map_key, ino);
                    node
                }
            }
        };
        if let (Kind::File, Some(info)) = (kind, info) {
            let mut st = node.file.lock();
            let opened_version = st.as_ref().and_then(|s| s.opened_version.clone());
            *st = Some(FileState {
                info: info.clone(),
                checked: Instant::now(),
                opened_version,
            });
        }
        node
    }
}
