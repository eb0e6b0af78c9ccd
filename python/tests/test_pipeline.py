"""The builder (immutable, mirroring the Rust one), batches as NumPy arrays, zero-copy
hand-over, statistics, and exact resume from state_dict()."""

from __future__ import annotations

import gc
import json
import pickle
import time

import numpy as np
import pytest

import stoker
from datasets import tar_shard


def numbers(n: int = 100) -> stoker.Pipeline:
    return stoker.from_samples([{"x": i, "name": f"s{i}"} for i in range(n)])


def xs(items) -> list[int]:
    return [int(s["x"]) for s in items]


def test_every_builder_method_returns_a_new_pipeline_and_leaves_the_old_one():
    base = numbers(20)
    before = base.explain()
    options_before = base.run_options
    derived = {
        "map": base.map("random_int", to="r", below=5),
        "filter": base.filter("filter_len", field="name", min=3),
        "apply": base.apply({"op": "take", "n": 2}),
        "shuffle": base.shuffle(4),
        "shuffle_shards": base.shuffle_shards(),
        "interleave": base.interleave(2),
        "shard": base.shard(0, 2),
        "batch": base.batch(4),
        "unbatch": base.batch(4).unbatch(),
        "take": base.take(3),
        "skip": base.skip(3),
        "cache": base.cache(),
        "prefetch": base.prefetch(2),
        "epochs": base.epochs(2),
        "seed": base.seed(3),
        "options": base.options(threads=options_before["threads"] + 1),
        "load_state_dict": base.load_state_dict(None),
    }
    for name, p in derived.items():
        assert isinstance(p, stoker.Pipeline), name
        assert p is not base, name
    assert base.explain() == before
    assert xs(base) == list(range(20))
    with pytest.raises(AttributeError):
        base._p = None  # type: ignore[misc]
    # The derived pipelines did what they say.
    assert xs(derived["take"]) == [0, 1, 2]
    assert xs(derived["skip"]) == list(range(3, 20))
    assert xs(derived["shard"]) == list(range(0, 20, 2))
    assert len(list(derived["epochs"])) == 40
    assert sorted(xs(derived["shuffle"])) == list(range(20))
    assert xs(derived["shuffle"]) != list(range(20))
    assert all(0 <= s["r"] < 5 for s in derived["map"])
    assert xs(derived["filter"]) == list(range(10, 20))
    assert derived["options"].run_options["threads"] == options_before["threads"] + 1
    assert base.run_options == options_before


def test_operators_go_through_the_spec_form():
    p = numbers(10).map("rename", **{"from": "name", "to": "label"}).map("select", fields=["x", "label"])
    assert [sorted(s) for s in p][0] == ["label", "x"]
    with pytest.raises(ValueError, match='operator "decode_png": unknown variant'):
        numbers().map("decode_png", field="x")
    with pytest.raises(ValueError, match='operator "to_tensor": unknown field `shap`'):
        numbers().map("to_tensor", field="x", dtype="float32", shap=[2])
    with pytest.raises(ValueError, match='operator "resize": missing field `size`'):
        numbers().map("resize", field="x")
    with pytest.raises(ValueError, match="to_tensor: unknown dtype"):
        numbers().map("to_tensor", field="name", dtype="complex64")
    with pytest.raises(ValueError, match="never drops samples"):
        numbers().filter("rename", **{"from": "x", "to": "y"})
    with pytest.raises(ValueError, match="not a per-sample operator"):
        numbers().map("shuffle", buffer=3)
    assert "take(2)" in numbers().apply({"op": "take", "n": 2}).explain()


def test_shard_splits_evenly_and_same_seed_same_order():
    p = numbers(10).shuffle_shards().seed(5)
    assert xs(p) == xs(p)
    assert xs(p) != xs(p.seed(6))
    ranks = [xs(p.shard(r, 3, policy="drop")) for r in range(3)]
    assert all(len(r) == 3 for r in ranks)
    assert len(set(sum(ranks, []))) == 9
    padded = [xs(p.shard(r, 3, policy="pad")) for r in range(3)]
    assert all(len(r) == 4 for r in padded)
    with pytest.raises(ValueError, match="rank 3 of world 3"):
        p.shard(3, 3)


def test_batches_are_dicts_of_numpy_arrays():
    samples = [
        {"x": i, "f": i / 2, "t": np.full((2, 3), i, dtype=np.float32), "s": f"s{i}"}
        for i in range(10)
    ]
    batches = list(stoker.from_samples(samples).batch(4))
    assert [len(b["s"]) for b in batches] == [4, 4, 2]
    first = batches[0]
    assert first["x"].dtype == np.int64 and list(first["x"]) == [0, 1, 2, 3]
    assert first["f"].dtype == np.float64
    assert first["t"].shape == (4, 2, 3) and first["t"].dtype == np.float32
    np.testing.assert_array_equal(first["t"][3], np.full((2, 3), 3, np.float32))
    assert first["s"] == ["s0", "s1", "s2", "s3"]
    assert len(list(stoker.from_samples(samples).batch(4, drop_last=True))) == 2
    ragged = [{"t": np.arange(i + 1, dtype=np.int32)} for i in range(3)]
    padded = next(iter(stoker.from_samples(ragged).batch(3, collate="pad", pad_value=-1)))
    np.testing.assert_array_equal(padded["t"], [[0, -1, -1], [0, 1, -1], [0, 1, 2]])
    listed = next(iter(stoker.from_samples(ragged).batch(3, collate={"t": "list"})))
    assert [list(a) for a in listed["t"]] == [[0], [0, 1], [0, 1, 2]]


def test_tensors_are_numpy_arrays_over_stokers_memory_without_a_copy(s3, prefix):
    raw = np.arange(24, dtype=np.float32).tobytes()
    url = s3.put(f"{prefix}a.tar", tar_shard([{"__key__": "a", "bin": raw, "txt": b"hello"}]))
    p = stoker.from_url(url, format="tar", **s3.options).map(
        "to_tensor", field="bin", dtype="float32", shape=[2, 3, 4]
    )
    run = p.run()
    sample = next(run)
    arr = sample["bin"]
    assert isinstance(arr, np.ndarray) and arr.shape == (2, 3, 4) and arr.dtype == np.float32
    owner = arr.base
    assert isinstance(owner, stoker.Buffer)
    assert arr.__array_interface__["data"][0] == owner.address
    assert len(owner) == arr.nbytes
    assert not arr.flags.owndata and not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0, 0, 0] = 1.0
    # The bytes field is a memoryview of a Stoker buffer, read-only, in the same shard
    # fetch: both were sliced from the tar without a copy.
    txt = sample["txt"]
    assert isinstance(txt, memoryview) and txt.readonly and isinstance(txt.obj, stoker.Buffer)
    assert bytes(txt) == b"hello"
    base = np.frombuffer(txt, dtype=np.uint8)
    assert base.__array_interface__["data"][0] == txt.obj.address
    assert abs(txt.obj.address - owner.address) < 4096  # neighbours in one tar buffer
    # The memory outlives the run and the pipeline.
    run.close()
    del run, p, sample, owner
    gc.collect()
    np.testing.assert_array_equal(arr.ravel(), np.arange(24, dtype=np.float32))


def test_a_collected_batch_s_memory_goes_to_a_later_batch_and_holds_its_own_values():
    # Batches of 2 x 1 MiB: large enough for the engine to recycle their buffers (glibc
    # would unmap blocks above its mmap threshold, and every batch would fault its pages in
    # afresh). Each array is dropped before the next is asked for, so later batches are
    # stacked into collected ones' memory. The consumer is slower than the engine, which
    # then waits with its few batches in flight (about 6: the queue, the one being filled)
    # and fills every later batch into a collected one's buffer. (A consumer as fast as the
    # engine lets some buffers go, at random: idle buffers are kept 2 at most.)
    from stoker import _native

    samples = [{"x": np.full((256, 1024), i, dtype=np.float32)} for i in range(48)]
    before, _ = _native.batch_buffers()
    for i, b in enumerate(stoker.from_samples(samples).batch(2)):
        x = b.pop("x")
        assert isinstance(x.base, stoker.Buffer) and x.base.exclusive  # zero-copy for torch
        assert (x[0] == 2 * i).all() and (x[1] == 2 * i + 1).all()
        del x, b
        time.sleep(0.005)
    assert i == 23
    reused, idle = _native.batch_buffers()
    assert reused - before >= 12
    # The idle buffers outlive the run for a moment (for the next run), then go.
    assert idle > 0
    t = time.perf_counter()
    while _native.batch_buffers()[1]:
        assert time.perf_counter() - t < 10, "idle buffers kept after the runs ended"
        time.sleep(0.05)
    # Batches kept alive are never handed out again while they live.
    kept = [b["x"] for b in stoker.from_samples(samples).batch(2)]
    assert _native.batch_buffers() == (reused, 0)
    assert len({k.__array_interface__["data"][0] for k in kept}) == 24
    for i, k in enumerate(kept):
        assert (k[0] == 2 * i).all() and (k[1] == 2 * i + 1).all()


def test_stats_are_a_dict_of_the_engine_statistics():
    run = numbers(50).batch(10).run()
    assert len(list(run)) == 5
    stats = run.stats()
    assert stats["samples"] == 50 and stats["items"] == 5
    assert any(s["name"].startswith("batch") for s in stats["stages"])
    assert json.loads(json.dumps(stats)) == stats
    assert run.shards == 50


def tar_dataset(s3, prefix, shards=4, per_shard=25):
    for s in range(shards):
        s3.put(
            f"{prefix}shard-{s}.tar",
            tar_shard(
                {"__key__": f"k{s}-{i:03d}", "cls": str(s * 1000 + i).encode()}
                for i in range(per_shard)
            ),
        )
    return (
        stoker.from_url(f"s3://data/{prefix}", format="tar", **s3.options)
        .shuffle_shards()
        .interleave(2)
        .map("parse_int", field="cls")
        .map("random_int", to="r", below=1000)
        .shuffle(16)
        .batch(3)
        .epochs(2)
        .seed(11)
    )


def batch_keys(items) -> list[tuple]:
    return [(tuple(b["__key__"]), tuple(b["r"])) for b in items]


@pytest.mark.parametrize("stop", [0, 1, 7, 33, 66])
def test_state_dict_resumes_exactly(s3, prefix, stop):
    p = tar_dataset(s3, prefix)
    full = batch_keys(p)
    assert len(full) == 2 * 34  # 100 samples an epoch in batches of 3 (the last has 1)
    run = p.run()
    head = batch_keys(next(run) for _ in range(stop))
    state = json.loads(json.dumps(run.state_dict()))
    run.close()
    assert head == full[:stop]
    assert batch_keys(p.resume(state)) == full[stop:]
    # load_state_dict: a new pipeline whose runs start there; the old one is unchanged.
    resumed = p.load_state_dict(state)
    assert resumed.start_state == state and p.start_state is None
    assert batch_keys(resumed) == full[stop:]
    assert batch_keys(p) == full


def test_a_state_from_another_pipeline_is_refused():
    state = numbers(10).seed(1).run().state_dict()
    with pytest.raises(ValueError, match="not taken from a run of this pipeline"):
        numbers(10).seed(2).resume(state)
    with pytest.raises(ValueError, match="not a Stoker pipeline state"):
        numbers(10).resume({"nonsense": True})


def test_spec_from_dict_toml_text_and_file(s3, prefix, tmp_path):
    for i in range(3):
        s3.put(f"{prefix}{i}.txt", f"line {i}".encode())
    toml_text = f"""
source = "s3://data/{prefix}"
format = "files"
seed = 3
[[ops]]
op = "decode_utf8"
field = "txt"
[[ops]]
op = "batch"
size = 2
[options]
threads = 2
errors = "skip"
"""
    spec_file = tmp_path / "p.toml"
    spec_file.write_text(toml_text)
    import tomllib

    for spec in (toml_text, spec_file, str(spec_file), tomllib.loads(toml_text)):
        p = stoker.from_spec(spec, **s3.options)
        assert p.run_options["threads"] == 2 and p.run_options["errors"] == "skip"
        batches = list(p)
        assert [list(b["txt"]) for b in batches] == [["line 0", "line 1"], ["line 2"]]
    with pytest.raises(ValueError, match="avro"):
        stoker.from_spec({"source": "s3://data/x/", "format": "avro"}, **s3.options)


def test_from_samples_round_trips_python_values():
    samples = [
        {"b": b"\x00\x01", "s": "é", "i": -3, "f": 2.5, "n": None, "l": [1, "a"], "t": True},
        {"b": bytearray(b"xy"), "s": "", "i": 2**62, "f": -0.0, "n": None, "l": [], "t": False},
    ]
    got = list(stoker.from_samples(samples))
    assert bytes(got[0]["b"]) == b"\x00\x01" and bytes(got[1]["b"]) == b"xy"
    assert [g["s"] for g in got] == ["é", ""]
    assert [g["i"] for g in got] == [-3, 2**62]
    assert [g["f"] for g in got] == [2.5, -0.0]
    assert [g["n"] for g in got] == [None, None]
    assert [g["l"] for g in got] == [[1, "a"], []]
    assert [g["t"] for g in got] == [1, 0]
    with pytest.raises(TypeError, match="cannot be of type"):
        stoker.from_samples([{"x": object()}])


def test_a_disk_cache_serves_a_later_run_without_reading_storage(s3, prefix, tmp_path):
    p = tar_dataset(s3, prefix).cache(dir=tmp_path / "cache")
    first = p.run()
    want = batch_keys(first)
    assert first.stats()["storage"]["get_requests"] > 0
    assert any((tmp_path / "cache").iterdir())
    later = p.run()
    assert batch_keys(later) == want
    assert later.stats()["storage"]["get_requests"] == 0


def _dir_bytes(d) -> int:
    return sum(f.stat().st_size for f in d.iterdir())


def test_a_disk_cache_with_a_size_keeps_within_it_and_reads_the_rest(s3, prefix, tmp_path):
    base = tar_dataset(s3, prefix)
    want = batch_keys(base.run())
    full = base.cache(dir=tmp_path / "full").run()
    assert batch_keys(full) == want
    total = full.stats()["cache"]["stored_bytes"]
    limit = total // 2
    p = base.cache(dir=tmp_path / "cache", size=limit)
    for _ in range(2):
        run = p.run()
        assert batch_keys(run) == want
        c = run.stats()["cache"]
        assert c["limit"] == limit
        assert c["over_limit"] > 0 and c["hits"] > 0, c
        assert _dir_bytes(tmp_path / "cache") <= limit
    # The recipe (pickling, DataLoader workers) keeps the size; a size needs a directory.
    again = pickle.loads(pickle.dumps(p)).run()
    assert batch_keys(again) == want
    assert again.stats()["cache"]["limit"] == limit
    assert base.cache(dir=tmp_path / "s", size="1MiB").run().stats()["cache"]["limit"] == 1 << 20
    with pytest.raises(ValueError, match="give dir"):
        base.cache(size="1MiB")


def test_a_one_epoch_run_keeps_no_blocks_in_memory(s3, prefix):
    base = tar_dataset(s3, prefix)
    one = base.epochs(1).run()
    list(one)
    cache = one.stats()["storage"]["cache"]
    assert (cache["memory_capacity"], cache["memory_bytes"]) == (0, 0), cache
    two = base.epochs(2).run()
    list(two)
    cache = two.stats()["storage"]["cache"]
    assert cache["memory_capacity"] > 0 and cache["memory_hits"] > 0, cache


def test_optimizer_passes_can_be_turned_off_and_explain_says_what_each_decided():
    p = numbers(20).map("random_int", to="r", below=100).shuffle(8).seed(1)
    # Samples in memory are one object each: the buffer becomes a permutation at the source.
    plan = p.explain()
    assert "shuffle(8) became a seeded permutation" in plan
    assert "  shuffle(8)\n" not in plan.split("physical:")[1]
    off = p.options(disable=["shuffle"])
    assert off.run_options["disable"] == ["shuffle"]
    assert "  shuffle(8)\n" in off.explain().split("physical:")[1]
    # The same samples with the same draws, in another order.
    on, as_written = list(p), list(off)
    assert sorted((s["x"], s["r"]) for s in on) == sorted((s["x"], s["r"]) for s in as_written)
    assert [s["x"] for s in on] == [s["x"] for s in p]
    with pytest.raises(ValueError, match='unknown optimizer pass "shufle"'):
        p.options(disable=["shufle"])
    # Every pass the build knows can be named, all at once too.
    assert stoker.OPTIMIZER_PASSES == ("shuffle", "batching", "cache", "fusion")
    every = list(stoker.OPTIMIZER_PASSES)
    assert p.options(disable=every).run_options["disable"] == every


def test_a_run_explains_its_plan_with_what_each_operator_measured():
    p = numbers(64).map("random_int", to="r", below=100).map("len", field="name", to="n")
    run = p.run()
    assert len(list(run)) == 64
    ops = run.stats()["operators"]
    assert [o["name"] for o in ops] == ["random_int(r)", "len(name)"]
    # One sample in eight is measured: 8 of 64.
    assert [o["samples"] for o in ops] == [8, 8]
    assert all(o["ns_per_sample"] > 0 and o["size_ratio"] > 1.0 for o in ops)
    text = run.explain()
    assert text.startswith("logical:\n")
    assert "measured (one sample in 8):\n  random_int(r): " in text
