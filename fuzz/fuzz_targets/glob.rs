//! Globs as listings use them (`--glob`, a spec's `glob`): compiled with globset and
//! matched against a key. The input is the glob, a NUL, then the key.
#![no_main]
use globset::Glob;
use libfuzzer_sys::fuzz_target;
use stoker_store::ListOptions;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (glob, key) = s.split_once('\0').unwrap_or((s, "train/shard-000.tar"));
    // What `Store::list` builds from `ListOptions::glob`.
    let _ = ListOptions::default().with_glob(glob);
    if let Ok(g) = Glob::new(glob) {
        let m = g.compile_matcher();
        let _ = m.is_match(key);
    }
});
