//! Image operators in pipelines: spec names, shapes, the decode + crop fusion, determinism
//! and errors. The kernels' own parity with torchvision is tested in stoker-ops.

use std::path::PathBuf;

use stoker_core::{DType, Sample, Tensor, Value};
use stoker_pipeline::{Builtin, FieldOp, ImageOp, Item, Pipeline, PipelineSpec, RunOptions, Size};

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../stoker-ops/tests/fixtures/image/files")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `n` samples, each one of the fixture JPEGs (and PNG) in turn.
fn images(n: usize) -> Pipeline {
    let files = [
        "photo_420.jpg",
        "photo_422.jpg",
        "progressive.jpg",
        "big.jpg",
        "photo.png",
        "gray.jpg",
        "cmyk.jpg",
    ];
    Pipeline::from_samples(
        (0..n)
            .map(|i| {
                let mut s = Sample::new();
                s.insert("__key__", format!("img{i}"));
                s.insert("jpg", Value::Bytes(fixture(files[i % files.len()]).into()));
                s.insert("label", i as i64);
                s
            })
            .collect(),
    )
}

fn decode() -> Builtin {
    Builtin::Image(ImageOp::DecodeImage {
        field: "jpg".into(),
        mode: None,
        exif_orientation: false,
        max_pixels: None,
        allow_truncated: false,
    })
}

fn rrc(n: usize) -> Builtin {
    Builtin::Image(ImageOp::RandomResizedCrop {
        field: "jpg".into(),
        size: Size::Square(n),
        scale: None,
        ratio: None,
        interpolation: None,
        antialias: None,
    })
}

fn to_tensor() -> Builtin {
    Builtin::Image(ImageOp::ImageToTensor {
        field: "jpg".into(),
        normalize: Some("imagenet".into()),
        mean: None,
        std: None,
        dtype: None,
        layout: None,
        scale: true,
    })
}

fn tensors(p: &Pipeline) -> Vec<Tensor> {
    p.run()
        .unwrap()
        .map(|i| match i.unwrap() {
            Item::Sample(s) => match s.get("jpg").unwrap() {
                Value::Tensor(t) => t.clone(),
                v => panic!("{v:?}"),
            },
            Item::Batch(_) => panic!("a batch"),
        })
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn an_imagenet_pipeline_from_a_spec_makes_normalized_chw_batches() {
    let spec: PipelineSpec = toml::from_str(
        r#"
        source = "unused"
        format = "files"
        [[ops]]
        op = "decode_image"
        field = "jpg"
        [[ops]]
        op = "random_resized_crop"
        field = "jpg"
        size = 32
        [[ops]]
        op = "random_flip"
        field = "jpg"
        [[ops]]
        op = "color_jitter"
        field = "jpg"
        brightness = 0.4
        contrast = 0.4
        saturation = 0.4
        hue = 0.1
        p = 0.8
        [[ops]]
        op = "random_grayscale"
        field = "jpg"
        p = 0.2
        [[ops]]
        op = "gaussian_blur"
        field = "jpg"
        kernel_size = 5
        [[ops]]
        op = "image_to_tensor"
        field = "jpg"
        normalize = "imagenet"
        [[ops]]
        op = "batch"
        size = 4
        "#,
    )
    .unwrap();
    let p = spec.apply_ops(images(10)).unwrap();
    let explain = p.explain();
    assert!(
        explain.contains("decode_image+random_resized_crop+random_flip(jpg)"),
        "{explain}"
    );
    let batches: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
    assert_eq!(batches.len(), 3);
    let b = batches[0].clone().into_batch().unwrap();
    let Value::Tensor(t) = b.get("jpg").unwrap() else {
        panic!("not stacked")
    };
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.shape(), &[4, 3, 32, 32]);
    // Normalized values: roughly centred, within what (x/255 - mean)/std allows.
    let v = f32s(t);
    assert!(v.iter().all(|x| (-2.2..=2.7).contains(x)));
    assert!(v.iter().any(|x| *x < 0.0) && v.iter().any(|x| *x > 0.0));
}

#[test]
fn the_fused_decode_and_crop_picks_the_same_boxes() {
    // A `select` between them keeps them apart: that pipeline runs them unfused.
    let fused = images(14).map(decode()).map(rrc(48)).seed(9);
    let apart = images(14)
        .map(decode())
        .map(Builtin::Fields(FieldOp::Select {
            fields: vec!["__key__".into(), "jpg".into(), "label".into()],
        }))
        .map(rrc(48))
        .seed(9);
    assert!(fused.explain().contains("decode_image+random_resized_crop"));
    assert!(!apart.explain().contains("decode_image+random_resized_crop"));
    // The select has index 1, so the crop is op 2 there and op 1 here: give the fused
    // pipeline the same index by a no-op in front.
    let fused = images(14)
        .map(Builtin::Fields(FieldOp::Drop { fields: vec![] }))
        .map(decode())
        .map(rrc(48))
        .seed(9);
    let a = tensors(&fused);
    let b = tensors(&apart);
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.shape(), &[48, 48, 3]);
        assert_eq!(x.shape(), y.shape());
        // Same box; pixels differ only by decoding at a DCT scale and the region's edges.
        let mean_abs: f64 = x
            .data()
            .iter()
            .zip(y.data().iter())
            .map(|(p, q)| (*p as f64 - *q as f64).abs())
            .sum::<f64>()
            / x.data().len() as f64;
        assert!(mean_abs < 6.0, "mean |diff| {mean_abs}: not the same crop");
    }
    // And a different seed gives different crops (the test can fail).
    let other = tensors(&images(14).map(decode()).map(rrc(48)).seed(10));
    assert_ne!(other, a);
}

fn flip() -> Builtin {
    Builtin::Image(ImageOp::RandomFlip {
        field: "jpg".into(),
        vertical: false,
        p: 0.5,
    })
}

#[test]
fn the_fused_chain_with_flip_and_to_tensor_gives_the_unfused_results() {
    // decode, crop, flip, to_tensor all run as one kernel.
    let whole = images(21)
        .map(decode())
        .map(rrc(40))
        .map(flip())
        .map(to_tensor())
        .seed(3);
    let plan = whole.explain();
    assert!(
        plan.contains("decode_image+random_resized_crop+random_flip+image_to_tensor(jpg)"),
        "{plan}"
    );
    // The same with to_tensor kept apart (a no-op in front of it): bit-identical, since the
    // crop and the flip keep their operator indices (1 and 2).
    let three = images(21)
        .map(decode())
        .map(rrc(40))
        .map(flip())
        .map(Builtin::Fields(FieldOp::Drop { fields: vec![] }))
        .map(to_tensor())
        .seed(3);
    assert!(three
        .explain()
        .contains("decode_image+random_resized_crop+random_flip(jpg)"));
    let a = tensors(&whole);
    assert_eq!(a, tensors(&three));
    // Nothing fused (a select between decode and crop), same operator indices as `fused`
    // below: the same boxes and the same flips, pixels within DCT-scaling differences.
    let apart = images(21)
        .map(decode())
        .map(Builtin::Fields(FieldOp::Select {
            fields: vec!["__key__".into(), "jpg".into(), "label".into()],
        }))
        .map(rrc(40))
        .map(flip())
        .map(to_tensor())
        .seed(3);
    assert!(!apart.explain().contains("+"));
    let fused = images(21)
        .map(Builtin::Fields(FieldOp::Drop { fields: vec![] }))
        .map(decode())
        .map(rrc(40))
        .map(flip())
        .map(to_tensor())
        .seed(3);
    let (x, y) = (tensors(&fused), tensors(&apart));
    assert_eq!(x.len(), 21);
    let mut flipped_differently = 0;
    for (p, q) in x.iter().zip(&y) {
        assert_eq!(p.shape(), &[3, 40, 40]);
        assert_eq!(p.shape(), q.shape());
        let (p, q) = (f32s(p), f32s(q));
        let mean_abs = p
            .iter()
            .zip(&q)
            .map(|(a, b)| (a - b).abs() as f64)
            .sum::<f64>()
            / p.len() as f64;
        // Normalized units: 6 levels of 255 over ImageNet's std is about 0.1.
        if mean_abs > 0.1 {
            flipped_differently += 1;
        }
    }
    assert_eq!(flipped_differently, 0, "some crops or flips differ");
    // The flips are really random: with another seed some outputs change.
    let other = tensors(
        &images(21)
            .map(decode())
            .map(rrc(40))
            .map(flip())
            .map(to_tensor())
            .seed(4),
    );
    assert_ne!(other, a);
}

#[test]
fn image_pipelines_do_not_depend_on_the_number_of_threads() {
    let p = |threads: usize| {
        images(20)
            .map(decode())
            .map(rrc(24))
            .map(Builtin::Image(ImageOp::RandomFlip {
                field: "jpg".into(),
                vertical: false,
                p: 0.5,
            }))
            .map(to_tensor())
            .seed(5)
            .options(RunOptions::default().with_threads(threads))
    };
    assert_eq!(tensors(&p(1)), tensors(&p(3)));
}

#[test]
fn bad_images_name_the_operator_and_the_sample() {
    let mut s = Sample::new();
    s.insert("__key__", "broken");
    let mut jpeg = fixture("photo_420.jpg");
    jpeg.truncate(jpeg.len() / 3);
    s.insert("jpg", Value::Bytes(jpeg.into()));
    let p = Pipeline::from_samples(vec![s]).map(decode()).map(rrc(16));
    let err = p.run().unwrap().next().unwrap().unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("decode_image"), "{msg}");
    assert!(
        msg.contains("memory:0") || msg.contains("record 0"),
        "{msg}"
    );
    // An operator that needs a decoded image says so.
    let p = images(1).map(rrc(16));
    let msg = p.run().unwrap().next().unwrap().unwrap_err().to_string();
    assert!(msg.contains("decode_image first"), "{msg}");
    // Arguments are checked before running.
    let bad: Result<PipelineSpec, _> = toml::from_str(
        "source = \"x\"\nformat = \"files\"\n[[ops]]\nop = \"image_to_tensor\"\nfield = \"jpg\"\nlayout = \"whc\"\n",
    );
    let msg = bad.unwrap().apply_ops(images(1)).unwrap_err().to_string();
    assert!(msg.contains("layout"), "{msg}");
}

/// The ImageNet-style chain batched: the fused kernel writes each sample's tensor into its
/// batch slot (see `stoker_core::BatchSlots`) when the batch follows it directly.
fn batched(samples: Vec<Sample>, threads: usize, last: Option<Builtin>) -> Pipeline {
    let mut p = Pipeline::from_samples(samples)
        .map(decode())
        .map(rrc(96))
        .map(flip())
        .map(to_tensor());
    if let Some(op) = last {
        p = p.map(op);
    }
    p.batch(8, false).seed(11).options(
        RunOptions::default()
            .with_threads(threads)
            .with_errors(stoker_pipeline::ErrorPolicy::Skip),
    )
}

fn samples(n: usize, bad_every: usize) -> Vec<Sample> {
    let files = [
        "photo_420.jpg",
        "progressive.jpg",
        "photo.png",
        "photo_422.jpg",
    ];
    (0..n)
        .map(|i| {
            let mut s = Sample::new();
            s.insert("__key__", format!("img{i}"));
            let data = if bad_every > 0 && i % bad_every == bad_every - 1 {
                b"not an image".to_vec()
            } else {
                fixture(files[i % files.len()])
            };
            s.insert("jpg", Value::Bytes(data.into()));
            s.insert("label", i as i64);
            s
        })
        .collect()
}

#[test]
fn batches_stacked_in_the_kernels_slots_equal_batches_stacked_by_copy() {
    for (n, bad_every, threads) in [(70, 0, 2), (61, 13, 2), (45, 0, 1), (50, 7, 3)] {
        let items = |last: Option<Builtin>| {
            let mut run = batched(samples(n, bad_every), threads, last).run().unwrap();
            let items: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
            (items, run.stats())
        };
        let (slotted, st) = items(None);
        // A no-op after the kernel: the batch stage copies every sample.
        let (copied, st2) = items(Some(Builtin::Fields(FieldOp::Drop { fields: vec![] })));
        assert_eq!(slotted, copied, "{n} samples, every {bad_every} bad");
        let rows: usize = slotted.iter().map(Item::samples).sum();
        let bad = n.checked_div(bad_every).unwrap_or(0);
        assert_eq!(rows, n - bad);
        assert_eq!(st.skipped, bad as u64);
        let slots = st.batch_slots.expect("the batch follows the kernel");
        // PNGs (a quarter) take the unfused path: copied. The others are found in place
        // unless skipped samples moved them (each one moves the prediction).
        if bad_every == 0 {
            assert!(
                slots.placed as usize >= rows / 2 && !slots.given_up,
                "{n} samples: {slots:?}"
            );
        }
        assert_eq!(st2.batch_slots.map(|s| s.placed), Some(0));
    }
}

#[test]
fn a_run_resumed_mid_batch_with_slots_gives_the_same_batches() {
    let p = batched(samples(60, 11), 2, None);
    let full: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
    for k in [1, 3, 5] {
        let mut run = p.run().unwrap();
        let head: Vec<Item> = run.by_ref().take(k).map(Result::unwrap).collect();
        assert_eq!(&head[..], &full[..k]);
        let state = run.state().unwrap();
        drop(run);
        let rest: Vec<Item> = p.resume(&state).unwrap().map(Result::unwrap).collect();
        assert_eq!(&rest[..], &full[k..], "resumed after {k} batches");
    }
}

#[test]
fn an_unfused_to_tensor_before_the_batch_writes_into_its_slots_too() {
    // Validation style: decode, resize, center crop, to_tensor (not fused with the decode).
    let p = |slotted: bool| {
        let mut p = Pipeline::from_samples(samples(40, 0))
            .map(decode())
            .map(Builtin::Image(ImageOp::Resize {
                field: "jpg".into(),
                size: Size::Square(110),
                interpolation: None,
                antialias: None,
            }))
            .map(Builtin::Image(ImageOp::CenterCrop {
                field: "jpg".into(),
                size: Size::Square(96),
            }))
            .map(to_tensor());
        if !slotted {
            p = p.map(Builtin::Fields(FieldOp::Drop { fields: vec![] }));
        }
        p.batch(8, false)
            .options(RunOptions::default().with_threads(2))
    };
    let mut run = p(true).run().unwrap();
    let a: Vec<Item> = run.by_ref().map(Result::unwrap).collect();
    let st = run.stats().batch_slots.unwrap();
    let b: Vec<Item> = p(false).run().unwrap().map(Result::unwrap).collect();
    assert_eq!(a, b);
    // PNGs too: to_tensor runs on every decoded image.
    assert!(st.placed >= 30, "{st:?}");
}

/// The images of a directory, read through the process's shared store, decoded and cropped
/// at random: what `stoker.torch` runs each epoch of a training loop.
fn shared_dir(dir: &std::path::Path, decode: Builtin) -> Pipeline {
    // Listings trusted for no time: the test changes the directory.
    let mut options = stoker_store::StoreOptions::default();
    options.metadata_ttl = std::time::Duration::ZERO;
    Pipeline::from_url(
        &format!("{}/", dir.display()),
        options,
        stoker_pipeline::FormatChoice::Files,
    )
    .map(decode)
    .map(rrc(16))
    .seed(3)
    .options(shared())
}

fn shared() -> RunOptions {
    RunOptions::default().with_share_store(true).with_threads(2)
}

fn crops(p: &Pipeline) -> (Vec<(String, Tensor)>, stoker_pipeline::Stats) {
    let mut run = p.run().unwrap();
    let mut out: Vec<(String, Tensor)> = run
        .by_ref()
        .map(|i| match i.unwrap() {
            Item::Sample(s) => (
                s.get("__key__")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_string(),
                match s.get("jpg").unwrap() {
                    Value::Tensor(t) => t.clone(),
                    v => panic!("{v:?}"),
                },
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    (out, run.stats())
}

#[test]
fn later_runs_through_the_shared_store_start_from_the_decoded_images_and_yield_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let names = [
        "photo_420.jpg",
        "photo_422.jpg",
        "progressive.jpg",
        "gray.jpg",
    ];
    for (i, n) in names.iter().enumerate() {
        std::fs::write(dir.path().join(format!("{i}.jpg")), fixture(n)).unwrap();
    }
    let p = shared_dir(dir.path(), decode());
    assert!(p.explain().contains("decided by a run"), "{}", p.explain());
    // The cached head decodes whole images, as the chain unfused does (fused, the decode
    // works at a DCT scale: the same boxes, pixels a little apart).
    let off = p
        .clone()
        .options(shared().with_disabled_passes(["cache", "fusion"]));
    // Epoch 0 fills the cache; epochs 1 and 2, each a run of its own, read from it.
    let (first, st) = crops(&p);
    let c = st
        .sample_cache
        .clone()
        .expect("a cache kept for later runs");
    assert_eq!((c.stored, c.hits), (4, 0), "{c:?}");
    let fetched = |st: &stoker_pipeline::Stats| st.storage.as_ref().unwrap().objects_fetched;
    assert_eq!(fetched(&st), 4, "{:?}", st.storage);
    for epoch in 1..3 {
        let (cached, st) = crops(&p.clone().first_epoch(epoch));
        let c = st.sample_cache.clone().unwrap();
        assert_eq!((c.stored, c.hits), (0, 4), "epoch {epoch}: {c:?}");
        // The cached images' files are not read again.
        assert_eq!(fetched(&st), 0, "epoch {epoch}: {:?}", st.storage);
        let (plain, st) = crops(&off.clone().first_epoch(epoch));
        assert!(st.sample_cache.is_none());
        assert_eq!(fetched(&st), 4, "epoch {epoch}: {:?}", st.storage);
        assert_eq!(cached, plain, "epoch {epoch}");
        assert_ne!(cached, first, "another epoch draws other crops");
    }
    // Another object in the directory: the listing differs, so the cache starts again.
    std::fs::write(dir.path().join("4.jpg"), fixture("photo_420.jpg")).unwrap();
    let (five, st) = crops(&p.clone().first_epoch(1));
    let c = st.sample_cache.unwrap();
    assert_eq!((c.stored, c.hits), (5, 0), "{c:?}");
    assert_eq!(five.len(), 5);
    // Other operators before the cache point (another decode mode): not the same samples.
    let gray = shared_dir(
        dir.path(),
        Builtin::Image(ImageOp::DecodeImage {
            field: "jpg".into(),
            mode: Some("gray".into()),
            exif_orientation: false,
            max_pixels: None,
            allow_truncated: false,
        }),
    );
    let (g, st) = crops(&gray.first_epoch(1));
    assert_eq!(st.sample_cache.unwrap().hits, 0);
    assert_eq!(g[0].1.shape()[2], 1);
    // Cleared with the shared stores.
    assert!(stoker_pipeline::shared::clear_shared_stores() >= 1);
    let (_, st) = crops(&p.clone().first_epoch(2));
    assert_eq!(st.sample_cache.unwrap().hits, 0);
}
