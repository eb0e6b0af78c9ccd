"""Stoker keeps accelerators fed.

Build a pipeline from a URL (or a spec, or samples in memory), chain operators, and
iterate: the Rust engine reads, parses and transforms in parallel with the GIL released,
and samples or batches arrive as dicts whose tensors are NumPy arrays and whose bytes are
memoryviews over Stoker's own buffers, without a copy::

    import stoker

    p = (stoker.from_url("s3://bucket/train/", format="tar",
                         endpoint="http://127.0.0.1:9000")
         .shuffle_shards()
         .map("to_tensor", field="npy", dtype="float32")
         .shuffle(1000)
         .batch(32)
         .seed(1))
    for batch in p:
        ...

Pipelines are immutable: every method returns a new pipeline. Iterating one starts a run
(:class:`Run`) with ``stats()`` and ``state_dict()``; ``pipeline.resume(state)`` continues
exactly where that run stopped. ``stoker.io.open(url)`` reads one object as a seekable file.
See ``docs/python.md``.
"""

from __future__ import annotations

import json
import operator
import os
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from . import _native, _pymap, _threads, io
from ._native import Buffer, DataError, Run
from ._options import FORMAT_KEYS, is_store_key, store_pairs, to_json, unknown_option

__all__ = [
    "Buffer",
    "DataError",
    "Pipeline",
    "Run",
    "from_samples",
    "from_spec",
    "from_url",
    "from_urls",
    "io",
    "profile",
]

__version__: str = _native.__version__

#: The optimizer passes ``options(disable=[...])`` can turn off, in the order they run
#: (docs/pipeline.md, The optimizer).
OPTIMIZER_PASSES: tuple[str, ...] = tuple(_native.OPTIMIZER_PASSES)

#: The record formats ``from_url`` reads (and ``"auto"``, its default, which chooses
#: among them by the objects' extensions).
FORMATS = ("files", "imagefolder", "tar", "webdataset", "tfrecord", "parquet", "jsonl", "csv")


def _count(what: str, n: Any, least: int = 0, bits: int = 64) -> int:
    """``n`` as an int of at least ``least`` and below ``2**bits`` (what the engine's
    unsigned argument holds): a ``ValueError`` naming ``what`` when it is out of range
    (not the ``OverflowError`` of the conversion), a ``TypeError`` when it is not an
    integer."""
    try:
        i = operator.index(n)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(n).__name__}") from None
    if i < least:
        raise ValueError(f"{what} must be at least {least}, not {i}")
    if i >> bits:
        raise ValueError(f"{what} must be below 2**{bits}, not {i}")
    return i


class Pipeline:
    """An immutable pipeline. Every method returns a new :class:`Pipeline`; the one it was
    called on is unchanged and can be run or extended again.

    Build one with :func:`from_url`, :func:`from_spec` or :func:`from_samples`.
    """

    __slots__ = ("_p", "_recipe", "_stages")

    def __init__(
        self,
        native: _native.Pipeline,
        _recipe: tuple[Any, ...] = (),
        _stages: tuple[_pymap.ProcessStage, ...] = (),
    ) -> None:
        if not isinstance(native, _native.Pipeline):
            raise TypeError(
                "build a Pipeline with stoker.from_url, stoker.from_spec or stoker.from_samples"
            )
        object.__setattr__(self, "_p", native)
        # How to build this pipeline again: the source call, then every method call, as
        # (name, args, kwargs). Pickling sends this recipe (see __reduce__).
        object.__setattr__(self, "_recipe", _recipe)
        # The worker pools of Python map stages in processes mode: every run leases them
        # (see _start).
        object.__setattr__(self, "_stages", _stages)

    def _then(self, native: _native.Pipeline, name: str, *args: Any, **kwargs: Any) -> Pipeline:
        return Pipeline(native, self._recipe + ((name, args, kwargs),), self._stages)

    def __reduce__(self) -> tuple[Any, ...]:
        # A native pipeline holds threads' worth of engine state and no serialisable form,
        # so a pickle is the recipe: the source call (its arguments, including store
        # options and credentials as they were given; the samples of from_samples) and the
        # method calls since, replayed on unpickling. That is what DataLoader workers
        # started with "spawn" receive.
        if not self._recipe:
            raise TypeError("this Pipeline was built without a recipe and cannot be pickled")
        return (_rebuild, (self._recipe,))

    def _calls(self) -> list[str]:
        """The names of the calls that built this pipeline (source first)."""
        return [name for name, _, _ in self._recipe]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Pipeline is immutable: its methods return new pipelines")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Pipeline is immutable")

    # Per-sample operators -------------------------------------------------------------

    def map(self, op: str | Callable[[dict[str, Any]], dict[str, Any] | None], /, **params: Any) -> Pipeline:
        """Adds a per-sample operator.

        ``op`` a string: the native operator ``op`` with its parameters, exactly as a spec
        file's ``[[ops]]`` entry names it: ``.map("decode_utf8", field="txt")`` is
        ``{op = "decode_utf8", field = "txt"}``. Every operator the spec knows is available.

        ``op`` a callable: a Python function on a sample, ``fn(sample: dict) -> dict | None``
        (``None`` drops the sample), with the keyword ``workers``: ``"auto"`` (default)
        runs its first 16 calls on the engine's threads, measuring what a call costs and
        whether a monitor thread can take the GIL during a call, then stays on threads when
        calls are cheap (under 0.2 ms) or release the GIL, and moves to worker processes
        when it holds the GIL
        (``run.explain()`` says which, with the numbers; a function that does not pickle
        stays on threads); ``"processes"``: a pool of ``processes`` worker processes, by
        default one per engine thread of the run, each started when that many calls are in
        flight at once; samples passed through shared memory; ``fn`` must pickle;
        ``"threads"``: called on the engine's threads (for functions that release the GIL,
        NumPy-heavy ones); ``processes=N`` alone chooses processes. The outputs are the same
        in every mode. ``batch_safe=True`` declares that ``fn`` applied to a batch (a dict of
        stacked columns) gives the batch of what it gives each sample, and never returns
        ``None`` (an error if it does): written just before :meth:`batch`, the optimizer
        then runs it once per batch, after the batch (pass ``"batching"``). With ``seeded=True`` the function is called as ``fn(sample, rng)``, ``rng`` a
        ``numpy.random.Generator`` seeded for this sample by the pipeline (its seed, the
        epoch, the sample's origin, the operator): random augmentations written with it
        repeat exactly under any parallelism, in threads or processes, and after a resume.

        After :meth:`batch`, the function gets the whole batch (a dict of columns: stacked
        tensors as NumPy arrays, the rest lists) and returns one with as many rows, or
        ``None`` to drop it (see :meth:`map_batches`). Placed after a shuffle buffer or a
        batch, it still runs in parallel, results in order. See docs/python.md.
        """
        if callable(op):
            return self._python_op(op, False, **params)
        if op == "embedding" and not isinstance(params.get("table", ""), (str, os.PathLike)):
            params = {**params, "table": _npy_file(params["table"])}
        return self._then(self._p.op(to_json({"op": op, **params}), "map"), "map", op, **params)

    def filter(self, op: str | Callable[[dict[str, Any]], Any], /, **params: Any) -> Pipeline:
        """Adds an operator that may drop samples: a native one (``filter_len``), checking
        that it is one: ``.filter("filter_len", field="txt", min=1)``; or a Python predicate
        ``fn(sample) -> bool`` (a sample is kept when it is true), with the keywords of
        :meth:`map`."""
        if callable(op):
            return self._python_op(op, True, **params)
        return self._then(self._p.op(to_json({"op": op, **params}), "filter"), "filter", op, **params)

    def _python_op(
        self,
        fn: Callable[..., Any],
        filter: bool,
        *,
        workers: str = "auto",
        processes: int | None = None,
        seeded: bool = False,
        batch_safe: bool = False,
    ) -> Pipeline:
        method = "filter" if filter else "map"
        qualname = _pymap._qualname(fn)
        kind = "py_filter" if filter else "py_map"
        seeded = bool(seeded)
        batch_safe = bool(batch_safe)
        kwargs: dict[str, Any] = {"workers": workers}
        if seeded:
            kwargs["seeded"] = True
        if batch_safe:
            if filter:
                raise ValueError("batch_safe is for map(): a filter drops samples")
            if seeded:
                raise ValueError(
                    "batch_safe needs an unseeded function: a seeded one draws per sample, "
                    "so it would draw differently once per batch"
                )
            kwargs["batch_safe"] = True
        label = ", seeded" if seeded else ""
        label += ", batch_safe" if batch_safe else ""
        if processes is not None:
            kwargs["processes"] = processes
            if workers == "auto":
                # A pool size given is a choice of processes.
                workers = "processes"
        recipe = self._recipe + ((method, (fn,), kwargs),)

        def op(target: Any, mode: str, where: str, stage: Any = None) -> Any:
            return self._p.py_op(target, f"{kind}({qualname}, {where}{label})", qualname, filter,
                                 mode, seeded, stage, batch_safe)

        on_threads = _pymap.Seeded(fn) if seeded else fn
        if workers == "auto":
            import multiprocessing

            try:
                if multiprocessing.current_process().daemon:
                    raise TypeError("a daemonic process cannot start worker processes")
                stage = _pymap.ProcessStage(fn, None, filter)
            except TypeError:
                # It cannot reach a worker process (it does not pickle, it was defined in an
                # interactive session, or this process cannot start any): engine threads.
                return Pipeline(op(on_threads, "threads", "threads"), recipe, self._stages)
            native = op(on_threads, "auto", "auto", stage)
            return Pipeline(native, recipe, self._stages + (stage,))
        if workers == "threads":
            if processes is not None:
                raise ValueError('processes= is for workers="processes"')
            return Pipeline(op(on_threads, "threads", "threads"), recipe, self._stages)
        if workers != "processes":
            raise ValueError(f'workers must be "auto", "processes" or "threads", not {workers!r}')
        # The pool's size is the run's business (its engine threads) unless given here.
        n = int(processes) if processes is not None else None
        stage = _pymap.ProcessStage(fn, n, filter)
        native = op(stage, "processes", f"processes={'auto' if n is None else n}")
        return Pipeline(native, recipe, self._stages + (stage,))

    def apply(self, op: Mapping[str, Any], /) -> Pipeline:
        """Adds any operator given as a spec entry (``{"op": "shuffle", "buffer": 100}``)."""
        return self._then(self._p.op(to_json(dict(op)), "any"), "apply", dict(op))

    # Source settings ------------------------------------------------------------------

    def glob(self, pattern: str) -> Pipeline:
        """Only keys matching ``pattern`` (relative to the URL's prefix)."""
        return self._then(self._p.glob(pattern), "glob", pattern)

    def shuffle_shards(self, on: bool = True) -> Pipeline:
        """Reads shards (objects) in a new seeded order every epoch; for formats with one
        sample per object that is a full shuffle."""
        return self._then(self._p.shuffle_shards(on), "shuffle_shards", on)

    def interleave(self, n: int) -> Pipeline:
        """Reads ``n`` shards at once, one sample from each in turn."""
        n = _count("interleave", n, 1)
        return self._then(self._p.interleave(n), "interleave", n)

    def shard(self, rank: int, world: int, policy: str = "drop", *, part: int = 0, parts: int = 1) -> Pipeline:
        """Keeps this data-parallel rank's share: ``"drop"`` gives every rank
        floor(n / world) samples per epoch, ``"pad"`` ceil(n / world). With ``parts > 1``,
        only part ``part`` of that share (its samples ``part``, ``part + parts``, ...: what
        one of the rank's ``parts`` loader workers reads); the parts of a rank are its whole
        share, and part ``k`` has as many samples on every rank."""
        rank, world = _count("rank", rank, bits=32), _count("world", world, bits=32)
        part, parts = _count("part", part, bits=32), _count("parts", parts, bits=32)
        if (part, parts) == (0, 1):
            return self._then(self._p.shard(rank, world, policy), "shard", rank, world, policy)
        return self._then(self._p.shard(rank, world, policy, part, parts), "shard", rank, world, policy,
                          part=part, parts=parts)

    def split_mode(self, mode: str) -> Pipeline:
        """How ranks split formats with many records per shard (tar, TFRecord, Parquet,
        JSONL, CSV): ``"interleaved"`` deals the stream of all shards out one sample per rank
        in rounds (every rank reads every shard); ``"contiguous"`` gives each rank a span of
        the epoch's records, so it reads only about ``1 / world`` of the shards (needs every
        shard's record count: Parquet's footers, or :meth:`shard_index`); ``"auto"`` (the
        default) is contiguous when the counts are known. Equal shares either way. Applies
        to :meth:`shard` and to ``stoker.torch.Dataset``'s sharding alike."""
        return self._then(self._p.split_mode(mode), "split_mode", mode)

    def shard_index(self, url: str) -> Pipeline:
        """A JSON file (any store URL) with every shard's record count, for the contiguous
        split: ``{"shards": [{"url": ..., "records": N}, ...]}`` (what ``stoker index``
        writes) or WebDataset's ``{"shardlist": [{"url": ..., "nsamples": N}]}``."""
        return self._then(self._p.shard_index(url), "shard_index", url)

    # Tail operators -------------------------------------------------------------------

    def shuffle(self, buffer: int) -> Pipeline:
        """A seeded shuffle buffer of ``buffer`` samples (a new order every epoch)."""
        buffer = _count("shuffle buffer", buffer, 1)
        return self._then(self._p.shuffle(buffer), "shuffle", buffer)

    def batch(
        self,
        size: int,
        drop_last: bool = False,
        collate: str | Mapping[str, str] = "auto",
        pad_value: float = 0.0,
    ) -> Pipeline:
        """Groups ``size`` samples into a batch: a dict of columns. ``collate`` is
        ``"auto"`` (equal-shape tensors stacked, ints and floats become arrays, the rest
        lists), ``"stack"`` (like auto, but ragged tensors are an error), ``"list"`` or
        ``"pad"`` (ragged tensors padded with ``pad_value``); or a dict of per-field policies
        (others ``"auto"``, or the dict's ``"*"`` entry)."""
        size = _count("batch size", size, 1)
        if isinstance(collate, str):
            default, fields = collate, []
        else:
            fields = [(str(k), str(v)) for k, v in collate.items() if k != "*"]
            default = str(collate.get("*", "auto"))
        return self._then(self._p.batch(size, drop_last, default, float(pad_value), fields), "batch", size, drop_last, collate, pad_value)

    def map_batches(
        self,
        fn: Callable[..., dict[str, Any] | None],
        batch_size: int,
        *,
        drop_last: bool = False,
        collate: str | Mapping[str, str] = "auto",
        pad_value: float = 0.0,
        workers: str = "auto",
        processes: int | None = None,
        seeded: bool = False,
    ) -> Pipeline:
        """A Python function on batches: exactly ``.batch(batch_size, drop_last, collate,
        pad_value).map(fn, workers=workers, processes=processes, seeded=seeded)``.

        ``fn(batch: dict) -> dict | None`` gets the batch as the iterator would yield it
        (stacked tensors, ints and floats as read-only NumPy arrays with a leading batch
        axis, no copy; bytes, strings and ragged values as lists) and returns a dict of
        columns with as many rows (arrays whose first axis is the batch size, or lists of
        that length), or ``None`` to drop the batch. It runs in parallel like any map (on
        the engine's threads, or in ``processes`` worker processes through shared memory),
        results in order. See docs/python.md, "Python functions on batches".
        """
        return self.batch(batch_size, drop_last=drop_last, collate=collate, pad_value=pad_value).map(
            fn, workers=workers, processes=processes, seeded=seeded
        )

    def pack(
        self,
        block_size: int,
        *,
        field: str = "input_ids",
        separator: int | None = None,
        remainder: str = "pad",
        pad_id: int = 0,
        dtype: str = "int64",
        keys: bool = False,
    ) -> Pipeline:
        """Sequence packing: the token ids in ``field`` of consecutive samples (1-d integer
        tensors, as ``tokenize`` makes them without ``pad_to``, or lists of ints), each
        followed by ``separator`` if given, cut into blocks of ``block_size`` tokens (a
        long document continues in the next block). A block is a sample with ``field``
        (the ids), ``attention_mask``, ``position_ids`` (restarting in every segment) and
        ``segment_ids``, in ``dtype`` (``"int64"`` or ``"int32"``), plus ``cu_seqlens``
        (int32, for flash-attention's varlen kernels), ``doc_index`` and ``doc_origin``,
        and with ``keys=True`` ``doc_keys``. The other fields are not carried over. The
        last partial block of an epoch is padded with ``pad_id`` (``remainder="pad"``)
        or dropped (``"drop"``). Exactly resumable like every stage; ``docs/ops.md`` has
        the details."""
        op: dict[str, Any] = {
            "op": "pack",
            "field": field,
            "block_size": block_size,
            "remainder": remainder,
            "pad_id": pad_id,
            "dtype": dtype,
            "keys": keys,
        }
        if separator is not None:
            op["separator"] = separator
        return self._then(
            self._p.op(to_json(op), "any"),
            "pack",
            block_size,
            field=field,
            separator=separator,
            remainder=remainder,
            pad_id=pad_id,
            dtype=dtype,
            keys=keys,
        )

    def unbatch(self) -> Pipeline:
        """Splits batches back into samples."""
        return self._then(self._p.unbatch(), "unbatch")

    def take(self, n: int) -> Pipeline:
        """At most ``n`` items per epoch."""
        n = _count("take", n)
        return self._then(self._p.take(n), "take", n)

    def skip(self, n: int) -> Pipeline:
        """Skips the first ``n`` items of each epoch."""
        n = _count("skip", n)
        return self._then(self._p.skip(n), "skip", n)

    def cache(
        self, dir: str | os.PathLike | None = None, *, size: int | str | None = None
    ) -> Pipeline:
        """Keeps parsed records after the first epoch, so later epochs neither fetch nor
        parse: in memory (within half the memory budget), or with ``dir`` in files there,
        one per shard, reused by later runs (a changed object is read anew). ``size``
        (bytes or ``"20GiB"``, with ``dir``) bounds the directory: shards that would go
        over it are not written and are read from the source each epoch; nothing is
        evicted. ``stats()["cache"]`` counts hits, shards stored and shards over the limit."""
        d = None if dir is None else os.fspath(dir)
        return self._then(self._p.cache(d, size), "cache", d, size=size)

    def prefetch(self, n: int) -> Pipeline:
        """Keeps ``n`` finished items ready ahead of the consumer."""
        n = _count("prefetch", n)
        return self._then(self._p.prefetch(n), "prefetch", n)

    # Run settings ---------------------------------------------------------------------

    def epochs(self, n: int | None) -> Pipeline:
        """Number of epochs; ``None`` repeats forever."""
        if n is not None:
            n = _count("epochs", n, 1)
        return self._then(self._p.epochs(n), "epochs", n)

    def seed(self, seed: int) -> Pipeline:
        """The seed of every random choice (shard order, shuffle buffer, random ops)."""
        seed = _count("seed", seed)
        return self._then(self._p.seed(seed), "seed", seed)

    def first_epoch(self, k: int) -> Pipeline:
        """Runs begin at epoch ``k`` (default 0): the shard order, the shuffle buffer and
        the random operators draw as in epoch ``k`` of a run from epoch 0, and with
        ``epochs(n)`` a run reads epochs ``k`` to ``k + n - 1``. One run per epoch with
        ``first_epoch(e)`` therefore reads what one run of several epochs reads
        (``stoker.torch.Dataset`` does this). Resume a state with the same ``k``."""
        k = _count("first_epoch", k)
        return self._then(self._p.first_epoch(k), "first_epoch", k)

    def span(self, start: int, end: int) -> Pipeline:
        """Reads only entries ``start`` to ``end - 1`` of each epoch's order: samples, for
        formats of one sample per object (files, ImageFolder, ``from_samples``), or whole
        shards, for formats of many records. The order is the whole pipeline's (shuffled by
        :meth:`shuffle_shards`, this rank's share after :meth:`shard` of objects), and every
        sample keeps its random draws, so spans ``0:a``, ``a:b``, ``b:n`` read one after the
        other give what the whole epoch gives (a shuffle buffer or a batch is filled within
        a span: cut at multiples of the batch size to get the same batches). That is the
        piece a distributed run hands a worker; :meth:`epoch_len` gives ``n``."""
        start, end = _count("span start", start), _count("span end", end)
        return self._then(self._p.span(start, end), "span", start, end)

    def distribute(
        self,
        workers: int | str = 2,
        *,
        min_workers: int = 1,
        max_workers: int | None = None,
        address: str | None = None,
        piece: int | None = None,
        ordered: bool = True,
        cpus_per_worker: float = 1.0,
        depth: int = 2,
        tune_s: float = 2.0,
    ) -> Any:
        """This pipeline run by ``workers`` Ray worker actors (a
        :class:`stoker.distributed.DistributedPipeline`: iterate it, or ``run()`` it, as
        a local pipeline). Each epoch is cut into pieces (``piece`` entries of its order
        each; by default about four per worker, whole batches for formats of one sample
        per object) that workers take as they finish; a piece whose worker dies is taken
        again, so every sample comes exactly once. ``ordered`` (the default) yields what
        the local run yields, in its order; ``run().scale(n)`` changes the worker count
        mid-run, and ``run().state_dict()`` resumes with any count. ``workers="auto"``
        starts ``min_workers`` and, every ``tune_s`` seconds, adds one while the consumer
        waits on them (and the cluster has ``cpus_per_worker`` free) or removes one while
        finished pieces wait for the consumer, within ``min_workers``..``max_workers``.
        ``depth``: pieces in flight per worker. ``address``: the Ray cluster to join when
        Ray is not initialised in the process (``None``: a local one).
        Needs Ray (``pip install './python[ray]'``); see ``docs/distributed.md``."""
        from .distributed import DistributedPipeline

        return DistributedPipeline(
            self,
            workers,
            min_workers=min_workers,
            max_workers=max_workers,
            address=address,
            piece=piece,
            ordered=ordered,
            cpus_per_worker=cpus_per_worker,
            depth=depth,
            tune_s=tune_s,
        )

    def serve(
        self,
        name: str,
        *,
        workers: int = 2,
        consumers: int = 1,
        mode: str = "shared",
        piece: int | None = None,
        cpus_per_worker: float = 1.0,
        depth: int = 2,
        address: str | None = None,
    ) -> Any:
        """This pipeline as a named service on Ray that ``consumers`` consumers, in any
        process or job of the cluster, read with ``stoker.service.attach(name, i)``:
        ``mode="shared"``, each reads every epoch whole, from pieces made once;
        ``mode="split"``, consumer ``i`` reads the share ``shard(i, consumers)`` of each
        epoch (equal counts, each sample once). A coordinator actor named after ``name``
        hands out the pieces to ``workers`` worker actors and redoes those of a worker that
        dies. Returns a :class:`stoker.service.Service` (``close()`` stops it). Needs Ray;
        see ``docs/distributed.md``."""
        from .service import Service

        return Service(
            self,
            name,
            workers=workers,
            consumers=consumers,
            mode=mode,
            piece=piece,
            cpus_per_worker=cpus_per_worker,
            depth=depth,
            address=address,
        )

    def to_ray_data(
        self, *, epoch: int | None = None, piece: int | None = None, block_rows: int = 256
    ) -> Any:
        """One epoch of this pipeline (its first, or ``epoch``) as a ``ray.data.Dataset``:
        each read task runs a piece of the epoch's order with the Stoker engine, and each of
        the pipeline's batches becomes a block (its fields the columns); without a batch,
        each sample is a row, ``block_rows`` rows a block. For Ray Data's own
        transformations and consumers. Needs Ray; see ``docs/distributed.md``."""
        from .raydata import to_ray_data

        return to_ray_data(self, epoch=epoch, piece=piece, block_rows=block_rows)

    def epoch_len(self) -> int:
        """The length of each epoch's order (what :meth:`span` cuts), from the listing:
        the objects (or samples in memory), or the shards of a format of many records."""
        return self._p.epoch_len()[0]

    def options(
        self,
        *,
        threads: int | None = None,
        memory_limit: int | str | None = None,
        deterministic: bool | None = None,
        errors: str | None = None,
        autotune: bool | None = None,
        window: int | None = None,
        columnar: bool | None = None,
        share_store: bool | None = None,
        disable: Sequence[str] | None = None,
    ) -> Pipeline:
        """Changes the given run options and keeps the others: ``threads`` (CPU workers),
        ``memory_limit`` (bytes or ``"2GiB"``: the one budget), ``deterministic`` (same
        order whatever the parallelism; default true), ``errors`` (``"raise"`` or
        ``"skip"``), ``autotune``, ``window`` (samples in flight), ``columnar`` (Parquet
        read straight into batches where the result is identical; default true),
        ``share_store`` (read through the process's store for the source's bucket and
        store options, which ``stoker.io.open`` shares too, so that its block cache and
        connections carry over to the next run, such as the next epoch; default false,
        and true in :class:`stoker.torch.Dataset`; ``stoker.io.clear_cache()`` lets the
        shared stores go), ``disable`` (optimizer passes to turn off, for ablation and
        debugging: ``"shuffle"``, ``"batching"``, ``"cache"``, ``"fusion"``; :meth:`explain` shows what each decided)."""
        if threads is not None:
            threads = _count("threads", threads, 1)
        if window is not None:
            window = _count("window", window, 1)
        given = {
            "threads": threads,
            "memory_limit": memory_limit,
            "deterministic": deterministic,
            "errors": errors,
            "autotune": autotune,
            "window": window,
            "columnar": columnar,
            "share_store": share_store,
            "disable": None if disable is None else [str(d) for d in disable],
        }
        return self._then(self._p.options(**given), "options", **given)

    @property
    def run_options(self) -> dict[str, Any]:
        """The run options in force."""
        return self._p.run_options()

    # Running --------------------------------------------------------------------------

    def index(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """A shard index of this pipeline's source: ``{"shards": [{"url": ..., "records": N},
        ...]}``, every shard read whole to count its records (Parquet reads only its
        footers; one-sample-per-object formats count 1 each; a record that fails to parse
        counts too, as it takes its place in a run's positions), many shards at once. What
        ``stoker index`` writes, and what :meth:`shard_index` reads for the contiguous
        split. With ``path``, also written there as JSON (a local file)."""
        _threads.check_fork()
        index = {"shards": [{"url": u, "records": n} for u, n in self._p.count_records()]}
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(index, f, indent=2)
                f.write("\n")
        return index

    def explain(self) -> str:
        """The plan the optimizer makes, with its reasons (from what the pipeline says
        before a run; ``run().explain()`` adds what the run measured)."""
        return self._p.explain()

    def run(self, *, progress: bool | int = False) -> Run:
        """Starts a run: an iterator of dicts with ``stats()``, ``state_dict()``,
        ``explain()`` (the plan it runs, then each operator's measured time and bytes a
        sample against its declaration; ``stats()["operators"]`` has the numbers) and
        ``profile(out=None)`` (the profiler's verdict, timeline and costs so far; with
        ``out``, its HTML report, JSON and trace written there; see :func:`profile`).

        ``progress=True`` shows a progress line on standard error while the run is
        iterated (samples/s, MB/s read, memory in use, epoch), ``progress=N`` also a bar
        and an ETA for ``N`` items."""
        total = None if isinstance(progress, bool) else _count("progress", progress, 1)
        run = self._start(self._p.run)
        if progress is False:
            return run
        return _Progress(run, total)  # type: ignore[return-value]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._start(self._p.run)

    def _start(self, start: Callable[[], Run]) -> Run:
        _threads.check_fork()
        _threads.note_started()
        # Each Python stage in processes mode keeps its workers while a run holds it.
        threads = int(self.run_options["threads"])
        leases = [stage.lease(threads) for stage in self._stages]
        try:
            run = start()
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        for lease in leases:
            run._hold(lease)
        return run

    def resume(self, state: Mapping[str, Any]) -> Run:
        """Starts a run from ``state`` (a run's ``state_dict()``, or that dict after a JSON
        round trip): it yields exactly the items that run had not yet yielded. A state of
        a distributed run (``p.distribute(...)``) resumes here, on this machine, piece by
        piece (a :class:`stoker.distributed.LocalPieceRun`)."""
        if isinstance(state, Mapping) and state.get("kind") == "distributed":
            from .distributed import LocalPieceRun

            return LocalPieceRun(self, state)  # type: ignore[return-value]
        text = to_json(state)
        return self._start(lambda: self._p.resume(text))

    def load_state_dict(self, state: Mapping[str, Any] | None) -> Pipeline:
        """A pipeline whose runs (``run()``, iteration) start at ``state``; ``None`` goes
        back to the beginning. The pipeline it is called on is unchanged, unlike a torch
        module's ``load_state_dict``: keep the result (``p = p.load_state_dict(s)``).
        ``stoker.torch``'s loader and dataset load in place, as torch's do."""
        return self._then(self._p.with_state(None if state is None else to_json(state)), "load_state_dict", None if state is None else dict(state))

    @property
    def start_state(self) -> dict[str, Any] | None:
        """The state runs start at (set by ``load_state_dict``), or ``None``."""
        import json

        text = self._p.start_state()
        return None if text is None else json.loads(text)

    def __repr__(self) -> str:
        logical = self.explain().split("physical:")[0].replace("logical:", "").split()
        return f"<stoker.Pipeline [{', '.join(logical)}]>"


def from_url(
    url: str | os.PathLike[str],
    format: str = "auto",
    *,
    glob: str | None = None,
    keys: Iterable[str] | None = None,
    endpoint: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    allow_http: bool | None = None,
    **options: Any,
) -> Pipeline:
    """Every object under ``url`` (or the one object it names), read as ``format``:
    ``files``, ``imagefolder``, ``tar`` (WebDataset), ``tfrecord``, ``parquet``, ``jsonl``
    or ``csv``; ``auto`` (the default) chooses from the objects' extensions when a run lists
    them (``.tar``; ``.tfrecord``, ``.tfrecords``, ``.tfrec``; ``.parquet``, ``.pq``;
    ``.jsonl``, ``.ndjson``; ``.csv``), ``files`` when none has one of them, and refuses
    objects of a record format mixed with others (name the format and a ``glob``).
    ``imagefolder`` (labels from class directories) is never guessed.

    ``keys``: exactly these objects (keys relative to ``url``'s prefix, taken literally),
    in this order, instead of a listing (a manifest; :func:`from_urls` takes whole URLs);
    not with ``glob``. Nothing is listed or looked up before the run: a missing object
    fails the run when it reaches it, naming it (with a disk ``cache(dir)`` a run looks
    every key up first, many at once, for the versions that tell a changed object).

    Keyword options are store options (``endpoint``, ``region``, ``access_key``,
    ``secret_key``, ``allow_http``, and every key of the CLI's ``-o KEY=VALUE``:
    ``part_size``, ``cache_dir``, ``aws_*``..., and the CLI's flags ``no_sign_request``
    and ``cache_size``) or the format's options (``columns`` for Parquet,
    ``parse_examples`` for TFRecord, ``delimiter``, ``has_header``, ``infer_types`` for
    CSV); any other keyword is a ``ValueError`` that lists both. Credentials and endpoints
    also come from the usual ``AWS_*`` environment variables.
    """
    url = os.fspath(url)
    store: dict[str, Any] = {
        "endpoint": endpoint,
        "region": region,
        "access_key": access_key,
        "secret_key": secret_key,
        "allow_http": allow_http,
    }
    format_options: dict[str, Any] = {}
    for key, value in options.items():
        if is_store_key(key):
            store[key] = value
        elif key in FORMAT_KEYS:
            format_options[key] = value
        else:
            raise unknown_option(key, "from_url")
    spec: dict[str, Any] = {"source": url, "format": format, "format_options": format_options}
    if glob is not None:
        spec["glob"] = glob
    if keys is not None:
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys is a list of keys, not one string")
        spec["keys"] = [os.fspath(k) for k in keys]
    native = _native.Pipeline.from_spec(to_json(spec), store_pairs(store))
    return Pipeline(native, (("from_spec", (spec,), store),))


def _store_root(url: str) -> str:
    """The part of ``url`` that names its store: ``s3://bucket/`` (local paths: ``""``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return ""
    return f"{scheme}://{rest.split('/', 1)[0]}/"


def _local(url: str) -> str:
    """``url`` with a local path as an absolute path (``file://`` URLs decoded, as the store
    decodes them), so that local objects given either way share their directories."""
    if url.startswith("file://"):
        path = urllib.parse.unquote(url[len("file://"):])
        return path[len("localhost"):] if path.startswith("localhost/") else path
    return url if "://" in url else os.path.abspath(url)


def from_urls(
    urls: Iterable[str | os.PathLike[str]],
    format: str = "auto",
    *,
    root: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Pipeline:
    """Exactly these objects, in this order (a manifest; repeats read an object again), as
    one source: :func:`from_url` on ``root`` with the URLs' keys relative to it. ``root``
    defaults to the URLs' common directory; give it where the keys below it mean something,
    as ImageFolder's class directories do (all the URLs in one class directory would
    otherwise make that directory the root). The URLs must be in one store (one bucket);
    they are percent-decoded as :func:`from_url`'s URL is (local paths are not). The
    keywords are :func:`from_url`'s. The order is the epoch's order unless
    ``shuffle_shards``; with a one-sample-per-object format (``files``, ``imagefolder``)
    every object is a sample."""
    given = [_local(os.fspath(u)) for u in urls]
    if not given:
        raise ValueError("from_urls: no URLs")
    roots = sorted({_store_root(u) for u in given})
    if len(roots) > 1:
        raise ValueError(f"from_urls: the URLs must be in one store, not in {', '.join(repr(r) for r in roots)}")
    if root is None:
        common = os.path.commonprefix(given)
        base = common[: common.rfind("/") + 1]
        if len(base) < len(roots[0]):
            base = roots[0]
    else:
        base = _local(os.fspath(root))
        base = base if base.endswith("/") else base + "/"
        outside = [u for u in given if not u.startswith(base)]
        if outside:
            raise ValueError(f"from_urls: {outside[0]} is not under root {base}")
    keys = [u[len(base):] for u in given]
    if roots[0]:
        keys = [urllib.parse.unquote(k) for k in keys]
    return from_url(base, format, keys=keys, **options)


def from_spec(spec: Mapping[str, Any] | str | os.PathLike[str], **store_options: Any) -> Pipeline:
    """A pipeline from a spec: a dict, TOML text, or the path of a TOML file (the format of
    ``stoker run PIPELINE.toml``). Keyword store options apply under the spec's own
    ``[store]`` table, which wins. A spec with a ``[distribute]`` table gives the pipeline
    distributed on Ray, ``Pipeline.distribute(**table)`` (a
    :class:`stoker.distributed.DistributedPipeline`; docs/distributed.md)."""
    if isinstance(spec, Mapping):
        data = dict(spec)
    elif isinstance(spec, os.PathLike) or (isinstance(spec, str) and _names_a_file(spec)):
        # A missing file is a FileNotFoundError here, not TOML's complaint about its name.
        with open(os.fspath(spec), "rb") as f:
            data = tomllib.load(f)
    elif isinstance(spec, str):
        data = tomllib.loads(spec)
    else:
        raise TypeError("a spec is a dict, TOML text or the path of a TOML file")
    dist = data.pop("distribute", None)
    native = _native.Pipeline.from_spec(to_json(data), store_pairs(store_options))
    p = Pipeline(native, (("from_spec", (data,), dict(store_options)),))
    if dist is None:
        return p
    if not isinstance(dist, Mapping):
        raise ValueError("a spec's [distribute] is a table of Pipeline.distribute's arguments")
    known = {"workers", "min_workers", "max_workers", "address", "piece", "ordered",
             "cpus_per_worker", "depth", "tune_s"}
    unknown = sorted(set(dist) - known)
    if unknown:
        raise ValueError(f"[distribute] has no {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return p.distribute(**dist)  # type: ignore[return-value]


def _names_a_file(text: str) -> bool:
    """Whether ``from_spec``'s string is a path rather than TOML text: an existing file, or
    one line ending in ``.toml`` or without the ``=`` every TOML spec has."""
    if os.path.isfile(text):
        return True
    return "\n" not in text and (text.endswith(".toml") or "=" not in text)


def from_samples(samples: Iterable[Mapping[str, Any]]) -> Pipeline:
    """A pipeline over samples in memory: dicts of ``bytes``, ``str``, ``int``, ``float``,
    ``bool``, ``None``, lists and NumPy arrays (copied into Stoker's data model)."""
    items = [dict(s) for s in samples]
    return Pipeline(_native.Pipeline.from_samples(items), (("from_samples", (items,), {}),))


def _rebuild(recipe: tuple[Any, ...]) -> Pipeline:
    """A pipeline from its recipe (unpickling)."""
    (source, args, kwargs), *calls = recipe
    sources = {"from_spec": from_spec, "from_samples": from_samples}
    if source not in sources:
        raise ValueError(f"not a Stoker pipeline recipe (source {source!r})")
    p = sources[source](*args, **kwargs)
    for name, args, kwargs in calls:
        p = getattr(p, name)(*args, **kwargs)
    return p


_NPY_DIR: list[str] = []


def _npy_file(table: Any) -> str:
    """An ``embedding`` table given as an array: saved once to a ``.npy`` file in a temporary
    directory of this process (removed at exit), which the operator memory-maps."""
    import atexit
    import shutil
    import tempfile

    import numpy as np

    a = np.asarray(table)
    if a.ndim != 2 or a.dtype not in (np.float32, np.float16):
        raise ValueError(
            f"embedding: table must be a 2-D float32 or float16 array, not {a.ndim}-D {a.dtype}"
            " (use .astype(np.float32))"
        )
    if not _NPY_DIR:
        _NPY_DIR.append(tempfile.mkdtemp(prefix="stoker-embedding-"))
        atexit.register(shutil.rmtree, _NPY_DIR[0], True)
    fd, path = tempfile.mkstemp(suffix=".npy", dir=_NPY_DIR[0])
    with os.fdopen(fd, "wb") as f:
        np.save(f, np.ascontiguousarray(a))
    return path


class _Progress:
    """A run that draws a progress line on ``sys.stderr`` as it is iterated (at most twice
    a second), like tqdm; every other attribute is the run's."""

    def __init__(self, run: Run, total: int | None) -> None:
        import time

        self._run = run
        self._total = total
        self._t0 = time.monotonic()
        self._last = 0.0
        self._items = 0
        self._samples = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def __iter__(self) -> _Progress:
        return self

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *args: object) -> bool:
        return self._run.__exit__(*args)

    def __next__(self) -> dict[str, Any]:
        import time

        try:
            item = next(self._run)
        except StopIteration:
            self._draw(time.monotonic(), final=True)
            raise
        self._items += 1
        self._samples += _samples_in(item)
        now = time.monotonic()
        if now - self._last >= 0.5:
            self._last = now
            self._draw(now)
        return item

    def _draw(self, now: float, final: bool = False) -> None:
        import sys

        st = self._run.stats() if not self._run.closed else None
        secs = max(now - self._t0, 1e-9)
        parts = [f"{self._samples} samples", f"{self._samples / secs:,.0f} samples/s"]
        if st is not None:
            read = (st.get("storage") or {}).get("bytes_read", st["stages"][0]["bytes"])
            mem = st["memory"]
            parts += [
                f"{read / secs / 1e6:,.1f} MB/s read",
                f"memory {mem['held'] / 2**20:,.0f}/{mem['limit'] / 2**20:,.0f} MiB",
                f"epoch {st['epoch']}",
            ]
        line = ", ".join(parts)
        if self._total:
            frac = min(self._items / self._total, 1.0)
            bar = "#" * int(frac * 20)
            eta = (secs / frac - secs) if frac > 0 else float("nan")
            line = f"[{bar:<20}] {self._items}/{self._total} items, ETA {eta:,.0f} s, " + line
        sys.stderr.write("\r" + line + ("\n" if final else ""))
        sys.stderr.flush()


def _samples_in(item: Mapping[str, Any]) -> int:
    """Samples in an item: 1, or a batch's length (its first column's)."""
    key = item.get("__key__")
    if isinstance(key, list):
        return len(key)
    for v in item.values():
        shape = getattr(v, "shape", None)
        if shape:
            return int(shape[0])
        if isinstance(v, list):
            return len(v)
        break
    return 1


def profile(
    pipeline: Pipeline,
    *,
    seconds: float = 30.0,
    step_ms: float = 0.0,
    limit: int | None = None,
    out: str | os.PathLike[str] | None = "stoker-profile",
    trace: bool = True,
) -> dict[str, Any]:
    """Runs ``pipeline`` for at most ``seconds`` (or ``limit`` items, or to its end) under
    the profiler and returns its profile as a dict; with ``out`` (the default
    ``"stoker-profile"``), also writes ``report.html`` (plots and the verdict, one page
    that needs no network), ``profile.json`` and, with ``trace``, ``trace.json`` (Chrome
    trace events: open it in Perfetto or ``chrome://tracing``) into that directory.

    ``step_ms`` stands in for a training step: the consumer sleeps that long after each
    item (without it, the profile measures the pipeline alone, which is then input-bound
    by definition). To profile a real training loop, iterate ``run = p.run()`` (or a
    ``stoker.torch.Dataset``) in it and call ``run.profile(out)`` (``dataset.profile(out)``)
    afterwards: the run measured how long the loop waited for input and how long it spent
    in its own step.

    The profile's ``verdict`` says whether the consumer is ``input_bound``, the
    ``bottleneck`` (an operator or stage as ``explain()`` names it, ``memory budget`` or
    ``consumer``), its ``cause`` (``cpu``, ``io``, ``memory`` or ``consumer``) and ranked
    ``recommendations``, each with its expected gain and the spec line or Python that makes
    it."""
    import time

    if trace:
        _native.trace_start()
    try:
        run = pipeline.run()
        with run:
            t0 = time.monotonic()
            n = 0
            for _ in run:
                n += 1
                if step_ms > 0:
                    time.sleep(step_ms / 1000.0)
                if (limit is not None and n >= limit) or time.monotonic() - t0 >= seconds:
                    break
            return run.profile(None if out is None else os.fspath(out))
    finally:
        if trace:
            _native.trace_stop()
