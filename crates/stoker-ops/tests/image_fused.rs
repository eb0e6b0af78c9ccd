//! The fused decode + RandomResizedCrop against decode followed by the unfused crop: same
//! boxes, and pixels within the tolerance docs/ops.md states for DCT scaling. The fused
//! flip and ToTensor stages against the separate kernels: bit-identical.

use std::path::PathBuf;

use stoker_core::rng::Rng;
use stoker_core::{BatchSlots, DType, Tensor};
use stoker_ops::image::{
    decode_image, decode_jpeg, image_info, ColorMode, DctScale, DecodeImage,
    DecodeRandomResizedCrop, Interpolation, JpegRegion, Layout, RandomFlip, RandomResizedCrop,
    ToTensor,
};

fn file(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/image/files")
        .join(name);
    std::fs::read(p).unwrap()
}

fn unfused(data: &[u8], rrc: &RandomResizedCrop, seed: u64) -> Tensor {
    let full = decode_image(data, &DecodeImage::default()).unwrap();
    rrc.apply(&full, &mut Rng::from_words(&[seed])).unwrap()
}

fn diff(a: &Tensor, b: &Tensor) -> (u8, f64) {
    assert_eq!(a.shape(), b.shape());
    let mut max = 0u8;
    let mut sum = 0u64;
    for (x, y) in a.data().iter().zip(b.data().iter()) {
        let d = x.abs_diff(*y);
        max = max.max(d);
        sum += d as u64;
    }
    (max, sum as f64 / a.data().len() as f64)
}

#[test]
fn without_dct_scaling_fused_equals_unfused_exactly() {
    // Same draws, same box; the region decode yields the same pixels as the full decode
    // (libjpeg-turbo decodes whole iMCUs around the region), so the outputs are equal.
    let rrc = RandomResizedCrop::new(64, 48);
    for name in [
        "big.jpg",
        "photo_420.jpg",
        "photo_422.jpg",
        "photo_444.jpg",
        "progressive.jpg",
        "gray.jpg",
    ] {
        let data = file(name);
        let op =
            DecodeRandomResizedCrop::new(DecodeImage::default(), rrc.clone()).dct_scaling(false);
        for seed in 0..40 {
            let f = op.apply(&data, &mut Rng::from_words(&[seed])).unwrap();
            assert_eq!(f, unfused(&data, &rrc, seed), "{name} seed {seed}");
        }
    }
}

#[test]
fn dct_scaled_fused_stays_close_to_unfused() {
    // The tolerance stated in docs/ops.md: mean absolute difference <= 2.5 levels per
    // image and <= 1.5 on average over images; single pixels may differ more at edges.
    let data = file("big.jpg");
    let rrc = RandomResizedCrop::new(64, 64);
    let op = DecodeRandomResizedCrop::new(DecodeImage::default(), rrc.clone());
    let mut means = Vec::new();
    let mut scaled = 0;
    for seed in 0..100 {
        let mut rng = Rng::from_words(&[seed]);
        let b = rrc.get_params(500, 375, &mut rng.clone());
        if op.choose_scale(b.width, b.height) != DctScale::FULL {
            scaled += 1;
        }
        let f = op.apply(&data, &mut rng).unwrap();
        let (_, mean) = diff(&f, &unfused(&data, &rrc, seed));
        assert!(mean <= 2.5, "seed {seed}: mean diff {mean}");
        means.push(mean);
    }
    let avg = means.iter().sum::<f64>() / means.len() as f64;
    println!(
        "DCT-scaled fused vs unfused: mean |diff| {avg:.3} over {} crops",
        means.len()
    );
    assert!(avg <= 1.5, "{avg}");
    // Most boxes of a 500x375 image are decoded at a reduced scale for a 64x64 output.
    assert!(scaled >= 90, "{scaled}");
}

#[test]
fn other_inputs_take_the_unfused_path() {
    let rrc = RandomResizedCrop::new(32, 32);
    let op = DecodeRandomResizedCrop::new(DecodeImage::default(), rrc.clone());
    for name in ["photo.png", "lossy.webp"] {
        let data = file(name);
        let f = op.apply(&data, &mut Rng::from_words(&[5])).unwrap();
        assert_eq!(f, unfused(&data, &rrc, 5), "{name}");
    }
    // EXIF rotation applied: decoded whole, rotated, then cropped.
    let data = file("exif6.jpg");
    let dec = DecodeImage::default().apply_exif_orientation(true);
    let op = DecodeRandomResizedCrop::new(dec.clone(), rrc.clone());
    let f = op.apply(&data, &mut Rng::from_words(&[6])).unwrap();
    let full = decode_image(&data, &dec).unwrap();
    assert_eq!(full.shape(), &[32, 24, 3]);
    assert_eq!(f, rrc.apply(&full, &mut Rng::from_words(&[6])).unwrap());
}

#[test]
fn region_decode_cuts_exactly_the_pixels_of_a_whole_decode() {
    for name in [
        "big.jpg",
        "photo_422.jpg",
        "photo_444.jpg",
        "progressive.jpg",
        "gray.jpg",
        "cmyk.jpg",
    ] {
        let data = file(name);
        for eighths in [8u8, 5, 4, 3, 1] {
            let s = DctScale::new(eighths).unwrap();
            let (whole, _) = decode_jpeg(&data, &DecodeImage::default(), s, None).unwrap();
            let (hs, ws) = (whole.shape()[0], whole.shape()[1]);
            let regions = [
                (37 * hs / 375, 11 * hs / 375, 20, 9),
                (0, 0, 5, 5),
                // Reaching past the right and bottom edges: clamped.
                (ws - 3, hs - 2, 10, 10),
                (1, 1, ws - 1, hs - 1),
            ];
            for (x, y, w, h) in regions {
                let want = JpegRegion { x, y, w, h };
                let (part, got) =
                    decode_jpeg(&data, &DecodeImage::default(), s, Some(want)).unwrap();
                let (gw, gh) = ((x + w).min(ws) - x, (y + h).min(hs) - y);
                assert_eq!(got, JpegRegion { x, y, w: gw, h: gh });
                assert_eq!(part.shape(), &[gh, gw, 3]);
                for row in 0..gh {
                    let a = &part.data()[row * gw * 3..(row + 1) * gw * 3];
                    let o = ((y + row) * ws + x) * 3;
                    assert_eq!(
                        a,
                        &whole.data()[o..o + gw * 3],
                        "{name} {eighths}/8 {want:?} row {row}"
                    );
                }
            }
        }
    }
}

/// The fused op without its flip and conversion, then the separate `RandomFlip` and
/// `ToTensor` kernels, drawing from the same generators in the same order.
fn separate(op: &DecodeRandomResizedCrop, data: &[u8], crop: &mut Rng, flip: &mut Rng) -> Tensor {
    let mut plain = op.clone();
    plain.flip = None;
    plain.to_tensor = None;
    let mut t = plain.apply(data, crop).unwrap();
    if let Some(f) = &op.flip {
        t = f.apply(&t, flip).unwrap();
    }
    match &op.to_tensor {
        Some(c) => c.apply(&t).unwrap(),
        None => t,
    }
}

const CHAIN_FILES: [&str; 9] = [
    "big.jpg",
    "photo_420.jpg",
    "photo_422.jpg",
    "photo_444.jpg",
    "progressive.jpg",
    "gray.jpg",
    "cmyk.jpg",
    "photo.png",
    "lossy.webp",
];

#[test]
fn fused_flip_and_to_tensor_equal_the_separate_kernels_bit_for_bit() {
    let conversions = [
        ToTensor::imagenet(),
        ToTensor::imagenet().dtype(DType::F16),
        ToTensor::imagenet().layout(Layout::Hwc),
        ToTensor::default().scale(false),
    ];
    let mut flipped = 0;
    let mut cases = 0;
    let mut in_slot = 0;
    for name in CHAIN_FILES {
        let data = file(name);
        for (i, (h, w)) in [(224, 224), (64, 48), (17, 33)].into_iter().enumerate() {
            let base =
                DecodeRandomResizedCrop::new(DecodeImage::default(), RandomResizedCrop::new(h, w));
            for seed in 0..24u64 {
                let flip = match seed % 3 {
                    0 => RandomFlip::horizontal(),
                    1 => RandomFlip::vertical(),
                    _ => RandomFlip::horizontal().p(1.0),
                };
                let conv = conversions[(seed as usize + i) % conversions.len()].clone();
                let mut op = base.clone().flip(flip.clone());
                if seed % 4 != 3 {
                    op = op.to_tensor(conv);
                }
                if seed % 5 == 4 {
                    op = op.dct_scaling(false);
                }
                // One generator for both: `apply` draws the box, then the flip.
                let r = Rng::from_words(&[seed, 1]);
                let mut plain = op.clone();
                plain.flip = None;
                plain.to_tensor = None;
                let mut a = r.clone();
                let cropped = plain.apply(&data, &mut a).unwrap();
                let mut probe = a.clone();
                flipped += usize::from(flip.decide(&mut probe));
                let cropped = flip.apply(&cropped, &mut a).unwrap();
                let want = match &op.to_tensor {
                    Some(c) => c.apply(&cropped).unwrap(),
                    None => cropped,
                };
                let mut b = r.clone();
                assert_eq!(
                    op.apply(&data, &mut b).unwrap(),
                    want,
                    "{name} {h}x{w} seed {seed}"
                );
                // Same generator state afterwards: the same number of draws.
                assert_eq!(b.unit(), a.unit());
                // Two generators (the pipeline's: crop op and flip op).
                let (c0, f0) = (Rng::from_words(&[seed, 2]), Rng::from_words(&[seed, 3]));
                let want = separate(&op, &data, &mut c0.clone(), &mut f0.clone());
                let got = op
                    .apply_chain(&data, &mut c0.clone(), &mut f0.clone())
                    .unwrap();
                assert_eq!(got, want, "{name} {h}x{w} seed {seed} (two generators)");
                // Into a batch slot: the same tensor, its bytes in the slot.
                let slots = BatchSlots::new(2);
                let mut slot = None;
                let mut lease = |len| {
                    let l = slots.lease(0, 1, len)?;
                    slot = Some(l.as_ptr());
                    Some(l)
                };
                let mut charged = 0u64;
                let got = op
                    .apply_into(
                        &data,
                        &mut c0.clone(),
                        Some(&mut f0.clone()),
                        &mut lease,
                        &mut |n| {
                            charged += n;
                            Ok(())
                        },
                    )
                    .unwrap();
                assert!(charged > 0, "the kernel charges what it allocates");
                assert_eq!(got, want, "{name} {h}x{w} seed {seed} (in a slot)");
                assert!(slot.is_none() || op.to_tensor.is_some());
                if let Some(p) = slot {
                    assert_eq!(got.data().as_ptr(), p, "{name} {h}x{w} seed {seed}");
                    in_slot += 1;
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= 600 && flipped > 100, "{cases} {flipped}");
    assert!(in_slot >= cases / 2, "{in_slot} of {cases} in a slot");
}

#[test]
fn fused_chain_is_exact_for_every_filter_and_mode() {
    for interp in [
        Interpolation::Bicubic,
        Interpolation::Lanczos,
        Interpolation::Box,
        Interpolation::Nearest,
    ] {
        for (name, mode) in [
            ("photo_420.jpg", ColorMode::Rgb),
            ("big.jpg", ColorMode::Gray),
            ("progressive.jpg", ColorMode::Rgb),
        ] {
            let data = file(name);
            let dec = DecodeImage::default().mode(mode);
            let mut rrc = RandomResizedCrop::new(40, 56);
            rrc.interpolation = interp;
            for seed in 0..12u64 {
                let flip = if seed % 2 == 0 {
                    RandomFlip::horizontal().p(1.0)
                } else {
                    RandomFlip::vertical().p(1.0)
                };
                let op = DecodeRandomResizedCrop::new(dec.clone(), rrc.clone())
                    .flip(flip)
                    .to_tensor(ToTensor::default().normalize(&[0.5], &[0.25]));
                let (c0, f0) = (Rng::from_words(&[seed]), Rng::from_words(&[seed, 9]));
                let want = separate(&op, &data, &mut c0.clone(), &mut f0.clone());
                let got = op
                    .apply_chain(&data, &mut c0.clone(), &mut f0.clone())
                    .unwrap();
                assert_eq!(got, want, "{interp:?} {name} {mode:?} seed {seed}");
            }
        }
    }
}

#[test]
fn fused_chain_is_exact_when_an_axis_needs_no_resampling() {
    // The whole image at its own size: neither axis is resampled, the flip and the
    // conversion still apply.
    for name in ["photo_444.jpg", "gray.jpg", "big.jpg"] {
        let data = file(name);
        let info = image_info(&data).unwrap();
        let r = info.width as f64 / info.height as f64;
        for (h, w) in [
            (info.height, info.width),
            (info.height, 31),
            (29, info.width),
        ] {
            let rrc = RandomResizedCrop::new(h, w).scale(1.0, 1.0).ratio(r, r);
            for flip in [
                RandomFlip::horizontal().p(1.0),
                RandomFlip::vertical().p(1.0),
            ] {
                let op = DecodeRandomResizedCrop::new(DecodeImage::default(), rrc.clone())
                    .dct_scaling(false)
                    .flip(flip)
                    .to_tensor(ToTensor::imagenet());
                let (c0, f0) = (Rng::from_words(&[1]), Rng::from_words(&[2]));
                let want = separate(&op, &data, &mut c0.clone(), &mut f0.clone());
                let got = op
                    .apply_chain(&data, &mut c0.clone(), &mut f0.clone())
                    .unwrap();
                assert_eq!(got, want, "{name} {h}x{w}");
            }
        }
    }
}

#[test]
fn fused_chain_reports_the_conversions_errors() {
    let data = file("photo_420.jpg");
    let op = DecodeRandomResizedCrop::new(DecodeImage::default(), RandomResizedCrop::new(8, 8))
        .to_tensor(ToTensor::default().normalize(&[0.5, 0.5], &[1.0, 1.0]));
    let e = op.apply(&data, &mut Rng::from_words(&[1])).unwrap_err();
    assert!(e.to_string().contains("to_tensor: 2 mean values"), "{e}");
}

#[test]
fn to_tensor_into_a_batch_slot_is_the_same_tensor_in_the_slot() {
    let conversions = [
        ToTensor::imagenet(),
        ToTensor::imagenet().dtype(DType::F16),
        ToTensor::imagenet().layout(Layout::Hwc),
        ToTensor::default().scale(false),
    ];
    for name in ["photo_420.jpg", "gray.jpg", "big.jpg"] {
        let img = decode_image(&file(name), &DecodeImage::default()).unwrap();
        for conv in &conversions {
            let want = conv.apply(&img).unwrap();
            let slots = BatchSlots::new(4);
            let mut slot = None;
            let got = conv
                .apply_into(&img, &mut |len| {
                    let l = slots.lease(0, 2, len)?;
                    slot = Some(l.as_ptr());
                    Some(l)
                })
                .unwrap();
            assert_eq!(got, want, "{name} {conv:?}");
            assert_eq!(Some(got.data().as_ptr()), slot, "{name}: in the slot");
        }
    }
}
