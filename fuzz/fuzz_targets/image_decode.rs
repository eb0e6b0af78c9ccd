//! Image decoding: JPEG (libjpeg-turbo), PNG and WebP into tensors, with EXIF orientation,
//! colour modes, and the fused region-decoding RandomResizedCrop. The pixel limit is
//! lowered so that a large (valid) header is refused rather than slowly decoded.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_core::rng::Rng;
use stoker_ops::image::{
    decode_image, image_info, ColorMode, DecodeImage, DecodeRandomResizedCrop, RandomResizedCrop,
};

const MAX_PIXELS: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&opts, data)) = data.split_first() else {
        return;
    };
    let mode = [ColorMode::Rgb, ColorMode::Gray, ColorMode::RgbKeepAlpha][(opts % 3) as usize];
    let options = DecodeImage::default()
        .mode(mode)
        .apply_exif_orientation(opts & 4 != 0)
        .allow_truncated(opts & 8 != 0)
        .max_pixels(MAX_PIXELS);
    let info = image_info(data);
    let decoded = decode_image(data, &options);
    if let (Ok(info), Ok(t)) = (&info, &decoded) {
        let shape = t.shape();
        assert_eq!(shape.len(), 3, "an image is [H, W, C]");
        let (h, w) = (shape[0], shape[1]);
        assert!(
            (h, w) == (info.height, info.width) || (h, w) == (info.width, info.height),
            "decoded {h}x{w}, header says {}x{}",
            info.height,
            info.width
        );
    }
    if opts & 16 != 0 && decoded.is_ok() {
        let fused = DecodeRandomResizedCrop::new(options, RandomResizedCrop::new(32, 24))
            .all_eighths(opts & 32 != 0);
        let mut rng = Rng::from_words(&[opts as u64, data.len() as u64]);
        let t = fused
            .apply(data, &mut rng)
            .expect("decodes whole, so crops");
        assert_eq!(&t.shape()[..2], &[32, 24]);
    }
});
