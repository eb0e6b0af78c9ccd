"""Single objects as read-only, seekable files.

``stoker.io.open(url)`` returns an ``io.BufferedReader`` over an :class:`ObjectFileIO`,
which reads through Stoker's store: parallel ranged GETs, read-ahead that grows while reads
stay sequential, and the store's block cache. The store is shared: every ``open`` in the
process of an object in one bucket (or host, or the local file system) with the same store
options reads through one store, with one block cache, memory budget, connection pool and
metadata cache, so opening an object again reads what is cached (:func:`clear_cache` lets
the shared stores go). Anything that takes a binary file works on
it: ``numpy.load``, ``pyarrow.parquet.read_table``, ``PIL.Image.open``, ``tarfile``,
``zipfile``::

    import numpy as np, stoker
    with stoker.io.open("s3://bucket/arrays/x.npy", endpoint="http://127.0.0.1:9000") as f:
        x = np.load(f)
"""

from __future__ import annotations

import io as _io
import json
import os
import warnings
from typing import Any

from . import _native, _threads
from ._options import store_pairs

__all__ = ["Listing", "ObjectFileIO", "clear_cache", "ls", "open"]

#: Bytes the BufferedReader asks for at once (the store reads ahead further on its own).
DEFAULT_BUFFER_SIZE = 256 * 1024


class ObjectFileIO(_io.RawIOBase):
    """A raw, read-only, seekable file over one object (see :func:`open`)."""

    def __init__(self, url: str | os.PathLike[str], **store_options: Any) -> None:
        super().__init__()
        _threads.check_fork()
        _threads.note_started()
        self._f = _native.ObjectFile(os.fspath(url), store_pairs(store_options))

    @property
    def name(self) -> str:
        return self._f.url

    @property
    def size(self) -> int:
        """The object's size in bytes."""
        return self._f.size

    def readable(self) -> bool:
        self._checkClosed()
        return True

    def seekable(self) -> bool:
        self._checkClosed()
        return True

    def writable(self) -> bool:
        self._checkClosed()
        return False

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        return self._f.readinto(buffer)

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        return self._f.read(-1 if size is None else size)

    def readall(self) -> bytes:
        self._checkClosed()
        return self._f.read(-1)

    def seek(self, offset: int, whence: int = _io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == _io.SEEK_SET:
            pos = offset
        elif whence == _io.SEEK_CUR:
            pos = self._f.tell() + offset
        elif whence == _io.SEEK_END:
            pos = self._f.size + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        return self._f.seek(pos)

    def tell(self) -> int:
        self._checkClosed()
        return self._f.tell()

    def __repr__(self) -> str:
        return f"<stoker.io.ObjectFileIO name={self.name!r} size={self.size}>"


class Listing(list):  # type: ignore[type-arg]
    """What :func:`ls` returns: a ``list`` of entries, plus ``skipped``, the keys left out
    because they cannot be file names (control characters, ``.`` or ``..`` segments, empty
    segments; for local directories also names that are not UTF-8 and symbolic links out of
    the root), each ``{"key", "escaped", "reason"}`` (``key`` exactly as the store has it,
    ``escaped`` safe to print). A sub-prefix among them stands for everything under it."""

    skipped: list[dict[str, str]]

    def __init__(self, entries: list[dict[str, Any]], skipped: list[dict[str, str]]) -> None:
        super().__init__(entries)
        self.skipped = skipped


def ls(
    url: str | os.PathLike[str],
    *,
    recursive: bool = False,
    glob: str | None = None,
    **store_options: Any,
) -> Listing:
    """What is under ``url``, as ``stoker ls --json`` lists it: one level (each
    sub-prefix as ``{"prefix": ..., "url": ...}``, then the objects) or, with
    ``recursive`` or a ``glob`` (``"**/*.jpg"``, relative to ``url``), every object below.
    An object is ``{"key", "url", "size", "etag", "version", "last_modified_ms"}`` (key
    relative to the bucket). A URL that names one object lists it (without a ``glob``,
    which matches keys below the URL); an empty prefix gives
    ``[]``. Store options as for :func:`open`; the listing goes through the same shared
    store (its metadata cache included).

    Keys that cannot be file names never fail the listing: they are left out, named in
    the result's ``skipped`` (a :class:`Listing`) and in one ``UserWarning``, escaped."""
    _threads.check_fork()
    _threads.note_started()
    text = _native.list_objects(os.fspath(url), store_pairs(store_options), recursive, glob)
    got = json.loads(text)
    listing = Listing(got["entries"], got["skipped"])
    if listing.skipped:
        names = ", ".join(s["escaped"] + " (" + s["reason"] + ")" for s in listing.skipped[:10])
        more = len(listing.skipped) - 10
        warnings.warn(
            f"stoker.io.ls: skipped {len(listing.skipped)} key(s) under {os.fspath(url)} that "
            f"cannot be file names: {names}" + (f" and {more} more" if more > 0 else ""),
            UserWarning,
            stacklevel=2,
        )
    return listing


def clear_cache() -> None:
    """Lets the shared stores go, with their cached blocks and connections, and the samples
    the optimizer's cache kept for later runs over them (decoded images): later opens, and
    later runs of pipelines with ``share_store`` (as :class:`stoker.torch.Dataset`'s
    epochs), start afresh. Files still open and runs still going keep reading through
    their store until they end."""
    _native.clear_stores()


def open(  # noqa: A001 - mirrors the builtin on purpose
    url: str | os.PathLike[str],
    mode: str = "rb",
    buffering: int = -1,
    encoding: str | None = None,
    errors: str | None = None,
    newline: str | None = None,
    **store_options: Any,
) -> Any:
    """Opens the object at ``url`` for reading, with store options as keywords (the same
    keys as ``stoker.from_url``: ``endpoint``, ``region``, ``access_key``, ``secret_key``,
    ``allow_http``, ``part_size``, ...).

    ``mode`` is ``"rb"`` (an ``io.BufferedReader``; with ``buffering=0`` the raw
    :class:`ObjectFileIO`) or ``"r"`` (an ``io.TextIOWrapper`` with ``encoding``, ``errors``
    and ``newline`` as for the builtin ``open``). A missing object raises
    ``FileNotFoundError``. Opens with the same bucket and options share one store and its
    cache (see the module docs).
    """
    binary = "b" in mode
    if set(mode) - set("rbt") or "r" not in mode or (binary and "t" in mode):
        raise ValueError(f"stoker.io.open reads only: mode must be 'rb' or 'r', not {mode!r}")
    if binary and (encoding or errors or newline is not None):
        raise ValueError("binary mode takes no encoding, errors or newline")
    raw = ObjectFileIO(url, **store_options)
    if buffering == 0:
        if not binary:
            raise ValueError("text mode needs buffering")
        return raw
    size = buffering if buffering > 1 else DEFAULT_BUFFER_SIZE
    buffered = _io.BufferedReader(raw, size)
    if binary:
        return buffered
    return _io.TextIOWrapper(buffered, encoding=encoding, errors=errors, newline=newline)
