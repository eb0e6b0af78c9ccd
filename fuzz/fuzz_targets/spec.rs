//! Pipeline specs (`stoker run PIPELINE.toml`): TOML into a `PipelineSpec`, then built into
//! a pipeline (operators' arguments checked; nothing is read).
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_pipeline::PipelineSpec;
use stoker_store::StoreOptions;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = toml::from_str::<PipelineSpec>(text) else {
        return;
    };
    if let Ok(p) = spec.build(StoreOptions::default()) {
        let _ = format!("{p:?}");
    }
});
