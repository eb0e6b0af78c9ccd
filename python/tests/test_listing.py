"""Keys that cannot be file names never fail a listing: stoker.io.ls leaves them out, names
them (escaped) in its result's ``skipped`` and in one warning, for local directories, S3
and a WebDAV server (a plain ``http://`` store, listed with PROPFIND)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from cheroot import wsgi
from wsgidav.wsgidav_app import WsgiDAVApp

import stoker


def tree(root: Path) -> None:
    """Good files, a file and a directory with control characters in their names."""
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "a.txt").write_bytes(b"aa")
    (root / "d" / "sub" / "c.txt").write_bytes(b"c")
    (root / "d" / "b\x01c.txt").write_bytes(b"bad")
    (root / "d" / "esc\x1b[31m").mkdir()
    (root / "d" / "esc\x1b[31m" / "x.txt").write_bytes(b"hidden")


@pytest.fixture
def webdav(tmp_path: Path) -> Iterator[str]:
    """A WebDAV server (wsgidav) over ``tmp_path``, anonymous, read-only; its base URL."""
    tree(tmp_path)
    app = WsgiDAVApp(
        {
            "provider_mapping": {"/": {"root": str(tmp_path), "readonly": True}},
            "simple_dc": {"user_mapping": {"*": True}},
            "http_authenticator": {"domain_controller": None},
            "verbose": 0,
            "logging": {"enable": False},
            "dir_browser": {"enable": False},
        }
    )
    server = wsgi.Server(("127.0.0.1", 0), app)
    server.prepare()
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.bind_addr[1]}"
    finally:
        server.stop()
        t.join(timeout=5)


def listed(listing: list[dict]) -> list[str]:
    return [e.get("key") or e["prefix"] for e in listing]


def skipped(listing: stoker.io.Listing) -> list[tuple[str, str]]:
    return [(s["key"], s["reason"]) for s in listing.skipped]


def test_a_local_listing_skips_and_names_keys_that_cannot_be_file_names(tmp_path):
    tree(tmp_path)
    base = tmp_path / "d"
    with pytest.warns(UserWarning, match=r"skipped 2 key\(s\).*b\\x01c\.txt"):
        every = stoker.io.ls(base, recursive=True)
    assert [Path(k).name for k in listed(every)] == ["a.txt", "c.txt"]
    assert sorted(Path(k).name for k, _ in skipped(every)) == ["b\x01c.txt", "esc\x1b[31m"]
    assert all(r == "a control character" for _, r in skipped(every))
    # What is printed is escaped: no raw control character reaches a terminal.
    assert all("\x1b" not in s["escaped"] and "\x01" not in s["escaped"] for s in every.skipped)


def test_an_s3_listing_skips_and_names_keys_that_cannot_be_file_names(s3, prefix):
    s3.put(f"{prefix}k/a.txt", b"aa")
    s3.put(f"{prefix}k/b\x01c.txt", b"bad")
    s3.put(f"{prefix}k/esc\x1b[0m/z.txt", b"esc")
    base = f"s3://data/{prefix}k/"
    with pytest.warns(UserWarning, match="skipped 2 key"):
        every = stoker.io.ls(base, recursive=True, **s3.options)
    assert listed(every) == [f"{prefix}k/a.txt"]
    assert sorted(skipped(every)) == [
        (f"{prefix}k/b\x01c.txt", "a control character"),
        (f"{prefix}k/esc\x1b[0m/", "a control character"),
    ]


def test_a_webdav_listing_skips_and_names_keys_that_cannot_be_file_names(webdav):
    base = f"{webdav}/d/"
    with pytest.warns(UserWarning, match="skipped 2 key"):
        level = stoker.io.ls(base)
    assert listed(level) == ["d/sub/", "d/a.txt"]
    assert sorted(skipped(level)) == [
        ("d/b\x01c.txt", "a control character"),
        ("d/esc\x1b[31m/", "a control character"),
    ]
    with pytest.warns(UserWarning, match="skipped 2 key"):
        every = stoker.io.ls(base, recursive=True)
    assert listed(every) == ["d/a.txt", "d/sub/c.txt"]
    assert [e["size"] for e in every] == [2, 1]
    # A pipeline over the prefix reads the good files and skips the rest.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = sorted(bytes(s["txt"]) for s in stoker.from_url(base, format="files"))
    assert got == [b"aa", b"c"]


def test_a_clean_listing_warns_of_nothing(tmp_path):
    (tmp_path / "ok.txt").write_bytes(b"1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = stoker.io.ls(tmp_path)
    assert got.skipped == [] and len(got) == 1
