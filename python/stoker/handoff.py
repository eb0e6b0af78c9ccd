"""Large arrays from a worker actor to a consumer on the same machine, through memory the two
share, beside Ray's object store.

Through the object store a batch is copied into fresh shared pages by Ray's serializer (the
object store hands out memory across its whole arena, so every 38.5 MB ImageNet batch faults
its pages in again) and then read in place by the consumer: measured on two cores, about
0.11 ms of CPU an image, a tenth of what making the image costs. Here a worker keeps a few
segments of memory (``memfd``), copies a batch's large arrays into a free one (its pages
are warm after the first use), and sends Ray only where it is; the consumer maps the
segment (``/proc/PID/fd/N`` of the worker, once per segment) and gets NumPy arrays over it,
writable and without a copy. When the consumer's last array over a segment is collected,
the segment's first byte says so, and the worker fills it again.

Used only where it can work, and otherwise the object store carries the array as before:
the consumer checks once per worker that it can open and read a segment of the worker's
(same machine, same user, a token only that worker wrote); a worker whose segments are all
held by the consumer (it keeps its batches) sends arrays the usual way. A worker that dies
takes its segments with it but for the consumer's mappings, which keep their pages until
their arrays go: nothing is left in ``/dev/shm``.
"""

from __future__ import annotations

import mmap
import os
import secrets
import weakref
from typing import Any

import numpy as np

#: Arrays smaller than this travel through the object store (inlined, they cost little).
MIN_BYTES = 1 << 20
#: A segment's header: byte 0 is FREE or BUSY, bytes 8-16 the segment's token (so that a
#: consumer never maps another file that took a dead worker's descriptor number); the
#: array starts after it, aligned.
HEADER = 64
FREE, BUSY = 0, 1
#: The key of a reference to a segment in an item, in place of the array.
KEY = "__stoker_segment__"
#: Segments a worker keeps at most, and their bytes in all.
MAX_SEGMENTS = 12
MAX_BYTES = 1 << 30


def available() -> bool:
    """Whether this platform has anonymous shared files (Linux's memfd), and the handoff is
    not turned off (``STOKER_HANDOFF=0`` in the workers' environment, to measure it)."""
    if os.environ.get("STOKER_HANDOFF") == "0":
        return False
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class _Segment:
    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("stoker-batch", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, HEADER + size)
        self.mm = mmap.mmap(self.fd, HEADER + size)
        self.size = size
        self.token = secrets.token_hex(8)
        self.mm[8:16] = bytes.fromhex(self.token)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class Pool:
    """The worker's side: its segments, and the items it sends with references to them."""

    def __init__(self) -> None:
        self._segments: list[_Segment] = []
        self._probe: _Segment | None = None
        self.sent = 0
        self.fallback = 0

    def probe(self) -> dict[str, Any]:
        """What the consumer needs to check that it can reach this worker's segments."""
        if self._probe is None:
            self._probe = _Segment(8)
        return {"pid": os.getpid(), "fd": self._probe.fd, "token": self._probe.token}

    def _free_segment(self, nbytes: int) -> _Segment | None:
        for s in self._segments:
            # A segment fits a batch of its size, or a little smaller (a last batch).
            if s.mm[0] == FREE and nbytes <= s.size <= nbytes + nbytes // 4:
                return s
        held = sum(s.size for s in self._segments)
        if len(self._segments) >= MAX_SEGMENTS or held + nbytes > MAX_BYTES:
            # Room for it by closing free ones of other sizes (the batch size changed).
            for s in [s for s in self._segments if s.mm[0] == FREE]:
                self._segments.remove(s)
                s.close()
            held = sum(s.size for s in self._segments)
            if len(self._segments) >= MAX_SEGMENTS or held + nbytes > MAX_BYTES:
                return None
        try:
            s = _Segment(nbytes)
        except OSError:
            return None
        self._segments.append(s)
        return s

    def pack(self, item: Any) -> Any:
        """`item` with each large NumPy array of a dict copied into a free segment and
        replaced by a reference to it (the rest as it is)."""
        if not isinstance(item, dict):
            return item
        out = None
        for k, v in item.items():
            if not (isinstance(v, np.ndarray) and v.nbytes >= MIN_BYTES and v.dtype.hasobject is False):
                continue
            s = self._free_segment(v.nbytes)
            if s is None:
                self.fallback += 1
                continue
            s.mm[0] = BUSY
            dst = np.frombuffer(s.mm, dtype=v.dtype, count=v.size, offset=HEADER).reshape(v.shape)
            np.copyto(dst, v, casting="no")
            del dst
            if out is None:
                out = dict(item)
            out[k] = {KEY: (os.getpid(), s.fd, s.token, v.dtype.str, v.shape, s.size)}
            self.sent += 1
        return item if out is None else out

    def close(self) -> None:
        for s in self._segments:
            s.close()
        self._segments.clear()
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def _release(mm: mmap.mmap) -> None:
    """The consumer's last array over a segment is gone: the worker may fill it again."""
    try:
        mm[0] = FREE
    except ValueError:  # closed
        pass


class Maps:
    """The consumer's side: its mappings of workers' segments."""

    def __init__(self) -> None:
        self._maps: dict[tuple[int, int, str], mmap.mmap] = {}

    @staticmethod
    def _open(pid: int, fd: int, size: int) -> mmap.mmap:
        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            return mmap.mmap(f, HEADER + size)
        finally:
            os.close(f)

    @classmethod
    def _open_checked(cls, pid: int, fd: int, size: int, token: str) -> mmap.mmap:
        mm = cls._open(pid, fd, size)
        if bytes(mm[8:16]) != bytes.fromhex(token):
            mm.close()
            raise OSError(f"/proc/{pid}/fd/{fd} is not the worker's segment any more")
        return mm

    def check(self, probe: dict[str, Any]) -> bool:
        """Whether this process can reach the probed worker's segments."""
        try:
            self._open_checked(probe["pid"], probe["fd"], 8, probe["token"]).close()
        except (OSError, ValueError):
            return False
        return True

    def unpack(self, item: Any) -> Any:
        """`item` with each reference to a segment replaced by a NumPy array over it.
        OSError if the segment is gone (its worker died before the array was mapped)."""
        if not isinstance(item, dict):
            return item
        for k, v in item.items():
            if not (isinstance(v, dict) and KEY in v):
                continue
            pid, fd, token, dtype, shape, size = v[KEY]
            key = (pid, fd, token)
            mm = self._maps.get(key)
            if mm is None:
                mm = self._maps[key] = self._open_checked(pid, fd, size, token)
            dt = np.dtype(dtype)
            root = np.frombuffer(mm, dtype=dt, count=int(np.prod(shape, dtype=np.int64)), offset=HEADER)
            # Every view of the array keeps `root` alive; when the last goes, so does it.
            weakref.finalize(root, _release, mm)
            item[k] = root.reshape(shape)
        return item

    def forget(self, pid: int) -> None:
        """Drops the mappings of a worker's segments (arrays over them keep theirs)."""
        for key in [k for k in self._maps if k[0] == pid]:
            del self._maps[key]

    def close(self) -> None:
        self._maps.clear()
