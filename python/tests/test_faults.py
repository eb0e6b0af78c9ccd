"""Storage faults injected by the S3 test server (conftest's ``s3.control("fault?...")``):
what a failure that outlasts the retries raises, from iteration and from ``stoker.io``,
and that faults within the retries leave no trace in the data.

test_errors.py covers an object that does not exist, an empty prefix and refused
credentials; here the objects exist and the server answers their GETs (or the listing)
with an error."""

from __future__ import annotations

import os
import re

import pytest

import stoker

# Few retries, so a failure that persists comes out fast (each retry waits a backoff).
RETRIES = 2

FAULTS = {
    "500": "kind=status&status=500",
    "503": "kind=status&status=503",
    "reset": "kind=reset",
}


@pytest.fixture
def objects(s3, prefix):
    """Four small objects ``obj-0.txt`` .. ``obj-3.txt``; faults cleared afterwards."""
    for i in range(4):
        s3.put(f"{prefix}obj-{i}.txt", b"hello %d" % i)
    yield f"s3://data/{prefix}"
    s3.control("clear")


def faults(s3) -> int:
    return int(s3.control("stats")["faults"])


def pipeline(s3, url, **options):
    return stoker.from_url(url, glob="obj-*", max_retries=RETRIES, **s3.options, **options)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failure_that_outlasts_the_retries_is_an_os_error_naming_the_object(s3, prefix, objects, fault):
    s3.control(f"fault?{FAULTS[fault]}&method=GET&times=forever&path={prefix}obj-2")
    url = f"{objects}obj-2.txt"
    before = faults(s3)
    keys = []
    with pytest.raises(OSError) as e:
        for s in pipeline(s3, objects):
            keys.append(s["__key__"])
    err = e.value
    assert not isinstance(err, (FileNotFoundError, PermissionError, stoker.DataError)), type(err)
    assert url in str(err) and err.object == url and err.kind == "storage"
    # The objects before it arrived, in order; the failing one was tried once and retried
    # exactly max_retries times.
    assert keys == ["obj-0", "obj-1"]
    assert faults(s3) - before == 1 + RETRIES
    assert re.search(rf"max_retries: {RETRIES}\b", str(err)), str(err)


def test_under_errors_skip_the_unreadable_object_is_skipped_and_named(s3, prefix, objects):
    s3.control(f"fault?kind=status&status=500&method=GET&times=forever&path={prefix}obj-1")
    run = pipeline(s3, objects).options(errors="skip").run()
    assert [bytes(s["txt"]) for s in run] == [b"hello 0", b"hello 2", b"hello 3"]
    stats = run.stats()
    assert stats["skipped"] == 1
    assert f"{objects}obj-1.txt" in stats["skipped_errors"][0]["error"]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_stoker_io_raises_os_error_for_a_persistent_failure(s3, prefix, objects, fault):
    s3.control(f"fault?{FAULTS[fault]}&method=GET&times=forever&path={prefix}obj-3")
    url = f"{objects}obj-3.txt"
    before = faults(s3)
    with pytest.raises(OSError) as e:
        with stoker.io.open(url, max_retries=RETRIES, **s3.options) as f:
            f.read()
    assert not isinstance(e.value, (FileNotFoundError, PermissionError)), type(e.value)
    assert url in str(e.value) and e.value.object == url
    assert faults(s3) - before == 1 + RETRIES


@pytest.mark.parametrize(
    "status,exception",
    [(404, FileNotFoundError), (403, PermissionError)],
    ids=["404-NoSuchKey", "403-AccessDenied"],
)
def test_a_refused_get_of_a_listed_object_raises_its_class(s3, prefix, objects, status, exception):
    # The listing shows obj-1; its GET is answered 404 NoSuchKey (deleted meanwhile) or 403
    # AccessDenied (a bucket policy), every time. Neither is retried.
    s3.control(f"fault?kind=status&status={status}&method=GET&times=forever&path={prefix}obj-1")
    url = f"{objects}obj-1.txt"
    before = faults(s3)
    with pytest.raises(exception) as e:
        list(pipeline(s3, objects))
    assert url in str(e.value) and e.value.object == url
    assert faults(s3) - before == 1
    with pytest.raises(exception) as e:
        with stoker.io.open(url, max_retries=RETRIES, **s3.options) as f:
            f.read()
    assert url in str(e.value)


def test_a_refused_listing_is_a_permission_error_and_a_failing_one_an_os_error(s3, prefix, objects):
    s3.control("fault?kind=status&status=403&method=GET&times=forever&path=list-type=2")
    with pytest.raises(PermissionError, match=re.escape(objects)):
        list(pipeline(s3, objects))
    s3.control("clear")
    s3.control("fault?kind=status&status=500&method=GET&times=forever&path=list-type=2")
    with pytest.raises(OSError, match=re.escape(objects)) as e:
        list(pipeline(s3, objects))
    assert not isinstance(e.value, (FileNotFoundError, PermissionError))


def test_faults_within_the_retries_leave_the_data_exact(s3, prefix, objects):
    # Two throttled answers for one object: retried, counted, and the data as written.
    s3.control(f"fault?kind=status&status=503&method=GET&times=2&path={prefix}obj-1")
    before = faults(s3)
    run = pipeline(s3, objects).run()
    assert [bytes(s["txt"]) for s in run] == [b"hello %d" % i for i in range(4)]
    assert faults(s3) - before == 2
    assert run.stats()["storage"]["retries"] >= 2
    # A large object whose body is cut after 100 kB, three times: resumed where it stopped
    # (with If-Match on its ETag), never spliced or short.
    data = os.urandom(700_000)
    big = s3.put(f"{prefix}big.bin", data)
    s3.control(f"fault?kind=short&after=100000&method=GET&times=3&path={prefix}big.bin")
    before = faults(s3)
    got = [bytes(s["bin"]) for s in stoker.from_url(big, max_retries=RETRIES, **s3.options)]
    assert got == [data] and faults(s3) - before == 3
    s3.control(f"fault?kind=short&after=100000&method=GET&times=3&path={prefix}big.bin")
    with stoker.io.open(big, max_retries=RETRIES, part_size="256KiB", **s3.options) as f:
        assert f.read() == data
