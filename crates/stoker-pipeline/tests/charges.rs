//! What an image operator allocates for a sample is no more than what it charged to the
//! memory budget: a counting allocator sees how far each operator's allocations rose above
//! what was allocated before it ran, and that rise must stay within its charges (plus a
//! small fixed allowance for the sample's map and names). Decodes, resizes up and down,
//! crops, pads, colour operators, the tensor conversion and the fused decode+crop kernel,
//! on frames of a few megapixels.
//!
//! (A test binary of its own with one test: the allocator counts the whole process, so
//! nothing else may run meanwhile. libjpeg-turbo's own buffers are allocated by C's
//! `malloc` and are not seen here; the decoder's charge covers them from the header.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use stoker_core::rng::Rng;
use stoker_core::{MemoryBudget, Sample, Value};
use stoker_ops::image::{DecodeImage, DecodeRandomResizedCrop, RandomResizedCrop, ToTensor};
use stoker_pipeline::{Builtin, OpContext, SampleOp};

/// The bytes allocated now, and the most since [`reset_peak`].
static NOW: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

struct Counting;

fn grew(by: usize) {
    let now = NOW.fetch_add(by as i64, Ordering::SeqCst) + by as i64;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is passed to the system allocator unchanged; the counters only add
// and subtract the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        NOW.fetch_sub(layout.size() as i64, Ordering::SeqCst);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new) };
        if !q.is_null() {
            // While it moves, both blocks exist.
            grew(new);
            NOW.fetch_sub(layout.size() as i64, Ordering::SeqCst);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Sample maps, field names, an error's text: what the operators do not charge.
const ALLOWANCE: i64 = 64 << 10;

/// The rise of the allocations above what was allocated before `f` ran.
fn rise<T>(f: impl FnOnce() -> T) -> (T, i64) {
    let before = NOW.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst) - before)
}

/// A `w` x `h` RGB image with gradients and noise (so its JPEG is photo-like in size).
fn pixels(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::from_words(&[seed]);
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let n = (rng.next_u64() % 24) as usize;
            px.extend_from_slice(&[
                ((x * 255 / w + n) % 256) as u8,
                ((y * 255 / h + n) % 256) as u8,
                (((x + y) / 7 + n) % 256) as u8,
            ]);
        }
    }
    px
}

fn png(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        e.set_compression(png::Compression::Fast);
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(&pixels(w, h, seed)).unwrap();
    }
    out
}

/// A lossless WebP with alpha.
fn webp(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let rgba: Vec<u8> = pixels(w, h, seed)
        .chunks(3)
        .flat_map(|p| [p[0], p[1], p[2], 200])
        .collect();
    let mut out = Vec::new();
    image_webp::WebPEncoder::new(&mut out)
        .encode(&rgba, w as u32, h as u32, image_webp::ColorType::Rgba8)
        .unwrap();
    out
}

/// An RGBA PNG (decoded to RGB: a conversion's copy).
fn png_rgba(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let rgba: Vec<u8> = pixels(w, h, seed)
        .chunks(3)
        .flat_map(|p| [p[0], p[1], p[2], 255])
        .collect();
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
        e.set_color(png::ColorType::Rgba);
        e.set_depth(png::BitDepth::Eight);
        e.set_compression(png::Compression::Fast);
        e.write_header().unwrap().write_image_data(&rgba).unwrap();
    }
    out
}

fn jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    stoker_ops::image::encode_jpeg(&pixels(w, h, seed), w, h, 90).unwrap()
}

fn op(toml_text: &str) -> Builtin {
    toml::from_str(toml_text).unwrap_or_else(|e| panic!("{toml_text}: {e}"))
}

fn encoded(data: &[u8]) -> Sample {
    let mut s = Sample::new();
    s.insert("__key__", "k".to_string());
    s.insert("img", Value::Bytes(data.to_vec().into()));
    s
}

/// `op` on `sample` with a budget: how far allocations rose while it ran, and what it
/// charged.
fn measure(budget: &MemoryBudget, op: &Builtin, sample: Sample) -> (i64, i64) {
    let bytes = sample.size_bytes() as u64;
    let hold = budget.try_reserve(bytes);
    let mut ctx =
        OpContext::new(7, 0, 0, 3, 0).with_budget(budget, hold, bytes, Duration::from_secs(1));
    let (out, rose) = rise(|| op.apply(sample, &mut ctx));
    let out = out.unwrap_or_else(|e| panic!("{op:?}: {e}"));
    assert!(out.is_some(), "{op:?} dropped the sample");
    let (_, need) = ctx.take_hold();
    let charged = need.expect("a budget") as i64 - bytes as i64;
    drop(out);
    (rose, charged)
}

#[test]
fn what_image_operators_allocate_is_no_more_than_what_they_charge() {
    let budget = MemoryBudget::new(4 << 30);
    let (w, h) = (2400, 1600);
    let big_png = png(w, h, 1);
    let big_jpeg = jpeg(w, h, 2);
    let small_jpeg = jpeg(300, 200, 3);
    let decode = op("op = 'decode_image'\nfield = 'img'");
    let decoded = |data: &[u8]| {
        let mut ctx = OpContext::new(1, 0, 0, 0, 0);
        decode.apply(encoded(data), &mut ctx).unwrap().unwrap()
    };
    let (frame, small) = (decoded(&big_jpeg), decoded(&small_jpeg));

    let mut failures = Vec::new();
    let mut check = |name: &str, (rose, charged): (i64, i64)| {
        println!("{name:<44} allocated {rose:>11} charged {charged:>11}");
        if rose > charged + ALLOWANCE {
            failures.push(format!("{name}: allocated {rose}, charged {charged}"));
        }
    };

    check("decode png", measure(&budget, &decode, encoded(&big_png)));
    check(
        "decode png rgba",
        measure(&budget, &decode, encoded(&png_rgba(w, h, 4))),
    );
    check(
        "decode png 300x200",
        measure(&budget, &decode, encoded(&png(300, 200, 5))),
    );
    check(
        "decode webp rgba",
        measure(&budget, &decode, encoded(&webp(w, h, 6))),
    );
    check("decode jpeg", measure(&budget, &decode, encoded(&big_jpeg)));
    let gray = op("op = 'decode_image'\nfield = 'img'\nmode = 'gray'");
    check(
        "decode jpeg as gray",
        measure(&budget, &gray, encoded(&big_jpeg)),
    );
    let cases = [
        (
            "resize 224 (down, antialiased)",
            "op = 'resize'\nsize = 224",
        ),
        (
            "resize 224 nearest",
            "op = 'resize'\nsize = 224\ninterpolation = 'nearest'",
        ),
        (
            "resize 224 bicubic",
            "op = 'resize'\nsize = 224\ninterpolation = 'bicubic'",
        ),
        (
            "resize [1500, 2000] (slightly down)",
            "op = 'resize'\nsize = [1500, 2000]",
        ),
        (
            "random_resized_crop 224",
            "op = 'random_resized_crop'\nsize = 224",
        ),
        ("center_crop 1000", "op = 'center_crop'\nsize = 1000"),
        (
            "random_crop 1000 padded",
            "op = 'random_crop'\nsize = 1000\npadding = [16]",
        ),
        ("pad 32", "op = 'pad'\npadding = [32]"),
        (
            "pad 32 reflect",
            "op = 'pad'\npadding = [32]\npadding_mode = 'reflect'",
        ),
        ("random_flip", "op = 'random_flip'\np = 1.0"),
        (
            "color_jitter",
            "op = 'color_jitter'\nbrightness = 0.4\ncontrast = 0.4\nsaturation = 0.4\nhue = 0.1",
        ),
        ("grayscale", "op = 'grayscale'"),
        ("random_grayscale", "op = 'random_grayscale'\np = 1.0"),
        ("gaussian_blur 9", "op = 'gaussian_blur'\nkernel_size = 9"),
        (
            "image_to_tensor imagenet",
            "op = 'image_to_tensor'\nnormalize = 'imagenet'",
        ),
        (
            "image_to_tensor float16 hwc",
            "op = 'image_to_tensor'\ndtype = 'float16'\nlayout = 'hwc'",
        ),
    ];
    for (name, text) in cases {
        let o = op(&format!("{text}\nfield = 'img'"));
        check(name, measure(&budget, &o, frame.clone()));
    }
    let up = op("op = 'resize'\nfield = 'img'\nsize = [1600, 2400]");
    check(
        "resize 300x200 up to 2400x1600",
        measure(&budget, &up, small.clone()),
    );

    // The fused kernel, through its own charge hook.
    let crop = RandomResizedCrop::new(224, 224);
    let fused = DecodeRandomResizedCrop::new(DecodeImage::default(), crop);
    let fused_tensor = fused.clone().to_tensor(ToTensor::default());
    for (name, k, data) in [
        ("fused decode+crop jpeg", &fused, &big_jpeg),
        ("fused decode+crop png", &fused, &big_png),
        ("fused decode+crop+to_tensor jpeg", &fused_tensor, &big_jpeg),
    ] {
        let mut charged = 0i64;
        let mut rng = Rng::from_words(&[5]);
        let (out, rose) = rise(|| {
            k.apply_into(data, &mut rng, None, &mut |_| None, &mut |n| {
                charged += n as i64;
                Ok(())
            })
        });
        out.unwrap();
        check(name, (rose, charged));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
