"""Deletes stale builds of this project's crates and fuzz binaries from the fuzz target dir.

    python3 fuzz/prune.py TARGET_DIR

Cargo names what it builds in `deps/` `lib<crate>-<16 hex digits>.{rlib,rmeta,d}` (a library)
or `<name>-<16 hex digits>[.d]` (a binary); a crate that changed gets a new hash and the old
files stay. For this project's libraries (`stoker*`) and binaries (the fuzz targets, read from
fuzz/Cargo.toml), every hash but the newest (by the latest modification time among its files)
is deleted. Third-party crates are left alone (two versions of one can both be in use; some
fuzz targets share a name with one, `url` for one), and so are `.fingerprint/` and `build/`
(small, and a crate has several hashes there at once). Prints what it freed.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARTIFACT = re.compile(r"^(?P<lib>lib)?(?P<name>[A-Za-z0-9_]+?)-(?P<hash>[0-9a-f]{16})(?P<ext>\..*)?$")


def ours() -> set[str]:
    names = set(re.findall(r'^name = "(.*)"$', (HERE / "Cargo.toml").read_text(), re.M))
    return {n.replace("-", "_") for n in names}


def key(m: re.Match, targets: set[str]) -> tuple[str, str] | None:
    """The artifact a file belongs to, when it is this project's, else None."""
    name = m.group("name")
    if m.group("lib"):
        return ("lib", name) if name.startswith("stoker") else None
    if m.group("ext") not in (None, ".d"):
        return None
    return ("bin", name) if name.startswith("stoker") or name in targets else None


def size(p: Path) -> int:
    if p.is_dir() and not p.is_symlink():
        return sum(size(c) for c in p.iterdir())
    try:
        return p.lstat().st_size
    except OSError:
        return 0


def prune(root: Path, targets: set[str]) -> int:
    freed = 0
    for profile in list(root.glob("*/release")) + list(root.glob("release")):
        d = profile / "deps"
        if not d.is_dir():
            continue
        groups: dict[tuple[str, str], dict[str, list[Path]]] = collections.defaultdict(
            lambda: collections.defaultdict(list))
        for entry in d.iterdir():
            m = ARTIFACT.match(entry.name)
            k = m and key(m, targets)
            if k:
                groups[k][m.group("hash")].append(entry)
        for (kind, name), builds in groups.items():
            if kind == "bin" and not name.startswith("stoker"):
                # A fuzz target's build has its binary; a `.d` alone is a third-party
                # library's of the same name (the `url` and `parquet` crates).
                builds = {h: ps for h, ps in builds.items() if any(not p.suffix for p in ps)}
            if len(builds) < 2:
                continue
            newest = max(builds, key=lambda h: max(p.lstat().st_mtime for p in builds[h]))
            for h, paths in builds.items():
                if h == newest:
                    continue
                for p in paths:
                    freed += size(p)
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
    return freed


def main() -> None:
    root = Path(sys.argv[1])
    freed = prune(root, ours())
    print(f"pruned stale builds of this project's crates: {freed / 2**30:.2f} GiB freed")


if __name__ == "__main__":
    main()
