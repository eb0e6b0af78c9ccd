//! TFRecord framing (lengths, masked CRC32Cs), records as `data` and as `tf.train.Example`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_formats::tfrecord::TfRecord;

fuzz_target!(|data: &[u8]| {
    for parse_examples in [false, true] {
        stoker_fuzz::check_stream(&TfRecord { parse_examples }, "shard.tfrecord", data);
    }
});
