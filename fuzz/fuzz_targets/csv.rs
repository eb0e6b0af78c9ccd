//! CSV: quoting, line ends, headers, type inference; the options come from the first byte.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_formats::csv::Csv;

fuzz_target!(|data: &[u8]| {
    let Some((&opts, text)) = data.split_first() else {
        return;
    };
    let csv = Csv {
        delimiter: [b',', b'\t', b';', b'|'][(opts & 3) as usize],
        has_header: opts & 4 == 0,
        infer_types: opts & 8 == 0,
    };
    stoker_fuzz::check_stream(&csv, "data.csv", text);
});
