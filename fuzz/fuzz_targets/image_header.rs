//! Image headers: format sniffing and JPEG/PNG/WebP size, as `image_info` reads them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = stoker_ops::image::image_info(data) {
        let _ = (info.width, info.height);
    }
});
