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


def test_a_missing_shard_index_is_file_not_found(s3, prefix):
    # The store's error travels under the engine's ("cannot read the shard index: ..."):
    # its class comes from the store's error the engine kept, not from the wording.
    s3.put(f"{prefix}tar/shard-0.tar", tar_shard([{"__key__": "a", "txt": b"x"}]))
    tar = stoker.from_url(f"s3://data/{prefix}tar/", format="tar", **s3.options)
    missing = f"s3://data/{prefix}idx/none.json"
    with pytest.raises(FileNotFoundError, match="shard index") as e:
        list(tar.shard_index(missing).shard(0, 2))
    assert e.value.kind == "storage" and e.value.object == missing


def test_a_missing_spec_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        stoker.from_spec(str(tmp_path / "missing.toml"))
    with pytest.raises(FileNotFoundError):
        stoker.from_spec(tmp_path / "missing.toml")
    with pytest.raises(FileNotFoundError):
        stoker.from_spec("specs/imagenet")  # a path without an extension
    # One line of TOML is still TOML.
    p = stoker.from_spec(f'source = "{tmp_path}"')
    assert isinstance(p, stoker.Pipeline)


def test_a_cache_directory_that_cannot_be_one_is_an_os_error(tmp_path):
    file = tmp_path / "a-file"
    file.write_bytes(b"not a directory")
    p = stoker.from_url(tmp_path, format="files").cache(file / "cache")
    with pytest.raises(OSError, match="cache directory") as e:
        list(p)
    assert not isinstance(e.value, ValueError) and e.value.kind == "storage"


@pytest.mark.parametrize(
    "build",
    [
        lambda p: p.take(-1),
        lambda p: p.skip(-5),
        lambda p: p.seed(-1),
        lambda p: p.seed(2**64),
        lambda p: p.prefetch(-1),
        lambda p: p.shuffle(0),
        lambda p: p.batch(-2),
        lambda p: p.interleave(0),
        lambda p: p.epochs(0),
        lambda p: p.epochs(-1),
        lambda p: p.first_epoch(-1),
        lambda p: p.shard(-1, 2),
        lambda p: p.shard(0, 2**40),
        lambda p: p.shard(0, 1, part=1),  # part without parts is refused, not ignored
        lambda p: p.shard(0, 1, part=2, parts=2),
        lambda p: p.options(threads=-1),
        lambda p: p.options(threads=0),
        lambda p: p.options(window=0),
        lambda p: p.options(memory_limit=-1),
        lambda p: p.options(memory_limit=2.5),
        lambda p: p.options(memory_limit=float("inf")),
        lambda p: p.cache("/tmp/stoker-never", size=-1),
    ],
)
def test_counts_out_of_range_are_value_errors(build):
    # Not OverflowError (what converting -1 to an unsigned int raises), which is no
    # ValueError.
    p = stoker.from_samples([{"x": 1}])
    with pytest.raises(ValueError):
        build(p)


def test_counts_of_other_types_are_type_errors():
    p = stoker.from_samples([{"x": 1}])
    with pytest.raises(TypeError, match="take"):
        p.take(1.5)
    with pytest.raises(TypeError, match="memory_limit"):
        p.options(memory_limit=[1])
    # NumPy integers and whole floats of bytes are fine.
    import numpy as np

    assert [s["x"] for s in p.take(np.int64(1)).seed(np.uint32(3))] == [1]
    assert p.options(memory_limit=2e9).run_options["memory_limit"] == 2_000_000_000


def test_unknown_keywords_of_from_url_name_both_kinds_of_option(s3):
    with pytest.raises(ValueError, match=r"unknown option 'part_sise'.*part_size.*columns \(parquet\)"):
        stoker.from_url("s3://data/x/", part_sise="8MiB", **s3.options)
    # The CLI's flags are store options here too, and keys are matched as the CLI does.
    stoker.from_url("s3://data/x/", no_sign_request=True, cache_size="1GiB", **s3.options)
    with pytest.raises(ValueError, match="part_size"):
        stoker.from_url("s3://data/x/", **{"Part-Size": "lots"}, **s3.options)
