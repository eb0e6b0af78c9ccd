//! Bad input never panics or hangs: truncated, corrupt, empty, zero-size and oversized
//! images give an error that names the operator (or, where documented, a recovered
//! image).

use std::path::PathBuf;

use bytes::Bytes;
use stoker_core::rng::Rng;
use stoker_core::{DType, ErrorKind, Tensor};
use stoker_ops::image::{
    decode_image, image_info, ColorMode, DecodeImage, DecodeRandomResizedCrop, Flip, Pad,
    RandomResizedCrop, Resize, ToTensor,
};

fn file(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/image/files")
        .join(name);
    std::fs::read(p).unwrap()
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG with the given IHDR dimensions and a few bytes of (bogus) image data.
fn png_with_size(w: u32, h: u32) -> Vec<u8> {
    let chunk = |kind: &[u8], data: &[u8]| {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend_from_slice(kind);
        c.extend_from_slice(data);
        let mut k = kind.to_vec();
        k.extend_from_slice(data);
        c.extend_from_slice(&crc32(&k).to_be_bytes());
        c
    };
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
    f.extend(chunk(b"IHDR", &ihdr));
    f.extend(chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    f.extend(chunk(b"IEND", &[]));
    f
}

fn assert_named(data: &[u8], opts: &DecodeImage, ops: &[&str]) {
    match decode_image(data, opts) {
        Ok(t) => panic!("decoded {t:?} from bad input"),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Operator, "{e}");
            assert!(
                ops.iter().any(|op| e.message.starts_with(op)),
                "error does not name {ops:?}: {e}"
            );
        }
    }
}

#[test]
fn truncated_jpeg_is_an_error_unless_allowed() {
    let full = file("photo_420.jpg");
    let whole = decode_image(&full, &DecodeImage::default()).unwrap();
    let lenient = DecodeImage::default().allow_truncated(true);
    for frac in [0.02, 0.1, 0.3, 0.5, 0.8, 0.95] {
        let cut = &full[..(full.len() as f64 * frac) as usize];
        assert_named(cut, &DecodeImage::default(), &["decode_jpeg"]);
        // Once the headers are complete, the lenient decoder returns the full-size image
        // with the missing rows filled in (as PIL with LOAD_TRUNCATED_IMAGES).
        if frac >= 0.3 {
            let t = decode_image(cut, &lenient).unwrap();
            assert_eq!(t.shape(), whole.shape());
        } else {
            assert!(decode_image(cut, &lenient).is_err());
        }
    }
    // Without the final EOI marker libjpeg warns too: still "truncated".
    let e = decode_image(&full[..full.len() - 2], &DecodeImage::default()).unwrap_err();
    assert!(e.message.contains("truncated"), "{e}");
}

#[test]
fn truncated_png_and_webp_are_errors() {
    for (name, op) in [
        ("photo.png", "decode_png"),
        ("palette.png", "decode_png"),
        ("lossy.webp", "decode_webp"),
        ("lossless.webp", "decode_webp"),
    ] {
        let full = file(name);
        for cut in [9, 20, 33, full.len() / 2, full.len() - 13] {
            assert_named(&full[..cut], &DecodeImage::default(), &[op]);
        }
    }
}

#[test]
fn corrupt_bytes_never_panic() {
    // Flip bytes throughout each file; every outcome must be an image of the declared
    // size or an error naming the decoder.
    for name in [
        "photo_420.jpg",
        "progressive.jpg",
        "cmyk.jpg",
        "photo.png",
        "lossy.webp",
        "lossless.webp",
    ] {
        let full = file(name);
        let mut decoded = 0;
        for i in (2..full.len()).step_by((full.len() / 97).max(1)) {
            let mut bad = full.clone();
            bad[i] ^= 0x5A;
            match decode_image(&bad, &DecodeImage::default()) {
                Ok(t) => {
                    decoded += 1;
                    assert_eq!(t.dtype(), DType::U8);
                    assert_eq!(t.shape().len(), 3);
                }
                Err(e) => assert!(
                    e.message.starts_with("decode_"),
                    "{name} byte {i}: error does not name the decoder: {e}"
                ),
            }
        }
        // Flips in entropy-coded data mostly decode (to wrong pixels); that path is
        // exercised, not only the error path.
        if name.ends_with(".jpg") {
            assert!(decoded > 0, "{name}");
        }
    }
}

#[test]
fn empty_zero_size_and_unknown_inputs() {
    assert_named(b"", &DecodeImage::default(), &["decode_image"]);
    assert_named(b"\xff\xd8\xff", &DecodeImage::default(), &["decode_jpeg"]);
    assert_named(b"hello world", &DecodeImage::default(), &["decode_image"]);
    assert_named(
        &png_with_size(0, 10),
        &DecodeImage::default(),
        &["decode_png"],
    );
    assert_named(
        &png_with_size(10, 0),
        &DecodeImage::default(),
        &["decode_png"],
    );
}

#[test]
fn bombs_are_refused_from_the_header() {
    for name in ["bomb.png", "bomb.jpg"] {
        let data = file(name);
        let e = decode_image(&data, &DecodeImage::default()).unwrap_err();
        assert!(e.message.contains("exceeds the limit"), "{name}: {e}");
        // The header is fine; only the size is refused.
        let info = image_info(&data).unwrap();
        assert!(info.width as u64 * info.height as u64 > 89_478_485);
    }
    let big = png_with_size(20_000, 20_000);
    let e = decode_image(&big, &DecodeImage::default()).unwrap_err();
    assert!(e.message.contains("exceeds the limit"), "{e}");
    // The limit is configurable, for every format and for the fused path.
    let small = DecodeImage::default().max_pixels(100);
    for name in ["photo_420.jpg", "photo.png", "lossy.webp"] {
        let e = decode_image(&file(name), &small).unwrap_err();
        assert!(
            e.message.contains("exceeds the limit of 100"),
            "{name}: {e}"
        );
    }
    let fused = DecodeRandomResizedCrop::new(small, RandomResizedCrop::new(8, 8));
    let e = fused
        .apply(&file("photo_420.jpg"), &mut Rng::from_words(&[1]))
        .unwrap_err();
    assert!(e.message.contains("exceeds the limit"), "{e}");
}

#[test]
fn cmyk_gray_and_tiny_images() {
    let g = decode_image(
        &file("cmyk.jpg"),
        &DecodeImage::default().mode(ColorMode::Gray),
    )
    .unwrap();
    assert_eq!(g.shape(), &[30, 40, 1]);
    let one = decode_image(&file("one.jpg"), &DecodeImage::default()).unwrap();
    assert_eq!(one.shape(), &[1, 1, 3]);
    // A 1x1 image through the whole augmentation chain.
    let mut rng = Rng::from_words(&[9]);
    let op = DecodeRandomResizedCrop::new(DecodeImage::default(), RandomResizedCrop::new(224, 224));
    for name in ["one.jpg", "one.png"] {
        let t = op.apply(&file(name), &mut rng).unwrap();
        assert_eq!(t.shape(), &[224, 224, 3]);
        let px = &t.data()[..3];
        assert!(t.data().chunks_exact(3).all(|p| p == px), "{name}");
        let t = Flip::Horizontal.apply(&t).unwrap();
        let n = ToTensor::imagenet().apply(&t).unwrap();
        assert_eq!(n.shape(), &[3, 224, 224]);
    }
}

#[test]
fn kernels_reject_what_is_not_an_image() {
    let f = Tensor::from_slice(vec![2, 2, 3], &[0f32; 12]).unwrap();
    let e = Resize::new(4, 4).apply(&f).unwrap_err();
    assert!(
        e.message.starts_with("resize: expects a uint8 image"),
        "{e}"
    );
    let empty = Tensor::new(DType::U8, vec![0, 5, 3], Bytes::new()).unwrap();
    let e = Pad::new([1; 4]).apply(&empty).unwrap_err();
    assert!(e.message.starts_with("pad: empty image"), "{e}");
    let five = Tensor::new(DType::U8, vec![1, 1, 5], Bytes::from(vec![0u8; 5])).unwrap();
    let e = Flip::Vertical.apply(&five).unwrap_err();
    assert!(e.message.starts_with("flip:"), "{e}");
    let e = RandomResizedCrop::new(0, 4)
        .apply(&five, &mut Rng::from_words(&[0]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
}
