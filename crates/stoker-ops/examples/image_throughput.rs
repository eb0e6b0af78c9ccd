//! Images per second on one thread for the image kernels over a directory of JPEGs
//! (files are read into memory first; only decoding and transforms are timed). Two rates
//! are printed: by wall-clock time, and by the thread's CPU time, which is the steadier
//! measure on a shared machine (other processes' load barely moves it).
//!
//! ```sh
//! python crates/stoker-ops/examples/make_jpegs.py /work/data-jpeg 2000
//! cargo run --release -p stoker-ops --example image_throughput -- /work/data-jpeg [--limit N] [--passes P] [--only MODE]
//! ```
//!
//! Modes:
//! - `decode`: full decode to RGB (libjpeg-turbo, accurate DCT, fancy upsampling).
//! - `decode 1/2`, `decode 1/4`: DCT-domain scaled decode.
//! - `fused`: decode + RandomResizedCrop(224) fused (region + DCT scaling), random
//!   horizontal flip, ImageNet normalisation to f32 CHW: a whole ImageNet train transform.
//! - `fused chain`: the same transform as `fused rrc+flip+normalize` with the flip and the
//!   normalisation fused into the crop's resample (`DecodeRandomResizedCrop::flip` and
//!   `::to_tensor`): what the pipeline runs for that chain.
//! - `unfused`: full decode, then RandomResizedCrop(224), flip, normalise.
//! - `unfused rrc only`: full decode then RandomResizedCrop(224), nothing else.

use std::time::Instant;

use stoker_core::rng::Rng;
use stoker_ops::image::{
    decode_image, decode_jpeg, DctScale, DecodeImage, DecodeRandomResizedCrop, RandomFlip,
    RandomResizedCrop, ToTensor,
};

/// This thread's CPU time in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut limit = usize::MAX;
    let mut passes = 1;
    let mut only: Option<String> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--limit" => limit = args.next().and_then(|v| v.parse().ok()).expect("--limit N"),
            "--passes" => {
                passes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--passes P")
            }
            "--only" => only = Some(args.next().expect("--only MODE")),
            _ => dir = Some(a),
        }
    }
    let dir = dir.unwrap_or_else(|| "/work/data-jpeg".to_string());
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jpg" || x == "jpeg"))
        .collect();
    paths.sort();
    paths.truncate(limit);
    let files: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let bytes: usize = files.iter().map(Vec::len).sum();
    println!(
        "{} JPEGs in {dir}, mean {:.1} KiB; one thread, {passes} pass(es) per mode",
        files.len(),
        bytes as f64 / files.len().max(1) as f64 / 1024.0
    );

    let dec = DecodeImage::default();
    let rrc = RandomResizedCrop::new(224, 224);
    let fused = DecodeRandomResizedCrop::new(dec.clone(), rrc.clone());
    let flip = RandomFlip::horizontal();
    let norm = ToTensor::imagenet();

    let run = |name: &str, f: &dyn Fn(&[u8], &mut Rng) -> usize| {
        if only.as_ref().is_some_and(|o| o != name) {
            return;
        }
        // One warm-up pass over a few files, then the timed passes.
        for (i, d) in files.iter().take(20).enumerate() {
            f(d, &mut Rng::from_words(&[99, i as u64]));
        }
        let t = Instant::now();
        let cpu = thread_cpu();
        let mut sink = 0usize;
        for pass in 0..passes {
            for (i, d) in files.iter().enumerate() {
                sink = sink.wrapping_add(f(d, &mut Rng::from_words(&[pass as u64, i as u64])));
            }
        }
        let n = files.len() * passes;
        let s = t.elapsed().as_secs_f64();
        let c = thread_cpu() - cpu;
        println!(
            "{name:28} {:7.1} images/s wall, {:7.1} images/s CPU ({:.3} ms CPU/image; checksum {sink})",
            n as f64 / s,
            n as f64 / c,
            c * 1e3 / n as f64
        );
    };

    run("decode", &|d, _| {
        decode_image(d, &dec).unwrap().data().len()
    });
    for e in [4u8, 2] {
        let s = DctScale::new(e).unwrap();
        run(&format!("decode 1/{}", 8 / e), &|d, _| {
            decode_jpeg(d, &dec, s, None).unwrap().0.data().len()
        });
    }
    run("fused rrc only", &|d, rng| {
        fused.apply(d, rng).unwrap().data().len()
    });
    run("fused rrc+flip+normalize", &|d, rng| {
        let t = fused.apply(d, rng).unwrap();
        let t = flip.apply(&t, rng).unwrap();
        norm.apply(&t).unwrap().data().len()
    });
    let chain = fused.clone().flip(flip.clone()).to_tensor(norm.clone());
    run("fused chain", &|d, rng| {
        chain.apply(d, rng).unwrap().data().len()
    });
    let every = chain.clone().all_eighths(true);
    run("fused chain, every M/8", &|d, rng| {
        every.apply(d, rng).unwrap().data().len()
    });
    run("unfused rrc only", &|d, rng| {
        let full = decode_image(d, &dec).unwrap();
        rrc.apply(&full, rng).unwrap().data().len()
    });
    run("unfused rrc+flip+normalize", &|d, rng| {
        let full = decode_image(d, &dec).unwrap();
        let t = rrc.apply(&full, rng).unwrap();
        let t = flip.apply(&t, rng).unwrap();
        norm.apply(&t).unwrap().data().len()
    });

    if only.is_some() {
        return;
    }
    // How far the DCT-scaled fused crop is from the unfused one (same boxes), with the
    // default scales (powers of two) and with every M/8.
    for (label, op) in [
        ("powers of two", fused.clone()),
        ("every M/8", fused.clone().all_eighths(true)),
    ] {
        let mut sum = 0.0;
        let mut worst: f64 = 0.0;
        let mut scaled = 0;
        let m = files.len().min(500);
        for (i, d) in files.iter().take(m).enumerate() {
            let words = [7, i as u64];
            let info = stoker_ops::image::image_info(d).unwrap();
            let b = rrc.get_params(info.width, info.height, &mut Rng::from_words(&words));
            if op.choose_scale(b.width, b.height) != DctScale::FULL {
                scaled += 1;
            }
            let a = op.apply(d, &mut Rng::from_words(&words)).unwrap();
            let full = decode_image(d, &dec).unwrap();
            let u = rrc.apply(&full, &mut Rng::from_words(&words)).unwrap();
            let diff: u64 = a
                .data()
                .iter()
                .zip(u.data().iter())
                .map(|(x, y)| x.abs_diff(*y) as u64)
                .sum();
            let mean = diff as f64 / a.data().len() as f64;
            sum += mean;
            worst = worst.max(mean);
        }
        println!(
            "fused ({label}) vs unfused RRC(224) over {m} images: mean |diff| {:.3} levels \
             (worst image {worst:.3}); {scaled} of {m} decoded at a reduced DCT scale",
            sum / m as f64
        );
    }
}
