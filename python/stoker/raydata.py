"""A Stoker pipeline as a Ray Data dataset (:meth:`stoker.Pipeline.to_ray_data`).

Each read task of the dataset runs one piece of an epoch (a span of its seeded order,
:meth:`stoker.Pipeline.span`) with the Stoker engine, and each batch the pipeline makes
becomes a block (a pipeline without a batch: each sample a row, ``block_rows`` of them a
block): Stoker's formats, operators and seeded randomness, read into Ray Data's own
transformations and consumers (``map_batches``, ``iter_torch_batches``, Ray Train). So any
format Stoker reads is a Ray dataset: ``stoker.from_url(url, format="tfrecord").to_ray_data()``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .distributed import _ray

if TYPE_CHECKING:
    from . import Pipeline


def to_ray_data(
    p: Pipeline, *, epoch: int | None = None, piece: int | None = None, block_rows: int = 256
) -> Any:
    """One epoch of ``p`` (its first, or ``epoch``) as a ``ray.data.Dataset``, a read task a
    piece of ``piece`` entries of the epoch's order (by default Ray's requested parallelism
    sets the count); each of ``p``'s batches is a block, its fields the columns, or, for a
    pipeline without a batch, each sample is a row and ``block_rows`` rows a block (arrays
    of one shape stacked, of several shapes a variable-shaped tensor column, strings and
    bytes object columns)."""
    _ray()
    import numpy as np

    try:
        import ray.data
    except ImportError as e:
        raise ImportError(
            "to_ray_data needs Ray Data (pandas, pyarrow, fsspec): pip install './python[ray]' "
            "or pip install 'ray[data]'"
        ) from e
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    _, first, batches, _ = p._p.shape()
    if piece is not None and piece < 1:
        raise ValueError(f"piece must be at least 1, not {piece}")
    if block_rows < 1:
        raise ValueError(f"block_rows must be at least 1, not {block_rows}")
    n, _ = p._p.epoch_len()
    e = first if epoch is None else int(epoch)

    def block(item: dict[str, Any]) -> Any:
        cols = {}
        for k, v in item.items():
            if isinstance(v, list):
                # Strings and bytes: an object column.
                a = np.empty(len(v), dtype=object)
                a[:] = v
                v = a
            cols[k] = v
        return BlockAccessor.batch_to_block(cols)

    def column(values: list[Any]) -> Any:
        first = values[0]
        if isinstance(first, np.ndarray) and all(
            isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values
        ):
            return np.stack(values)
        if all(isinstance(v, (bool, int, float, np.generic)) for v in values):
            return np.asarray(values)
        a = np.empty(len(values), dtype=object)
        a[:] = values
        return a

    def rows_block(rows: list[dict[str, Any]]) -> Any:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        return BlockAccessor.batch_to_block({k: column([r.get(k) for r in rows]) for k in keys})

    def blocks(items: Any) -> Any:
        if batches:
            for item in items:
                yield block(item)
            return
        rows: list[dict[str, Any]] = []
        for item in items:
            rows.append(item)
            if len(rows) == block_rows:
                yield rows_block(rows)
                rows = []
        if rows:
            yield rows_block(rows)

    class _Source(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: Any = None, data_context: Any = None) -> list:
            size = piece or max(1, math.ceil(n / max(1, parallelism)))
            if piece is None and batches:
                b = batches[0]
                size = max(b, math.ceil(size / b) * b)
            tasks = []
            for start in range(0, n, size):
                end = min(n, start + size)

                def read(start: int = start, end: int = end) -> Any:
                    yield from blocks(p.first_epoch(e).epochs(1).span(start, end))

                meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
                tasks.append(ReadTask(read, meta))
            return tasks

    return ray.data.read_datasource(_Source())
