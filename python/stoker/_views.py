"""Which NumPy arrays are a Stoker tensor as it came (for the DLPack adapters)."""

from __future__ import annotations

import numpy as np

from ._native import Buffer


def whole_view(a: np.ndarray, base: Buffer) -> bool:
    """Whether ``a`` is the whole tensor ``base`` holds (not a slice or reshape of it), so
    that ``base``'s DLPack export is ``a``."""
    if not a.flags.c_contiguous or tuple(a.shape) != tuple(base.shape):
        return False
    if a.__array_interface__["data"][0] != base.address:
        return False
    return a.dtype.name == base.dtype or (base.dtype == "bfloat16" and a.dtype == np.uint16)
