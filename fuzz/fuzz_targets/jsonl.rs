//! JSON Lines: one object per line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_formats::jsonl::Jsonl;

fuzz_target!(|data: &[u8]| {
    stoker_fuzz::check_stream(&Jsonl, "data.jsonl", data);
});
