"""stoker.io.open shares one store per bucket and options: its block cache, connections and
metadata, checked against the S3 test server's request count."""

from __future__ import annotations

import os

import stoker
import stoker.io


def requests(s3) -> int:
    return int(s3.control("stats")["requests"])


def read(url: str, **options) -> bytes:
    with stoker.io.open(url, **options) as f:
        return f.read()


def test_a_second_open_reads_the_cached_blocks(s3, prefix):
    stoker.io.clear_cache()
    data = os.urandom(3 * 1024 * 1024 + 5)
    url = s3.put(f"{prefix}shared.bin", data)
    other = s3.put(f"{prefix}other.bin", data[:1000])
    before = requests(s3)
    assert read(url, **s3.options) == data
    first = requests(s3) - before
    assert first >= 2  # the HEAD, then ranged GETs

    # The same object again, whole and in part, from one or two files at once: nothing
    # is requested.
    before = requests(s3)
    assert read(url, **s3.options) == data
    with stoker.io.open(url, **s3.options) as a, stoker.io.open(url, **s3.options) as b:
        a.seek(1_000_000)
        assert a.read(10) == data[1_000_000:1_000_010]
        assert b.read(5) == data[:5]
    assert requests(s3) == before

    # Another object in the bucket goes through the same store, and is fetched.
    before = requests(s3)
    assert read(other, **s3.options) == data[:1000]
    assert requests(s3) > before

    # Other store options are another store, with its own cache.
    before = requests(s3)
    assert read(url, **s3.options, part_size="1MiB") == data
    assert requests(s3) - before >= 2

    # clear_cache() lets the stores go; a file still open keeps reading through its own.
    keep = stoker.io.open(url, **s3.options)
    stoker.io.clear_cache()
    before = requests(s3)
    assert keep.read() == data
    assert requests(s3) == before
    keep.close()
    assert read(url, **s3.options) == data
    assert requests(s3) - before == first
