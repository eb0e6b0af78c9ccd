//! Parity of the image kernels with torchvision/PIL: every case of
//! `fixtures/image/manifest.json` (written by `make_fixtures.py`) is recomputed here and
//! compared with the reference output within the tolerance `docs/ops.md` states.
//!
//! `cargo test -p stoker-ops --test image_parity -- --nocapture` prints the measured
//! differences.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value as Json;
use stoker_core::rng::Rng;
use stoker_core::{DType, Tensor};
use stoker_ops::image::{
    decode_image, decode_jpeg, CenterCrop, ColorJitter, ColorMode, DctScale, DecodeImage, Flip,
    GaussianBlur, Grayscale, Interpolation, Pad, PaddingMode, RandomResizedCrop, Resize, ToTensor,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/image")
}

fn file(name: &str) -> Vec<u8> {
    std::fs::read(dir().join("files").join(name)).unwrap()
}

fn input(case: &Json) -> Tensor {
    decode_image(
        &file(case["input"].as_str().unwrap()),
        &DecodeImage::default(),
    )
    .unwrap()
}

/// Tolerances: (max abs diff, mean abs diff) per operator, in u8 levels (f32 for
/// to_tensor). Keep in step with docs/ops.md.
fn tolerance(case: &Json) -> (f64, f64) {
    let op = case["op"].as_str().unwrap();
    let name = case["name"].as_str().unwrap();
    match op {
        // libjpeg's luma plane vs PIL's convert("L") of the decoded RGB.
        "decode" if name.starts_with("decode_gray_photo_420") => (1.0, 0.01),
        "decode" => (0.0, 0.0),
        "decode_scaled" => (0.0, 0.0),
        "resize" if case["params"]["antialias"] == false => (1.0, 0.25),
        "resize" | "resize_shorter" | "resized_crop" => (0.0, 0.0),
        "center_crop" | "pad" | "hflip" | "vflip" | "grayscale" => (0.0, 0.0),
        "jitter" | "jitter_all" => (0.0, 0.0),
        "blur" => (1.0, 0.001),
        "to_tensor" => (1e-6, 1e-7),
        _ => panic!("no tolerance for {op}"),
    }
}

fn compute(case: &Json) -> Tensor {
    let p = &case["params"];
    let pu = |k: &str| p[k].as_u64().unwrap() as usize;
    let pf = |k: &str| p[k].as_f64().unwrap();
    match case["op"].as_str().unwrap() {
        "decode" => {
            let mode = match p["mode"].as_str().unwrap() {
                "gray" => ColorMode::Gray,
                "rgba" => ColorMode::RgbKeepAlpha,
                _ => ColorMode::Rgb,
            };
            let opts = DecodeImage::default()
                .mode(mode)
                .apply_exif_orientation(p["exif"] == true);
            decode_image(&file(case["input"].as_str().unwrap()), &opts).unwrap()
        }
        "decode_scaled" => {
            let s = DctScale::new(pu("eighths") as u8).unwrap();
            let data = file(case["input"].as_str().unwrap());
            decode_jpeg(&data, &DecodeImage::default(), s, None)
                .unwrap()
                .0
        }
        "resize" => {
            let f = match p["interpolation"].as_str().unwrap() {
                "nearest" => Interpolation::Nearest,
                "bilinear" => Interpolation::Bilinear,
                "bicubic" => Interpolation::Bicubic,
                "lanczos" => Interpolation::Lanczos,
                "box" => Interpolation::Box,
                other => panic!("{other}"),
            };
            Resize::new(pu("h"), pu("w"))
                .interpolation(f)
                .antialias(p["antialias"] == true)
                .apply(&input(case))
                .unwrap()
        }
        "resize_shorter" => Resize::shorter_side(pu("size"))
            .apply(&input(case))
            .unwrap(),
        "resized_crop" => {
            // RandomResizedCrop's second half (torchvision's `resized_crop`).
            let img = input(case);
            let rrc = RandomResizedCrop::new(pu("out_h"), pu("out_w"));
            let b = stoker_ops::image::CropBox {
                top: pu("top"),
                left: pu("left"),
                height: pu("h"),
                width: pu("w"),
            };
            rrc.apply_with_box(&img, b).unwrap()
        }
        "center_crop" => CenterCrop::new(pu("h"), pu("w"))
            .apply(&input(case))
            .unwrap(),
        "pad" => {
            let pad: Vec<usize> = p["padding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let mode = match p["mode"].as_str().unwrap() {
                "constant" => PaddingMode::Constant,
                "edge" => PaddingMode::Edge,
                "reflect" => PaddingMode::Reflect,
                _ => PaddingMode::Symmetric,
            };
            Pad::new([pad[0], pad[1], pad[2], pad[3]])
                .fill(pu("fill") as u8)
                .mode(mode)
                .apply(&input(case))
                .unwrap()
        }
        "hflip" => Flip::Horizontal.apply(&input(case)).unwrap(),
        "vflip" => Flip::Vertical.apply(&input(case)).unwrap(),
        "grayscale" => Grayscale::new(pu("channels")).apply(&input(case)).unwrap(),
        "jitter" => {
            let idx = match p["kind"].as_str().unwrap() {
                "brightness" => 0,
                "contrast" => 1,
                "saturation" => 2,
                _ => 3,
            };
            let mut factors = [None; 4];
            factors[idx] = Some(pf("factor") as f32);
            ColorJitter::apply_params(&input(case), [0, 1, 2, 3], factors).unwrap()
        }
        "jitter_all" => {
            let o: Vec<usize> = p["order"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let f: Vec<f32> = p["factors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            ColorJitter::apply_params(
                &input(case),
                [o[0], o[1], o[2], o[3]],
                [Some(f[0]), Some(f[1]), Some(f[2]), Some(f[3])],
            )
            .unwrap()
        }
        "blur" => GaussianBlur::new(pu("kernel"), (1.0, 1.0))
            .apply_sigma(&input(case), pf("sigma") as f32)
            .unwrap(),
        "to_tensor" => {
            let v = |k: &str| -> Vec<f32> {
                p[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect()
            };
            ToTensor::default()
                .normalize(&v("mean"), &v("std"))
                .apply(&input(case))
                .unwrap()
        }
        other => panic!("unknown op {other}"),
    }
}

fn as_f64(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::U8 => t.data().iter().map(|&v| v as f64).collect(),
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        d => panic!("{d}"),
    }
}

fn reference(case: &Json) -> (Vec<usize>, Vec<f64>) {
    let shape: Vec<usize> = case["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let raw = std::fs::read(dir().join(case["output"].as_str().unwrap())).unwrap();
    let vals = match case["dtype"].as_str().unwrap() {
        "uint8" => raw.iter().map(|&v| v as f64).collect(),
        "float32" => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect(),
        d => panic!("{d}"),
    };
    (shape, vals)
}

#[test]
fn every_case_matches_its_reference() {
    let manifest: Json =
        serde_json::from_slice(&std::fs::read(dir().join("manifest.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    let mut worst: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for case in manifest["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (shape, want) = reference(case);
        let got = compute(case);
        // Gray outputs may come as [H, W, 1] on both sides.
        if got.shape() != shape.as_slice() {
            failures.push(format!("{name}: shape {:?} != {shape:?}", got.shape()));
            continue;
        }
        let got = as_f64(&got);
        let mut max: f64 = 0.0;
        let mut sum = 0.0;
        for (a, b) in got.iter().zip(&want) {
            let d = (a - b).abs();
            max = max.max(d);
            sum += d;
        }
        let mean = sum / want.len() as f64;
        let (tmax, tmean) = tolerance(case);
        println!("{name:40} max {max:10.6} mean {mean:10.6}");
        let op = case["op"].as_str().unwrap().to_string();
        let w = worst.entry(op).or_default();
        w.0 = w.0.max(max);
        w.1 = w.1.max(mean);
        if max > tmax || mean > tmean {
            failures.push(format!(
                "{name}: max diff {max} (allowed {tmax}), mean {mean} (allowed {tmean})"
            ));
        }
    }
    for (op, (m, a)) in &worst {
        println!("worst {op:14} max {m:10.6} mean {a:10.6}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Our RandomResizedCrop draws the very boxes torchvision's `get_params` draws when fed
/// the same random numbers (make_fixtures.py replays our generator into it).
#[test]
fn rrc_boxes_match_torchvision_get_params() {
    let boxes: Vec<Vec<u64>> =
        serde_json::from_slice(&std::fs::read(dir().join("rrc_boxes.json")).unwrap()).unwrap();
    assert!(boxes.len() >= 900);
    let rrc = RandomResizedCrop::new(224, 224);
    let mut rng = Rng::from_words(&[0]);
    let mut last_seed = u64::MAX;
    for b in &boxes {
        let [seed, w, h, top, left, bh, bw] = b[..] else {
            panic!("{b:?}")
        };
        if seed != last_seed {
            rng = Rng::from_words(&[seed]);
            last_seed = seed;
        }
        let got = rrc.get_params(w as usize, h as usize, &mut rng);
        assert_eq!(
            (got.top, got.left, got.height, got.width),
            (top as usize, left as usize, bh as usize, bw as usize),
            "seed {seed}, {w}x{h}"
        );
    }
}
