"""Which process last started Stoker's threads (a run, or ``stoker.io``'s I/O runtime).

A child forked while those threads existed inherits their locks' bookkeeping half-way:
the engine's locks (``parking_lot``) keep one process-wide table of parked threads, and
the child's first threads can walk entries of parent threads that no longer exist there
(heap corruption, seen as ``free(): invalid pointer`` or a panic in ``parking_lot``).
So a run, a resume or ``stoker.io.open`` in such a child is refused with
``RuntimeError`` (and ``stoker.torch`` says so in DataLoader workers) rather than risk it;
forking before any Stoker thread started, or "forkserver"/"spawn", is safe.
"""

from __future__ import annotations

import os

_started_in: int | None = None


def note_started() -> None:
    """Called before anything that starts threads (after :func:`check_fork`)."""
    global _started_in
    _started_in = os.getpid()


def forked_with_threads() -> bool:
    """Whether this process was forked from one in which Stoker's threads had started (and
    has started none of its own since)."""
    return _started_in is not None and _started_in != os.getpid()


def check_fork() -> None:
    """Refuses to start threads in a child forked while Stoker's threads existed."""
    if forked_with_threads():
        raise RuntimeError(
            "this process was forked from one in which Stoker's threads had started (a "
            "pipeline ran or stoker.io was used there); starting Stoker here is not safe, "
            "because the engine's lock bookkeeping is copied half-way. Fork before using "
            'Stoker, or start processes with "forkserver" or "spawn"'
        )
