"""A pipeline run by worker actors on Ray (:meth:`stoker.Pipeline.distribute`).

Each epoch's order (of objects, or of shards for formats of many records) is cut into
*pieces*, spans of it (:meth:`stoker.Pipeline.span`). Worker actors, each hosting the
Stoker engine, run the pipeline over the pieces they are handed and stream each piece's
items back as they are made (Ray's streaming generators), through Ray's object store; the
consumer's side hands pieces out as workers finish (at most ``depth`` running on each) and
yields the items of one piece after the other.

Exactly once: a piece's output is deterministic (every sample keeps its place in the
epoch's order, and so its random draws), so a piece whose worker dies (or whose items are
lost with its node) is handed out again with the items the consumer already took from it
skipped: nothing is lost or repeated. A piece counts as done when the consumer has taken
its last item; :meth:`DistributedRun.state_dict` records the done pieces and the items
taken from the current one, so a run resumes exactly, with any number of workers.

Deterministic (``ordered=True``, the default): pieces are yielded in the epoch's order, and
since every sample keeps its position (and so its random draws) in a span, the run yields
what the local run yields, batch for batch when the pieces are cut at multiples of the
batch size (done for formats of one sample per object). A shuffle buffer or a pack is
filled within a piece (``explain()`` says so). ``ordered=False`` yields pieces as they
finish (a piece is still read from its first item to its last before the next).

Ray is optional: without it, :meth:`~stoker.Pipeline.distribute` raises an ``ImportError``
naming the extra (``pip install './python[ray]'``).
"""

from __future__ import annotations

import collections
import copy
import math
import os
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from . import handoff

if TYPE_CHECKING:
    from . import Pipeline

EXTRA = "pip install './python[ray]'"

STATE_VERSION = 1

# The key of a piece's last item, its numbers (not one of the pipeline's items).
PIECE_END = "__stoker_piece_end__"

# workers="auto": the consumer's share of time waiting for a piece above which a worker is
# added, and below which (with finished pieces waiting for it) one is removed.
AUTO_UP = 0.10
AUTO_DOWN = 0.02
# ... and the workers' busy share (time on pieces over the time they had) below which a
# wait is not for lack of workers.
AUTO_BUSY = 0.5


def init_ray(ray: Any, address: str | None) -> None:
    """Joins the Ray cluster at `address`; None starts a Ray of this machine ("local", not
    Ray's own default of joining whatever cluster a file in /tmp names: a dead one, after a
    crash), whose worker processes run at normal priority: Ray's default niceness of 15
    starves them under any competing load (measured: 91 against 605 images/s beside two busy
    loops on two cores), and these workers are the input the training loop waits for.
    ``RAY_worker_niceness`` in the environment still decides."""
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        return
    key = "RAY_worker_niceness"
    ours = key not in os.environ
    if ours:
        os.environ[key] = "0"
    try:
        ray.init(address="local", ignore_reinit_error=True, log_to_driver=False)
    finally:
        if ours:
            os.environ.pop(key, None)


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            f"Pipeline.distribute runs on Ray, an optional dependency that is not installed: "
            f"{EXTRA} (or pip install 'ray[data]>=2.9')"
        ) from e
    return ray


class _Worker:
    """The actor: the engine over one pipeline, run piece by piece."""

    def __init__(self, pipeline: Pipeline, threads: int) -> None:
        self._p = pipeline.options(threads=threads)
        self._pieces = 0
        self._pool = handoff.Pool() if handoff.available() else None

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def niceness(self) -> int:
        """This worker process's niceness."""
        return os.nice(0)

    def handoff_probe(self) -> dict[str, Any] | None:
        """Where the consumer checks that it can map this worker's segments
        (:mod:`stoker.handoff`); None where there are none."""
        if self._pool is None:
            return None
        return {"node": self.node(), **self._pool.probe()}

    def stream_piece(
        self, epoch: int, start: int, end: int, skip: int, share: bool = False
    ) -> Iterator[dict[str, Any]]:
        """The piece's items as they are made (a Ray streaming generator), its first
        `skip` left out, then a last item of its numbers. With `share`, large arrays go in
        the worker's shared segments (the consumer maps them)."""
        t0 = time.perf_counter()
        pack = self._pool.pack if share and self._pool is not None else None
        for i, item in enumerate(self._p.first_epoch(epoch).epochs(1).span(start, end).run()):
            if i >= skip:
                yield item if pack is None else pack(item)
        self._pieces += 1
        yield {PIECE_END: {"seconds": time.perf_counter() - t0, "pieces": self._pieces}}


class _Stream:
    """A piece handed out: its worker's stream of items, whether the worker's task
    finished, and the items the consumer took from it."""

    def __init__(self, gen: Any, worker: Any, seq: int, skip: int = 0, start: int | None = None) -> None:
        self.gen = gen
        self.start = start
        self.worker = worker
        self.seq = seq
        self.skip = skip
        self.taken = 0
        self.finished = False


_ACTOR: Any = None


def _lost() -> tuple[type[BaseException], ...]:
    """Ray's errors for a task whose worker, node or result is gone."""
    import ray.exceptions as x

    names = ("RayActorError", "ObjectLostError", "OwnerDiedError", "WorkerCrashedError", "NodeDiedError")
    return tuple(getattr(x, n) for n in names if hasattr(x, n))


def piece_size(n: int, workers: int, one_each: bool, batches: list[int]) -> int:
    """About four pieces per worker; whole batches for formats of one sample per object
    (so the pieces' batches are the local run's)."""
    piece = max(1, math.ceil(n / (4 * max(1, workers))))
    if one_each and batches:
        b = batches[0]
        piece = max(b, piece // b * b)
    return piece


def _default_piece(ray: Any, dp: DistributedPipeline, n: int, one_each: bool, batches: list[int]) -> int:
    """`piece_size` at the most workers the run may have."""
    most = dp.max_workers
    if most is None:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        most = max(dp.workers, int(cpus // dp.cpus_per_worker))
    return piece_size(n, most, one_each, batches)


def cuts(n: int, piece: int) -> list[int]:
    """Where the pieces of an epoch of `n` entries begin, and its end."""
    return list(range(0, n, piece)) + [n] if n else [0, 0]


def make_state(
    n: int, piece: int, epoch: int, done: Any, current: int | None, taken: int, offset: int | None
) -> dict[str, Any]:
    """A distributed run's position (what `state_dict()` returns)."""
    return {
        "version": STATE_VERSION,
        "kind": "distributed",
        "n": n,
        "piece": piece,
        "epoch": epoch,
        "done": sorted(done),
        "current": current,
        "taken": taken,
        "offset": offset if current is not None else None,
    }


def check_state(s: Mapping[str, Any], n: int) -> None:
    """Refuses what is not a distributed run's state of an epoch of `n` entries."""
    if s.get("version") != STATE_VERSION or s.get("kind") != "distributed":
        raise ValueError("not a state of a distributed run (or of another version)")
    if s["n"] != n:
        raise ValueError(f"the state is of an epoch of {s['n']} entries, this pipeline's has {n}")


def local_to_distributed(p: Pipeline, local: Mapping[str, Any], piece: int) -> dict[str, Any]:
    """A local run's ``state_dict()`` as a distributed run's, pieces of ``piece``: the
    pieces before the local run's position are done, and the one it is in begins at that
    position. Between items of a pipeline whose stages hold no sample at that point (no
    half-filled batch, shuffle buffer or pack) over a format of one sample per object;
    anything else is a ``ValueError`` saying why."""
    n, one_each = p._p.epoch_len()
    if not one_each:
        raise ValueError(
            "a local run's state resumes on Ray only for formats of one sample per object "
            "(files, imagefolder, samples in memory): for record formats a local position "
            "is inside a shard"
        )
    cursor = local.get("cursor") or {}
    held = [st.get("kind", "?") for st in local.get("stages", []) if any(v for k, v in st.items() if k != "kind")]
    if cursor.get("slots") or held:
        raise ValueError(
            f"this local state holds samples in a stage ({', '.join(held) or 'the source'}): "
            "it resumes on Ray only between batches of a pipeline without a shuffle buffer "
            "or pack; resume it locally, or take the state at a batch boundary"
        )
    at, epoch = int(cursor["next"]), int(local["epoch"])
    c = cuts(n, piece)
    if at >= n:
        epoch, at = epoch + 1, 0
    k = max(i for i in range(len(c) - 1) if c[i] <= at) if n else 0
    inside = at != c[k]
    return make_state(n, piece, epoch, range(k), k if inside else None, 0, at if inside else None)


class LocalPieceRun:
    """A distributed run's state resumed on this machine (``Pipeline.resume`` of a
    distributed state): the same pieces, one after the other, in this process, so the items
    are those the distributed run would have yielded next. Its ``state_dict()`` is a
    distributed one, so the run can go back to Ray."""

    def __init__(self, p: Pipeline, state: Mapping[str, Any]) -> None:
        n, _ = p._p.epoch_len()
        check_state(state, n)
        epochs, first, _, _ = p._p.shape()
        self._p = p
        self._n, self._piece = n, state["piece"]
        self._cuts = cuts(n, self._piece)
        self._last = None if epochs is None else first + epochs - 1
        self._epoch = state["epoch"]
        self._done = set(state["done"])
        self._current = state["current"]
        self._taken = state["taken"]
        self._offset = state.get("offset")
        self._run: Any = None
        self.closed = False

    def __iter__(self) -> LocalPieceRun:
        return self

    def __next__(self) -> dict[str, Any]:
        pieces = len(self._cuts) - 1
        while True:
            if self.closed:
                raise StopIteration
            if self._run is None:
                if self._current is None:
                    k = next((k for k in range(pieces) if k not in self._done), None)
                    if k is None:
                        if self._last is not None and self._epoch >= self._last:
                            self.close()
                            raise StopIteration
                        self._epoch, self._done = self._epoch + 1, set()
                        continue
                    self._current, self._taken, self._offset = k, 0, None
                k = self._current
                begin = self._cuts[k] if self._offset is None else self._offset
                run = self._p.first_epoch(self._epoch).epochs(1).span(begin, self._cuts[k + 1]).run()
                for _ in range(self._taken):
                    next(run)
                self._run = run
            try:
                item = next(self._run)
            except StopIteration:
                self._run.close()
                self._run = None
                self._done.add(self._current)
                self._current, self._taken, self._offset = None, 0, None
                continue
            self._taken += 1
            return item

    def state_dict(self) -> dict[str, Any]:
        """Where the run is, as a distributed run's state (it resumes on Ray or here)."""
        return make_state(self._n, self._piece, self._epoch, self._done, self._current, self._taken, self._offset)

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
        self.closed = True


def _actor_class() -> Any:
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = _ray().remote(_Worker)
    return _ACTOR


class DistributedPipeline:
    """A pipeline whose per-sample work runs in Ray worker actors; iterate it (or
    :meth:`run` it) as a local pipeline. Made by :meth:`stoker.Pipeline.distribute`."""

    def __init__(
        self,
        pipeline: Pipeline,
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
    ) -> None:
        auto = workers == "auto"
        if not auto and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ValueError(f'workers must be a positive integer or "auto", not {workers!r}')
        if min_workers < 1:
            raise ValueError(f"min_workers must be at least 1, not {min_workers}")
        if max_workers is not None and max_workers < min_workers:
            raise ValueError(f"max_workers ({max_workers}) is below min_workers ({min_workers})")
        if piece is not None and piece < 1:
            raise ValueError(f"piece must be at least 1, not {piece}")
        if cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker must be positive, not {cpus_per_worker}")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        if tune_s <= 0:
            raise ValueError(f"tune_s must be positive, not {tune_s}")
        _ray()  # the clear error now, not at the first batch
        self.pipeline = pipeline
        self.auto = auto
        self.workers = min_workers if auto else int(workers)
        self.min_workers = min_workers
        # "auto" without max_workers: as many as the cluster's free CPUs allow.
        self.max_workers = (
            max_workers
            if max_workers is not None
            else (None if auto else max(self.workers, min_workers))
        )
        self.address = address
        self.piece = piece
        self.ordered = ordered
        self.cpus_per_worker = cpus_per_worker
        self.depth = depth
        self.tune_s = tune_s

    def with_pipeline(self, pipeline: Pipeline) -> DistributedPipeline:
        """The same distribution over another pipeline (``stoker.torch.Dataset`` gives each
        rank its share this way)."""
        out = copy.copy(self)
        out.pipeline = pipeline
        return out

    def first_epoch(self, epoch: int) -> DistributedPipeline:
        """As :meth:`stoker.Pipeline.first_epoch`, in the workers."""
        return self.with_pipeline(self.pipeline.first_epoch(epoch))

    def epochs(self, n: int | None) -> DistributedPipeline:
        """As :meth:`stoker.Pipeline.epochs`, in the workers."""
        return self.with_pipeline(self.pipeline.epochs(n))

    def run(self, state: dict[str, Any] | None = None) -> DistributedRun:
        """Starts a run (from ``state``, a :meth:`DistributedRun.state_dict`, when given)."""
        return DistributedRun(self, state)

    def resume(self, state: dict[str, Any]) -> DistributedRun:
        """A run from ``state`` (any number of workers)."""
        return self.run(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.run()

    def explain(self) -> str:
        epochs, first, batches, holds = self.pipeline._p.shape()
        most = self.max_workers if self.max_workers is not None else "as the free CPUs allow"
        lines = [
            f"distributed on Ray: {self.workers} worker actors"
            + (f' ("auto": {self.min_workers} to {most})' if self.auto else "")
            + f", {self.cpus_per_worker:g} CPU each, pieces handed out as workers finish "
            f"({self.depth} in flight each), {'in order' if self.ordered else 'as they finish'}",
        ]
        if self.auto:
            lines.append(
                f"every {self.tune_s:g} s: a worker more after the consumer waited more than "
                f"{AUTO_UP:.0%} of the time twice in a row on workers busy more than "
                f"{AUTO_BUSY:.0%} of theirs, and the cluster has "
                f"{self.cpus_per_worker:g} CPU free; a worker fewer after it waited less than "
                f"{AUTO_DOWN:.0%} twice in a row with finished pieces queued for it"
            )
        if holds:
            lines.append(
                "a shuffle buffer or pack is filled within each piece (the local run fills "
                "it across the epoch): the same samples, in another order"
            )
        lines.append("each worker runs:")
        lines.append(self.pipeline.explain())
        return "\n".join(lines)


class DistributedRun:
    """An iterator of the pipeline's items, made by Ray worker actors."""

    def __init__(self, dp: DistributedPipeline, state: dict[str, Any] | None) -> None:
        ray = _ray()
        self._ray = ray
        if not ray.is_initialized():
            init_ray(ray, dp.address)
        self._dp = dp
        p = dp.pipeline
        epochs, first, batches, _ = p._p.shape()
        n, one_each = p._p.epoch_len()
        piece = dp.piece
        if state is not None and "cursor" in state and piece is None:
            piece = _default_piece(ray, dp, n, one_each, batches)
        if state is not None and "cursor" in state:
            state = local_to_distributed(p, state, piece)
        if state is not None:
            check_state(state, n)
            piece = state["piece"]
        if piece is None:
            piece = _default_piece(ray, dp, n, one_each, batches)
        self._n, self._piece = n, piece
        self._cuts = cuts(n, piece)
        self._pieces = len(self._cuts) - 1
        self._last_epoch = None if epochs is None else first + epochs - 1
        # Where the consumer is: the epoch, the pieces of it done, the piece being taken
        # and how many of its items were taken.
        self._epoch = first
        self._done: set[int] = set()
        self._current: int | None = None
        self._taken = 0
        # Where the current piece began when not at its cut (a local run's state resumed
        # here begins it at the local run's position).
        self._offset: int | None = None
        if state is not None:
            self._epoch = state["epoch"]
            self._done = set(state["done"])
            self._current = state["current"]
            self._taken = state["taken"]
            self._offset = state.get("offset")
        # Pieces waiting (epoch, index, items to skip), and those handed out: (epoch, index)
        # -> their stream of items, until the consumer has taken them all.
        self._queue: collections.deque[tuple[int, int, int, int | None]] = collections.deque()
        self._queued_epoch = self._epoch - 1
        self._streams: dict[tuple[int, int], _Stream] = {}
        self._cur: _Stream | None = None
        self._seq = 0
        if self._current is not None:
            # Resuming inside a piece: it goes first, skipping what was taken.
            self._queue.append((self._epoch, self._current, self._taken, self._offset))
        self._workers: list[Any] = []
        self._retiring: list[Any] = []
        self._target = dp.workers
        self._redone = 0
        # Workers that finished a piece (by id), and workers in a row that died first.
        self._finished_by: set[int] = set()
        self._stillborn = 0
        self._pieces_done = 0
        self._worker_s = 0.0
        self._started = time.perf_counter()
        self._wait_s = 0.0
        self._exhausted = False
        # workers="auto": the last decision's time and wait, the decisions made.
        self._tune_at = (self._started, 0.0, 0.0)
        self._calm = self._hot = 0
        self._scaling: list[dict[str, Any]] = []
        # Same-machine handoff of large arrays (stoker.handoff): per worker (by id), its
        # probe, whether its segments can be mapped here (None until the probe is back),
        # and its process id.
        self._maps = handoff.Maps()
        self._share: dict[int, list[Any]] = {}
        self._node = ray.get_runtime_context().get_node_id()
        self._scale_to(self._target)
        self._fill_queue()

    # Workers ----------------------------------------------------------------------------

    def _new_worker(self) -> Any:
        dp = self._dp
        threads = max(1, int(dp.cpus_per_worker))
        w = _actor_class().options(num_cpus=dp.cpus_per_worker).remote(dp.pipeline, threads)
        self._share[id(w)] = [w.handoff_probe.remote(), None, None]
        return w

    def _can_share(self, w: Any) -> bool:
        """Whether `w` may hand large arrays over in its shared segments: once its probe
        is back, and only where this process can map them (same machine)."""
        entry = self._share.get(id(w))
        if entry is None:
            return False
        if entry[1] is None:
            ready, _ = self._ray.wait([entry[0]], timeout=0)
            if not ready:
                return False
            try:
                probe = self._ray.get(entry[0])
            except Exception:  # noqa: BLE001 - a worker that died: it shares nothing
                probe = None
            entry[1] = bool(probe) and probe["node"] == self._node and self._maps.check(probe)
            entry[2] = probe["pid"] if probe else None
        return bool(entry[1])

    def _forget(self, w: Any) -> None:
        """A worker gone: its segments' mappings go (arrays over them keep theirs)."""
        entry = self._share.pop(id(w), None)
        if entry is not None and entry[2] is not None:
            self._maps.forget(entry[2])

    def _scale_to(self, n: int) -> None:
        while len(self._workers) < n:
            self._workers.append(self._new_worker())
        while len(self._workers) > n:
            # The last worker takes no new pieces and goes once its pieces are back.
            self._retiring.append(self._workers.pop())
        self._reap()

    def scale(self, n: int) -> None:
        """Runs ``n`` worker actors from now on: new ones take pieces at once; removed
        ones finish the pieces they hold (nothing is lost or repeated)."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"workers must be at least 1, not {n!r}")
        self._target = n
        self._scale_to(n)

    @property
    def workers(self) -> int:
        """Worker actors taking pieces now."""
        return len(self._workers)

    def _held(self, w: Any) -> int:
        """Pieces running on `w` (its task not yet finished)."""
        return sum(1 for st in self._streams.values() if st.worker is w and not st.finished)

    def _reap(self) -> None:
        for w in list(self._retiring):
            # Gone once its tasks finished and the consumer took their items.
            if not any(st.worker is w for st in self._streams.values()):
                self._retiring.remove(w)
                self._ray.kill(w)
                self._forget(w)

    # Pieces -----------------------------------------------------------------------------

    def _fill_queue(self) -> None:
        """Queues the next epoch's pieces once the current epoch's are all handed out."""
        while not self._queue and (self._last_epoch is None or self._queued_epoch < self._last_epoch):
            e = self._queued_epoch + 1
            self._queued_epoch = e
            skip = set(self._done) if e == self._epoch else set()
            if e == self._epoch and self._current is not None:
                skip.add(self._current)
            self._queue.extend((e, k, 0, None) for k in range(self._pieces) if k not in skip)
            if self._last_epoch is None:
                break

    def _window_open(self, key: tuple[int, int, int]) -> bool:
        """In order, pieces run at most a few pieces ahead of the one being taken, so that
        finished pieces waiting for their turn stay bounded."""
        if not self._dp.ordered:
            return True
        pos = key[0] * self._pieces + key[1]
        k = self._current if self._current is not None else min(
            (k for k in range(self._pieces) if k not in self._done), default=self._pieces
        )
        return pos - (self._epoch * self._pieces + k) < 2 * self._depth_total() + 2

    def _depth_total(self) -> int:
        return self._dp.depth * max(1, len(self._workers))

    def _dispatch(self) -> None:
        self._fill_queue()
        for w in self._workers:
            while self._held(w) < self._dp.depth and self._queue and self._window_open(self._queue[0]):
                e, k, skip, start = self._queue.popleft()
                begin = self._cuts[k] if start is None else start
                gen = w.stream_piece.options(num_returns="streaming").remote(
                    e, begin, self._cuts[k + 1], skip, self._can_share(w)
                )
                self._seq += 1
                self._streams[(e, k)] = _Stream(gen, w, self._seq, skip, start)
                self._fill_queue()

    def _collect(self, timeout: float | None) -> None:
        """Waits (up to `timeout`) for a running piece's task to finish, and notes every
        one that did; a task that failed (its worker or node died) is handed out again."""
        ray = self._ray
        running = {st.gen.completed(): key for key, st in self._streams.items() if not st.finished}
        if not running:
            return
        ready, _ = ray.wait(list(running), num_returns=len(running), timeout=timeout)
        if not ready and timeout:
            return
        for ref in ready:
            key = running[ref]
            st = self._streams.get(key)
            if st is None:
                continue
            try:
                ray.get(ref)
            except _lost() as e:
                self._fail(key, e)
                continue
            except Exception:  # noqa: BLE001 - the pipeline's own error: raised at its item
                pass
            st.finished = True
            self._stillborn = 0
            self._finished_by.add(id(st.worker))
        self._reap()

    def _fail(self, key: tuple[int, int], e: BaseException) -> None:
        """The piece's worker (or node) died: the piece goes back to the front of the
        queue, to skip what the consumer already took from it, and a new worker takes the
        dead one's place, unless workers die before they finish anything (they cannot
        start: a function the workers cannot unpickle, a pipeline that fails to build),
        which is an error."""
        st = self._streams.pop(key)
        self._queue.appendleft((key[0], key[1], st.skip + st.taken, st.start))
        self._redone += 1
        if self._cur is st:
            self._cur = None
        dead = st.worker
        if id(dead) not in self._finished_by and dead in self._workers + self._retiring:
            self._stillborn += 1
            if self._stillborn >= 3:
                self.close()
                raise RuntimeError(
                    f"{self._stillborn} worker actors died before finishing a piece "
                    f"(functions in the pipeline must be importable, or defined in "
                    f"__main__, on every node): {e}"
                ) from e
        if dead in self._workers:
            self._workers[self._workers.index(dead)] = self._new_worker()
            self._forget(dead)
        elif dead in self._retiring:
            self._retiring.remove(dead)
            self._forget(dead)

    def _next_key(self) -> tuple[int, int] | None:
        """The piece to take next: in order, the first not done of the epoch; else one of
        the epoch's running pieces, one with an item ready first, else the earliest
        handed out."""
        if self._dp.ordered or self._current is not None:
            k = self._current
            if k is None:
                k = next((k for k in range(self._pieces) if k not in self._done), None)
            return None if k is None else (self._epoch, k)
        mine = [(st.seq, key) for key, st in self._streams.items() if key[0] == self._epoch]
        ready = [(seq, key) for seq, key in mine if self._streams[key].gen.next_ready()]
        pick = min(ready or mine, default=None)
        return None if pick is None else pick[1]

    def __iter__(self) -> DistributedRun:
        return self

    def __next__(self) -> dict[str, Any]:
        ray = self._ray
        while True:
            if self._exhausted:
                raise StopIteration
            if self._cur is None:
                if len(self._done) >= self._pieces:
                    if self._last_epoch is not None and self._epoch >= self._last_epoch:
                        self._exhausted = True
                        self._shutdown()
                        raise StopIteration
                    self._epoch += 1
                    self._done = set()
                    continue
                # Between pieces: note the tasks that finished, decide the worker count,
                # hand out pieces.
                self._collect(0)
                self._tune()
                self._dispatch()
                key = self._next_key()
                st = self._streams.get(key) if key is not None else None
                if st is None:
                    self._wait()
                    continue
                if self._current != key[1]:
                    self._current, self._taken = key[1], 0
                self._cur = st
                self._offset = st.start
            st = self._cur
            if not st.gen.next_ready() and not st.gen.is_finished():
                # Its next item is not made yet: hand out pieces, note finished ones.
                self._wait(0.01)
                continue
            try:
                ref = next(st.gen)
            except StopIteration:
                self._streams.pop((self._epoch, self._current), None)
                self._cur = None
                self._finish_piece()
                self._reap()
                continue
            try:
                item = ray.get(ref)
            except _lost() as e:
                self._fail((self._epoch, self._current), e)
                continue
            if isinstance(item, dict) and PIECE_END in item:
                self._worker_s += item[PIECE_END]["seconds"]
                self._finished_by.add(id(st.worker))
                continue
            try:
                item = self._maps.unpack(item)
            except OSError as e:
                # The worker died before its segment was mapped: as any lost item.
                self._fail((self._epoch, self._current), e)
                continue
            st.taken += 1
            self._taken += 1
            return item

    def _wait(self, timeout: float | None = None) -> None:
        self._tune()
        self._dispatch()
        t0 = time.perf_counter()
        self._collect(timeout=min(1.0, self._dp.tune_s) if timeout is None else timeout)
        self._wait_s += time.perf_counter() - t0

    def _finish_piece(self) -> None:
        assert self._current is not None
        self._done.add(self._current)
        self._pieces_done += 1
        self._current = None
        self._taken = 0
        self._offset = None

    def _tune(self) -> None:
        """``workers="auto"``: every ``tune_s``, from the consumer's wait since the last
        decision. Waiting more than AUTO_UP of the time twice in a row, on workers busy
        more than AUTO_BUSY of theirs, means the workers are behind: one more, within
        ``max_workers`` and the cluster's free CPUs. Waiting
        less than AUTO_DOWN twice in a row, with finished pieces queued, means they are
        ahead: one fewer, down to ``min_workers``. Twice, so that one slow moment (a
        worker starting, a stall elsewhere on the machine) does not swing the count."""
        dp = self._dp
        now = time.perf_counter()
        t0, w0, b0 = self._tune_at
        if not dp.auto or now - t0 < dp.tune_s:
            return
        self._tune_at = (now, self._wait_s, self._worker_s)
        waited = (self._wait_s - w0) / (now - t0)
        n = len(self._workers)
        # How busy the workers were: their time on pieces returned in the window, over
        # the time they had.
        busy = (self._worker_s - b0) / ((now - t0) * max(1, n))
        why = None
        cap = dp.max_workers if dp.max_workers is not None else 1 << 16
        # Pieces made ahead of the one being read: the workers are ahead of the consumer.
        ahead = any(st.finished and st is not self._cur for st in self._streams.values())
        if waited > AUTO_UP and n < cap and busy < AUTO_BUSY:
            # The consumer waited, but not on busy workers (a stall elsewhere: a worker
            # starting, the machine, Ray's transport): more workers would not help.
            self._hot = 0
            self._calm = 0
        elif waited > AUTO_UP and n < cap:
            free = self._ray.available_resources().get("CPU", 0.0)
            self._calm = 0
            self._hot += 1
            if self._hot < 2:
                pass
            elif free >= dp.cpus_per_worker:
                self._hot = 0
                why = (
                    f"the consumer waited {waited:.0%} of the time, the workers were "
                    f"{busy:.0%} busy; {free:g} CPU free"
                )
                self._target = n + 1
            else:
                self._note_scaling(n, f"wanted a worker more (waited {waited:.0%}): no CPU free")
        elif waited < AUTO_DOWN and ahead and n > dp.min_workers:
            self._hot = 0
            self._calm += 1
            if self._calm >= 2:
                self._calm = 0
                why = f"the consumer waited {waited:.0%} of the time, pieces were waiting for it"
                self._target = n - 1
        else:
            self._calm = self._hot = 0
        if why is not None:
            self._scale_to(self._target)
            self._note_scaling(self._target, why)

    def _note_scaling(self, workers: int, why: str) -> None:
        last = self._scaling[-1] if self._scaling else {}
        if last.get("why") == why and last.get("workers") == workers:
            return
        self._scaling.append(
            {"t": round(time.perf_counter() - self._started, 3), "workers": workers, "why": why}
        )
        del self._scaling[:-64]

    # State and numbers ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the run is: the epoch, its pieces done, the piece being taken and the
        items taken from it. :meth:`DistributedPipeline.resume` continues from it exactly,
        with any number of workers."""
        return make_state(self._n, self._piece, self._epoch, self._done, self._current, self._taken, self._offset)

    def stats(self) -> dict[str, Any]:
        """Workers, pieces done and handed out again, the consumer's wait."""
        return {
            "workers": len(self._workers),
            "retiring": len(self._retiring),
            "pieces_per_epoch": self._pieces,
            "piece": self._piece,
            "pieces_done": self._pieces_done,
            "pieces_redone": self._redone,
            "in_flight": len(self._streams),
            "epoch": self._epoch,
            "elapsed_s": time.perf_counter() - self._started,
            "consumer_wait_s": self._wait_s,
            "worker_s": self._worker_s,
            "scaling": list(self._scaling),
        }

    @property
    def closed(self) -> bool:
        """Whether the run ended (iterated to its end, or closed)."""
        return self._exhausted

    def profile(self, out: str | None = None) -> dict[str, Any]:
        """What the consumer's side measured: :meth:`stats`, and whether the consumer
        waited on the workers (``input_bound``: waiting more than a tenth of the time).
        Each worker's own run is not profiled here; ``out`` is not supported yet."""
        if out is not None:
            raise ValueError("a distributed run has no report to write yet (out=)")
        st = self.stats()
        st["kind"] = "distributed"
        st["input_bound"] = st["consumer_wait_s"] > 0.1 * max(st["elapsed_s"], 1e-9)
        return st

    def _shutdown(self) -> None:
        for w in self._workers + self._retiring:
            try:
                self._ray.kill(w)
            except Exception:  # noqa: BLE001 - a worker already gone
                pass
        self._workers, self._retiring, self._streams, self._cur = [], [], {}, None
        self._share.clear()
        self._maps.close()

    def close(self) -> None:
        """Stops the workers (a run iterated to its end stops them itself)."""
        self._exhausted = True
        self._shutdown()

    def __del__(self) -> None:
        try:
            if not self._exhausted:
                self._shutdown()
        except Exception:  # noqa: BLE001 - interpreter exit
            pass
