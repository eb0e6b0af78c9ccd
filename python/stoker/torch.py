"""PyTorch adapters: batches as torch tensors without a copy, an ``IterableDataset`` that
shards by data-parallel rank and DataLoader worker, and a DataLoader whose
``state_dict()`` resumes mid-epoch exactly.

::

    import stoker, stoker.torch

    p = stoker.from_url(...).map(...).batch(64, drop_last=True).seed(1)
    ds = stoker.torch.Dataset(p)            # rank and world size from torch.distributed
    loader = stoker.torch.DataLoader(ds)    # num_workers=0: the recommended path
    for batch in loader:                    # dicts of torch tensors over Stoker's memory
        ...
    checkpoint = {"data": loader.state_dict(), ...}

See ``docs/python.md`` (PyTorch).
"""

from __future__ import annotations

import copy
import os
import pickle
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.data as tud

from . import Buffer, Pipeline, _threads
from ._views import whole_view as _whole_view

__all__ = ["DataLoader", "Dataset", "distributed_rank", "to_torch"]

#: What ``shared`` may be in :func:`to_torch`.
SHARED_POLICIES = ("copy", "view")

_STATE_VERSION = 1


_warned_pin = False


def _pin(t: torch.Tensor) -> torch.Tensor:
    """``t`` in pinned memory when CUDA is available (one copy); otherwise ``t`` itself,
    after one warning per process."""
    global _warned_pin
    if torch.cuda.is_available():
        return t.pin_memory()
    if not _warned_pin:
        _warned_pin = True
        warnings.warn(
            "pin_memory=True but CUDA is not available: tensors stay in ordinary memory "
            "(no copy made)",
            RuntimeWarning,
            stacklevel=3,
        )
    return t


def _array_to_torch(a: np.ndarray, shared: str) -> torch.Tensor:
    base = a.base
    if isinstance(base, Buffer) and _whole_view(a, base):
        if base.exclusive or shared == "view":
            return torch.from_dlpack(base)
        # torch has no read-only tensors: memory that other samples, the store's cache or a
        # mapped file share is copied once rather than handed out writable.
        return torch.from_dlpack(base, copy=True)
    if a.flags.writeable:
        return torch.from_numpy(a)
    return torch.from_numpy(a.copy())


def to_torch(
    item: Any, *, shared: str = "copy", pin_memory: bool = False, bytes_as: str = "memoryview"
) -> Any:
    """A sample or batch (a dict, as a run yields it) with its NumPy arrays as torch
    tensors, recursively through dicts, lists and tuples; other values unchanged.

    A tensor whose memory belongs to this item alone (a batch the engine stacked) becomes a
    torch tensor over the same memory, through DLPack, without a copy. A tensor whose memory
    is shared (with other samples, the store's cache or a mapped disk-cache file: typical
    for unbatched samples) is copied once when ``shared="copy"`` (the default), because torch
    tensors are always writable and a write would change what others see;
    ``shared="view"`` shares it anyway (then never write to it). bfloat16 tensors arrive as
    ``torch.bfloat16``. ``pin_memory=True`` copies each tensor into pinned memory when CUDA
    is available, and otherwise warns once and does nothing. Bytes fields stay
    ``memoryview`` (``bytes_as="memoryview"``) or become ``bytes`` (``bytes_as="bytes"``, a
    copy; what crosses a process boundary must be picklable).
    """
    if shared not in SHARED_POLICIES:
        raise ValueError(f"shared must be one of {SHARED_POLICIES}, not {shared!r}")
    if bytes_as not in ("memoryview", "bytes"):
        raise ValueError(f'bytes_as must be "memoryview" or "bytes", not {bytes_as!r}')

    def conv(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            t = _array_to_torch(x, shared)
            return _pin(t) if pin_memory else t
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        if isinstance(x, tuple):
            return tuple(conv(v) for v in x)
        if isinstance(x, memoryview) and bytes_as == "bytes":
            return x.tobytes()
        return x

    return conv(item)


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def distributed_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's ``(rank, world_size)``: the arguments when given (both), else
    ``torch.distributed``'s when it is initialized, else the ``RANK`` and ``WORLD_SIZE``
    environment variables (both), else ``(0, 1)``."""
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    source = "arguments"
    if rank is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world_size, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
        else:
            rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
            if (rank is None) != (world_size is None):
                raise ValueError("set both RANK and WORLD_SIZE, or neither")
            source = "RANK/WORLD_SIZE"
            if rank is None:
                rank, world_size = 0, 1
    assert rank is not None and world_size is not None
    if isinstance(rank, bool) or isinstance(world_size, bool):
        raise TypeError("rank and world_size are integers")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size} (from {source}) is not a rank")
    return int(rank), int(world_size)


class _Tagged(NamedTuple):
    """What a worker of :class:`DataLoader` sends: the item with the position after it
    and the epoch it belongs to. ``item`` is ``None`` and ``done`` true at the end of the
    worker's run."""

    item: Any
    split: int
    state: Any
    done: bool
    epoch: int


class Dataset(tud.IterableDataset):
    """An ``IterableDataset`` over a Stoker :class:`~stoker.Pipeline`.

    Each iteration is one run of the pipeline, sharded with the engine's
    ``shard(rank, world_size, policy)`` so that every rank gets the same number of samples
    (``"drop"``: floor(n / world), ``"pad"``: ceil(n / world)) and so the same number of
    batches. ``rank`` and ``world_size`` come from the arguments, else from
    ``torch.distributed`` when initialized, else from ``RANK``/``WORLD_SIZE``, else 0 of 1;
    they are read here, so build the dataset after ``init_process_group``.

    Use it with ``DataLoader(ds, batch_size=None)`` (the pipeline batches). With
    ``num_workers=0`` (recommended: the engine already runs in parallel) the run is in this
    process. With ``num_workers=K > 0`` each worker runs its own part: the rank's share
    (the same number of samples on every rank, as above) is dealt to its K workers in turn,
    worker k taking the share's samples k, k + K, ...; workers read disjoint samples, the
    workers of a rank together read its whole share (nothing more is dropped or repeated
    than the rank split's ``world_size - 1`` at most), and worker k has as many samples on
    every rank, so every rank still gets the same number of batches.

    Items are converted with :func:`to_torch` (``shared``, ``pin_memory``); ``to_torch=False``
    yields the run's dicts of NumPy arrays. The dataset pickles (the pipeline as its recipe),
    so it works with the "fork", "spawn" and "forkserver" start methods.

    Epochs: each iteration is the next epoch, 0, 1, 2, ... (the pipeline run with
    ``first_epoch(e)``), so the shard order, the shuffle buffer and random operators draw
    anew every epoch, exactly as one run of the pipeline over several epochs would. The
    runs read through the process's shared store (``options(share_store=True)``, unless the
    pipeline sets it), so an epoch reads from the block cache what earlier ones left there,
    as one run would: from object storage, up to half the memory budget by default
    (``cache_memory`` sets the size, ``cache_memory=0`` turns it off, ``cache_dir`` adds a
    disk tier; local files are not copied, the page cache holds them), and the optimizer's
    sample cache (the decoded images, when they fit in half the budget) serves the epochs
    after the first, as in one run (``run.explain()`` says whether it was placed).
    ``set_epoch(e)`` makes the next iteration epoch ``e`` (as ``DistributedSampler``'s);
    it is needed only with torch's own ``DataLoader`` and workers, whose worker copies do
    not see the iterations counted here (:class:`DataLoader` counts for its workers).

    A pipeline made by ``p.distribute(...)`` (``docs/distributed.md``) works the same way
    with ``num_workers=0``: each rank's share runs on Ray worker actors, in the same order
    as the local pipeline's share, and ``state_dict()`` resumes it.

    ``state_dict()`` / ``load_state_dict()`` work with ``num_workers=0``; with workers use
    :class:`DataLoader`, which tracks every worker's position.

    Fork: a worker forked from a process where Stoker's threads had started (a pipeline ran
    or ``stoker.io`` was used there) raises ``RuntimeError`` rather than run on copied lock
    state; :class:`DataLoader` starts workers with "forkserver", which is always safe.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        policy: str = "drop",
        shared: str = "copy",
        pin_memory: bool = False,
        to_torch: bool = True,
    ) -> None:
        super().__init__()
        from .distributed import DistributedPipeline

        # A distributed pipeline (p.distribute(...)): each rank runs its share on Ray
        # workers; `inner` is the pipeline they run.
        self._distributed = isinstance(pipeline, DistributedPipeline)
        inner = pipeline.pipeline if self._distributed else pipeline
        if not isinstance(inner, Pipeline):
            raise TypeError(
                "Dataset takes a stoker.Pipeline (or one made by .distribute()), "
                f"not {type(pipeline).__name__}"
            )
        source = inner._recipe[0] if inner._recipe else None
        spec_rank = source is not None and source[0] == "from_spec" and "rank" in source[1][0]
        if "shard" in inner._calls() or spec_rank:
            raise ValueError(
                "the pipeline is already sharded (.shard() or a spec's [rank]): "
                "stoker.torch.Dataset shards "
                "it by rank (and worker) itself; give it the unsharded pipeline"
            )
        if policy not in ("drop", "pad"):
            raise ValueError(f'policy must be "drop" or "pad", not {policy!r}')
        if shared not in SHARED_POLICIES:
            raise ValueError(f"shared must be one of {SHARED_POLICIES}, not {shared!r}")
        self.rank, self.world_size = distributed_rank(rank, world_size)
        self.pipeline = pipeline
        self.policy = policy
        self.shared = shared
        self.pin_memory = bool(pin_memory)
        self.to_torch = bool(to_torch)
        # Where the next iteration starts: None, or a loader state (see DataLoader).
        self._start: dict[str, Any] | None = None
        # The epoch the next iteration runs, in a box that shallow copies share (the copy
        # DataLoader makes), and the epoch of the current or last iteration. A pipeline's
        # own first_epoch(k) is where the first iteration starts; with epochs(n) each
        # iteration reads n epochs.
        calls = dict((name, args) for name, args, _ in inner._recipe)
        self._first_epoch = int(calls["first_epoch"][0]) if "first_epoch" in calls else 0
        self._next_epoch = [self._first_epoch]
        n = calls["epochs"][0] if "epochs" in calls else 1
        self._per_iteration = 1 if n is None else int(n)
        self._epoch = 0
        # The last iteration read its whole share (so its state is the next epoch's start).
        self._finished = False
        # Set by DataLoader for worker processes: send _Tagged items.
        self._tagged = False
        self._run: Any = None
        self._last_state: Any = None
        self._split: tuple[int, int] | None = None

    # Pickling: everything but the run of this process. ---------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_run"] = None
        state["_last_state"] = None
        return state

    # Iteration ----------------------------------------------------------------------

    def pipeline_for(self, part: int, parts: int) -> Any:
        """The pipeline that worker ``part`` of this rank's ``parts`` workers runs (``0``
        of ``1`` without workers): this rank's share, dealt out to the workers."""
        inner = self.pipeline.pipeline if self._distributed else self.pipeline
        p = inner.shard(self.rank, self.world_size, self.policy, part=part, parts=parts)
        chosen = any(
            name == "options" and kwargs.get("share_store") is not None
            for name, _, kwargs in inner._recipe
        )
        # Each iteration is a run: the shared store carries the block cache from epoch to
        # epoch, as one run over several epochs would keep it.
        p = p if chosen else p.options(share_store=True)
        return self.pipeline.with_pipeline(p) if self._distributed else p

    def set_epoch(self, epoch: int) -> None:
        """The next iteration is epoch ``epoch`` (its shard order, shuffle and random
        draws); later ones follow it, ``epoch + 1``, ... ."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be at least 0, not {epoch}")
        self._next_epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._next_epoch[0]

    def _convert(self, item: Any, in_worker: bool) -> Any:
        if not self.to_torch:
            return item
        # Pinning happens in the main process (the DataLoader's pin_memory) when there
        # are workers; items then cross a process boundary, so bytes must be picklable.
        return to_torch(
            item,
            shared=self.shared,
            pin_memory=self.pin_memory and not in_worker,
            bytes_as="bytes" if in_worker else "memoryview",
        )

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the start state is read (and used up) now, when DataLoader asks
        # for the iterator, not at the first item.
        info = tud.get_worker_info()
        if info is not None and _threads.forked_with_threads():
            raise RuntimeError(
                "this DataLoader worker was forked from a process in which Stoker's threads "
                "had started (a pipeline ran there, or stoker.io was used), which is not "
                "safe: the engine's lock bookkeeping is copied half-way. Start workers with "
                'multiprocessing_context="forkserver" (stoker.torch.DataLoader does) or '
                '"spawn"'
            )
        if info is not None and self._distributed:
            raise ValueError(
                "a distributed pipeline runs on Ray workers already: use it with "
                "num_workers=0 (DataLoader worker processes would each start their own)"
            )
        workers = 1 if info is None else info.num_workers
        worker = 0 if info is None else info.id
        start = self._start
        entry = None
        offset = 0
        epoch = self._next_epoch[0]
        if start is not None:
            self._check_state(start, workers)
            offset = start["next_worker"]
            epoch = start.get("epoch", 0)
            # Used up: the next iteration starts at the beginning of the next epoch (a
            # persistent DataLoader worker keeps this object from epoch to epoch).
            self._start = None
        self._epoch = epoch
        self._next_epoch[0] = epoch + self._per_iteration
        self._finished = False
        # After a resume, torch's worker j takes the part that was next in turn, so the
        # loader's round-robin over workers continues in the original order.
        part = (worker + offset) % workers
        if start is not None:
            entry = start["splits"].get(str(part))
        self._split = (part, workers)
        p = self.pipeline_for(part, workers).first_epoch(epoch)
        if entry is not None and entry.get("done"):
            self._run = None
            self._finished = True
            return iter(())
        run = p.resume(entry["state"]) if entry is not None else p.run()
        self._run = run
        return self._items(run, part, info is not None, epoch)

    def _items(self, run: Any, part: int, in_worker: bool, epoch: int) -> Iterator[Any]:
        tagged = self._tagged and in_worker
        try:
            for item in run:
                out = self._convert(item, in_worker)
                if tagged:
                    yield _Tagged(out, part, run.state_dict(), False, epoch)
                else:
                    yield out
            self._finished = True
            if tagged:
                yield _Tagged(None, part, None, True, epoch)
        finally:
            # The position stays readable after the run is closed (state_dict() after the
            # epoch, or after the loader dropped its iterator).
            try:
                self._last_state = run.state_dict()
            except (ValueError, RuntimeError):
                self._last_state = None
            try:
                self._last_profile = run.profile()
            except (ValueError, RuntimeError):
                self._last_profile = None
            run.close()

    def profile(self, out: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """The profile (``stoker.profile``'s dict) of this process's current run, or of
        the last one when none is running (``None`` before the first). The run measured
        how long the training loop waited for input and how long it spent in its own step
        between batches, so the verdict says whether this loop is input-bound. With
        ``out``, the current run's report is also written there (``report.html``,
        ``profile.json``, ``trace.json``). Measures the iteration in this process: with
        DataLoader worker processes, each worker's run is its own."""
        run = getattr(self, "_run", None)
        if run is not None and not run.closed:
            return run.profile(None if out is None else os.fspath(out))
        return getattr(self, "_last_profile", None)

    # State ----------------------------------------------------------------------------

    def _check_state(self, state: Mapping[str, Any], workers: int) -> None:
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise ValueError("not a stoker.torch state (from state_dict())")
        if (state["rank"], state["world_size"]) != (self.rank, self.world_size):
            raise ValueError(
                f"this state is rank {state['rank']} of {state['world_size']}; this dataset "
                f"is rank {self.rank} of {self.world_size}"
            )
        if state["num_workers"] != workers:
            raise ValueError(
                f"this state was taken with {state['num_workers']} worker(s) "
                f"(num_workers={state['num_workers'] if state['num_workers'] > 1 else 0}); "
                f"resume with the same number, not {workers}"
            )

    def _make_state(
        self, splits: dict[str, Any], next_worker: int, workers: int, epoch: int
    ) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": workers,
            "epoch": epoch,
            "next_worker": next_worker,
            "splits": splits,
        }

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item this process's iteration yielded (JSON-able);
        before any iteration, the state it would start at. Only without workers: with
        ``num_workers > 0`` the runs are in the workers, so use :class:`DataLoader`."""
        if self._start is not None:
            return copy.deepcopy(self._start)
        if self._run is None or self._finished:
            # Before any iteration, or after one that read everything: the next epoch's
            # start.
            return self._make_state({}, 0, 1, self._next_epoch[0])
        try:
            if self._run.closed and self._last_state is not None:
                state = self._last_state
            else:
                state = self._run.state_dict()
        except RuntimeError as e:
            raise RuntimeError(
                f"{e}; with DataLoader workers use stoker.torch.DataLoader's state_dict()"
            ) from None
        return self._make_state({"0": {"state": state, "done": False}}, 0, 1, self._epoch)

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """The next iteration starts at ``state`` (from ``state_dict()``), once, in the
        state's epoch; ``None`` goes back to the beginning of the first epoch."""
        if state is None:
            self._start = None
            self._next_epoch[0] = self._first_epoch
            return
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise ValueError("not a stoker.torch state (from state_dict())")
        self._check_state(state, state["num_workers"])
        self._start = copy.deepcopy(dict(state))
        self._run = None


def _unwrap_worker_item(
    item: Any, loader: DataLoader
) -> tuple[bool, Any]:
    if not isinstance(item, _Tagged):
        raise TypeError("stoker.torch.DataLoader's workers sent an untagged item")
    if item.epoch != loader._epoch:
        raise RuntimeError(
            f"a DataLoader worker ran epoch {item.epoch} where the loader is at epoch "
            f"{loader._epoch}: with persistent_workers=True the workers count epochs "
            "themselves, so set_epoch() and load_state_dict() cannot reach them once they "
            "have started; use persistent_workers=False to change the epoch or position"
        )
    loader._positions[str(item.split)] = {"state": item.state, "done": item.done}
    if item.done:
        return False, None
    loader._last_part = item.split
    return True, item.item


class DataLoader(tud.DataLoader):
    """A ``torch.utils.data.DataLoader`` over a :class:`Dataset` (``batch_size=None``: the
    pipeline batches) with ``state_dict()`` / ``load_state_dict()`` that resume mid-epoch
    exactly, also with ``num_workers > 0``: each worker sends the position after each item
    with it, and the loader keeps the positions of the items it has handed out (not of
    what workers have read ahead). Resume with the same world size and ``num_workers``.

    Workers start with "forkserver" (see :func:`worker_context`) unless
    ``multiprocessing_context`` says otherwise.

    ``pin_memory=True`` pins the tensors when CUDA is available (a copy into pinned memory;
    in the worker-less path by :func:`to_torch`, else by torch's pinning thread), and
    otherwise warns once and does nothing.

    Each iteration is the dataset's next epoch (see :class:`Dataset`), also with workers;
    ``set_epoch(e)`` (of the loader or of its dataset) picks the next one. State dicts
    record the epoch: a state taken after an epoch ended resumes at the next one's start.
    """

    def __init__(self, dataset: Dataset, num_workers: int = 0, **kwargs: Any) -> None:
        if not isinstance(dataset, Dataset):
            raise TypeError(
                f"stoker.torch.DataLoader takes a stoker.torch.Dataset, not "
                f"{type(dataset).__name__}"
            )
        for key in ("batch_size", "sampler", "batch_sampler", "shuffle", "collate_fn"):
            if kwargs.get(key) not in (None, False):
                raise ValueError(
                    f"{key} is the pipeline's business (batch, shuffle in the pipeline); "
                    "the loader hands its items over as they are"
                )
            kwargs.pop(key, None)
        pin = bool(kwargs.pop("pin_memory", False))
        # A copy: the loader's settings (tagging, pinning) must not change the caller's.
        dataset = copy.copy(dataset)
        dataset._tagged = num_workers > 0
        self._pin = pin
        if pin:
            dataset.pin_memory = True
        torch_pin = pin and num_workers > 0 and torch.cuda.is_available()
        if pin and num_workers > 0 and not torch.cuda.is_available():
            _pin(torch.empty(0))  # the same one warning
        if num_workers > 0:
            # Workers get the dataset pickled: say why it cannot be, here, rather than as
            # a pickling failure inside torch's worker start.
            try:
                pickle.dumps(dataset)
            except Exception as e:
                raise TypeError(
                    f"with num_workers={num_workers} the dataset is pickled into each worker, "
                    f"and this one does not pickle ({e}): its pipeline's Python functions "
                    "must be module-level (a lambda or a local function is not), or use "
                    "num_workers=0, the recommended path"
                ) from e
        if num_workers > 0 and kwargs.get("multiprocessing_context") is None:
            kwargs["multiprocessing_context"] = worker_context()
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=torch_pin,
            collate_fn=_identity,
            **kwargs,
        )
        self._positions: dict[str, Any] = {}
        self._last_part: int | None = None
        self._workers = max(1, num_workers)
        # The epoch of the current or last iteration with workers.
        self._epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The next iteration is epoch ``epoch`` (see :meth:`Dataset.set_epoch`)."""
        self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self.dataset.epoch  # type: ignore[attr-defined, no-any-return]

    def __iter__(self) -> Iterator[Any]:
        ds: Dataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            # The dataset's own iteration, in this process, keeps the epoch and position.
            yield from super().__iter__()
            return
        start = ds._start
        epoch = ds._next_epoch[0]
        if start is not None:
            ds._check_state(start, self._workers)
            self._positions = copy.deepcopy(dict(start["splits"]))
            self._last_part = (start["next_worker"] - 1) % self._workers
            epoch = start.get("epoch", 0)
        else:
            self._positions = {}
            self._last_part = None
        self._epoch = epoch
        # Workers starting now copy the dataset with this epoch (persistent ones count
        # from theirs; _unwrap_worker_item checks that they agree).
        ds._next_epoch[0] = epoch
        it = super().__iter__()
        # Worker processes have the start state now; the next iteration starts afresh,
        # at the next epoch.
        ds._start = None
        ds._next_epoch[0] = epoch + ds._per_iteration
        for item in it:
            keep, value = _unwrap_worker_item(item, self)
            if keep:
                yield value

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item this loader handed out (JSON-able)."""
        ds: Dataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            return ds.state_dict()
        if ds._start is not None:
            return copy.deepcopy(ds._start)
        done = sum(1 for v in self._positions.values() if v.get("done"))
        if self._last_part is None and not self._positions or done == self._workers:
            # Before any iteration, or after one whose every worker finished: the next
            # epoch's start.
            return ds._make_state({}, 0, self._workers, ds._next_epoch[0])
        nxt = 0 if self._last_part is None else (self._last_part + 1) % self._workers
        return ds._make_state(copy.deepcopy(self._positions), nxt, self._workers, self._epoch)

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """The next iteration starts at ``state`` (from ``state_dict()``), in its epoch."""
        ds: Dataset = self.dataset  # type: ignore[assignment]
        if state is not None:
            ds._check_state(state, self._workers)
        if self.persistent_workers and getattr(self, "_iterator", None) is not None:
            raise RuntimeError(
                "load_state_dict() on a DataLoader with persistent_workers=True whose workers "
                "have started cannot reach them; load the state into a new DataLoader"
            )
        ds.load_state_dict(state)


def worker_context() -> Any:
    """The multiprocessing context :class:`DataLoader` starts workers with: "forkserver",
    with torch and stoker preloaded in the server, so a worker is a fork of a process in
    which no Stoker thread ever ran (safe whatever this process has run) that starts in
    milliseconds, not an interpreter importing torch anew ("spawn")."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "stoker.torch"])
    return ctx


def _identity(x: Any) -> Any:
    return x
