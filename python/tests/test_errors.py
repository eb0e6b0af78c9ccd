"""Errors reach Python as the exception class of their kind, with the engine's context."""

from __future__ import annotations

import pytest

import stoker
from datasets import jsonl, tar_shard, tfrecord


def test_a_missing_object_is_file_not_found_naming_the_url(s3, prefix):
    url = f"s3://data/{prefix}missing.tar"
    with pytest.raises(FileNotFoundError, match=url.replace(".", r"\.")) as e:
        list(stoker.from_url(url, format="tar", **s3.options))
    assert isinstance(e.value, OSError)
    with pytest.raises(FileNotFoundError, match=prefix):
        list(stoker.from_url(f"s3://data/{prefix}nothing-here/", format="tar", **s3.options))


def test_a_missing_bucket_is_file_not_found_naming_it(s3):
    # S3 answers a listing of a bucket it does not have with 404 NoSuchBucket.
    with pytest.raises(FileNotFoundError, match="s3://no-such-bucket/"):
        list(stoker.from_url("s3://no-such-bucket/train/", format="tar", **s3.options))


def test_a_corrupted_tar_is_a_data_error_with_its_place(s3, prefix):
    good = tar_shard({"__key__": f"{i:03d}", "txt": b"x" * 700} for i in range(4))
    # Cut the shard inside the third member's data.
    url = s3.put(f"{prefix}cut.tar", good[: 512 * 6 + 100])
    with pytest.raises(stoker.DataError) as e:
        list(stoker.from_url(url, format="tar", **s3.options))
    err = e.value
    assert isinstance(err, ValueError)
    assert err.kind == "record" and err.stage == "tar"
    assert err.object == url and url in str(err)
    assert err.offset is not None and str(err.offset) in str(err)


def test_a_bad_record_names_its_index_and_skip_counts_it(s3, prefix):
    lines = jsonl([{"i": 0}, {"i": 1}]) + b"{not json\n" + jsonl([{"i": 3}])
    url = s3.put(f"{prefix}bad.jsonl", lines)
    p = stoker.from_url(url, format="jsonl", **s3.options)
    with pytest.raises(stoker.DataError) as e:
        list(p)
    assert e.value.record == 2 and e.value.object == url
    run = p.options(errors="skip").run()
    assert [s["i"] for s in run] == [0, 1, 3]
    stats = run.stats()
    assert stats["skipped"] == 1 and "jsonl" in stats["skipped_errors"][0]["error"]


def test_a_bad_crc_is_a_data_error(s3, prefix):
    data = bytearray(tfrecord([b"aaaa", b"bbbb"]))
    data[-6] ^= 0xFF  # inside the second record's data
    url = s3.put(f"{prefix}bad.tfrecord", bytes(data))
    with pytest.raises(stoker.DataError, match="record 1"):
        list(stoker.from_url(url, format="tfrecord", parse_examples=False, **s3.options))


def test_an_operator_failing_on_a_sample_is_a_data_error_naming_the_operator():
    p = stoker.from_samples([{"b": b"\xff\xfe"}]).map("decode_utf8", field="b")
    with pytest.raises(stoker.DataError, match="not UTF-8") as e:
        list(p)
    assert e.value.kind == "operator" and "decode_utf8" in str(e.value)


def test_mistakes_in_the_pipeline_are_value_errors(s3):
    with pytest.raises(ValueError, match="unknown format"):
        stoker.from_url("s3://data/x/", format="avro", **s3.options)
    with pytest.raises(ValueError, match="unknown field|columnz"):
        stoker.from_url("s3://data/x/", format="parquet", columnz=["a"], **s3.options)
    with pytest.raises(ValueError, match="part_size"):
        stoker.from_url("s3://data/x/", part_size="lots", **s3.options)
    with pytest.raises(ValueError, match="errors must be"):
        stoker.from_samples([{"x": 1}]).options(errors="ignore")
    with pytest.raises(ValueError, match="field"):
        list(stoker.from_samples([{"x": 1}]).map("select", fields=["y"]))


def test_refused_credentials_are_a_permission_error(s3, prefix):
    s3.put(f"{prefix}a.txt", b"a")
    options = dict(s3.options, secret_key="wrong", max_retries=0)
    with pytest.raises(PermissionError):
        list(stoker.from_url(f"s3://data/{prefix}", **options))
    with pytest.raises(PermissionError):
        list(stoker.from_url(f"s3://data/{prefix}a.txt", **options))
    with pytest.raises(PermissionError):
        stoker.io.open(f"s3://data/{prefix}a.txt", **options)
