"""Every built-in per-sample operator through the Python API (``Pipeline.map("op", ...)``),
and the spec-level ``pack`` stage (``Pipeline.apply``): shapes, dtypes and values against
independent NumPy / PIL / stdlib references; random operators for determinism under one
seed and a property that holds whatever they drew."""

from __future__ import annotations

import io
import json
import math
import pathlib
import wave

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image, ImageFilter

import stoker
from datasets import norm

REPO = pathlib.Path(__file__).resolve().parents[2]
TEXT_FIXTURES = REPO / "crates/stoker-ops/tests/fixtures/text"


# Helpers ----------------------------------------------------------------------------------


def run(samples, *ops, seed=None, batch=None):
    """The items of ``from_samples(samples)`` with ``ops`` (``(name, params)``) mapped; with
    ``batch``, the operators run on batches of that size (column-wise)."""
    p = stoker.from_samples(samples)
    if batch is not None:
        p = p.batch(batch)
    for op, params in ops:
        p = p.map(op, **params)
    if seed is not None:
        p = p.seed(seed)
    return list(p)


def one(value, op, field="x", seed=None, **params):
    """``op`` on a single sample ``{field: value}``; returns the output field."""
    return run([{field: value}], (op, dict(field=field, **params)), seed=seed)[0][field]


def image(h=12, w=16, seed=0, c=3):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def images(n=12, h=12, w=16):
    return [{"img": image(h, w, seed=i)} for i in range(n)]


def outputs(n_or_samples, op, seed, **params):
    """The ``img`` outputs of ``op`` over several images, as a list of arrays (copied)."""
    samples = images(n_or_samples) if isinstance(n_or_samples, int) else n_or_samples
    return [np.array(s["img"]) for s in run(samples, (op, dict(field="img", **params)), seed=seed)]


def same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


def assert_seeded(samples, op, **params):
    """The same seed gives the same outputs in two runs; another seed gives others."""
    a = outputs(samples, op, 5, **params)
    b = outputs(samples, op, 5, **params)
    assert same(a, b), f"{op}: two runs with one seed differ"
    c = outputs(samples, op, 6, **params)
    assert not same(a, c), f"{op}: another seed drew exactly the same for every sample"
    return a


def wav(frames: np.ndarray, rate: int, width: int = 2) -> bytes:
    """A WAV file (stdlib ``wave``) of integer PCM ``frames`` ``[N, C]``."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(frames).tobytes())
    return buf.getvalue()


def signal(n=1000, rate=8000, channels=2, seed=0):
    """A clip in [-1, 1): a 440 Hz sine, a 1.3 kHz one and some noise, per channel."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    rows = [
        0.4 * np.sin(2 * np.pi * 440 * t + c) + 0.2 * np.sin(2 * np.pi * 1300 * t) + 0.05 * rng.standard_normal(n)
        for c in range(channels)
    ]
    return np.clip(np.stack(rows), -1, 0.999).astype(np.float32)


def clip_sample(x: np.ndarray, rate: int) -> dict:
    return {"audio": x, "audio_sample_rate": rate}


# Image geometry ---------------------------------------------------------------------------


def center_crop_ref(img, h, w):
    """torchvision's center_crop: zero padding where the crop is larger, then the crop at
    ``round((H - h) / 2)``."""
    ih, iw = img.shape[:2]
    if h > ih or w > iw:
        top, bottom = ((h - ih) // 2, (h - ih + 1) // 2) if h > ih else (0, 0)
        left, right = ((w - iw) // 2, (w - iw + 1) // 2) if w > iw else (0, 0)
        img = np.pad(img, ((top, bottom), (left, right), (0, 0)))
        ih, iw = img.shape[:2]
    t = int(round((ih - h) / 2.0))
    left = int(round((iw - w) / 2.0))
    return img[t : t + h, left : left + w]


@pytest.mark.parametrize(
    "size",
    [[4, 6], [5, 7], 9, [12, 16], [15, 20], [16, 9]],
    ids=["even", "odd-offsets", "square", "whole", "larger", "taller"],
)
def test_center_crop_is_the_centre_slice_or_zero_padding(size):
    img = image(12, 16)
    got = one(img, "center_crop", size=size)
    h, w = (size, size) if isinstance(size, int) else size
    assert got.dtype == np.uint8 and got.shape == (h, w, 3)
    np.testing.assert_array_equal(got, center_crop_ref(img, h, w))


def pad_ref(img, padding, mode, fill=0):
    left, top, right, bottom = {1: padding * 4, 2: padding * 2, 4: padding}[len(padding)]
    widths = ((top, bottom), (left, right), (0, 0))
    if mode == "constant":
        return np.pad(img, widths, constant_values=fill)
    return np.pad(img, widths, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize("padding", [[2], [1, 3], [1, 2, 3, 4]], ids=["one", "lr-tb", "ltrb"])
def test_pad_matches_numpy_pad(mode, padding):
    img = image(6, 7)
    got = one(img, "pad", padding=padding, padding_mode=mode, fill=9)
    want = pad_ref(img, padding, mode, fill=9)
    assert got.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


@pytest.mark.parametrize("interpolation", list(RESAMPLE))
@pytest.mark.parametrize(
    "size",
    [[12, 10], [7, 9], [48, 40], [24, 30], [30, 14], [19, 30], [10, 18], [12, 22]],
    ids=[
        "down",
        "down-rows-more",
        "up",
        "one-axis",
        "up-rows-down-cols",
        "down-rows-up-cols",
        "rows-down-much-more",
        "rows-down-cols-up",
    ],
)
def test_resize_matches_pil(interpolation, size):
    # From 24x20: gradients, a sine and sharp wrap-around edges, as photographs have.
    y, x = np.mgrid[0:24, 0:20]
    img = np.stack([(x * 11) % 256, (y * 9 + x * 3) % 256, 128 + 100 * np.sin(x / 3.0 + y / 5.0)], -1)
    img = img.astype(np.uint8)
    got = one(img, "resize", size=size, interpolation=interpolation)
    h, w = size
    if interpolation == "nearest":
        # The source pixel under each output pixel's centre (torchvision's NEAREST_EXACT).
        # PIL agrees except where a centre falls exactly on a pixel edge (24 -> 12 rows
        # here: no; 20 -> 30 columns: every third), where its accumulated float steps
        # pick the pixel on the left.
        rows = np.floor((np.arange(h) + 0.5) * img.shape[0] / h).astype(int)
        cols = np.floor((np.arange(w) + 0.5) * img.shape[1] / w).astype(int)
        want = img[rows][:, cols]
    else:
        # Pillow 13 runs the vertical pass first when the rows shrink by more than twice as
        # many pixels as the columns (the last three sizes), the horizontal one otherwise;
        # each pass clips to 0-255, so the order shows with bicubic and Lanczos.
        want = np.asarray(Image.fromarray(img).resize((w, h), RESAMPLE[interpolation]))
    assert got.dtype == np.uint8 and got.shape == (h, w, 3)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.1, (diff.max(), diff.mean())


def test_resize_of_one_number_is_square():
    got = one(image(12, 16), "resize", size=6)
    assert got.shape == (6, 6, 3)


def is_window_of(out, padded):
    """Whether ``out`` is a window of ``padded`` (at some offset)."""
    h, w = out.shape[:2]
    for i in range(padded.shape[0] - h + 1):
        for j in range(padded.shape[1] - w + 1):
            if np.array_equal(padded[i : i + h, j : j + w], out):
                return (i, j)
    return None


def test_random_crop_is_a_window_of_the_padded_image_and_seeded():
    samples = images(10, 8, 10)
    got = assert_seeded(samples, "random_crop", size=[5, 6], padding=[2], fill=200)
    offsets = set()
    for s, out in zip(samples, got):
        assert out.dtype == np.uint8 and out.shape == (5, 6, 3)
        where = is_window_of(out, pad_ref(s["img"], [2], "constant", fill=200))
        assert where is not None, "not a window of the padded image"
        offsets.add(where)
    assert len(offsets) > 1, offsets  # the window moves
    # pad_if_needed pads an image smaller than the crop up to it.
    small = one(image(3, 4), "random_crop", seed=1, size=[5, 6], pad_if_needed=True)
    assert small.shape == (5, 6, 3)


def test_random_resized_crop_is_seeded_and_the_whole_box_is_a_resize():
    samples = images(8, 20, 24)
    got = assert_seeded(samples, "random_resized_crop", size=[10, 12])
    assert all(g.shape == (10, 12, 3) and g.dtype == np.uint8 for g in got)
    # scale (1, 1) at the image's own aspect ratio: the box is the whole image, so the
    # output is a bilinear (antialiased) resize of it, as PIL makes it.
    img = samples[0]["img"]
    whole = one(img, "random_resized_crop", seed=3, size=[10, 12], scale=[1.0, 1.0], ratio=[1.2, 1.2])
    want = np.asarray(Image.fromarray(img).resize((12, 10), Image.Resampling.BILINEAR))
    assert np.abs(whole.astype(int) - want.astype(int)).max() <= 1


def jpeg(img: np.ndarray, quality: int = 92) -> bytes:
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def png(img: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="PNG")
    return out.getvalue()


def smooth(h, w, seed):
    """A photograph-like image (gradients and a blob), so JPEG keeps it close."""
    y, x = np.mgrid[0:h, 0:w]
    r = np.random.default_rng(seed)
    a, b = r.uniform(0.05, 0.2, 2)
    img = np.stack([x * 255 / w, y * 255 / h, 127 + 120 * np.sin(a * x + b * y)], -1)
    return img.astype(np.uint8)


def test_decode_then_random_resized_crop_fused_equals_them_apart():
    # The optimizer fuses decode_image + random_resized_crop of one field; crops of a 40x48
    # image to 32x32 never take a reduced DCT scale, so the fused output must equal the
    # unfused one exactly (a `drop` of nothing keeps the crop's operator index the same).
    samples = [{"img": jpeg(smooth(40, 48, i))} for i in range(6)]
    crop = dict(field="img", size=32)
    fused = stoker.from_samples(samples).map("drop", fields=[]).map("decode_image", field="img")
    fused = fused.map("random_resized_crop", **crop).seed(4)
    apart = stoker.from_samples(samples).map("decode_image", field="img").map("drop", fields=[])
    apart = apart.map("random_resized_crop", **crop).seed(4)
    assert "decode_image+random_resized_crop" in fused.explain()
    assert "decode_image+random_resized_crop" not in apart.explain()
    a = [np.array(s["img"]) for s in fused]
    b = [np.array(s["img"]) for s in apart]
    assert all(x.shape == (32, 32, 3) for x in a)
    assert same(a, b)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "lanczos"])
@pytest.mark.parametrize("size", [[16, 44], [30, 40]], ids=["vertical-first", "horizontal-first"])
def test_the_fused_crop_and_tensor_kernel_follows_pillow(interpolation, size):
    # decode_image + random_resized_crop + image_to_tensor run as one kernel; with the whole
    # image as the box it is PIL's decode, resize and ToTensor, pass order included (40x48
    # to 16x44: rows down by 24, columns by 4, so Pillow 13 resamples the rows first).
    data = jpeg(smooth(40, 48, 2))
    p = (
        stoker.from_samples([{"img": data}])
        .map("decode_image", field="img")
        .map(
            "random_resized_crop",
            field="img",
            size=size,
            scale=[1.0, 1.0],
            ratio=[1.2, 1.2],
            interpolation=interpolation,
        )
        .map("image_to_tensor", field="img")
    )
    assert "decode_image+random_resized_crop+image_to_tensor" in p.explain()
    got = np.array(next(iter(p))["img"])
    h, w = size
    pil = Image.open(io.BytesIO(data)).convert("RGB").resize((w, h), RESAMPLE[interpolation])
    want = np.asarray(pil).astype(np.float32).transpose(2, 0, 1) / 255.0
    assert got.shape == (3, h, w)
    assert np.abs(got - want).max() < 1e-6


@pytest.mark.parametrize("vertical", [False, True], ids=["horizontal", "vertical"])
def test_random_flip_mirrors_exactly_or_not_at_all(vertical):
    samples = images(16)
    mirror = (lambda a: a[::-1]) if vertical else (lambda a: a[:, ::-1])
    always = outputs(samples, "random_flip", 1, vertical=vertical, p=1.0)
    never = outputs(samples, "random_flip", 1, vertical=vertical, p=0.0)
    for s, a, n in zip(samples, always, never):
        np.testing.assert_array_equal(a, mirror(s["img"]))
        np.testing.assert_array_equal(n, s["img"])
    got = assert_seeded(samples, "random_flip", vertical=vertical)
    flipped = 0
    for s, g in zip(samples, got):
        assert g.dtype == np.uint8 and g.shape == s["img"].shape
        if np.array_equal(g, mirror(s["img"])):
            flipped += 1
        else:
            np.testing.assert_array_equal(g, s["img"])
    assert 0 < flipped < len(samples), flipped


# Image colour -----------------------------------------------------------------------------


def luma(img):
    """ITU-R 601-2 luma, as PIL's convert("L") defines it."""
    return img[..., 0] * 0.299 + img[..., 1] * 0.587 + img[..., 2] * 0.114


@pytest.mark.parametrize("channels", [1, 3])
def test_grayscale_is_the_601_luma(channels):
    img = image(9, 11)
    got = one(img, "grayscale", channels=channels)
    assert got.dtype == np.uint8 and got.shape == (9, 11, channels)
    assert np.abs(got[..., 0].astype(float) - luma(img.astype(float))).max() <= 1
    np.testing.assert_array_equal(got[..., 0], np.asarray(Image.fromarray(img).convert("L")))
    for c in range(channels):
        np.testing.assert_array_equal(got[..., c], got[..., 0])


def test_random_grayscale_keeps_channels_and_is_gray_or_unchanged():
    samples = images(16)
    for s, g in zip(samples, outputs(samples, "random_grayscale", 2, p=1.0)):
        assert g.shape == s["img"].shape
        np.testing.assert_array_equal(g, np.repeat(np.asarray(Image.fromarray(s["img"]).convert("L"))[..., None], 3, -1))
    for s, g in zip(samples, outputs(samples, "random_grayscale", 2, p=0.0)):
        np.testing.assert_array_equal(g, s["img"])
    got = assert_seeded(samples, "random_grayscale", p=0.5)
    gray = 0
    for s, g in zip(samples, got):
        if np.array_equal(g, s["img"]):
            continue
        assert (g == g[..., :1]).all(), "neither unchanged nor gray"
        gray += 1
    assert 0 < gray < len(samples), gray


def test_color_jitter_brightness_is_one_factor_in_range_per_image():
    samples = images(8)
    got = assert_seeded(samples, "color_jitter", brightness=0.5)
    factors = []
    for s, g in zip(samples, got):
        x = s["img"].astype(np.float64).ravel()
        y = g.astype(np.float64).ravel()
        assert g.dtype == np.uint8 and g.shape == s["img"].shape
        # PIL's brightness: min(255, trunc(x * f)). Every pixel bounds f; one f must fit all.
        lit = x > 0
        lo = np.where(y < 255, (y - 0.01) / np.maximum(x, 1), (254.99) / np.maximum(x, 1))[lit].max()
        hi = np.where(y < 255, (y + 1.01) / np.maximum(x, 1), np.inf)[lit].min()
        assert lo <= hi, "no single brightness factor explains the output"
        assert 0.5 - 1e-3 <= hi and lo <= 1.5 + 1e-3, (lo, hi)
        factors.append((lo + hi) / 2)
    assert max(factors) - min(factors) > 0.05, factors  # drawn per image


def test_color_jitter_saturation_and_hue_keep_gray_pixels_and_p0_is_identity():
    gray = np.repeat(np.random.default_rng(1).integers(0, 256, (8, 9, 1), dtype=np.uint8), 3, -1)
    samples = [{"img": gray}] * 4
    for g in outputs(samples, "color_jitter", 3, saturation=0.8, hue=0.4):
        np.testing.assert_array_equal(g, gray)
    colour = images(4)
    for s, g in zip(colour, outputs(colour, "color_jitter", 3, brightness=0.9, contrast=0.9, p=0.0)):
        np.testing.assert_array_equal(g, s["img"])
    # All four on colour images: seeded, and they change the pixels.
    got = assert_seeded(colour, "color_jitter", brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    assert any(not np.array_equal(g, s["img"]) for s, g in zip(colour, got))


def blur_ref(img, k, sigma):
    """torchvision's gaussian_blur: a normalised 1-D kernel on linspace(-(k-1)/2, (k-1)/2),
    reflect padding, float convolution, rounded."""
    x = np.linspace(-(k - 1) / 2, (k - 1) / 2, k)
    kern = np.exp(-0.5 * (x / sigma) ** 2)
    kern /= kern.sum()
    r = k // 2
    f = np.pad(img.astype(np.float64), ((r, r), (r, r), (0, 0)), mode="reflect")
    f = np.einsum("hwck,k->hwc", sliding_window_view(f, k, axis=0), kern)
    f = np.einsum("hwck,k->hwc", sliding_window_view(f, k, axis=1), kern)
    return np.clip(np.round(f), 0, 255)


@pytest.mark.parametrize("k,sigma", [(3, 0.5), (5, 1.3)])
def test_gaussian_blur_matches_a_reference_convolution(k, sigma):
    img = image(10, 13)
    got = one(img, "gaussian_blur", seed=0, kernel_size=k, sigma=[sigma, sigma])
    assert got.dtype == np.uint8 and got.shape == img.shape
    assert np.abs(got.astype(int) - blur_ref(img, k, sigma)).max() <= 1
    # PIL's own Gaussian blur is another filter; the result stays near it.
    pil = np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(sigma)))
    assert np.abs(got.astype(int) - pil.astype(int)).mean() < 12


def test_gaussian_blur_sigma_is_drawn_per_seed_and_p0_is_identity():
    samples = images(6)
    assert_seeded(samples, "gaussian_blur", kernel_size=5, sigma=[0.1, 3.0])
    for s, g in zip(samples, outputs(samples, "gaussian_blur", 1, kernel_size=5, p=0.0)):
        np.testing.assert_array_equal(g, s["img"])


IMAGENET = (np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225]))


@pytest.mark.parametrize(
    "params,layout,dtype,ref",
    [
        ({}, "chw", np.float32, lambda x: x / 255.0),
        ({"normalize": "imagenet"}, "chw", np.float32, lambda x: (x / 255.0 - IMAGENET[0]) / IMAGENET[1]),
        (
            {"mean": [0.5, 0.25, 0.0], "std": [0.5, 2.0, 1.0], "layout": "hwc"},
            "hwc",
            np.float32,
            lambda x: (x / 255.0 - [0.5, 0.25, 0.0]) / [0.5, 2.0, 1.0],
        ),
        ({"scale": False, "mean": [100, 0, 50], "std": [10, 1, 5]}, "chw", np.float32,
         lambda x: (x - [100, 0, 50]) / [10, 1, 5]),
        ({"normalize": "imagenet", "dtype": "float16"}, "chw", np.float16,
         lambda x: (x / 255.0 - IMAGENET[0]) / IMAGENET[1]),
    ],
    ids=["scale", "imagenet", "mean-std-hwc", "no-scale", "float16"],
)
def test_image_to_tensor_matches_numpy(params, layout, dtype, ref):
    img = image(5, 7)
    got = one(img, "image_to_tensor", **params)
    want = ref(img.astype(np.float64))
    if layout == "chw":
        want = want.transpose(2, 0, 1)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 2e-3 * max(1.0, np.abs(want).max()) if dtype == np.float16 else 1e-5 * max(1.0, np.abs(want).max())
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=tol)


def test_decode_image_equals_pil():
    rgb = smooth(20, 28, 0)
    rgba = np.concatenate([image(9, 10, seed=3), np.arange(90, dtype=np.uint8).reshape(9, 10, 1)], -1)
    samples = [
        {"jpg": jpeg(rgb), "png": png(rgba), "gray": jpeg(rgb)},
    ]
    s = run(
        samples,
        ("decode_image", {"field": "jpg"}),
        ("decode_image", {"field": "png", "mode": "rgba"}),
        ("decode_image", {"field": "gray", "mode": "gray"}),
    )[0]
    want_jpg = np.asarray(Image.open(io.BytesIO(samples[0]["jpg"])).convert("RGB"))
    assert s["jpg"].dtype == np.uint8 and s["jpg"].shape == (20, 28, 3)
    np.testing.assert_array_equal(s["jpg"], want_jpg)  # libjpeg-turbo, as PIL: exact
    np.testing.assert_array_equal(s["png"], rgba)  # lossless, alpha kept
    assert s["gray"].shape == (20, 28, 1)
    want_gray = np.asarray(Image.open(io.BytesIO(samples[0]["gray"])).convert("L")).astype(int)
    assert np.abs(s["gray"][..., 0].astype(int) - want_gray).max() <= 1
    # Without mode, RGBA loses its alpha.
    plain = one(png(rgba), "decode_image")
    np.testing.assert_array_equal(plain, rgba[..., :3])


def test_decode_image_of_bad_bytes_is_a_data_error():
    with pytest.raises(stoker.DataError, match="decode_image"):
        one(jpeg(smooth(8, 8, 0))[:60], "decode_image")


# Text -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parity():
    """Texts and the ids Python `tokenizers` 0.23.3 gave for them (the Rust parity
    fixtures, generated by crates/stoker-ops/tests/fixtures/text/gen_fixtures.py)."""
    data = json.loads((TEXT_FIXTURES / "parity.json").read_text())
    cases = {(c["tokenizer"], c["config"]["name"]): c for c in data["cases"]}
    return data["texts"], cases


@pytest.mark.parametrize(
    "name,params",
    [
        ("plain", {}),
        ("no_special", {"add_special_tokens": False}),
        ("trunc_pad_16", {"max_length": 16, "pad_to": 16}),
    ],
)
def test_tokenize_gives_the_ids_of_python_tokenizers(parity, name, params):
    texts, cases = parity
    case = cases[("minilm", name)]
    tok = str(TEXT_FIXTURES / "minilm-tokenizer.json")
    got = run([{"text": t} for t in texts], ("tokenize", dict(field="text", tokenizer=tok, **params)))
    assert len(got) == len(texts)
    for i, s in enumerate(got):
        assert s["text"] == texts[i]
        ids, mask = s["input_ids"], s["attention_mask"]
        assert ids.dtype == np.int64 and mask.dtype == np.int64 and ids.ndim == 1
        assert ids.tolist() == case["ids"][i], (i, texts[i])
        assert mask.tolist() == case["attention_mask"][i], (i, texts[i])


def test_tokenize_bos_eos_left_padding_int32_and_batches(parity):
    texts, cases = parity
    tok = str(TEXT_FIXTURES / "minilm-tokenizer.json")
    plain = cases[("minilm", "plain")]["ids"]
    # Left padding to 20 with explicit ids at both ends, int32, other output names.
    got = run(
        [{"text": t} for t in texts[:30]],
        ("tokenize", dict(field="text", tokenizer=tok, add_special_tokens=False, bos_id=7, eos_id=8,
                          max_length=12, pad_to=20, pad_id=3, pad_side="left", dtype="int32",
                          ids_field="ids", mask_field="mask")),
    )
    for i, s in enumerate(got):
        body = plain[i][1:-1][:10]  # no [CLS]/[SEP]; room for bos and eos within 12
        want = [3] * (20 - len(body) - 2) + [7] + body + [8]
        assert s["ids"].dtype == np.int32 and s["ids"].tolist() == want, i
        assert s["mask"].tolist() == [0] * (20 - len(body) - 2) + [1] * (len(body) + 2)
    # After a batch the column is tokenized at once into [N, L], padded to its longest row.
    batch = run([{"text": t} for t in texts[:5]], ("tokenize", dict(field="text", tokenizer=tok)), batch=5)[0]
    longest = max(len(plain[i]) for i in range(5))
    assert batch["input_ids"].shape == (5, longest)
    for i in range(5):
        row = plain[i] + [0] * (longest - len(plain[i]))
        assert batch["input_ids"][i].tolist() == row
        assert batch["attention_mask"][i].tolist() == [1] * len(plain[i]) + [0] * (longest - len(plain[i]))


def pack_ref(docs, block, sep=None, pad_id=0, drop=False):
    """Blocks of the documents' ids (each followed by ``sep``), cut every ``block`` tokens,
    with per-token positions and segments restarting at every document and block."""
    stream = []
    for d, ids in enumerate(docs):
        stream += [(int(t), d) for t in ids] + ([(sep, d)] if sep is not None else [])
    blocks = []
    for start in range(0, len(stream), block):
        chunk = stream[start : start + block]
        if len(chunk) < block and drop:
            break
        ids, pos, seg, cu, doc = [], [], [], [0], []
        for k, (t, d) in enumerate(chunk):
            if k == 0 or d != chunk[k - 1][1]:
                if k:
                    cu.append(k)
                doc.append(d)
                first = k
            ids.append(t)
            pos.append(k - first)
            seg.append(len(doc) - 1)
        cu.append(len(chunk))
        pad = block - len(chunk)
        blocks.append({
            "input_ids": ids + [pad_id] * pad,
            "position_ids": pos + [0] * pad,
            "segment_ids": seg + [-1] * pad,
            "attention_mask": [1] * len(chunk) + [0] * pad,
            "cu_seqlens": cu,
            "doc_index": doc,
        })
    return blocks


@pytest.mark.parametrize(
    "spec",
    [
        {"block_size": 8, "separator": 0},
        {"block_size": 5, "remainder": "drop", "dtype": "int32"},
        {"block_size": 16, "separator": 99, "pad_id": 7},
    ],
    ids=["separator", "drop-int32", "pad-id"],
)
def test_pack_blocks_equal_a_reference_packing(spec):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 1000, n) for n in [5, 3, 12, 0, 1, 9, 20]]
    samples = [{"input_ids": d.astype(np.int64), "__key__": f"doc{i}", "other": i} for i, d in enumerate(docs)]
    p = stoker.from_samples(samples).apply({"op": "pack", "keys": True, **spec})
    got = list(p)
    want = pack_ref(docs, spec["block_size"], spec.get("separator"), spec.get("pad_id", 0),
                    spec.get("remainder") == "drop")
    assert len(got) == len(want) > 1
    dtype = np.int32 if spec.get("dtype") == "int32" else np.int64
    for g, w in zip(got, want):
        assert "other" not in g  # the documents' other fields are not carried over
        for k in ("input_ids", "position_ids", "segment_ids", "attention_mask"):
            assert g[k].dtype == dtype and g[k].shape == (spec["block_size"],), k
            assert g[k].tolist() == w[k], k
        assert g["cu_seqlens"].dtype == np.int32 and g["cu_seqlens"].tolist() == w["cu_seqlens"]
        assert g["doc_index"].tolist() == w["doc_index"]
        assert g["doc_origin"].tolist() == [[d, 0] for d in w["doc_index"]]
        assert g["doc_keys"] == [f"doc{d}" for d in w["doc_index"]]
    # Pipeline.pack() is the same stage.
    method = list(stoker.from_samples(samples).pack(keys=True, **spec))
    assert [norm(s) for s in method] == [norm(s) for s in got]
    # A batch after pack stacks the per-token fields.
    batch = next(iter(p.batch(2)))
    assert batch["input_ids"].shape == (2, spec["block_size"])
    assert batch["input_ids"].tolist() == [want[0]["input_ids"], want[1]["input_ids"]]


# Tabular ----------------------------------------------------------------------------------

NUMBERS = [0.0, 0.5, 3.0, 7.25, 100.0, 1e6, 2.0, 1.0]


def column(values, op, where, **params):
    """``op`` on field ``x`` of one sample per value, or on the batch of them; returns the
    outputs as one array."""
    samples = [{"x": v} for v in values]
    if where == "batch":
        got = run(samples, (op, dict(field="x", **params)), batch=len(values))[0]["x"]
        assert isinstance(got, np.ndarray) and got.shape == (len(values),)
        return got
    got = [s["x"] for s in run(samples, (op, dict(field="x", **params)))]
    return got


@pytest.mark.parametrize("where", ["sample", "batch"])
@pytest.mark.parametrize(
    "op,params,ref",
    [
        ("log1p", {}, np.log1p),
        ("clip", {"min": 0.75, "max": 50.0}, lambda x: np.clip(x, 0.75, 50.0)),
        ("clip", {"max": 2.5}, lambda x: np.minimum(x, 2.5)),
        ("standardize", {"mean": 3.5, "std": 2.0}, lambda x: (x - 3.5) / 2.0),
    ],
    ids=["log1p", "clip", "clip-max", "standardize"],
)
def test_numeric_features_match_numpy_as_float32(where, op, params, ref):
    got = column(NUMBERS, op, where, **params)
    want = ref(np.array(NUMBERS, dtype=np.float64)).astype(np.float32)
    if where == "sample":
        assert all(isinstance(g, np.ndarray) and g.shape == () and g.dtype == np.float32 for g in got)
        got = np.array(got)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_log1p_negative_is_an_error_unless_clamped():
    with pytest.raises(stoker.DataError, match="log1p"):
        column([1.0, -0.5], "log1p", "sample")
    got = column([1.0, -0.5, -3.0], "log1p", "batch", negative="clamp")
    np.testing.assert_allclose(got, [np.log1p(1.0), 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("where", ["sample", "batch"])
def test_bucketize_is_searchsorted_left(where):
    bounds = [0.5, 2.0, 2.0, 7.25, 1000.0]
    got = column(NUMBERS, "bucketize", where, boundaries=bounds)
    want = np.searchsorted(bounds, NUMBERS, side="left")
    if where == "sample":
        assert all(isinstance(g, int) for g in got)
        got = np.array(got)
    else:
        assert got.dtype == np.int64
    assert got.tolist() == want.tolist()


def test_fill_null_replaces_nulls_and_nan():
    # Per sample and per batch; NaN counts as null by default.
    vals = [1.5, None, float("nan"), -2.0]
    per_sample = column(vals, "fill_null", "sample", value=9.5)
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float32 and g.shape == () for g in per_sample)
    assert [float(g) for g in per_sample] == [1.5, 9.5, 9.5, -2.0]
    batch = column(vals, "fill_null", "batch", value=0.0)
    assert batch.dtype == np.float32 and batch.tolist() == [1.5, 0.0, 0.0, -2.0]
    # An integer fill of a column of ints and nulls stays int64.
    ints = column([3, None, 5], "fill_null", "batch", value=-1)
    assert ints.dtype == np.int64 and ints.tolist() == [3, -1, 5]
    # A string fill.
    got = run([{"x": "a"}, {"x": None}], ("fill_null", {"field": "x", "value": "?"}))
    assert [s["x"] for s in got] == ["a", "?"]
    # fill_null then log1p: the chain a DLRM feature takes.
    chained = run([{"x": v} for v in [None, 3.0]], ("fill_null", {"field": "x", "value": 0.0}),
                  ("log1p", {"field": "x"}))
    np.testing.assert_allclose([float(s["x"]) for s in chained], [0.0, np.log1p(3.0)], rtol=1e-6)


# XXH64, written from its specification (github.com/Cyan4973/xxHash, doc/xxhash_spec.md).
_P1, _P2, _P3, _P4, _P5 = (
    0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5,
)
_M = (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def _merge(acc, v):
    return (((acc ^ _round(0, v)) * _P1) + _P4) & _M


def xxh64(data: bytes, seed: int = 0) -> int:
    n, i = len(data), 0
    lane = lambda at, k=8: int.from_bytes(data[at : at + k], "little")  # noqa: E731
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed & _M, (seed - _P1) & _M]
        while i + 32 <= n:
            v = [_round(v[k], lane(i + 8 * k)) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = _merge(h, x)
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h = ((_rotl(h ^ _round(0, lane(i)), 27) * _P1) + _P4) & _M
        i += 8
    if i + 4 <= n:
        h = ((_rotl(h ^ ((lane(i, 4) * _P1) & _M), 23) * _P2) + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M), 11) * _P1) & _M
        i += 1
    h = ((h ^ (h >> 33)) * _P2) & _M
    h = ((h ^ (h >> 29)) * _P3) & _M
    return h ^ (h >> 32)


def test_the_reference_xxh64_gives_the_published_values():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc") == 0x44BC2CF5AD770999


@pytest.mark.parametrize("where", ["sample", "batch"])
@pytest.mark.parametrize("seed", [0, 12345])
def test_hash_bucket_is_xxh64_of_the_text_modulo_buckets(where, seed):
    values = ["a", "user_123", "", "é-ünïcode", "a much longer category value over 32 bytes", 123, -7, 0]
    got = column(values, "hash_bucket", where, buckets=1009, seed=seed)
    want = [xxh64(str(v).encode(), seed) % 1009 for v in values]
    if where == "batch":
        assert got.dtype == np.int64
    assert list(map(int, got)) == want
    # 123 and "123" are one category.
    assert column([123, "123"], "hash_bucket", "sample", buckets=1009, seed=seed) == [want[5]] * 2


@pytest.mark.parametrize("where", ["sample", "batch"])
def test_vocab_lookup_indexes_tokens_and_maps_the_rest_to_oov(where, tmp_path):
    vocab = ["apple", "banana", "42", "cherry"]
    values = ["banana", "zzz", 42, "apple", "Cherry", "cherry"]
    got = column(values, "vocab_lookup", where, vocab=vocab)
    assert list(map(int, got)) == [1, 4, 2, 0, 4, 3]
    f = tmp_path / "vocab.txt"
    f.write_text("\r\n".join(vocab) + "\n", encoding="utf-8")
    got = column(values, "vocab_lookup", where, vocab_file=str(f), oov_index=-1)
    assert list(map(int, got)) == [1, -1, 2, 0, -1, 3]


# Audio ------------------------------------------------------------------------------------


def test_decode_audio_of_a_16_bit_stereo_wav_is_exact():
    rng = np.random.default_rng(0)
    pcm = rng.integers(-32768, 32768, (1200, 2), dtype=np.int64).astype("<i2")
    s = run([{"audio": wav(pcm, 22050)}], ("decode_audio", {"field": "audio"}))[0]
    assert s["audio_sample_rate"] == 22050
    assert s["audio"].dtype == np.float32 and s["audio"].shape == (2, 1200)
    np.testing.assert_array_equal(s["audio"], pcm.T.astype(np.float32) / 32768)
    # mono averages the channels; offset and duration cut the frames.
    s = run(
        [{"audio": wav(pcm, 22050)}],
        ("decode_audio", {"field": "audio", "mono": True, "offset_s": 100 / 22050, "duration_s": 500 / 22050}),
    )[0]
    assert s["audio"].shape == (1, 500)
    want = pcm[100:600].astype(np.float64).mean(axis=1) / 32768
    np.testing.assert_allclose(s["audio"][0], want, atol=1e-6)


def test_decode_audio_of_an_8_bit_wav_recentres_it():
    pcm = np.arange(256, dtype=np.uint8).reshape(-1, 1)
    s = run([{"a": wav(pcm, 8000, width=1)}], ("decode_audio", {"field": "a"}))[0]
    assert s["a_sample_rate"] == 8000 and s["a"].shape == (1, 256)
    np.testing.assert_array_equal(s["a"][0], (np.arange(256) - 128) / 128.0)


def test_decode_audio_of_non_audio_is_a_data_error():
    with pytest.raises(stoker.DataError, match="decode_audio"):
        run([{"a": b"definitely not a wav file"}], ("decode_audio", {"field": "a"}))


def resample_ref(x, orig, new, width=6, rolloff=0.99):
    """torchaudio.functional.resample (sinc_interp_hann), in float64."""
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * rolloff
    w = math.ceil(width * orig / base)
    idx = np.arange(-w, w + orig, dtype=np.float64) / orig
    t = (-np.arange(new, dtype=np.float64) / new)[:, None] + idx[None, :]
    t = np.clip(t * base, -width, width)
    window = np.cos(t * np.pi / width / 2) ** 2
    t = t * np.pi
    kern = np.where(t == 0, 1.0, np.sin(t) / np.where(t == 0, 1.0, t)) * window * (base / orig)
    n = x.shape[-1]
    xp = np.pad(x.astype(np.float64), ((0, 0), (w, w + orig)))
    frames = sliding_window_view(xp, kern.shape[1], axis=1)[:, ::orig]
    out = np.einsum("cfl,nl->cfn", frames, kern).reshape(x.shape[0], -1)
    return out[:, : math.ceil(new * n / orig)]


@pytest.mark.parametrize("orig,new", [(8000, 16000), (16000, 12000), (22050, 16000)])
def test_resample_matches_torchaudio_s_windowed_sinc(orig, new):
    x = signal(900, orig)
    s = run([clip_sample(x, orig)], ("resample", {"field": "audio", "rate": new}))[0]
    want = resample_ref(x, orig, new)
    assert s["audio_sample_rate"] == new
    assert s["audio"].dtype == np.float32 and s["audio"].shape == want.shape
    np.testing.assert_allclose(s["audio"], want, atol=2e-5)


def stft_ref(x, n_fft, hop, win=None, center=True):
    """torch.stft with a periodic Hann window (zero-padded to n_fft, centred), reflect
    padding: complex [C, F, T]."""
    win = win or n_fft
    w = np.zeros(n_fft)
    left = (n_fft - win) // 2
    w[left : left + win] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)
    x = x.astype(np.float64)
    if center:
        x = np.pad(x, ((0, 0), (n_fft // 2, n_fft // 2)), mode="reflect")
    frames = sliding_window_view(x, n_fft, axis=1)[:, ::hop] * w
    return np.fft.rfft(frames, axis=-1).transpose(0, 2, 1)


STFT_CASES = [
    {"n_fft": 64, "hop_length": 16},
    {"n_fft": 64, "win_length": 48, "hop_length": 12},
    {"n_fft": 50, "hop_length": 20, "center": False},
]


@pytest.mark.parametrize("params", STFT_CASES, ids=["plain", "short-window", "no-center"])
def test_stft_matches_numpy(params):
    x = signal()
    got = one(x, "stft", field="audio", **params)
    want = stft_ref(x, params["n_fft"], params["hop_length"], params.get("win_length"), params.get("center", True))
    assert got.dtype == np.float32 and got.shape == want.shape + (2,)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got[..., 0], want.real, atol=1e-5 * scale)
    np.testing.assert_allclose(got[..., 1], want.imag, atol=1e-5 * scale)


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_spectrogram_is_the_stft_magnitude_to_a_power(power):
    x = signal()
    got = one(x, "spectrogram", field="audio", n_fft=64, hop_length=16, power=power)
    want = np.abs(stft_ref(x, 64, 16)) ** power
    assert got.dtype == np.float32 and got.shape == (2, 33, want.shape[-1])
    np.testing.assert_allclose(got, want, atol=1e-5 * want.max())
    # Defaults: n_fft 400, hop = win_length / 2.
    default = one(signal(1000), "spectrogram", field="audio")
    assert default.shape == (2, 201, 1000 // 200 + 1)


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_complex_power_of_a_complex_tensor(power):
    z = np.random.default_rng(2).standard_normal((2, 5, 7, 2)).astype(np.float32)
    got = one(z, "complex_power", field="spec", power=power)
    want = np.hypot(z[..., 0].astype(np.float64), z[..., 1]) ** power
    assert got.dtype == np.float32 and got.shape == (2, 5, 7)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("stype,top_db", [("power", None), ("power", 30.0), ("magnitude", 40.0)])
def test_amplitude_to_db(stype, top_db):
    spec = (10.0 ** np.random.default_rng(3).uniform(-12, 2, (2, 6, 9))).astype(np.float32)
    spec[0, 0, 0] = 0.0
    params = {"stype": stype} if top_db is None else {"stype": stype, "top_db": top_db}
    got = one(spec, "amplitude_to_db", field="s", **params)
    m = 10.0 if stype == "power" else 20.0
    want = m * np.log10(np.maximum(spec.astype(np.float64), 1e-10))
    if top_db is not None:
        want = np.maximum(want, want.max() - top_db)  # the whole clip's maximum
    assert got.dtype == np.float32 and got.shape == spec.shape
    np.testing.assert_allclose(got, want, atol=1e-3)
    if top_db is not None:
        assert np.isclose(got.min(), want.max() - top_db, atol=1e-3)


def mel_fbanks(n_freqs, f_min, f_max, n_mels, rate, scale="htk", norm=None):
    """torchaudio.functional.melscale_fbanks, in float64: [n_freqs, n_mels]."""
    if scale == "htk":
        to_mel = lambda f: 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)  # noqa: E731
        to_hz = lambda m: 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)  # noqa: E731
    else:
        f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
        min_log_mel = min_log_hz / f_sp

        def to_mel(f):
            f = np.asarray(f, dtype=np.float64)
            return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)

        def to_hz(m):
            m = np.asarray(m, dtype=np.float64)
            return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    all_freqs = np.linspace(0, rate // 2, n_freqs)
    f_pts = to_hz(np.linspace(to_mel(f_min), to_mel(f_max), n_mels + 2))
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    if norm == "slaney":
        fb *= 2.0 / (f_pts[2 : n_mels + 2] - f_pts[:n_mels])
    return fb


MEL_CASES = [
    {"n_mels": 10},
    {"n_mels": 12, "f_min": 100.0, "f_max": 3500.0},
    {"n_mels": 8, "mel_scale": "slaney", "norm": "slaney"},
]


@pytest.mark.parametrize("params", MEL_CASES, ids=["htk", "f-range", "slaney"])
def test_mel_scale_and_mel_spectrogram_match_torchaudio_s_filterbank(params):
    rate, x = 8000, signal()
    power = np.abs(stft_ref(x, 64, 16)) ** 2
    fb = mel_fbanks(33, params.get("f_min", 0.0), params.get("f_max", rate / 2), params["n_mels"], rate,
                    params.get("mel_scale", "htk"), params.get("norm"))
    want = np.einsum("cft,fm->cmt", power, fb)
    # mel_scale on a spectrogram (the rate read from audio_sample_rate) ...
    s = run([clip_sample(x, rate)], ("spectrogram", {"field": "audio", "n_fft": 64, "hop_length": 16}),
            ("mel_scale", {"field": "audio", **params}))[0]
    assert s["audio"].dtype == np.float32 and s["audio"].shape == (2, params["n_mels"], power.shape[-1])
    np.testing.assert_allclose(s["audio"], want, atol=1e-5 * want.max())
    # ... and mel_spectrogram in one step.
    m = run([clip_sample(x, rate)], ("mel_spectrogram", {"field": "audio", "n_fft": 64, "hop_length": 16, **params}))[0]
    np.testing.assert_allclose(m["audio"], want, atol=1e-5 * want.max())


def phase_vocoder_ref(z, rate, hop):
    """torchaudio.functional.phase_vocoder, in float64: complex [C, F, T] to [C, F, ceil(T / rate)]."""
    n_freq, t = z.shape[-2], z.shape[-1]
    steps = np.arange(0, t, rate)
    alphas = steps % 1.0
    advance = np.linspace(0, np.pi * hop, n_freq)[:, None]
    phase_0 = np.angle(z[..., :1])
    zp = np.pad(z, ((0, 0), (0, 0), (0, 2)))
    i0 = np.floor(steps).astype(int)
    s0, s1 = zp[..., i0], zp[..., i0 + 1]
    phase = np.angle(s1) - np.angle(s0) - advance
    phase = phase - 2 * np.pi * np.round(phase / (2 * np.pi)) + advance
    acc = np.cumsum(np.concatenate([phase_0, phase[..., :-1]], -1), -1)
    return (alphas * np.abs(s1) + (1 - alphas) * np.abs(s0)) * np.exp(1j * acc)


def test_time_stretch_matches_the_phase_vocoder():
    x = signal()
    ops = [("stft", {"field": "audio", "n_fft": 64, "hop_length": 16})]
    z = run([clip_sample(x, 8000)], *ops)[0]["audio"]
    zc = z[..., 0].astype(np.float64) + 1j * z[..., 1]
    got = run([clip_sample(x, 8000)], *ops, ("time_stretch", {"field": "audio", "rate": 1.25, "hop_length": 16}))[0]["audio"]
    want = phase_vocoder_ref(zc, 1.25, 16)
    assert got.dtype == np.float32 and got.shape == (2, 33, math.ceil(zc.shape[-1] / 1.25), 2)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, atol=2e-4 * scale)
    # Rate 1 leaves the STFT as it is.
    same_rate = run([clip_sample(x, 8000)], *ops, ("time_stretch", {"field": "audio", "rate": 1.0}))[0]["audio"]
    np.testing.assert_array_equal(same_rate, z)


def test_time_stretch_with_a_range_draws_a_rate_per_sample():
    samples = [clip_sample(signal(800, seed=i), 8000) for i in range(10)]
    ops = [("stft", {"field": "audio", "n_fft": 64, "hop_length": 16}),
           ("time_stretch", {"field": "audio", "rate": [0.5, 2.0], "hop_length": 16})]
    a = [np.array(s["audio"]) for s in run(samples, *ops, seed=1)]
    b = [np.array(s["audio"]) for s in run(samples, *ops, seed=1)]
    assert same(a, b)
    frames_in = 800 // 16 + 1
    lengths = {g.shape[2] for g in a}
    assert all(math.ceil(frames_in / 2.0) <= n <= math.ceil(frames_in / 0.5) for n in lengths), lengths
    assert len(lengths) > 2, lengths


@pytest.mark.parametrize("op,axis", [("frequency_masking", 1), ("time_masking", 2)])
@pytest.mark.parametrize("iid", [False, True], ids=["shared", "iid"])
def test_masks_cover_whole_rows_or_columns_below_mask_param(op, axis, iid):
    rng = np.random.default_rng(4)
    samples = [{"s": rng.uniform(1, 2, (2, 20, 30)).astype(np.float32)} for _ in range(24)]
    params = dict(field="s", mask_param=8, mask_value=-1.0, iid_channels=iid)
    got = [np.array(s["s"]) for s in run(samples, (op, params), seed=7)]
    again = [np.array(s["s"]) for s in run(samples, (op, params), seed=7)]
    assert same(got, again)
    widths, starts, differ = [], set(), 0
    for s, g in zip(samples, got):
        assert g.dtype == np.float32 and g.shape == (2, 20, 30)
        masked = g == -1.0
        np.testing.assert_array_equal(g[~masked], s["s"][~masked])  # the rest unchanged
        spans = []
        for c in range(2):
            along = masked[c].any(axis=2 - axis)  # per row (freq) or per column (time)
            idx = np.flatnonzero(along)
            if idx.size:
                # Whole rows/columns, one contiguous run.
                assert masked[c].all(axis=2 - axis)[idx].all()
                assert idx[-1] - idx[0] + 1 == idx.size
            spans.append(tuple(idx))
            widths.append(idx.size)
            if idx.size:
                starts.add(idx[0])
        if spans[0] != spans[1]:
            differ += 1
    assert max(widths) < 8 and max(widths) > 0 and len(starts) > 2, (widths, starts)
    if iid:
        assert differ > 0  # a mask per channel
    else:
        assert differ == 0  # one mask for both channels


def test_epochs_run_one_by_one_through_the_shared_store_reuse_the_decoded_images(tmp_path):
    # Each epoch of a training loop is a run (as stoker.torch iterates): through the shared
    # store, the first keeps each decoded image for the runs after it, which crop them anew.
    for i in range(5):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(smooth(60 + 4 * i, 80, i)))
    stoker.io.clear_cache()

    def pipeline(**options):
        return (
            stoker.from_url(str(tmp_path) + "/", format="files")
            .map("decode_image", field="jpg")
            .map("random_resized_crop", field="jpg", size=24)
            .seed(2)
            .options(share_store=True, threads=2, **options)
        )

    def crops(p):
        run = p.run()
        out = {s["__key__"]: np.array(s["jpg"]) for s in run}
        return out, run.stats()["sample_cache"]

    first, cache = crops(pipeline())
    assert (cache["stored"], cache["hits"]) == (5, 0), cache
    for epoch in (1, 2):
        got, cache = crops(pipeline().first_epoch(epoch))
        assert (cache["stored"], cache["hits"]) == (0, 5), cache
        # The cached head is the decode unfused: the same as the chain without both passes.
        want, none = crops(pipeline(disable=["cache", "fusion"]).first_epoch(epoch))
        assert none is None
        assert sorted(got) == sorted(want) == ["0", "1", "2", "3", "4"]
        assert all(np.array_equal(got[k], want[k]) for k in got)
        assert any(not np.array_equal(got[k], first[k]) for k in got)
    stoker.io.clear_cache()
    _, cache = crops(pipeline().first_epoch(3))
    assert cache["hits"] == 0, cache


GPT2 = pathlib.Path(__file__).resolve().parents[2] / "crates/stoker-ops/tests/fixtures/text/gpt2-tokenizer.json"


@pytest.mark.parametrize("table_as", ["array", "npy"])
def test_embedding_rows_are_the_tables_before_and_after_the_batch(tmp_path, table_as):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50257, 8)).astype(np.float32)
    if table_as == "npy":
        np.save(tmp_path / "t.npy", table)
        given: object = str(tmp_path / "t.npy")
    else:
        given = table
    texts = [{"text": f"document {i}: " + "word " * (i * 7)} for i in range(9)]
    tok = dict(field="text", tokenizer=str(GPT2), max_length=16, pad_to=16, eos_id=50256)

    def batches(embed_first):
        p = stoker.from_samples(texts).map("tokenize", **tok)
        emb = dict(field="input_ids", table=given, to="emb")
        p = p.map("embedding", **emb).batch(4) if embed_first else p.batch(4).map("embedding", **emb)
        return list(p)

    for before, after in zip(batches(True), batches(False)):
        ids = np.array(before["input_ids"])
        got = np.array(before["emb"])
        assert got.shape == ids.shape + (8,) and got.dtype == np.float32
        np.testing.assert_array_equal(got, table[ids])
        np.testing.assert_array_equal(got, np.array(after["emb"]))


def test_embedding_refuses_a_table_that_is_not_2d_float_and_names_a_bad_id():
    with pytest.raises(ValueError, match="2-D float32 or float16"):
        stoker.from_samples([{"x": 1}]).map("embedding", field="x", table=np.zeros((3, 2), np.float64))
    p = stoker.from_samples([{"ids": np.array([1, 7], dtype=np.int64)}]).map(
        "embedding", field="ids", table=np.zeros((5, 2), np.float32)
    )
    with pytest.raises(Exception, match=r"id 7 \(at 1 of 2\) is outside table"):
        list(p)
