"""An exception, a KeyboardInterrupt or a SIGINT leaving a loop over a run.

Regression tests for a crash: when an exception left a ``for`` loop over a pipeline with a
Python ``map`` in worker processes, CPython dropped the run with that exception still set,
the run's drop called into Python to release its worker pool, and the process died with
SIGSEGV (after a ``SystemError`` from ``_pymap``), leaving its ``/dev/shm`` segments behind.
Each case runs in a child process (a crash must fail the test, not end pytest): the loop
is left in a ``try``, the ``except`` runs, nothing of the pool outlives the run, and the
process goes on to run another pipeline and exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from datasets import MODES

CHILD = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    import stoker

    def same(s):
        return s

    def own_shm():
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"stoker-{os.getpid()}-"))

    def pipeline(mode):
        kw = {"workers": "processes", "processes": 2} if mode == "processes" else {"workers": "threads"}
        return stoker.from_samples([{"x": i} for i in range(1000)]).map(same, **kw)

    def main(mode, how):
        seen = 0
        try:
            for s in pipeline(mode):
                seen += 1
                if seen == 11:
                    if how == "raise":
                        raise ValueError("out of the loop")
                    if how == "keyboardinterrupt":
                        raise KeyboardInterrupt
                    if how == "sigint":
                        os.kill(os.getpid(), signal.SIGINT)
                    if how == "sigint-group":
                        print("READY", flush=True)
                        time.sleep(60)
                    time.sleep(5)
                    print("NOT INTERRUPTED", flush=True)
        except (ValueError, KeyboardInterrupt) as e:
            print("CAUGHT", type(e).__name__, flush=True)
        # The pool went with the run: no worker, no segment.
        deadline = time.monotonic() + 10
        while (own_shm() or multiprocessing.active_children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        print("SHM", own_shm(), flush=True)
        print("CHILDREN", len(multiprocessing.active_children()), flush=True)
        # And the process carries on.
        print("AGAIN", sum(1 for _ in pipeline(mode).take(50)), flush=True)

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
    """
)

CAUGHT = {
    "raise": "ValueError",
    "keyboardinterrupt": "KeyboardInterrupt",
    "sigint": "KeyboardInterrupt",
    "sigint-group": "KeyboardInterrupt",
}


def run_child(tmp_path, mode: str, how: str) -> tuple[int, str, str, int]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), mode, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        # Its own process group, as a shell gives a job: Ctrl-C at a terminal signals the
        # whole group (the forkserver and the workers too), which "sigint-group" does.
        start_new_session=True,
    )
    try:
        if how == "sigint-group":
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            assert line == "READY", line + (child.stderr.read() if child.stderr else "")
            os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, out, err, child.pid


@pytest.mark.parametrize("how", sorted(CAUGHT))
@pytest.mark.parametrize("mode", MODES)
def test_leaving_a_loop_by_an_exception_keeps_the_process_alive_and_dev_shm_clean(
    tmp_path, mode, how
):
    code, out, err, pid = run_child(tmp_path, mode, how)
    assert code == 0, f"exit {code} (a negative code is the signal that killed it)\n{out}\n{err}"
    lines = out.split("\n")
    assert f"CAUGHT {CAUGHT[how]}" in lines, out + err
    assert "SHM []" in lines, out + err
    assert "CHILDREN 0" in lines, out + err
    assert "AGAIN 50" in lines, out + err
    assert "SystemError" not in err, err
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker-{pid}-")]
