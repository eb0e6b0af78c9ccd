//! The inode table: which key each inode number stands for.
//!
//! S3 has no directories; a directory here is a key prefix ending in `/` (the root is the
//! mount's prefix). A node is created the first time a listing or lookup shows its name and
//! keeps its number while the kernel holds references to it (lookups answered minus those
//! it forgot): a forgotten node is removed, so memory follows what the kernel caches, not
//! every name ever seen. Nodes made only to number a listing's entries go when the
//! directory handle closes, unless a lookup took them meanwhile. A name that changes kind
//! (an object replaced by a "directory" of the same name) gets a new inode.

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

/// A local source's permission bits and owner for a node, as its file or directory has
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// What a local entry that can no longer be looked at shows: nothing for anyone but
    /// root.
    pub const NOBODY: Owner = Owner {
        perm: 0,
        uid: 0,
        gid: 0,
    };
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
    /// Local sources only: the modes and owner of the file or directory (`None`: the
    /// mount's own, for object stores).
    pub owner: Mutex<Option<Owner>>,
    /// References the kernel holds (lookups answered minus forgotten).
    lookups: Mutex<u64>,
}

impl Node {
    /// The prefix a directory's children share (the key itself for a directory).
    pub fn dir_prefix(&self) -> &str {
        &self.key
    }

    /// Its name in its parent (`""` for the root).
    pub fn name(&self) -> &str {
        let k = self.key.strip_suffix('/').unwrap_or(&self.key);
        k.rsplit('/').next().unwrap_or(k)
    }

    /// Records a file's metadata, as of now.
    pub fn set_info(&self, info: &ObjectInfo) {
        let mut st = self.file.lock();
        let opened_version = st.as_ref().and_then(|s| s.opened_version.clone());
        *st = Some(FileState {
            info: info.clone(),
            checked: Instant::now(),
            opened_version,
        });
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
            owner: Mutex::new(None),
            lookups: Mutex::new(0),
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
                        owner: Mutex::new(None),
                        lookups: Mutex::new(0),
                    });
                    self.nodes.write().insert(ino, Arc::clone(&node));
                    children.insert(map_key, ino);
                    node
                }
            }
        };
        if let (Kind::File, Some(info)) = (kind, info) {
            node.set_info(info);
        }
        node
    }

    /// The kernel now holds one more reference to `node` (a lookup was answered with it).
    /// A node forgotten meanwhile (a lookup racing the kernel's forget) is put back, so
    /// the kernel's count and ours always agree.
    pub fn looked_up(&self, node: &Arc<Node>) {
        let mut children = self.children.write();
        let mut nodes = self.nodes.write();
        *node.lookups.lock() += 1;
        if node.ino != ROOT && !nodes.contains_key(&node.ino) {
            nodes.insert(node.ino, Arc::clone(node));
            children
                .entry((node.parent, node.name().to_string()))
                .or_insert(node.ino);
        }
    }

    /// The kernel dropped `n` references to `ino`; at none left the node is removed (the
    /// root stays). A later lookup of the name makes a new node. Returns whether it went.
    pub fn forget(&self, ino: u64, n: u64) -> bool {
        if ino == ROOT {
            return false;
        }
        let mut children = self.children.write();
        let mut nodes = self.nodes.write();
        let Some(node) = nodes.get(&ino) else {
            return false;
        };
        let mut lookups = node.lookups.lock();
        *lookups = lookups.saturating_sub(n);
        if *lookups == 0 {
            drop(lookups);
            let node = nodes.remove(&ino).expect("present");
            let k = (node.parent, node.name().to_string());
            if children.get(&k) == Some(&ino) {
                children.remove(&k);
            }
            return true;
        }
        false
    }

    /// Removes `ino` if the kernel holds no reference to it: nodes made only to number
    /// the entries of a listing do not outlive the directory handle that listed them.
    pub fn prune(&self, ino: u64) -> bool {
        self.forget(ino, 0)
    }
}
