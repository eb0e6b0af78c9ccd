"""Python functions as pipeline operators in worker processes (``Pipeline.map(fn)``).

A :class:`ProcessStage` is what the engine calls for a Python map or filter stage in
``workers="processes"`` mode: the engine's worker thread calls :meth:`ProcessStage.call`
with the sample (a dict, as the iterator yields it), which takes an idle worker process,
writes the sample's payloads (bytes fields, arrays) into that worker's shared memory, sends
a small header (field names, dtypes, shapes, offsets, and the scalars) over a pipe, and
waits for the answer with the GIL released. The worker maps the payloads as read-only
NumPy arrays and memoryviews (no copy), calls ``fn``, writes the result's payloads into
its own shared memory and answers with the result's header. The engine copies the result
into its own memory, then gives the worker back (:meth:`ProcessStage.release`).

Shared memory: two segments per worker, files under ``/dev/shm`` named
``stoker-<pid>-<stage>-<worker>-{req,resp}-<n>``. The request segment is created by the
engine's process, the response segment by the worker; each side replaces its own with a
larger one when a sample does not fit (doubling, 1 MiB at first) and removes the old name.
Closing a pool removes every name of its workers, including those of a worker that died.

Processes start with the "forkserver" context: the forkserver is a fresh interpreter, so
no worker is ever a fork of a process in which Stoker's threads run. Workers are started
when the first sample needs one, up to ``processes``; they live while a run holds a lease
on the stage (:meth:`ProcessStage.lease`: every run of a pipeline with the stage takes one
and releases it when it ends, is closed or is dropped), so two runs at once share them and
the last one to end stops them. A worker that dies (``os._exit``, a signal) fails the
sample it was running with an error naming it, and is replaced for the next sample.

At interpreter exit, open pools are closed and the engine stops calling Python
(``_native.close_python_calls``) before the interpreter is torn down.
"""

from __future__ import annotations

import atexit
import itertools
import mmap
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
import weakref
from typing import Any

import numpy as np

from . import _native

_SHM_DIR = "/dev/shm"
_PREFIX = "stoker-"
# The longest close() waits for a worker being started to be stopped (seconds).
_START_WAIT_S = 60.0
_MIN_SEGMENT = 1 << 20
_ALIGN = 64
#: Dtypes a result's arrays may have (those of Stoker tensors).
_DTYPES = frozenset(["u1", "b1", "i2", "i4", "i8", "f2", "f4", "f8"])

_stage_ids = itertools.count()
_open_pools: weakref.WeakSet[_Pool] = weakref.WeakSet()


class WorkerDied(RuntimeError):
    """A worker process ended while it ran the function on a sample."""


def _failure(message: str, cls: type[Exception] = RuntimeError) -> Exception:
    """An exception the engine reports as ``message`` alone (no traceback of this module)."""
    err = cls(message)
    err._stoker_message = message  # type: ignore[attr-defined]
    return err


# Shared-memory segments ------------------------------------------------------------------


class _Segment:
    """A named shared-memory segment (a file under /dev/shm), mapped."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        path = os.path.join(_SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.name = name
        self.size = size

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            # Views of it are still alive (a function kept one): the mapping goes when they do.
            pass


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(_SHM_DIR, name))
    except FileNotFoundError:
        pass


def _grown(need: int) -> int:
    size = _MIN_SEGMENT
    while size < need:
        size *= 2
    return size


# The wire format -------------------------------------------------------------------------
#
# A sample's header is a list of (name, spec); a spec is ("v", scalar) for str, int, float,
# bool and None, ("b", offset, length) for bytes, ("a", offset, dtype, shape) for an array,
# ("l", [spec, ...]) for a list. Payloads sit in the segment at 64-byte aligned offsets.


def _plan(
    sample: dict[str, Any], check: bool, inputs: dict[int, str] | None = None
) -> tuple[list[Any], list[Any], int]:
    """The header of ``sample``, its payloads as flat uint8 arrays with their offsets, and
    the bytes they need. ``check``: refuse what cannot become a sample field (results).
    ``inputs``: the request's arrays and memoryviews by ``id``, with their field names: a
    result that returns one of them unchanged refers to it (``("in", field)``), so the
    engine takes its own value back and nothing is copied."""
    payloads: list[tuple[int, np.ndarray]] = []
    end = 0

    def place(flat: np.ndarray) -> int:
        nonlocal end
        offset = end
        payloads.append((offset, flat))
        end = offset + ((flat.nbytes + _ALIGN - 1) // _ALIGN) * _ALIGN
        return offset

    def spec(v: Any, field: str) -> Any:
        if v is None or isinstance(v, (str, int, float)):
            return ("v", v)
        if inputs is not None and id(v) in inputs:
            return ("in", inputs[id(v)])
        if isinstance(v, (bytes, bytearray, memoryview)):
            flat = np.frombuffer(v, dtype=np.uint8) if not isinstance(v, memoryview) else _flat_view(v)
            return ("b", place(flat), flat.nbytes)
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.asarray(v)
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)  # (never 0-d: ascontiguousarray makes 1-d of those)
            dt = a.dtype.str
            if check and (dt[1:] not in _DTYPES or (dt[0] == ">" and dt[1:] not in ("u1", "b1"))):
                raise TypeError(
                    f"field {field!r}: arrays of dtype {a.dtype} ({dt}) cannot be sample "
                    "fields (uint8, bool, int16, int32, int64, float16, float32, float64)"
                )
            return ("a", place(a.reshape(-1).view(np.uint8)), dt, a.shape)
        if isinstance(v, (list, tuple)):
            return ("l", [spec(x, field) for x in v])
        raise TypeError(
            f"field {field!r}: a value of type {type(v).__qualname__} cannot be a sample "
            "field (bytes, bytearray, memoryview, str, int, float, bool, None, list, tuple "
            "or a NumPy array)"
        )

    if not isinstance(sample, dict):
        raise TypeError(
            f"a map function returns the sample (a dict) or None, not {type(sample).__qualname__}"
        )
    header = []
    for k, v in sample.items():
        if not isinstance(k, str):
            raise TypeError(f"field names must be str, not {type(k).__qualname__}")
        header.append((k, spec(v, k)))
    return header, payloads, end


def _flat_view(v: memoryview) -> np.ndarray:
    if v.c_contiguous:
        return np.frombuffer(v.cast("B") if v.format != "B" or v.ndim != 1 else v, dtype=np.uint8)
    return np.frombuffer(v.tobytes(), dtype=np.uint8)


def _write(seg: _Segment, payloads: list[tuple[int, np.ndarray]]) -> None:
    for offset, flat in payloads:
        if flat.nbytes:
            np.frombuffer(seg.map, dtype=np.uint8, count=flat.nbytes, offset=offset)[:] = flat


def _read(
    header: list[Any], seg: _Segment | None, inputs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The sample a header describes, its payloads read-only views of ``seg``; fields of
    ``inputs`` where the header refers to them."""

    def value(s: Any) -> Any:
        tag = s[0]
        if tag == "v":
            return s[1]
        if tag == "in":
            assert inputs is not None
            return inputs[s[1]]
        if tag == "l":
            return [value(x) for x in s[1]]
        if tag == "b":
            _, offset, n = s
            if n == 0:
                return memoryview(b"")
            assert seg is not None
            return memoryview(seg.map)[offset : offset + n].toreadonly()
        _, offset, dt, shape = s
        dtype = np.dtype(dt)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            a = np.empty(shape, dtype=dtype)
        else:
            assert seg is not None
            a = np.frombuffer(seg.map, dtype=dtype, count=count, offset=offset).reshape(shape)
        a.flags.writeable = False
        return a

    return {k: value(s) for k, s in header}


# The worker process ----------------------------------------------------------------------


def _worker_main(conn: Any, fn_pickle: bytes, filter_: bool, name: str) -> None:
    """A worker: answers requests on ``conn`` until it reads an empty message or EOF."""
    # Ctrl-C is for the main process, which stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn = pickle.loads(fn_pickle)
    except Exception:
        # Every sample then fails with why (an import error, usually).
        reason = "the worker process could not load the function:\n" + traceback.format_exc()

        def fn(sample: Any) -> Any:
            raise RuntimeError(reason)

    req: _Segment | None = None
    resp: _Segment | None = None
    generation = 0
    try:
        while True:
            try:
                msg = conn.recv_bytes()
            except EOFError:
                return
            if not msg:
                return
            req_name, header, seed = pickle.loads(msg)
            if req_name is not None:
                if req is not None:
                    req.close()
                req = _Segment(req_name, 0, create=False)
            try:
                sample = _read(header, req)
                out = fn(sample) if seed is None else fn(sample, rng_of(seed))
            except Exception as e:
                # The traceback as text, and the exception itself when it pickles (the
                # caller chains it as the DataError's __cause__).
                try:
                    exc: bytes | None = pickle.dumps(e, protocol=5)
                except Exception:
                    exc = None
                conn.send_bytes(pickle.dumps(("err", traceback.format_exc(), exc), protocol=5))
                continue
            try:
                if filter_:
                    conn.send_bytes(pickle.dumps(("ok", None, bool(out)), protocol=5))
                    continue
                if out is None:
                    conn.send_bytes(pickle.dumps(("ok", None, None), protocol=5))
                    continue
                passed = {
                    id(v): k for k, v in sample.items() if isinstance(v, (np.ndarray, memoryview))
                }
                out_header, payloads, need = _plan(out, check=True, inputs=passed)
                new_name = None
                if resp is None or need > resp.size:
                    old = resp
                    generation += 1
                    resp = _Segment(f"{name}-resp-{generation}", _grown(need), create=True)
                    new_name = resp.name
                    if old is not None:
                        old.close()
                        _unlink(old.name)
                _write(resp, payloads)
                del out, payloads, sample, passed
                conn.send_bytes(pickle.dumps(("ok", new_name, out_header), protocol=5))
            except Exception as e:
                # The result cannot be a sample (or its shared memory failed).
                conn.send_bytes(pickle.dumps(("bad", f"{type(e).__name__}: {e}", None), protocol=5))
    finally:
        if resp is not None:
            resp.close()
            _unlink(resp.name)


# The engine's side -----------------------------------------------------------------------


class _Worker:
    """One worker process, its pipe and its segments."""

    def __init__(self, pool: _Pool, index: int) -> None:
        self.name = f"{pool.prefix}-{index}"
        self.qualname = pool.stage.qualname
        parent, child = multiprocessing.Pipe(duplex=True)
        ctx = multiprocessing.get_context("forkserver")
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child, pool.stage.fn_pickle, pool.stage.filter, self.name),
            name=f"stoker-pymap-{pool.stage.qualname}",
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.conn = parent
        self.req: _Segment | None = None
        self.resp: _Segment | None = None
        self.generation = 0
        self.dead = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def request(self, sample: dict[str, Any], filter_: bool, seed: int | None = None) -> Any:
        header, payloads, need = _plan(sample, check=False)
        new_name = None
        if self.req is None or need > self.req.size:
            old = self.req
            self.generation += 1
            self.req = _Segment(f"{self.name}-req-{self.generation}", _grown(need), create=True)
            new_name = self.req.name
            if old is not None:
                old.close()
                _unlink(old.name)
        _write(self.req, payloads)
        del payloads
        try:
            self.conn.send_bytes(pickle.dumps((new_name, header, seed), protocol=5))
            msg = self.conn.recv_bytes()  # waits with the GIL released
        except (EOFError, OSError) as e:
            self.dead = True
            self.proc.join(timeout=5)
            code = self.proc.exitcode
            how = (
                f"killed by signal {signal.Signals(-code).name}"
                if code is not None and code < 0
                else f"exit code {code}"
            )
            raise _failure(
                f"the worker process (pid {self.pid}) running Python function "
                f"{self.qualname} died ({how}) on this sample",
                WorkerDied,
            ) from e
        tag, resp_name, body = pickle.loads(msg)
        if tag == "err":
            # The worker's traceback text travels in resp_name's place.
            err = RuntimeError(resp_name)
            err._stoker_traceback = resp_name  # type: ignore[attr-defined]
            original = None
            if body is not None:
                try:
                    original = pickle.loads(body)
                except Exception:
                    original = None
            err._stoker_exception = original  # type: ignore[attr-defined]
            raise err
        if tag == "bad":
            raise _failure(f"the result of Python function {self.qualname}: {resp_name}")
        if filter_:
            return body
        if resp_name is not None:
            if self.resp is not None:
                self.resp.close()
            self.resp = _Segment(resp_name, 0, create=False)
        if body is None:
            return None
        return _read(body, self.resp, sample)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()

    def stop(self) -> None:
        """Asks an idle worker to end, and makes sure it did."""
        try:
            self.conn.send_bytes(b"")
        except OSError:
            pass
        self.proc.join(timeout=2)
        self.kill()

    def release_resources(self) -> None:
        self.conn.close()
        for seg in (self.req, self.resp):
            if seg is not None:
                seg.close()
        self.req = self.resp = None


class _Pool:
    """The worker processes of one stage while runs hold it."""

    def __init__(self, stage: ProcessStage, size: int) -> None:
        self.stage = stage
        # The most workers it starts (on demand, as calls come in at once).
        self.size = size
        self.prefix = f"{_PREFIX}{os.getpid()}-{stage.id}-{next(_stage_ids)}"
        self.cond = threading.Condition()
        self.idle: list[_Worker] = []
        self.busy: set[_Worker] = set()
        self.started = 0
        self.next_index = 0
        self.closed = False
        # Threads starting a worker now (acquire() between taking a slot and handing the
        # worker out).
        self.starting: set[int] = set()
        _open_pools.add(self)

    def acquire(self) -> _Worker:
        with self.cond:
            while True:
                if self.closed:
                    raise RuntimeError("the run this sample belongs to has ended")
                if self.idle:
                    w = self.idle.pop()
                    self.busy.add(w)
                    return w
                if self.started < self.size:
                    self.started += 1
                    index = self.next_index
                    self.next_index += 1
                    # close() waits for this start to finish (or to undo itself).
                    self.starting.add(threading.get_ident())
                    break
                self.cond.wait()
        try:
            return self._start(index)
        finally:
            with self.cond:
                self.starting.discard(threading.get_ident())
                self.cond.notify_all()

    def _start(self, index: int) -> _Worker:
        try:
            if multiprocessing.current_process().daemon:
                raise _failure(
                    f"Python function {self.stage.qualname} cannot run in worker processes "
                    "here: this process is itself a daemonic worker (a DataLoader worker?), "
                    'which may not start processes. Use workers="threads" in such a '
                    "pipeline, or run it in the main process (num_workers=0)"
                )
            w = _Worker(self, index)
        except BaseException:
            with self.cond:
                self.started -= 1
                self.cond.notify()
            raise
        with self.cond:
            if not self.closed:
                self.busy.add(w)
                return w
        # The run ended while this worker started: it is stopped here, before close()
        # (which waits for starts in flight) returns.
        w.stop()
        w.release_resources()
        self._remove_names(w.name)
        raise RuntimeError("the run this sample belongs to has ended")

    def give_back(self, w: _Worker) -> None:
        with self.cond:
            self.busy.discard(w)
            if w.dead or self.closed:
                self.started -= 1
                self.cond.notify()
                gone = True
            else:
                self.idle.append(w)
                self.cond.notify()
                gone = False
        if gone:
            if not w.dead:
                w.stop()
            w.release_resources()
            self._remove_names(w.name)

    def close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
            # A worker being started as the run ends is stopped by the thread starting it:
            # waiting for that keeps the promise that no worker outlives its run. Not by a
            # thread that is itself starting one (a garbage collection there can end the
            # run), and not for ever (a start that hangs is a bug to see, not a hung exit).
            me = threading.get_ident()
            self.cond.wait_for(
                lambda: not (self.starting - {me}), timeout=_START_WAIT_S
            )
            idle, busy = self.idle, list(self.busy)
            self.idle = []
        for w in idle:
            w.stop()
            w.release_resources()
        # A busy worker's engine thread is still waiting on its pipe: killing the process
        # ends that wait (EOF), and that thread releases the rest.
        for w in busy:
            w.kill()
        self._remove_names(self.prefix)
        _open_pools.discard(self)

    def _remove_names(self, prefix: str) -> None:
        try:
            names = os.listdir(_SHM_DIR)
        except OSError:
            return
        for n in names:
            if n.startswith(prefix + "-"):
                _unlink(n)

    def pids(self) -> list[int]:
        with self.cond:
            return [w.pid for w in [*self.idle, *self.busy] if w.pid is not None]


class _Lease:
    """A run's hold on a stage's pool; ``release()`` once when the run ends."""

    def __init__(self, stage: ProcessStage) -> None:
        self._stage: ProcessStage | None = stage

    def release(self) -> None:
        stage, self._stage = self._stage, None
        if stage is not None:
            stage._release()


class ProcessStage:
    """A Python function run in a pool of worker processes (see the module docs)."""

    def __init__(self, fn: Any, processes: int | None, filter: bool) -> None:
        try:
            self.fn_pickle = pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"map({_qualname(fn)}) runs the function in worker processes, so it must "
                "pickle, and this one does not (a lambda, a nested or local function, or a "
                f"closure: {e}). Use a module-level function, or workers=\"threads\""
            ) from None
        main = sys.modules.get("__main__")
        if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
            raise TypeError(
                f"map({_qualname(fn)}) runs the function in worker processes, which import "
                "it by name, and a function defined in an interactive session cannot be "
                "imported. Put it in a module, or use workers=\"threads\""
            )
        if processes is not None and processes < 1:
            raise ValueError("processes must be at least 1")
        self.fn = fn
        self.qualname = _qualname(fn)
        # None: as many as the run has engine threads (decided when a run starts).
        self.processes = processes
        self.filter = filter
        self.id = next(_stage_ids)
        # Reentrant: a garbage collection inside lease() may drop a Run, whose lease's
        # release() then takes this lock on the same thread.
        self._lock = threading.RLock()
        self._leases = 0
        self._pool: _Pool | None = None

    def lease(self, threads: int) -> _Lease:
        """A run's hold on the pool, which starts up to ``processes`` workers, or with
        ``processes=None`` one per engine thread of the run (``threads``), each started
        when that many calls are first in flight at once. Runs that overlap share the pool
        the first of them sized."""
        with self._lock:
            self._leases += 1
            if self._pool is None:
                self._pool = _Pool(self, self.processes or max(1, int(threads)))
        return _Lease(self)

    def _release(self) -> None:
        with self._lock:
            self._leases -= 1
            pool = None
            if self._leases == 0:
                pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def call(self, sample: dict[str, Any], seed: int | None = None) -> tuple[Any, Any]:
        """Runs the function on ``sample`` in a worker: ``(result, token)``; the caller
        gives ``token`` to :meth:`release` once it is done with ``result``. With a
        ``seed``, the worker calls ``fn(sample, rng_of(seed))``."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("the run this sample belongs to has ended")
        w = pool.acquire()
        try:
            out = w.request(sample, self.filter, seed)
        except BaseException:
            pool.give_back(w)
            raise
        return out, (pool, w)

    def release(self, token: tuple[_Pool, _Worker]) -> None:
        pool, w = token
        pool.give_back(w)

    def worker_pids(self) -> list[int]:
        """The worker processes alive now (for tests and diagnostics)."""
        pool = self._pool
        return [] if pool is None else pool.pids()

    def __reduce__(self) -> Any:
        raise TypeError("a ProcessStage does not pickle (its Pipeline does, by its recipe)")


def rng_of(seed: int) -> np.random.Generator:
    """The generator a seeded function gets for the sample whose seed is ``seed``."""
    return np.random.Generator(np.random.PCG64(seed))


class Seeded:
    """A seeded function run on the engine's threads: called with the sample and its seed."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, sample: dict[str, Any], seed: int) -> Any:
        return self.fn(sample, rng_of(seed))


def _qualname(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name is not None else type(fn).__qualname__


def _at_exit() -> None:
    for pool in list(_open_pools):
        pool.close()
    # Engine threads may still be running a Python function: let those calls finish, and
    # refuse new ones, before the interpreter goes.
    _native.close_python_calls(10.0)


atexit.register(_at_exit)
