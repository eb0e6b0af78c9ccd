//! Store URL parsing (`s3://`, `gs://`, `az://`, `file://`, paths, `http(s)://`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_store::StoreUrl;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(u) = StoreUrl::parse(s) {
        let _ = u.object_url("a/b c%2F.tar");
        let _ = format!("{u:?}");
    }
});
