"""Fixtures: the real S3 test server (crates/stoker-testserver) on loopback, serving a
temporary directory, and helpers that write datasets into it.

The server binary is taken from ``STOKER_TESTSERVER_BIN``, else from the Cargo target
directory (``CARGO_TARGET_DIR`` or ``target/``), else built with ``cargo build -p
stoker-testserver``.
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUCKET = "data"
ACCESS_KEY = "stoker-test"
SECRET_KEY = "stoker-test-secret"


def testserver_binary() -> str:
    explicit = os.environ.get("STOKER_TESTSERVER_BIN")
    if explicit:
        return explicit
    bases = [os.environ.get("CARGO_TARGET_DIR"), str(REPO / "target")]

    def found() -> str | None:
        for base in filter(None, bases):
            for profile in ("debug", "release"):
                p = pathlib.Path(base) / profile / "stoker-testserver"
                if p.is_file():
                    return str(p)
        return None

    path = found()
    if path is None:
        subprocess.run(["cargo", "build", "-p", "stoker-testserver"], cwd=REPO, check=True)
        path = found()
    if path is None:
        raise RuntimeError("cannot find or build the stoker-testserver binary")
    return path


class S3Server:
    """One stoker-testserver process serving ``root`` (bucket ``data``)."""

    def __init__(self, root: pathlib.Path, latency_ms: float = 0.0) -> None:
        self.root = root
        (root / BUCKET).mkdir(parents=True, exist_ok=True)
        self.log = open(root.parent / f"testserver-{uuid.uuid4().hex[:8]}.log", "w")
        self.proc = subprocess.Popen(
            [
                testserver_binary(),
                "--root",
                str(root),
                "--bucket",
                BUCKET,
                "--latency-ms",
                str(latency_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.endpoint = self._wait_for_endpoint()

    def _wait_for_endpoint(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("STOKER_TESTSERVER_ENDPOINT="):
                    return line.strip().split("=", 1)[1]
                if not line and self.proc.poll() is not None:
                    break
        self.close()
        raise RuntimeError(f"stoker-testserver did not start; log: {self.log.name}")

    @property
    def options(self) -> dict[str, object]:
        """Store options that reach this server."""
        return {
            "endpoint": self.endpoint,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "region": "us-east-1",
            "allow_http": True,
        }

    def put(self, key: str, data: bytes) -> str:
        """Writes object ``key`` (atomically, as a file in the served directory) and returns
        its URL."""
        path = self.root / BUCKET / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return f"s3://{BUCKET}/{key}"

    def control(self, what: str) -> dict[str, object]:
        """A request to the ``/__stoker/`` control endpoint (``fault?kind=...``, ``clear``,
        ``latency?ms=...``, ``stats``)."""
        method = "GET" if what == "stats" else "POST"
        req = urllib.request.Request(f"{self.endpoint}/__stoker/{what}", method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3") / "root")
    yield server
    server.close()


@pytest.fixture
def prefix(s3: S3Server) -> str:
    """A fresh key prefix per test (ends with ``/``)."""
    return f"t-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def local_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "local"
    d.mkdir()
    return d


def cleanup(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
