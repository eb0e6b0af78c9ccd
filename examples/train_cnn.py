"""Train a small CNN for a few steps on JPEGs read by a Stoker pipeline (CPU).

    python examples/train_cnn.py [--data DIR] [--steps 60]

Without ``--data`` it generates a small ImageFolder (4 classes of 48x48 JPEGs) in a
temporary directory. The pipeline decodes, crops, flips and normalises in the engine;
``stoker.torch.DataLoader`` hands over the batches as torch tensors over Stoker's memory
(DLPack, no copy). Halfway it checkpoints the loader's position and at the end checks that
a loader restored from that checkpoint yields exactly the batch that followed it. It
asserts that the loss fell and that the model classifies the images.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import torch
from torch import nn

import stoker
import stoker.torch as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from jpeg_folder import make_imagefolder  # noqa: E402

CLASSES = 4


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, CLASSES),
    )


def train_pipeline(url: str, batch: int) -> stoker.Pipeline:
    return (
        stoker.from_url(url, format="imagefolder")
        .shuffle_shards()  # one image per object: a full shuffle, new every epoch
        .map("decode_image", field="jpg")
        .map("random_resized_crop", field="jpg", size=[32, 32], scale=[0.6, 1.0])
        .map("random_flip", field="jpg")
        .map("image_to_tensor", field="jpg", normalize="imagenet")
        .batch(batch, drop_last=True)
        .epochs(None)
        .seed(7)
    )


def eval_pipeline(url: str) -> stoker.Pipeline:
    return (
        stoker.from_url(url, format="imagefolder")
        .map("decode_image", field="jpg")
        .map("resize", field="jpg", size=[32, 32])
        .map("image_to_tensor", field="jpg", normalize="imagenet")
        .batch(64)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="an ImageFolder directory (default: generate one)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    tmp = None
    if args.data is None:
        tmp = tempfile.TemporaryDirectory()
        args.data = str(make_imagefolder(tmp.name, classes=CLASSES))
    url = str(pathlib.Path(args.data).resolve()) + "/"
    started = time.perf_counter()

    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    loader = st.DataLoader(st.Dataset(train_pipeline(url, args.batch)))
    losses: list[float] = []
    checkpoint = None
    after_checkpoint: list[str] | None = None
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        images, labels = batch["jpg"], batch["label"]
        loss = nn.functional.cross_entropy(net(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == args.steps // 2:
            checkpoint = {"data": loader.state_dict(), "model": net.state_dict()}
        elif checkpoint is not None and after_checkpoint is None:
            after_checkpoint = list(batch["__key__"])
        if step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.3f}")

    # Resume the data exactly where the checkpoint was taken.
    restored = st.DataLoader(st.Dataset(train_pipeline(url, args.batch)))
    restored.load_state_dict(checkpoint["data"])
    resumed_keys = list(next(iter(restored))["__key__"])
    assert resumed_keys == after_checkpoint, "the restored loader did not continue exactly"

    net.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in st.DataLoader(st.Dataset(eval_pipeline(url))):
            pred = net(batch["jpg"]).argmax(1)
            correct += int((pred == batch["label"]).sum())
            total += len(pred)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    accuracy = correct / total
    print(
        f"{len(losses)} steps in {time.perf_counter() - started:.1f} s: loss {first:.3f} -> "
        f"{last:.3f}, accuracy {accuracy:.2f} on {total} images; resume exact"
    )
    assert last < 0.7 * first, f"the loss did not fall enough: {first:.3f} -> {last:.3f}"
    assert accuracy >= 0.9, f"accuracy {accuracy:.2f}"
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
