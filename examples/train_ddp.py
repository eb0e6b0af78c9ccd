"""The same CNN trained with torch.distributed (gloo, CPU) on 2 processes.

    python examples/train_ddp.py [--data DIR] [--world 2] [--epochs 3]

Each process builds the same pipeline; ``stoker.torch.Dataset`` reads its rank and the
world size from ``torch.distributed`` and shards the pipeline in the engine, so every rank
gets the same number of batches (an uneven rank would hang DDP's all-reduce at the end of
an epoch). The example checks that: equal batch counts, disjoint samples across ranks in
every epoch, the loss fell, and the replicas' weights are identical at the end.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import stoker
import stoker.torch as st

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from jpeg_folder import make_imagefolder  # noqa: E402
from train_cnn import CLASSES, model  # noqa: E402


def pipeline(url: str, epochs: int) -> stoker.Pipeline:
    return (
        stoker.from_url(url, format="imagefolder")
        .shuffle_shards()
        .map("decode_image", field="jpg")
        .map("random_resized_crop", field="jpg", size=[32, 32], scale=[0.6, 1.0])
        .map("random_flip", field="jpg")
        .map("image_to_tensor", field="jpg", normalize="imagenet")
        .batch(8)  # drop_last=False: the shard keeps ranks equal, not the batching
        .epochs(epochs)
        .seed(3)
    )


def worker(rank: int, world: int, init: str, url: str, epochs: int) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)  # the same initial weights on every rank
    torch.set_num_threads(1)
    net = DDP(model())
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    ds = st.Dataset(pipeline(url, epochs))  # rank and world from torch.distributed
    assert (ds.rank, ds.world_size) == (rank, world)
    losses: list[float] = []
    keys: list[str] = []
    for batch in st.DataLoader(ds):
        loss = nn.functional.cross_entropy(net(batch["jpg"]), batch["label"])
        opt.zero_grad()
        loss.backward()  # all-reduces gradients: every rank must take part every step
        opt.step()
        losses.append(loss.item())
        keys.extend(batch["__url__"])
    weights = torch.cat([p.detach().flatten() for p in net.parameters()])
    report = {"steps": len(losses), "keys": keys, "losses": losses, "weights": weights}
    reports: list[dict] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(reports, report)
    if rank == 0:
        check(reports, epochs)
    dist.destroy_process_group()


def check(reports: list[dict], epochs: int) -> None:
    steps = [r["steps"] for r in reports]
    assert len(set(steps)) == 1 and steps[0] > 0, f"unequal batch counts per rank: {steps}"
    per_epoch = len(reports[0]["keys"]) // epochs
    for e in range(epochs):
        seen = [set(r["keys"][e * per_epoch : (e + 1) * per_epoch]) for r in reports]
        assert sum(len(s) for s in seen) == len(set().union(*seen)), "ranks overlapped"
    first = sum(r["losses"][0] for r in reports) / len(reports)
    last = sum(r["losses"][-1] for r in reports) / len(reports)
    assert last < 0.7 * first, f"the loss did not fall enough: {first:.3f} -> {last:.3f}"
    for r in reports[1:]:
        assert torch.equal(r["weights"], reports[0]["weights"]), "replicas diverged"
    print(
        f"{len(reports)} ranks x {steps[0]} steps ({per_epoch} images per rank per epoch, "
        f"disjoint): loss {first:.3f} -> {last:.3f}, replicas identical"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="an ImageFolder directory (default: generate one)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or str(make_imagefolder(os.path.join(tmp, "data"), classes=CLASSES))
        url = str(pathlib.Path(data).resolve()) + "/"
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        started = time.perf_counter()
        mp.spawn(worker, args=(args.world, init, url, args.epochs), nprocs=args.world)
        print(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
