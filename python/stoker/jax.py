"""JAX adapter: batches as ``jax.Array`` through DLPack.

JAX's ``from_dlpack`` asks for legacy (pre-1.0) DLPack capsules, which cannot mark memory
read-only; JAX arrays are immutable, but Stoker's export cannot know its consumer, so
:func:`to_jax` exports a batch's own memory as it is and copies memory that is shared (with
other samples, the store's cache or a mapped disk-cache file) first, exactly as
:func:`stoker.torch.to_torch` does by default.

On the CPU, XLA takes a DLPack buffer without a copy only when it is 64-byte aligned; the
engine starts every stacked batch's data on a 64-byte boundary, so batches reach JAX
without a copy (single samples' tensors, 16-byte aligned, are copied by XLA). See
``docs/python.md`` (JAX).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import Buffer
from ._views import whole_view

__all__ = ["to_jax"]


class _Export:
    """What ``jax.dlpack.from_dlpack`` takes: the buffer's DLPack, copied when shared."""

    __slots__ = ("_buffer", "_copy")

    def __init__(self, buffer: Buffer) -> None:
        self._buffer = buffer
        self._copy = not buffer.exclusive

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        # JAX passes the CPU stream it got from its device (None); Stoker's memory needs
        # no stream.
        return self._buffer.__dlpack__(copy=True if self._copy else None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._buffer.__dlpack_device__()


def to_jax(item: Any) -> Any:
    """A sample or batch with its NumPy arrays as ``jax.Array`` (on the default CPU
    device), recursively through dicts, lists and tuples; other values unchanged. bfloat16
    tensors arrive as ``bfloat16``."""

    def conv(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            base = x.base
            if isinstance(base, Buffer) and whole_view(x, base):
                return jax.dlpack.from_dlpack(_Export(base))
            return jax.numpy.asarray(x)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        if isinstance(x, tuple):
            return tuple(conv(v) for v in x)
        return x

    return conv(item)
