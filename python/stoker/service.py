"""One pipeline on Ray, read by several consumers (:meth:`stoker.Pipeline.serve`).

A *coordinator*, a named Ray actor, owns the worker actors and hands out the pieces of each
epoch (spans of its seeded order, as in :mod:`stoker.distributed`). Consumers, in any
process or job of the cluster, attach by name (:func:`attach`) and ask it for their next
piece; the piece's items go from the worker that made them to the consumer through Ray's
object store (the coordinator passes a reference, never the data).

Two modes:

- ``"shared"``: every consumer reads every epoch whole, from one stream made once: each
  piece is made by one worker and kept until every consumer has taken it (tf.data
  service's sharing of one stream, without its loss: a piece whose worker dies is made
  again before anyone reads it).
- ``"split"``: the consumers split each epoch, consumer ``i`` reading the share
  ``shard(i, consumers)`` of it in its order (the same number of samples, and so of
  batches, for every consumer: what DDP needs), each sample read by exactly one consumer.
  Formats of one sample per object.

Exactly once: a worker returns a piece as two objects, a small status the coordinator
reads and the items it does not; a piece whose status is an error (its worker or node
died) goes back to the front of the queue and a replacement worker is started. A consumer
gets a piece only once it is whole.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

from .distributed import _ray, cuts, init_ray, piece_size

if TYPE_CHECKING:
    from . import Pipeline

MODES = ("shared", "split")
PREFIX = "stoker-service:"


class _PieceWorker:
    """A worker actor of a service: runs a piece of one consumer's share (or of the whole
    epoch) and returns (status, items) as two objects."""

    def __init__(self, pipeline: Pipeline, threads: int) -> None:
        self._p = pipeline.options(threads=threads)

    def run_piece(
        self, share: int | None, shares: int, epoch: int, start: int, end: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        t0 = time.perf_counter()
        p = self._p if share is None else self._p.shard(share, shares, "drop")
        items = list(p.first_epoch(epoch).epochs(1).span(start, end).run())
        return {"seconds": time.perf_counter() - t0, "items": len(items)}, items


class _Coordinator:
    """The service's state; a threaded Ray actor (consumers wait in `take` concurrently)."""

    def __init__(
        self,
        pipeline: Pipeline,
        workers: int,
        consumers: int,
        mode: str,
        piece: int | None,
        cpus_per_worker: float,
        depth: int,
    ) -> None:
        import ray

        self._ray = ray
        self._p = pipeline
        self._consumers = consumers
        self._mode = mode
        self._cpus = cpus_per_worker
        self._depth = depth
        epochs, first, batches, _ = pipeline._p.shape()
        self._first = first
        self._last = None if epochs is None else first + epochs - 1
        # The streams: one in shared mode, one per consumer in split mode; each with its
        # length and cuts.
        streams = 1 if mode == "shared" else consumers
        self._cuts: list[list[int]] = []
        for s in range(streams):
            q = pipeline if mode == "shared" else pipeline.shard(s, consumers, "drop")
            n, one_each = q._p.epoch_len()
            if mode == "split" and not one_each:
                raise ValueError(
                    'mode="split" needs a format of one sample per object (files, '
                    'imagefolder, samples in memory); use mode="shared" or the rank split'
                )
            size = piece or piece_size(n, workers, one_each, batches)
            self._cuts.append(cuts(n, size))
        self._lock = threading.Condition()
        # (stream, epoch, index) -> (status ref, items ref, worker) while running;
        # -> items ref once made.
        self._running: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}
        self._made: dict[tuple[int, int, int], Any] = {}
        # Each consumer's position: (epoch, index) of the piece it takes next.
        self._pos = {c: (first, 0) for c in range(consumers)}
        self._ended: set[int] = set()
        self._workers = [self._new_worker() for _ in range(workers)]
        self._redone = 0
        self._pieces_made = 0
        self._closed = False
        self._failure: str | None = None
        self._stillborn = 0
        self._proven: set[int] = set()
        self._pump = threading.Thread(target=self._loop, daemon=True)
        self._pump.start()

    def _new_worker(self) -> Any:
        cls = self._ray.remote(_PieceWorker)
        return cls.options(num_cpus=self._cpus).remote(self._p, max(1, int(self._cpus)))

    def _stream(self, consumer: int) -> int:
        return 0 if self._mode == "shared" else consumer

    def _pieces(self, stream: int) -> int:
        return len(self._cuts[stream]) - 1

    def _wanted(self) -> list[tuple[int, int, int]]:
        """The pieces to have made or running now: each consumer's next few, soonest
        first."""
        out: list[tuple[int, int, int]] = []
        window = self._depth * max(1, len(self._workers)) + 1
        cursors = {}
        for c, (e, k) in self._pos.items():
            if c in self._ended:
                continue
            s = self._stream(c)
            # Shared mode: the slowest consumer's position bounds what is kept.
            if s in cursors:
                cursors[s] = min(cursors[s], (e, k))
            else:
                cursors[s] = (e, k)
        for _ in range(window):
            for s, (e, k) in list(cursors.items()):
                if self._last is not None and e > self._last:
                    continue
                out.append((s, e, k))
                k += 1
                if k >= self._pieces(s):
                    e, k = e + 1, 0
                cursors[s] = (e, k)
        # Shared mode: the slowest consumer's window; the faster ones' next pieces too.
        if self._mode == "shared":
            for c, (e, k) in self._pos.items():
                past = self._last is not None and e > self._last
                if c not in self._ended and not past and (0, e, k) not in out:
                    out.append((0, e, k))
        return out

    def _loop(self) -> None:
        ray = self._ray
        while True:
            with self._lock:
                if self._closed:
                    return
                self._dispatch()
                running = {st: key for key, (st, _, _) in self._running.items()}
            if not running:
                with self._lock:
                    self._lock.wait(0.05)
                continue
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.05)
            for st in ready:
                key = running[st]
                with self._lock:
                    _st, items, w = self._running.pop(key)
                    try:
                        ray.get(st)
                    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
                        self._redone += 1
                        if id(w) not in self._proven:
                            self._stillborn += 1
                            if self._stillborn >= 3:
                                self._failure = f"worker actors died before finishing a piece: {e}"
                        if w in self._workers:
                            self._workers[self._workers.index(w)] = self._new_worker()
                        self._lock.notify_all()
                        continue
                    except Exception as e:  # noqa: BLE001 - the pipeline failed: every consumer is told
                        self._failure = f"a piece failed: {e}"
                        self._lock.notify_all()
                        continue
                    self._stillborn = 0
                    self._proven.add(id(w))
                    self._made[key] = items
                    self._pieces_made += 1
                    self._lock.notify_all()

    def _dispatch(self) -> None:
        wanted = self._wanted()
        keep = set(wanted)
        # Made pieces no consumer will take again are dropped (their objects freed).
        for key in list(self._made):
            if key not in keep and self._behind_everyone(key):
                del self._made[key]
        held = collections.Counter(id(w) for _, _, w in self._running.values())
        for key in wanted:
            if key in self._made or key in self._running:
                continue
            free = [w for w in self._workers if held[id(w)] < self._depth]
            if not free:
                break
            w = min(free, key=lambda w: held[id(w)])
            s, e, k = key
            share = None if self._mode == "shared" else s
            st, items = w.run_piece.options(num_returns=2).remote(
                share, self._consumers, e, self._cuts[s][k], self._cuts[s][k + 1]
            )
            self._running[key] = (st, items, w)
            held[id(w)] += 1

    def _behind_everyone(self, key: tuple[int, int, int]) -> bool:
        s, e, k = key
        for c, pos in self._pos.items():
            if c not in self._ended and self._stream(c) == s and pos <= (e, k):
                return False
        return True

    # Called by consumers -----------------------------------------------------------------

    def take(self, consumer: int, timeout: float = 5.0) -> tuple[str, Any]:
        """The consumer's next piece: ("piece", [items ref]), ("end", None) after its last
        epoch, or ("wait", None) when none was ready within `timeout` (ask again)."""
        if not 0 <= consumer < self._consumers:
            raise ValueError(f"consumer must be in 0..{self._consumers - 1}, not {consumer}")
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                if self._failure is not None:
                    raise RuntimeError(self._failure)
                e, k = self._pos[consumer]
                if self._last is not None and e > self._last:
                    self._ended.add(consumer)
                    self._lock.notify_all()
                    return ("end", None)
                s = self._stream(consumer)
                key = (s, e, k)
                if key in self._made:
                    items = self._made[key]
                    k += 1
                    if k >= self._pieces(s):
                        e, k = e + 1, 0
                    self._pos[consumer] = (e, k)
                    if self._mode == "split":
                        del self._made[key]
                    self._lock.notify_all()
                    return ("piece", [items])
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("wait", None)
                self._lock.wait(min(left, 0.1))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "mode": self._mode,
                "consumers": self._consumers,
                "workers": len(self._workers),
                "pieces_made": self._pieces_made,
                "pieces_redone": self._redone,
                "pieces_per_epoch": [self._pieces(s) for s in range(len(self._cuts))],
                "positions": {str(c): list(p) for c, p in self._pos.items()},
                "kept": len(self._made),
            }

    def worker_handles(self) -> list[Any]:
        with self._lock:
            return list(self._workers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for w in self._workers:
                try:
                    self._ray.kill(w)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            self._workers = []
            self._lock.notify_all()


class Service:
    """A pipeline served by a named coordinator actor (made by :meth:`Pipeline.serve`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        name: str,
        *,
        workers: int = 2,
        consumers: int = 1,
        mode: str = "shared",
        piece: int | None = None,
        cpus_per_worker: float = 1.0,
        depth: int = 2,
        address: str | None = None,
    ) -> None:
        ray = _ray()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        for what, v in (("workers", workers), ("consumers", consumers), ("depth", depth)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{what} must be a positive integer, not {v!r}")
        if piece is not None and piece < 1:
            raise ValueError(f"piece must be at least 1, not {piece}")
        if not ray.is_initialized():
            init_ray(ray, address)
        self.name = name
        cls = ray.remote(_Coordinator)
        self._actor = cls.options(
            name=PREFIX + name, max_concurrency=consumers + 4, num_cpus=0
        ).remote(pipeline, workers, consumers, mode, piece, cpus_per_worker, depth)
        # Its errors (a bad mode for the format) now, not at the first take.
        ray.get(self._actor.stats.remote())

    def stats(self) -> dict[str, Any]:
        """Pieces made and made again, each consumer's position, pieces kept."""
        return _ray().get(self._actor.stats.remote())

    def close(self) -> None:
        """Stops the workers and the coordinator."""
        ray = _ray()
        try:
            ray.get(self._actor.close.remote())
        finally:
            ray.kill(self._actor)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach(name: str, consumer: int = 0, *, address: str | None = None) -> Iterator[dict[str, Any]]:
    """Consumer ``consumer`` of the service ``name`` (started by :meth:`Pipeline.serve`
    anywhere in the cluster): an iterator of its items."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    try:
        actor = ray.get_actor(PREFIX + name)
    except ValueError as e:
        raise LookupError(f"no Stoker service named {name!r} in this Ray cluster") from e
    return _consume(ray, actor, consumer)


def _consume(ray: Any, actor: Any, consumer: int) -> Iterator[dict[str, Any]]:
    while True:
        what, ref = ray.get(actor.take.remote(consumer))
        if what == "end":
            return
        if what == "piece":
            yield from ray.get(ref[0])
