//! The fused decode + RandomResizedCrop against decode followed by the unfused crop: same
//! boxes, and pixels within the tolerance docs/ops.md states for DCT scaling.

use std::path::PathBuf;

use stoker_core::rng::Rng;
use stoker_core::Tensor;
use stoker_ops::image::{
    decode_image, decode_jpeg, DctScale, DecodeImage, DecodeRandomResizedCrop, JpegRegion,
    RandomResizedCrop,
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
