"""Every format, written by a reference writer, read back through the real S3 server (or a
local directory) and compared with what was written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

import stoker
from datasets import FIXTURES, jsonl, npy, tar_shard, tfrecord


def read_all(p: stoker.Pipeline) -> list[dict]:
    return list(p)


def test_webdataset_tar_round_trip(s3, prefix):
    shards = []
    for shard in range(3):
        samples = [
            {
                "__key__": f"s{shard}/{i:03d}",
                "txt": f"caption {shard}-{i}".encode(),
                "cls": str(i % 4).encode(),
                "npy": npy(np.arange(i, i + 6, dtype=np.float32).reshape(2, 3)),
            }
            for i in range(5)
        ]
        shards.append(samples)
        s3.put(f"{prefix}shard-{shard}.tar", tar_shard(samples))
    p = (
        stoker.from_url(f"s3://data/{prefix}", format="tar", glob="*.tar", **s3.options)
        .map("decode_utf8", field="txt")
        .map("parse_int", field="cls")
    )
    got = read_all(p)
    want = [s for shard in shards for s in shard]
    assert [g["__key__"] for g in got] == [w["__key__"] for w in want]
    for g, w in zip(got, want):
        assert g["txt"] == w["txt"].decode()
        assert g["cls"] == int(w["cls"])
        assert isinstance(g["npy"], memoryview)
        assert bytes(g["npy"]) == w["npy"]
        assert g["__url__"].endswith(".tar")


def test_tfrecord_examples_written_by_tensorflow(s3, prefix):
    expected = json.loads((FIXTURES / "expected.json").read_text())["tfrecord"]
    examples = expected["examples.tfrecord"]["examples"]
    url = s3.put(f"{prefix}examples.tfrecord", (FIXTURES / "examples.tfrecord").read_bytes())
    got = read_all(stoker.from_url(url, format="tfrecord", **s3.options))
    assert len(got) == len(examples)
    for g, want in zip(got, examples):
        for name, feature in want.items():
            values, kind = feature["values"], feature["kind"]
            value = g[name]
            if kind == "bytes":
                have = [bytes(value)] if len(values) == 1 else [bytes(v) for v in value]
                assert [h.hex() for h in have] == values, name
            elif not values:
                assert len(value) == 0, name
            elif len(values) == 1:
                assert value == (values[0] if kind == "int64" else np.float32(values[0])), name
            else:
                arr = np.asarray(value)
                dtype = np.int64 if kind == "int64" else np.float32
                assert arr.dtype == dtype, name
                np.testing.assert_array_equal(arr, np.array(values, dtype=dtype))


def test_tfrecord_framing_raw_records(s3, prefix):
    records = [bytes([i]) * (i * 7) for i in range(10)]
    url = s3.put(f"{prefix}raw.tfrecord", tfrecord(records))
    got = read_all(stoker.from_url(url, format="tfrecord", parse_examples=False, **s3.options))
    assert [bytes(g["data"]) for g in got] == records


def test_jsonl_values_are_python_values(s3, prefix):
    rows = [
        {"i": i, "x": i / 4, "s": f"row {i}", "tags": ["a", "b"][: i % 3], "none": None}
        for i in range(20)
    ]
    s3.put(f"{prefix}part-0.jsonl", jsonl(rows[:12]))
    s3.put(f"{prefix}part-1.jsonl", jsonl(rows[12:]))
    got = read_all(stoker.from_url(f"s3://data/{prefix}", format="jsonl", **s3.options))
    for g, w in zip(got, rows, strict=True):
        assert g["i"] == w["i"] and isinstance(g["i"], int)
        assert g["x"] == w["x"]
        assert g["s"] == w["s"]
        assert list(g["tags"]) == w["tags"]
        assert g["none"] is None


def test_csv_with_options(s3, prefix):
    text = "id;name;score\n1;ann;0.5\n2;bob;1.25\n3;cy;-2\n"
    url = s3.put(f"{prefix}t.csv", text.encode())
    got = read_all(stoker.from_url(url, format="csv", delimiter=";", **s3.options))
    assert [g["id"] for g in got] == [1, 2, 3]
    assert [g["name"] for g in got] == ["ann", "bob", "cy"]
    assert [g["score"] for g in got] == [0.5, 1.25, -2]
    untyped = read_all(
        stoker.from_url(url, format="csv", delimiter=";", infer_types=False, **s3.options)
    )
    assert [g["id"] for g in untyped] == ["1", "2", "3"]


def test_parquet_written_by_pyarrow(s3, prefix):
    n = 1000
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "x": pa.array([i * 0.5 for i in range(n)], pa.float64()),
            "name": pa.array([f"n{i}" for i in range(n)], pa.string()),
            "blob": pa.array([bytes([i % 256]) * 3 for i in range(n)], pa.binary()),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=128)
    url = s3.put(f"{prefix}t.parquet", sink.getvalue().to_pybytes())
    got = read_all(stoker.from_url(url, format="parquet", **s3.options))
    assert [g["id"] for g in got] == list(range(n))
    assert [g["x"] for g in got] == [i * 0.5 for i in range(n)]
    assert [g["name"] for g in got] == [f"n{i}" for i in range(n)]
    assert [bytes(g["blob"]) for g in got] == [bytes([i % 256]) * 3 for i in range(n)]
    projected = read_all(stoker.from_url(url, format="parquet", columns=["name"], **s3.options))
    assert set(projected[0]) == {"name"}

    # Batched, Parquet goes straight into batches (the columnar path) unless switched off;
    # both give the same batches.
    batched = stoker.from_url(url, format="parquet", **s3.options).batch(100)
    assert "source (columnar: batches of 100" in batched.explain()
    rows = batched.options(columnar=False)
    assert rows.run_options["columnar"] is False
    assert "source (rows)" in rows.explain()
    a, b = list(batched), list(rows)
    assert len(a) == len(b) == 10
    for x, y in zip(a, b):
        assert np.array_equal(x["id"], y["id"]) and np.array_equal(x["x"], y["x"])
        assert list(x["name"]) == list(y["name"])


def test_the_default_format_follows_the_extensions(s3, prefix, local_dir):
    rows = [{"i": i} for i in range(6)]
    s3.put(f"{prefix}j/part-0.jsonl", jsonl(rows[:4]))
    s3.put(f"{prefix}j/part-1.jsonl", jsonl(rows[4:]))
    assert [g["i"] for g in read_all(stoker.from_url(f"s3://data/{prefix}j/", **s3.options))] == list(
        range(6)
    )
    samples = [{"__key__": f"{i:03d}", "txt": f"t{i}".encode()} for i in range(4)]
    s3.put(f"{prefix}t/shard-0.tar", tar_shard(samples))
    got = read_all(stoker.from_url(f"s3://data/{prefix}t/", **s3.options))
    assert [(g["__key__"], bytes(g["txt"])) for g in got] == [
        (s["__key__"], s["txt"]) for s in samples
    ]
    # Parquet under auto takes the columnar path too (the format is known once listed).
    table = pa.table({"id": pa.array(range(300), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=100)
    s3.put(f"{prefix}p/t.parquet", sink.getvalue().to_pybytes())
    run = stoker.from_url(f"s3://data/{prefix}p/", **s3.options).batch(100).run()
    assert [int(b["id"][0]) for b in run] == [0, 100, 200]
    assert run.columnar
    # No record extension: files. A record format mixed with other objects is refused,
    # naming both; a glob picks the records.
    (local_dir / "a.jpg").write_bytes(b"jpeg")
    assert [bytes(f["jpg"]) for f in read_all(stoker.from_url(str(local_dir) + "/"))] == [b"jpeg"]
    s3.put(f"{prefix}t/index.json", b"{}")
    with pytest.raises(ValueError, match=r"1 objects are tar \(.*shard-0.tar\) and 1 are not \(.*index.json\)"):
        read_all(stoker.from_url(f"s3://data/{prefix}t/", **s3.options))
    assert len(read_all(stoker.from_url(f"s3://data/{prefix}t/", glob="*.tar", **s3.options))) == 4
    # Format options must be the chosen format's.
    with pytest.raises(ValueError, match=r"columns is for the parquet format, not jsonl"):
        read_all(stoker.from_url(f"s3://data/{prefix}j/", columns=["i"], **s3.options))


def test_files_and_imagefolder_from_a_local_directory(local_dir):
    for cls in ("cat", "dog"):
        (local_dir / cls).mkdir()
        for i in range(3):
            (local_dir / cls / f"{i}.jpg").write_bytes(f"{cls}{i}".encode())
    files = read_all(stoker.from_url(str(local_dir) + "/", format="files"))
    assert sorted(bytes(f["jpg"]) for f in files) == sorted(
        f"{c}{i}".encode() for c in ("cat", "dog") for i in range(3)
    )
    images = read_all(stoker.from_url(local_dir.as_uri() + "/", format="imagefolder"))
    labels = {bytes(s["jpg"]).decode(): s["label"] for s in images}
    assert labels == {f"{c}{i}": (0 if c == "cat" else 1) for c in ("cat", "dog") for i in range(3)}


def test_ranks_split_parquet_contiguously_and_tar_with_a_shard_index(s3, prefix):
    # Parquet files of uneven row counts, written by pyarrow: the footers give the counts,
    # so each rank reads only its span (auto); a WebDataset shard index does it for tar.
    sizes = [70, 5, 130, 41]
    for i, n in enumerate(sizes):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": pa.array(range(i * 1000, i * 1000 + n), pa.int64())}), sink,
                       row_group_size=32)
        s3.put(f"{prefix}pq/{i}.parquet", sink.getvalue().to_pybytes())
    base = stoker.from_url(f"s3://data/{prefix}pq/", format="parquet", **s3.options).shuffle_shards().seed(2)
    total = sum(sizes)
    ids = []
    for rank in range(3):
        p = base.shard(rank, 3)
        assert "rank split contiguous" in p.explain()
        got = [int(s["id"]) for s in p]
        assert len(got) == total // 3
        ids += got
    assert len(set(ids)) == len(ids) == total // 3 * 3
    inter = [int(s["id"]) for s in base.split_mode("interleaved").shard(0, 3)]
    assert len(inter) == total // 3
    with_pad = [len(list(base.shard(r, 3, "pad"))) for r in range(3)]
    assert with_pad == [-(-total // 3)] * 3

    for shard in range(3):
        samples = [{"__key__": f"t{shard}/{i:03d}", "txt": b"x"} for i in range(4 + shard)]
        s3.put(f"{prefix}tar/shard-{shard}.tar", tar_shard(samples))
    index = {"__kind__": "wids-shard-index-v1",
             "shardlist": [{"url": f"../tar/shard-{s}.tar", "nsamples": 4 + s} for s in range(3)]}
    s3.put(f"{prefix}idx/wids.json", json.dumps(index).encode())
    tar = stoker.from_url(f"s3://data/{prefix}tar/", format="tar", **s3.options)
    assert "rank split interleaved" in tar.shard(0, 2).explain()
    # Relative names are relative to the index's own directory.
    url = f"s3://data/{prefix}idx/wids.json"
    keys = []
    for rank in range(2):
        p = tar.shard_index(url).shard(rank, 2)
        assert "rank split contiguous" in p.explain()
        got = [s["__key__"] for s in p]
        assert len(got) == 15 // 2
        keys += got
    assert len(set(keys)) == len(keys)
    # A shard the index does not list is named, and the run does not start.
    index["shardlist"].pop()
    s3.put(f"{prefix}idx/wids.json", json.dumps(index).encode())
    with pytest.raises(ValueError, match="shard-2.tar"):
        list(tar.shard_index(url).shard(0, 2))
    with pytest.raises(ValueError, match="split must be"):
        tar.split_mode("sideways")


def test_index_counts_every_shard_and_feeds_the_contiguous_split(s3, prefix, tmp_path):
    counts = [3, 9, 1, 6]
    for shard, n in enumerate(counts):
        samples = [{"__key__": f"s{shard}/{i:03d}", "txt": b"y" * (100 + i)} for i in range(n)]
        s3.put(f"{prefix}shards/shard-{shard}.tar", tar_shard(samples))
    tar = stoker.from_url(f"s3://data/{prefix}shards/", format="tar", **s3.options)
    out = tmp_path / "index.json"
    index = tar.index(out)
    assert index == {"shards": [{"url": f"s3://data/{prefix}shards/shard-{s}.tar", "records": n}
                                for s, n in enumerate(counts)]}
    assert json.loads(out.read_text()) == index
    # The index, put where the ranks can read it, makes the split contiguous.
    url = s3.put(f"{prefix}index.json", out.read_bytes())
    keys = []
    for rank in range(3):
        p = tar.shard_index(url).shard(rank, 3)
        assert "rank split contiguous" in p.explain()
        got = [s["__key__"] for s in p]
        assert len(got) == sum(counts) // 3
        keys += got
    assert len(set(keys)) == len(keys) == sum(counts) // 3 * 3
    # A failed record takes its place in the count, as it does in a run's positions (so a
    # skip policy keeps ranks aligned); the run itself names it.
    s3.put(f"{prefix}shards/shard-9.tar", b"not a tar archive" * 40)
    assert tar.index()["shards"][-1] == {"url": f"s3://data/{prefix}shards/shard-9.tar", "records": 1}
    with pytest.raises(stoker.DataError, match="shard-9.tar"):
        list(tar)


def test_from_urls_reads_exactly_those_objects_in_their_order(s3, prefix, local_dir, tmp_path):
    for i in range(5):
        s3.put(f"{prefix}m/{i}.txt", f"t{i}".encode())
    s3.put(f"{prefix}m/sub/x.txt", b"sub")
    base = f"s3://data/{prefix}m/"
    urls = [base + "3.txt", base + "sub/x.txt", base + "0.txt", base + "3.txt"]
    p = stoker.from_urls(urls, format="files", **s3.options)
    got = [(s["__url__"], bytes(s["txt"])) for s in p]
    assert got == [(u, d) for u, d in zip(urls, [b"t3", b"sub", b"t0", b"t3"])]
    # The same through from_url's keys, and the pipeline pickles with them.
    import pickle

    q = pickle.loads(pickle.dumps(stoker.from_url(base, "files", keys=["4.txt", "1.txt"], **s3.options)))
    assert [bytes(s["txt"]) for s in q] == [b"t4", b"t1"]
    # A missing object fails the run where it reaches it, naming it; with a disk cache
    # (which looks every object up first, for its version) at the run's start.
    missing = stoker.from_urls([base + "1.txt", base + "nope.txt"], format="files", **s3.options)
    run = iter(missing)
    assert bytes(next(run)["txt"]) == b"t1"
    with pytest.raises(FileNotFoundError, match="nope.txt") as e:
        next(run)
    assert e.value.object == base + "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        iter(missing.cache(tmp_path / "cache"))
    # Percent-encoded URLs are decoded as from_url's are.
    s3.put(f"{prefix}m/a b.txt", b"spaced")
    assert [bytes(s["txt"]) for s in stoker.from_urls([base + "a%20b.txt"], **s3.options)] == [b"spaced"]
    with pytest.raises(ValueError, match="one store"):
        stoker.from_urls([base + "1.txt", "s3://other/1.txt"], **s3.options)
    with pytest.raises(ValueError, match="not both"):
        list(stoker.from_url(base, "files", keys=["1.txt"], glob="*.txt", **s3.options))
    with pytest.raises(TypeError, match="list of keys"):
        stoker.from_url(base, "files", keys="1.txt")
    # Local paths, an ImageFolder with its labels from the class directories under the
    # common directory.
    for cls in ("cat", "dog"):
        (local_dir / cls).mkdir()
        for i in range(2):
            (local_dir / cls / f"{i}.jpg").write_bytes(f"{cls}{i}".encode())
    paths = [local_dir / "dog" / "1.jpg", f"file://{local_dir}/cat/0.jpg"]
    got = [(bytes(s["jpg"]), int(s["label"])) for s in stoker.from_urls(paths, format="imagefolder")]
    assert got == [(b"dog1", 1), (b"cat0", 0)]
    # All in one class directory: the root says where the classes are.
    dogs = [local_dir / "dog" / "0.jpg", local_dir / "dog" / "1.jpg"]
    got = [int(s["label"]) for s in stoker.from_urls(dogs, format="imagefolder", root=local_dir)]
    assert got == [0, 0]
    with pytest.raises(ValueError, match="not under root"):
        stoker.from_urls(dogs, root=local_dir / "cat")
