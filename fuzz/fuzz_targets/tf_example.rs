//! `tf.train.Example` protobuf decoding: the bytes are one record's payload, framed with
//! correct CRCs so that every input reaches the decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_formats::tfrecord::{write_record, TfRecord};

fuzz_target!(|data: &[u8]| {
    let mut framed = Vec::with_capacity(data.len() + 16);
    write_record(&mut framed, data);
    // And twice, so that a decoder's state carried between records is exercised.
    write_record(&mut framed, data);
    stoker_fuzz::check_stream(
        &TfRecord {
            parse_examples: true,
        },
        "shard.tfrecord",
        &framed,
    );
});
