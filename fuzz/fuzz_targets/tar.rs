//! WebDataset tar: headers (ustar, GNU, pax), long names, payloads, grouping by key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_formats::tar::Tar;

fuzz_target!(|data: &[u8]| {
    stoker_fuzz::check_stream(&Tar, "shard.tar", data);
});
