"""``Pipeline.distribute`` on a local Ray cluster of two nodes (``ray.cluster_utils.Cluster``,
the machine's CPUs split between them): every sample exactly once per epoch, the local
run's order, a worker killed mid-epoch, scaling up and down mid-epoch, resuming at random
points with another worker count, pieces taken as they finish, and the error without Ray.

Ray is an optional dependency: where it is not installed these tests are skipped, except
under ``STOKER_REQUIRE_RAY=1`` (``.ci/run`` sets it, and installs Ray)."""

from __future__ import annotations

import collections
import os
import random
import sys
import time

import pytest

import stoker
import stoker.service

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # pragma: no cover - CI installs Ray
    if os.environ.get("STOKER_REQUIRE_RAY") == "1":
        raise
    pytest.skip("Ray is not installed (pip install './python[ray]')", allow_module_level=True)


# The workers unpickle this module's functions by value (they cannot import it).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def samples(n: int) -> list[dict]:
    return [{"__key__": f"k{i:04d}", "i": i} for i in range(n)]


def slow(s):
    time.sleep(0.004)
    return s


def pipeline(n: int = 120, batch: int = 8, epochs: int = 2, fn=None):
    p = stoker.from_samples(samples(n)).shuffle_shards().map("random_int", to="r", below=10**6)
    if fn is not None:
        p = p.map(fn, workers="threads")
    return p.batch(batch).seed(11).epochs(epochs)


def view(batch) -> tuple:
    return (tuple(batch["__key__"]), tuple(batch["r"].tolist()))


def local(p) -> list[tuple]:
    return [view(b) for b in p]


def test_every_sample_once_per_epoch_in_the_local_runs_order(cluster):
    p = pipeline(n=200, epochs=3)
    want = local(p)
    run = p.distribute(2, cpus_per_worker=1).run()
    # One worker on each node.
    nodes = set(ray.get([w.node.remote() for w in run._workers]))
    got = [view(b) for b in run]
    assert got == want
    assert len(nodes) == 2, nodes
    keys = collections.Counter(k for b in got for k in b[0])
    assert set(keys.values()) == {3} and len(keys) == 200
    st = run.stats()
    assert st["pieces_done"] == 3 * st["pieces_per_epoch"] and st["pieces_redone"] == 0, st
    # Cut at whole batches: 200 samples, batches of 8, so pieces of a multiple of 8.
    assert st["piece"] % 8 == 0, st


def test_a_worker_killed_mid_epoch_loses_and_repeats_nothing(cluster):
    p = pipeline(n=160, epochs=1, fn=slow)
    want = local(p)
    run = p.distribute(2, piece=16, cpus_per_worker=0.5).run()
    got = [view(next(run)) for _ in range(3)]
    victim = run._workers[0]
    assert run._held(victim) > 0
    ray.kill(victim, no_restart=True)
    got += [view(b) for b in run]
    assert got == want
    assert run.stats()["pieces_redone"] >= 1, run.stats()


def test_large_arrays_come_through_shared_segments_on_the_consumer_s_node(cluster):
    # Batches of 2 x 1 MiB: a worker on the consumer's node hands them over in its shared
    # segments (stoker.handoff: writable arrays, no object-store copy), the other node's
    # through the object store (read-only). Arrays taken before their worker is killed stay
    # whole, and nothing is lost or repeated.
    import numpy as np

    def big(s):
        s["x"] = np.full((256, 1024), s["i"], dtype=np.float32)
        return s

    p = (stoker.from_samples(samples(48)).shuffle_shards().map(big, workers="threads")
         .map("random_int", to="r", below=10**6).batch(2).seed(5).epochs(2))
    want = local(p)
    run = p.distribute(2, piece=6, cpus_per_worker=0.5).run()
    held, got = [], []
    for b in run:
        got.append(view(b))
        held.append(b)
        if len(got) == 20:
            ray.kill(run._workers[0], no_restart=True)
    assert got == want
    for b in held:
        assert b["x"].shape == (2, 256, 1024)
        np.testing.assert_array_equal(b["x"][:, 0, 0], np.asarray(b["i"], dtype=np.float32))
        assert (b["x"] == b["x"][:, :1, :1]).all()
    writable = [b["x"].flags.writeable for b in held]
    assert any(writable), "no batch came through a shared segment"


def test_a_spec_with_a_distribute_table_is_the_distributed_pipeline(cluster, tmp_path):
    from stoker.distributed import DistributedPipeline

    for i in range(30):
        (tmp_path / f"{i:02d}.txt").write_text(f"line {i}")
    spec = f"""source = "{tmp_path}"
format = "files"
seed = 3
shuffle_shards = true
[[ops]]
op = "random_int"
to = "r"
below = 1000000
[[ops]]
op = "batch"
size = 4
"""
    dist = stoker.from_spec(spec + "[distribute]\nworkers = 2\npiece = 8\ncpus_per_worker = 0.5\n")
    assert isinstance(dist, DistributedPipeline)
    assert (dist.workers, dist.piece, dist.cpus_per_worker) == (2, 8, 0.5)
    want = [(tuple(b["__key__"]), tuple(b["r"].tolist())) for b in stoker.from_spec(spec)]
    assert [(tuple(b["__key__"]), tuple(b["r"].tolist())) for b in dist] == want
    with pytest.raises(ValueError, match="no worker "):
        stoker.from_spec(spec + "[distribute]\nworker = 2\n")


def test_a_ray_that_stoker_starts_runs_its_workers_at_normal_priority(cluster, tmp_path):
    # Ray's own default (niceness 15) starves the workers under competing load; a Ray that
    # distribute() starts itself (none initialised in the process) runs them at 0, and
    # RAY_worker_niceness still decides. In a process of its own (this one has Ray up).
    import subprocess

    script = tmp_path / "nice.py"
    script.write_text(
        "import ray, stoker\n"
        "p = stoker.from_samples([{'i': i} for i in range(8)]).batch(2).distribute(1, cpus_per_worker=0.5)\n"
        "run = p.run()\n"
        "next(run)\n"
        "print('niceness', ray.get(run._workers[0].niceness.remote()))\n"
        "assert sum(1 for _ in run) == 3\n"
        "import os; assert 'RAY_worker_niceness' not in os.environ or os.environ['RAY_worker_niceness'] == '7'\n"
    )
    for env, want in (({}, 0), ({"RAY_worker_niceness": "7"}, 7)):
        e = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
        out = subprocess.run([sys.executable, str(script)], env={**e, **env}, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"niceness {want}" in out.stdout, out.stdout


def test_scale_up_and_down_mid_epoch(cluster):
    p = pipeline(n=240, epochs=2, fn=slow)
    want = local(p)
    run = p.distribute(1, piece=16, cpus_per_worker=0.5).run()
    got = [view(next(run)) for _ in range(4)]
    run.scale(3)
    assert run.workers == 3
    got += [view(next(run)) for _ in range(10)]
    run.scale(1)
    assert run.workers == 1
    got += [view(b) for b in run]
    assert got == want
    with pytest.raises(ValueError, match="at least 1"):
        run.scale(0)


def test_resume_at_random_points_with_another_worker_count(cluster):
    p = pipeline(n=96, batch=8, epochs=2)
    want = local(p)
    rng = random.Random(5)
    for _ in range(3):
        k = rng.randrange(1, len(want))
        run = p.distribute(2, piece=16, cpus_per_worker=0.5).run()
        head = [view(next(run)) for _ in range(k)]
        state = run.state_dict()
        run.close()
        resumed = p.distribute(rng.choice([1, 3]), cpus_per_worker=0.5).resume(state)
        assert head + [view(b) for b in resumed] == want, k


def test_a_distributed_state_resumes_locally_and_a_local_one_on_ray(cluster):
    p = pipeline(n=96, batch=8, epochs=2)
    want = local(p)
    for k in (3, 7, 12, 17):
        # Ray -> this machine -> Ray.
        run = p.distribute(2, piece=16, cpus_per_worker=0.5).run()
        got = [view(next(run)) for _ in range(k)]
        state = run.state_dict()
        run.close()
        here = p.resume(state)
        got += [view(next(here)) for _ in range(2)]
        back = p.distribute(1, cpus_per_worker=0.5).resume(here.state_dict())
        here.close()
        assert got + [view(b) for b in back] == want, k
        # This machine -> Ray, at a position inside a piece (batch 5 is inside the third
        # piece of 16 samples) or at its start.
        r = p.run()
        head = [view(next(r)) for _ in range(k)]
        state = r.state_dict()
        r.close()
        rest = p.distribute(2, piece=16, cpus_per_worker=0.5).resume(state)
        assert head + [view(b) for b in rest] == want, k
    # A shuffle the optimizer turns into a permutation of the objects holds nothing: the
    # same items on Ray, and its local state resumes there.
    q = stoker.from_samples(samples(96)).map("random_int", to="r", below=10**6).shuffle(16).batch(8).seed(3)
    want = local(q)
    assert [view(b) for b in q.distribute(2, piece=16, cpus_per_worker=0.5)] == want
    r = q.run()
    head = [view(next(r)) for _ in range(5)]
    assert head + [view(b) for b in q.distribute(1, piece=16, cpus_per_worker=0.5).resume(r.state_dict())] == want
    # A local state that holds samples in a stage (a shuffle of batches) cannot be cut into
    # pieces.
    q = stoker.from_samples(samples(96)).batch(8).shuffle(4).seed(3)
    r = q.run()
    next(r)
    with pytest.raises(ValueError, match="holds samples in a stage .shuffle"):
        q.distribute(1, piece=16).resume(r.state_dict())


def test_pieces_as_they_finish_give_each_sample_once(cluster):
    p = pipeline(n=128, epochs=2, fn=slow)
    want = local(p)
    got = [view(b) for b in p.distribute(2, piece=16, ordered=False, cpus_per_worker=0.5)]
    # The same batches each epoch (pieces are whole batches), perhaps in another order.
    half = len(want) // 2
    assert sorted(got[:half]) == sorted(want[:half])
    assert sorted(got[half:]) == sorted(want[half:])


def test_bad_arguments_and_a_foreign_state(cluster):
    p = pipeline()
    with pytest.raises(ValueError, match="workers"):
        p.distribute(0)
    with pytest.raises(ValueError, match="max_workers"):
        p.distribute(2, min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="not a state of a distributed run"):
        p.distribute(1).resume({"version": 1, "kind": "local"})
    other = stoker.from_samples(samples(7)).batch(8)
    state = p.distribute(1, cpus_per_worker=0.5).run().state_dict()
    with pytest.raises(ValueError, match="entries"):
        other.distribute(1).resume(state)


def test_auto_adds_workers_while_the_consumer_waits(cluster):
    p = pipeline(n=640, epochs=1, fn=slow)
    want = local(p)
    run = p.distribute(
        "auto", min_workers=1, max_workers=3, piece=16, cpus_per_worker=0.5, tune_s=0.3
    ).run()
    assert run.workers == 1
    seen = []
    got = []
    for b in run:
        got.append(view(b))
        seen.append(run.workers)
    assert got == want
    # One worker makes about 250 samples/s, and the consumer waits on it: more are added,
    # up to max_workers, each decision recorded with its reason.
    assert max(seen) >= 2, seen
    assert max(seen) <= 3, seen
    ups = [d for d in run.stats()["scaling"] if "waited" in d["why"]]
    assert ups and ups[0]["workers"] == 2, run.stats()["scaling"]


def test_auto_removes_workers_while_pieces_wait_for_the_consumer(cluster):
    p = pipeline(n=2400, epochs=1)
    want = local(p)
    run = p.distribute(
        "auto", min_workers=1, max_workers=3, piece=8, cpus_per_worker=0.5, tune_s=0.2
    ).run()
    run.scale(3)
    got = []
    seen = []
    for b in run:
        got.append(view(b))
        seen.append(run.workers)
        if run.workers > 1:
            time.sleep(0.06)  # a slow training step: the workers are ahead
    assert got == want
    assert seen[0] == 3 and min(seen) == 1, (seen, run.stats()["scaling"])
    downs = [d for d in run.stats()["scaling"] if "pieces were waiting" in d["why"]]
    assert [d["workers"] for d in downs][:2] == [2, 1], run.stats()["scaling"]
    assert "auto" in p.distribute("auto", max_workers=3).explain()


def test_torch_dataset_takes_a_distributed_pipeline_and_resumes_it(cluster):
    torch_mod = pytest.importorskip("stoker.torch")
    p = pipeline(n=200, epochs=1)
    dp = p.distribute(2, piece=16, cpus_per_worker=0.5)
    for rank in range(2):
        want = [view(b) for b in torch_mod.Dataset(p, rank=rank, world_size=2, to_torch=False)]
        ds = torch_mod.Dataset(dp, rank=rank, world_size=2, to_torch=False)
        it = iter(ds)
        head = [view(next(it)) for _ in range(3)]
        state = ds.state_dict()
        again = torch_mod.Dataset(dp, rank=rank, world_size=2, to_torch=False)
        again.load_state_dict(state)
        assert head + [view(b) for b in again] == want, rank
        # The rest of the first iteration too, and the next epoch of both.
        assert head + [view(b) for b in it] == want
    loader = torch_mod.DataLoader(
        torch_mod.Dataset(dp, rank=0, world_size=2), batch_size=None, num_workers=1
    )
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(loader))


@ray.remote(num_cpus=0)
def consume(name: str, i: int) -> list:
    import stoker.service

    return [view(b) for b in stoker.service.attach(name, i)]


def test_a_service_shared_by_two_consumers_makes_each_piece_once(cluster):
    p = pipeline(n=160, epochs=2)
    want = local(p)
    with p.serve("shared-test", workers=2, consumers=2, piece=16, cpus_per_worker=0.5) as svc:
        got = ray.get([consume.remote("shared-test", i) for i in range(2)])
        st = svc.stats()
    # Each consumer reads both epochs whole, in the local run's order; every piece was made
    # once for the two.
    assert got[0] == want and got[1] == want
    assert st["pieces_made"] == 2 * st["pieces_per_epoch"][0] and st["pieces_redone"] == 0, st


def test_a_service_split_between_two_consumers_gives_equal_shares_once(cluster):
    p = pipeline(n=170, epochs=2, fn=slow)
    with p.serve("split-test", workers=2, consumers=2, mode="split", piece=16, cpus_per_worker=0.5) as svc:
        futures = [consume.remote("split-test", i) for i in range(2)]
        time.sleep(0.5)
        # A worker dies mid-epoch: its pieces are made again, nothing lost or repeated.
        ray.kill(ray.get(svc._actor.worker_handles.remote())[0], no_restart=True)
        got = ray.get(futures)
        st = svc.stats()
    for i in range(2):
        assert got[i] == local(p.shard(i, 2)), i
    # 170 samples, two consumers: 85 each per epoch ("drop" keeps floor(170 / 2)), batches
    # of 8: the same count for both.
    assert len(got[0]) == len(got[1])
    for epoch in range(2):
        keys = [k for g in got for b in g[len(g) // 2 * epoch : len(g) // 2 * (epoch + 1)] for k in b[0]]
        assert len(keys) == len(set(keys)) == 170, epoch
    assert st["pieces_redone"] >= 1, st
    with pytest.raises(LookupError, match="no Stoker service"):
        next(stoker.service.attach("split-test", 0))


def test_a_pipeline_as_a_ray_data_dataset(cluster):
    p = pipeline(n=100, epochs=1)
    want = sorted((k, r) for keys, rs in local(p) for k, r in zip(keys, rs))
    ds = p.to_ray_data(piece=16)
    rows = ds.take_all()
    assert sorted((row["__key__"], int(row["r"])) for row in rows) == want
    # Ray Data's own transformations on it.
    doubled = ds.map_batches(lambda b: {"r2": b["r"] * 2}, batch_format="numpy").sum("r2")
    assert doubled == 2 * sum(r for _, r in want)
    # Without a batch: a sample a row, of any shape (a format read into Ray Data as is).
    import numpy as np

    def ragged(s):
        s["v"] = np.arange(s["i"] % 5, dtype=np.int32)
        s["img"] = np.full((2, 3), s["i"], dtype=np.uint8)
        s["txt"] = f"text {s['i']}"
        return s

    q = stoker.from_samples(samples(40)).map(ragged, workers="threads").seed(2)
    rows = q.to_ray_data(piece=16, block_rows=6).take_all()
    assert len(rows) == 40
    for row in rows:
        i = int(row["i"])
        assert row["__key__"] == f"k{i:04d}" and row["txt"] == f"text {i}"
        np.testing.assert_array_equal(row["v"], np.arange(i % 5))
        np.testing.assert_array_equal(row["img"], np.full((2, 3), i, dtype=np.uint8))
    assert sorted(int(r["i"]) for r in rows) == list(range(40))
    with pytest.raises(ValueError, match="block_rows"):
        q.to_ray_data(block_rows=0)


def _explode():
    raise RuntimeError("this function cannot be rebuilt in a worker")


class Unbuildable:
    """A function that pickles but fails to unpickle: the workers cannot start."""

    def __call__(self, s):
        return s

    def __reduce__(self):
        return (_explode, ())


def test_workers_that_cannot_start_are_an_error_not_a_hang(cluster):
    p = stoker.from_samples(samples(20)).map(Unbuildable(), workers="threads")
    with pytest.raises(RuntimeError, match="died before finishing a piece"):
        list(p.distribute(1, cpus_per_worker=0.5))


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"python\[ray\]"):
        stoker.from_samples(samples(3)).distribute(2)
