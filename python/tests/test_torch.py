"""PyTorch: DLPack without a copy, stoker.torch.Dataset (ranks, DataLoader workers, fork
and spawn), the stateful DataLoader's exact resume, pinned memory, and pickled pipelines."""

from __future__ import annotations

import gc
import json
import pickle
import random
import resource
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader as TorchDataLoader

import stoker
import stoker.io
import stoker.torch as st
from datasets import tar_shard


def numbers(n: int) -> stoker.Pipeline:
    """Samples ``{"i": i, "x": float32[2, 3] filled with i}``."""
    return stoker.from_samples(
        [{"i": i, "x": np.full((2, 3), i, dtype=np.float32)} for i in range(n)]
    )


def ids(items, key: str = "i") -> list[int]:
    """The ids in batches (arrays or tensors) or samples (ints), in order."""
    out: list[int] = []
    for item in items:
        v = item[key]
        out.extend([int(v)] if isinstance(v, int) else [int(i) for i in v])
    return out


def npy_tar(s3, prefix: str, n: int, per_shard: int = 8) -> str:
    """Tar shards of samples with a ``bin`` field of 12 float32s (value i) and ``cls`` i."""
    for s in range(0, n, per_shard):
        members = [
            {
                "__key__": f"{i:05d}",
                "bin": np.full(12, i, dtype=np.float32).tobytes(),
                "cls": str(i).encode(),
            }
            for i in range(s, min(n, s + per_shard))
        ]
        s3.put(f"{prefix}shard-{s:05d}.tar", tar_shard(members))
    return f"s3://data/{prefix}"


def tensor_pipeline(s3, prefix: str, n: int) -> stoker.Pipeline:
    url = npy_tar(s3, prefix, n)
    return (
        stoker.from_url(url, format="tar", glob="*.tar", **s3.options)
        .map("to_tensor", field="bin", dtype="float32", shape=[3, 4])
        .map("parse_int", field="cls")
    )


# DLPack --------------------------------------------------------------------------------


def test_batches_reach_torch_through_dlpack_without_a_copy(s3, prefix):
    p = tensor_pipeline(s3, prefix, 20).batch(8)
    batch = next(iter(p))
    arr = batch["bin"]
    buf = arr.base
    assert isinstance(buf, stoker.Buffer)
    assert buf.dtype == "float32" and buf.shape == (8, 3, 4)
    assert buf.exclusive  # a freshly stacked batch: nobody else has this memory
    t = torch.from_dlpack(buf)
    assert t.data_ptr() == buf.address == arr.__array_interface__["data"][0]
    assert t.dtype == torch.float32 and tuple(t.shape) == (8, 3, 4)
    np.testing.assert_array_equal(t.numpy(), arr)
    # to_torch does the same for a whole batch.
    converted = st.to_torch(batch)
    assert converted["bin"].data_ptr() == buf.address
    assert converted["cls"].dtype == torch.int64
    assert converted["cls"].tolist() == list(range(8))
    # The memory outlives the array, the batch and the run.
    expected = arr.copy()
    del batch, arr, buf, converted, p
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), expected)


def test_shared_memory_is_marked_read_only_and_to_torch_copies_it(s3, prefix):
    # Unbatched samples are slices of one tar shard's fetch: shared memory.
    p = tensor_pipeline(s3, prefix, 4)
    run = p.run()  # kept open: its other samples share the shard's memory
    sample = next(run)
    buf = sample["bin"].base
    assert not buf.exclusive
    # A legacy (pre-1.0) consumer cannot be told "read-only": refused, unless it copies.
    with pytest.raises(BufferError, match="read-only"):
        buf.__dlpack__()
    copied = torch.from_dlpack(buf.__dlpack__(copy=True))
    assert copied.data_ptr() != buf.address
    # torch ignores DLPack's read-only flag, so to_torch copies shared memory by default...
    t = st.to_torch(sample)["bin"]
    assert t.data_ptr() != buf.address
    t.fill_(-1.0)
    assert float(sample["bin"][0, 0]) == 0.0
    # ...and shares it when told to.
    view = st.to_torch(sample, shared="view")["bin"]
    assert view.data_ptr() == buf.address
    with pytest.raises(ValueError, match="shared must be"):
        st.to_torch(sample, shared="write")
    run.close()


def test_dlpack_dtypes_bytes_and_bad_requests():
    samples = [
        {
            "f16": np.arange(4, dtype=np.float16),
            "i16": np.arange(4, dtype=np.int16),
            "i32": np.arange(4, dtype=np.int32),
            "u8": np.arange(4, dtype=np.uint8),
            "f64": np.arange(4, dtype=np.float64),
            "raw": b"\x01\x02\x03",
        }
        for _ in range(2)
    ]
    batch = next(iter(stoker.from_samples(samples).batch(2)))
    got = st.to_torch(batch)
    expect = {
        "f16": torch.float16,
        "i16": torch.int16,
        "i32": torch.int32,
        "u8": torch.uint8,
        "f64": torch.float64,
    }
    for name, dtype in expect.items():
        assert got[name].dtype == dtype and got[name].shape == (2, 4), name
        assert got[name].data_ptr() == batch[name].base.address, name
        assert got[name][1].tolist() == [0, 1, 2, 3]
    # Bytes stay memoryviews (bytes fields are not tensors), or become bytes.
    assert all(isinstance(v, memoryview) for v in got["raw"])
    assert st.to_torch(batch, bytes_as="bytes")["raw"] == [b"\x01\x02\x03"] * 2
    # A bytes buffer exports as uint8.
    view = next(iter(stoker.from_samples(samples)))["raw"]
    assert torch.from_dlpack(view.obj).tolist() == [1, 2, 3]
    buf = batch["f64"].base
    assert buf.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError, match="CPU"):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="stream=None"):
        buf.__dlpack__(stream=1)


def test_bfloat16_arrives_as_torch_bfloat16(s3, prefix):
    values = torch.arange(6, dtype=torch.bfloat16)
    raw = values.view(torch.uint16).numpy().tobytes()
    url = s3.put(f"{prefix}a.tar", tar_shard([{"__key__": "a", "bin": raw}]))
    p = (
        stoker.from_url(url, format="tar", **s3.options)
        .map("to_tensor", field="bin", dtype="bfloat16", shape=[6])
        .batch(1)
    )
    batch = next(iter(p))
    assert batch["bin"].dtype == np.uint16  # NumPy has no bfloat16
    t = st.to_torch(batch)["bin"]
    assert t.dtype == torch.bfloat16 and t[0].tolist() == values.tolist()
    assert t.data_ptr() == batch["bin"].base.address


def test_dlpack_exports_release_their_reference():
    batch = next(iter(numbers(64).batch(64)))
    buf = batch["x"].base
    assert buf.exports == 0
    t = torch.from_dlpack(buf)
    t2 = torch.from_dlpack(buf)
    assert buf.exports == 2 and buf.exclusive  # exports hold references, and share
    assert t.data_ptr() == t2.data_ptr() == buf.address
    del t, t2
    gc.collect()
    assert buf.exports == 0  # torch's deleter dropped them
    capsule = buf.__dlpack__(max_version=(1, 0))
    assert buf.exports == 1
    del capsule  # never consumed: the capsule's destructor drops it
    assert buf.exports == 0
    legacy = buf.__dlpack__()
    del legacy
    assert buf.exports == 0
    copied = buf.__dlpack__(copy=True)
    assert buf.exports == 0  # a copy holds its own memory
    del copied


def test_dlpack_in_a_loop_does_not_leak():
    p = stoker.from_samples([{"x": np.ones(1 << 18, dtype=np.float32)} for _ in range(4)])
    p = p.batch(4).epochs(None)  # 4 MiB batches, forever
    run = p.run()
    for _ in range(20):
        torch.from_dlpack(next(run)["x"].base).sum()
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(300):  # 1.2 GiB through DLPack
        b = next(run)
        t = torch.from_dlpack(b["x"].base)
        assert float(t[0, 0]) == 1.0
        capsule = b["x"].base.__dlpack__(max_version=(1, 0))
        del t, b, capsule
    run.close()
    gc.collect()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 * 1024, f"peak RSS grew by {grown_kib} KiB"


# Pinned memory -------------------------------------------------------------------------


def test_pin_memory_pins_with_cuda_and_otherwise_warns_once():
    batch = next(iter(numbers(4).batch(4)))
    if torch.cuda.is_available():
        t = st.to_torch(batch, pin_memory=True)["x"]
        assert t.is_pinned() and t.data_ptr() != batch["x"].base.address
        return
    st._warned_pin = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = st.to_torch(batch, pin_memory=True)["x"]
        st.to_torch(batch, pin_memory=True)
    assert [str(w.message) for w in caught] == [
        "pin_memory=True but CUDA is not available: tensors stay in ordinary memory "
        "(no copy made)"
    ]
    assert t.data_ptr() == batch["x"].base.address and not t.is_pinned()


# Ranks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_rank_gets_the_same_number_of_batches(s3, prefix, world):
    n = 61  # uneven for every world size here
    p = tensor_pipeline(s3, prefix, n).shuffle_shards().shuffle(16).batch(4).seed(world)
    per_rank = []
    for rank in range(world):
        ds = st.Dataset(p, rank=rank, world_size=world)
        batches = list(TorchDataLoader(ds, batch_size=None))
        assert all(isinstance(b["bin"], torch.Tensor) for b in batches)
        per_rank.append(batches)
    counts = [len(b) for b in per_rank]
    assert len(set(counts)) == 1, counts
    samples = [ids(b, "cls") for b in per_rank]
    assert all(len(s) == n // world for s in samples)
    flat = sum(samples, [])
    assert len(set(flat)) == len(flat) == (n // world) * world  # disjoint
    # pad: ceil(n / world) each, every sample at least once
    padded = [
        ids(st.Dataset(p, rank=r, world_size=world, policy="pad"), "cls") for r in range(world)
    ]
    assert all(len(s) == -(-n // world) for s in padded)
    assert set(sum(padded, [])) == set(range(n))


def test_rank_comes_from_arguments_environment_or_default(monkeypatch):
    p = numbers(10)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert st.distributed_rank() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = st.Dataset(p)
    assert (ds.rank, ds.world_size) == (2, 3)
    assert ids(ds) == [2, 5, 8]
    assert st.distributed_rank(0, 2) == (0, 2)
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ValueError, match="WORLD_SIZE='x'"):
        st.Dataset(p)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="both RANK and WORLD_SIZE"):
        st.Dataset(p)
    with pytest.raises(ValueError, match="rank 3 of world size 3"):
        st.Dataset(p, rank=3, world_size=3)
    with pytest.raises(ValueError, match="both rank and world_size"):
        st.Dataset(p, rank=1)


def test_bad_datasets_and_loaders_are_refused():
    p = numbers(10)
    with pytest.raises(TypeError, match="stoker.Pipeline"):
        st.Dataset([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already sharded"):
        st.Dataset(p.shard(0, 2), rank=0, world_size=1)
    spec = {"source": "s3://data/x/", "format": "files", "rank": {"rank": 0, "world": 2}}
    with pytest.raises(ValueError, match="already sharded"):
        st.Dataset(stoker.from_spec(spec), rank=0, world_size=1)
    with pytest.raises(ValueError, match="policy"):
        st.Dataset(p, rank=0, world_size=1, policy="even")
    ds = st.Dataset(p, rank=0, world_size=1)
    with pytest.raises(ValueError, match="batch_size is the pipeline's"):
        st.DataLoader(ds, batch_size=4)
    with pytest.raises(TypeError, match="stoker.torch.Dataset"):
        st.DataLoader(p)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a stoker.torch state"):
        ds.load_state_dict({"epoch": 1})
    other = st.Dataset(p, rank=1, world_size=2).state_dict()
    with pytest.raises(ValueError, match="rank 1 of 2"):
        ds.load_state_dict(other)


def _gloo_rank(rank: int, world: int, init: str, options: dict, url: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        p = (
            stoker.from_url(url, format="tar", glob="*.tar", **options)
            .map("parse_int", field="cls")
            .shuffle_shards()
            .shuffle(8)
            .batch(3)
            .seed(11)
        )
        ds = st.Dataset(p)  # rank and world from torch.distributed
        seen = [int(i) for b in st.DataLoader(ds) for i in b["cls"]]
        batches = torch.tensor([len(list(st.DataLoader(ds)))])
        gathered = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(gathered, batches)
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"rank": ds.rank, "seen": seen, "batches": [int(g) for g in gathered]}, f)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_get_equal_batches_of_disjoint_samples(s3, prefix, tmp_path):
    url = npy_tar(s3, prefix, 29)
    init = f"file://{tmp_path / 'rendezvous'}"
    out = str(tmp_path / "rank")
    tmp.spawn(_gloo_rank, args=(2, init, s3.options, url, out), nprocs=2, join=True)
    reports = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert reports[0]["batches"] == reports[1]["batches"] == [5, 5]  # 14 samples, batches of 3
    a, b = (set(r["seen"]) for r in reports)
    assert len(a) == len(b) == 14 and not a & b


# Workers -------------------------------------------------------------------------------


def test_two_dataloader_workers_read_every_sample_exactly_once(s3, prefix):
    n = 48
    p = tensor_pipeline(s3, prefix, n).shuffle_shards().batch(5).seed(2)
    ds = st.Dataset(p, rank=0, world_size=1)
    got = list(st.DataLoader(ds, num_workers=2))
    seen = ids(got, "cls")
    assert sorted(seen) == list(range(n))
    for b in got:  # the tensor matches its sample
        assert b["bin"].dtype == torch.float32
        np.testing.assert_array_equal(b["bin"][:, 0, 0].numpy(), b["cls"].numpy())
    # With ranks too: disjoint across the 2 x 2 workers, equal batch counts per rank.
    per_rank = [
        list(st.DataLoader(st.Dataset(p, rank=r, world_size=2), num_workers=2)) for r in range(2)
    ]
    assert len(per_rank[0]) == len(per_rank[1])
    flat = [int(i) for batches in per_rank for b in batches for i in b["cls"]]
    assert sorted(flat) == list(range(n))


def test_workers_split_a_rank_s_share_without_leaving_anything_more_out(s3, prefix):
    n = 47
    p = tensor_pipeline(s3, prefix, n).batch(4)
    # One rank: the 2 workers read all 47 (23 and 24), nothing left out.
    ds = st.Dataset(p, rank=0, world_size=1)
    seen = [int(i) for b in st.DataLoader(ds, num_workers=2) for i in b["cls"]]
    assert sorted(seen) == list(range(n))
    # Two ranks of 3 workers: each rank gets floor(47 / 2) = 23, only 1 sample is left out
    # (not up to 2 x 3 - 1), and both ranks get the same number of batches.
    per_rank = [
        [b for b in st.DataLoader(st.Dataset(p, rank=r, world_size=2), num_workers=3)]
        for r in range(2)
    ]
    counts = [sum(len(b["cls"]) for b in batches) for batches in per_rank]
    assert counts == [23, 23]
    assert len(per_rank[0]) == len(per_rank[1])
    flat = [int(i) for batches in per_rank for b in batches for i in b["cls"]]
    assert len(set(flat)) == len(flat) == 46


def test_the_dataset_pickles_and_works_in_spawned_workers(s3, prefix):
    n = 20
    p = tensor_pipeline(s3, prefix, n).batch(4).seed(1)
    again = pickle.loads(pickle.dumps(p))
    assert again.explain() == p.explain()
    assert [b["cls"].tolist() for b in again] == [b["cls"].tolist() for b in p]
    ds = st.Dataset(p, rank=0, world_size=1)
    loader = TorchDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(int(i) for b in loader for i in b["cls"]) == list(range(n))


FORK_AFTER_RUN = """
import sys, stoker, stoker.torch as st
from torch.utils.data import DataLoader
p = stoker.from_url(sys.argv[1], format="tar", glob="*.tar", **eval(sys.argv[2])).batch(4)
ds = st.Dataset(p, rank=0, world_size=1)
next(iter(ds))  # Stoker's threads start in this process
try:
    list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    print("not refused")
except RuntimeError as e:
    print("refused" if "forked from a process in which Stoker's threads" in str(e) else e)
"""


def test_workers_forked_after_stoker_threads_refuse_and_the_loader_uses_forkserver(s3, prefix):
    n = 24
    p = tensor_pipeline(s3, prefix, n).batch(4)
    ds = st.Dataset(p, rank=0, world_size=1)
    it = iter(ds)
    first = next(it)  # a run and its threads exist in this process
    # A forked worker refuses (in a fresh interpreter: this one may hold JAX's threads,
    # which fork() does not like either).
    out = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_RUN, f"s3://data/{prefix}", repr(s3.options)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused"
    loader = st.DataLoader(ds, num_workers=2)
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    assert sorted(int(i) for b in loader for i in b["cls"]) == list(range(n))
    # The parent's run goes on untouched.
    assert first["cls"].tolist() + [int(i) for b in it for i in b["cls"]] == list(range(n))


FORK_SCRIPT = """
import sys, stoker, stoker.torch as st
from torch.utils.data import DataLoader
p = (stoker.from_url(sys.argv[1], format="tar", glob="*.tar", **eval(sys.argv[2]))
     .map("parse_int", field="cls").batch(4))
ds = st.Dataset(p, rank=0, world_size=1)
for epoch in range(2):  # workers forked anew each epoch, from a parent that runs nothing
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    print(sorted(int(i) for b in loader for i in b["cls"]))
"""


def test_fork_workers_rebuild_their_handles_in_the_child(s3, prefix):
    url = npy_tar(s3, prefix, 24)
    out = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, url, repr(s3.options)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [str(list(range(24)))] * 2


def test_a_run_cannot_be_pickled():
    with pytest.raises(TypeError):
        pickle.dumps(numbers(3).run())


# Resume --------------------------------------------------------------------------------


def batches_as_lists(batches) -> list[list[int]]:
    return [[int(i) for i in b["cls"]] for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_resumes_mid_epoch_exactly(s3, prefix, workers):
    p = (
        tensor_pipeline(s3, prefix, 40)
        .shuffle_shards()
        .interleave(2)
        .shuffle(7)
        .batch(3)
        .epochs(2)
        .seed(9)
    )

    def dataset():
        return st.Dataset(p, rank=1, world_size=2)

    full = batches_as_lists(st.DataLoader(dataset(), num_workers=workers))
    # 20 samples of this rank per epoch, or 10 per worker; batches end with the epoch.
    assert len(full) == {0: 14, 2: 16}[workers]
    rng = random.Random(workers)
    for stop in sorted(rng.sample(range(1, len(full)), 3)) + [0, len(full)]:
        loader = st.DataLoader(dataset(), num_workers=workers)
        it = iter(loader)
        head = batches_as_lists(next(it) for _ in range(stop))
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        resumed = st.DataLoader(dataset(), num_workers=workers)
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        # Stop the resumed run again and resume from there.
        it2 = iter(resumed)
        mid = batches_as_lists(next(it2) for _ in range(min(2, len(full) - stop)))
        state2 = resumed.state_dict()
        del it2
        again = st.DataLoader(dataset(), num_workers=workers)
        again.load_state_dict(state2)
        tail = batches_as_lists(again)
        assert head + mid + tail == full, (stop, workers)
    # The iteration after a resumed one is the next: epochs 2 and 3 (two per iteration).
    later = dataset()
    later.set_epoch(2)
    assert again.epoch == 2
    assert batches_as_lists(again) == batches_as_lists(st.DataLoader(later, num_workers=workers))


@pytest.mark.parametrize("workers", [0, 2])
def test_each_iteration_is_the_next_epoch(s3, prefix, workers):
    p = tensor_pipeline(s3, prefix, 24).shuffle_shards().shuffle(8).batch(4).seed(5)
    loader = st.DataLoader(st.Dataset(p), num_workers=workers)
    epochs = [batches_as_lists(loader) for _ in range(3)]
    # A new order every epoch, each epoch whole, and exactly the epochs of one run of three
    # (without workers; with them each worker runs its part of each epoch).
    assert len({str(e) for e in epochs}) == 3
    assert all(sorted(sum(e, [])) == sorted(sum(epochs[0], [])) for e in epochs)
    if workers == 0:
        assert sum(epochs, []) == batches_as_lists(st.DataLoader(st.Dataset(p.epochs(3))))
    # set_epoch picks the epoch; the loader's and its dataset's are the same.
    loader.set_epoch(1)
    assert batches_as_lists(loader) == epochs[1]
    assert loader.epoch == 2 and loader.dataset.epoch == 2
    # A pipeline's own first_epoch is where the first iteration starts.
    assert batches_as_lists(st.DataLoader(st.Dataset(p.first_epoch(2)), num_workers=workers)) == epochs[2]
    # A state taken after an epoch ended resumes at the next epoch's start.
    loader.set_epoch(0)
    assert batches_as_lists(loader) == epochs[0]
    end = loader.state_dict()
    assert end["epoch"] == 1 and end["splits"] == {}
    resumed = st.DataLoader(st.Dataset(p), num_workers=workers)
    resumed.load_state_dict(end)
    assert batches_as_lists(resumed) == epochs[1]


def test_persistent_workers_run_each_epoch_once_after_a_resume(s3, prefix):
    p = tensor_pipeline(s3, prefix, 24).shuffle(8).batch(4).seed(6)
    plain = st.DataLoader(st.Dataset(p), num_workers=2)
    epochs = [batches_as_lists(plain) for _ in range(3)]
    first = st.DataLoader(st.Dataset(p), num_workers=2)
    it = iter(first)
    head = batches_as_lists(next(it) for _ in range(2))
    state = first.state_dict()
    del it
    loader = st.DataLoader(st.Dataset(p), num_workers=2, persistent_workers=True)
    loader.load_state_dict(state)
    # The rest of epoch 0, then epochs 1 and 2 whole: the resumed start is used once.
    assert head + batches_as_lists(loader) == epochs[0]
    assert batches_as_lists(loader) == epochs[1]
    assert batches_as_lists(loader) == epochs[2]
    # The persistent workers count epochs themselves: a set_epoch cannot reach them, and
    # says so rather than read another epoch than asked.
    loader.set_epoch(0)
    with pytest.raises(RuntimeError, match="persistent_workers=True"):
        batches_as_lists(loader)
    with pytest.raises(RuntimeError, match="persistent_workers=True"):
        loader.load_state_dict(state)


def test_dataset_state_dict_without_a_loader_and_mismatched_workers(s3, prefix):
    p = tensor_pipeline(s3, prefix, 16).shuffle(5).batch(2).seed(4)
    ds = st.Dataset(p, rank=0, world_size=1)
    full = batches_as_lists(ds)
    ds.set_epoch(0)
    it = iter(TorchDataLoader(ds, batch_size=None))
    head = batches_as_lists(next(it) for _ in range(3))
    state = ds.state_dict()
    ds2 = st.Dataset(p, rank=0, world_size=1)
    ds2.load_state_dict(state)
    assert head + batches_as_lists(TorchDataLoader(ds2, batch_size=None)) == full
    with pytest.raises(ValueError, match="same number"):
        st.DataLoader(ds, num_workers=2).load_state_dict(state)


def test_workers_refuse_a_pipeline_that_does_not_pickle_and_say_why():
    p = numbers(4).map(lambda s: s, workers="threads")
    with pytest.raises(TypeError, match="num_workers=2 the dataset is pickled.*lambda"):
        st.DataLoader(st.Dataset(p), num_workers=2)
    assert len(list(st.DataLoader(st.Dataset(p)))) == 4  # fine without workers


def test_a_data_error_in_a_worker_reaches_the_loop(s3, prefix):
    # DataError pickles (a DataLoader worker sends its exception to the main process), so
    # a bad record in a worker stops the loop with it instead of ending the epoch early.
    samples = [{"txt": b"ok"}, {"txt": b"\xff\xfe"}] + [{"txt": b"fine"}] * 6
    p = stoker.from_samples(samples).map("decode_utf8", field="txt")
    loader = st.DataLoader(st.Dataset(p, to_torch=False), num_workers=1)
    seen = []
    with pytest.raises(stoker.DataError, match="decode_utf8"):
        for item in loader:
            seen.append(item)
    assert len(seen) == 1
    err = stoker.DataError("bad")
    err.object = "s3://b/k"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is stoker.DataError and back.object == "s3://b/k"


def test_a_state_of_the_wrong_rank_is_refused():
    ds0 = st.Dataset(numbers(8), rank=0, world_size=2)
    ds1 = st.Dataset(numbers(8), rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank 0 of 2"):
        ds1.load_state_dict(ds0.state_dict())


# Epochs share the store ------------------------------------------------------------------


def server_requests(s3) -> int:
    return int(s3.control("stats")["requests"])


def test_an_epoch_reads_what_the_last_one_cached(s3, prefix):
    stoker.io.clear_cache()
    p = tensor_pipeline(s3, prefix, 24).shuffle_shards().batch(4).seed(5)
    loader = st.DataLoader(st.Dataset(p))
    before = server_requests(s3)
    first = batches_as_lists(loader)
    assert server_requests(s3) - before >= 3  # the three shards (and the listing)
    # The next epoch is a new run over the same shared store: nothing is fetched again.
    before = server_requests(s3)
    second = batches_as_lists(loader)
    assert server_requests(s3) - before <= 1  # at most a listing
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))
    # stoker.io.open reads through the same store.
    before = server_requests(s3)
    with stoker.io.open(f"s3://data/{prefix}shard-00000.tar", **s3.options) as f:
        assert f.read(512)[:5] == b"00000"
    assert server_requests(s3) == before
    # share_store=False: each epoch starts with a store of its own.
    own = st.DataLoader(st.Dataset(p.options(share_store=False)))
    assert batches_as_lists(own) == first
    before = server_requests(s3)
    assert batches_as_lists(own) == second
    assert server_requests(s3) - before >= 3
    # Cleared: the next epoch fetches again.
    stoker.io.clear_cache()
    before = server_requests(s3)
    batches_as_lists(loader)
    assert server_requests(s3) - before >= 3
