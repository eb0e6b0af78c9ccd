//! The profiler's HTML report in a real browser (headless Chromium, [`common::browser`]):
//! a run over samples in memory, its profile written as `report.html`, then loaded: every
//! chart drew something, nothing went to the console, the page is not blank, and the
//! stages are named on it. Skipped without Chromium unless `STOKER_REQUIRE_BROWSER=1`;
//! `STOKER_KEEP_REPORT=DIR` keeps the report and the DOM the browser made of it in `DIR`.

use std::time::Duration;

use stoker_core::Sample;
use stoker_pipeline::{Builtin, FieldOp, Pipeline};

mod common;

use common::browser;

/// Text as the report escapes it.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[test]
fn report_renders_in_a_browser() {
    let samples: Vec<Sample> = (0..2000i64)
        .map(|i| [("x", i)].into_iter().collect())
        .collect();
    let p = Pipeline::from_samples(samples)
        .map(Builtin::Fields(FieldOp::RandomInt {
            to: "noise".into(),
            below: 10,
        }))
        .map(Builtin::Fields(FieldOp::Rename {
            from: "x".into(),
            to: "y".into(),
        }))
        .batch(16, false)
        .seed(7);
    let mut run = p.run().unwrap();
    // A consumer with a step of its own, so that the run spans several of the timeline's
    // intervals (100 ms).
    let mut batches = 0;
    for item in run.by_ref() {
        item.unwrap();
        batches += 1;
        std::thread::sleep(Duration::from_millis(4));
    }
    assert_eq!(batches, 125);
    let profile = run.profile();
    assert_eq!(profile.samples, 2000);

    let dir = tempfile::tempdir().unwrap();
    let written = profile.write(dir.path(), &[]).unwrap();
    let html = dir.path().join("report.html");
    assert!(written.contains(&html), "{written:?}");

    assert_renders(&html, &profile.stages);
}

/// The report at `html` in the browser: every chart drew, nothing on the console, not
/// blank, self-contained, every stage named.
fn assert_renders(html: &std::path::Path, stages: &[String]) {
    let check = browser::check_report(html);
    if let Some(why) = &check.skipped {
        eprintln!("skipped: {why}");
        return;
    }
    let keep = || {
        // What the browser saw, kept for a look when the test fails (or, with
        // STOKER_KEEP_REPORT=DIR, always, there).
        let out = std::env::var_os("STOKER_KEEP_REPORT").map_or_else(
            || std::env::temp_dir().join("stoker-report-browser"),
            Into::into,
        );
        let _ = std::fs::create_dir_all(&out);
        let _ = std::fs::copy(html, out.join("report.html"));
        let _ = std::fs::write(out.join("dom.html"), &check.dom);
        out.display().to_string()
    };
    assert!(
        check.charts_total > 0 && check.charts_ok == check.charts_total,
        "charts drawn {}/{} (report kept in {})",
        check.charts_ok,
        check.charts_total,
        keep()
    );
    assert!(
        check.console_errors.is_empty(),
        "console: {:#?} (report kept in {})",
        check.console_errors,
        keep()
    );
    assert!(
        check.nonwhite_share > 0.02,
        "the page looks blank: {:.4} of its pixels are not white (report kept in {})",
        check.nonwhite_share,
        keep()
    );
    // Self-contained: nothing loaded from elsewhere.
    assert!(
        !check.dom.contains("<link") && !check.dom.contains(" src="),
        "the report loads something (kept in {})",
        keep()
    );
    assert!(stages.len() >= 3, "{:?}", stages);
    for stage in stages {
        assert!(
            check.dom.contains(&esc(stage)),
            "stage {stage:?} is not on the page (report kept in {})",
            keep()
        );
    }
    if std::env::var_os("STOKER_KEEP_REPORT").is_some() {
        eprintln!("report kept in {}", keep());
    }
    eprintln!(
        "report: {}/{} charts drawn, {:.1}% of the page not white",
        check.charts_ok,
        check.charts_total,
        100.0 * check.nonwhite_share
    );
}

/// The demo's pipeline (the ImageNet pipeline over JPEGs from its embedded S3 server),
/// profiled by `stoker demo --profile DIR`: the verdict in its JSON, the report in the
/// browser (with the store's charts: the source is S3), the trace with its tracks.
#[test]
fn the_demos_profile_renders_in_a_browser_and_its_trace_loads() {
    let dir = tempfile::tempdir().unwrap();
    let prof = dir.path().join("prof");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["demo", "--json", "--images", "40", "--large-size", "1MiB"])
        .args(["--latency-ms", "2", "--threads", "2", "--dir"])
        .arg(dir.path())
        .arg("--profile")
        .arg(&prof)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let note = &v["pipeline"]["profile"];
    assert_eq!(
        note["dir"].as_str().map(std::path::PathBuf::from),
        Some(prof.clone())
    );
    let p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(prof.join("profile.json")).unwrap()).unwrap();
    let verdict = &p["verdict"];
    // The demo's consumer does nothing between batches: input-bound by definition.
    assert_eq!(verdict["input_bound"], true, "{verdict}");
    assert_eq!(note["bottleneck"], verdict["bottleneck"]);
    assert!(
        ["cpu", "io", "memory"].contains(&verdict["cause"].as_str().unwrap()),
        "{verdict}"
    );
    assert!(verdict["recommendations"].is_array());
    assert_eq!(p["samples"], 80, "two epochs of 40 images");
    assert!(
        p["storage"]["get_requests"].as_u64().unwrap() >= 40,
        "{}",
        p["storage"]
    );
    let stages: Vec<String> = p["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    assert!(stages[0].starts_with("source(imagefolder"), "{stages:?}");

    // The trace: valid trace-event JSON with a track per thread and the store's requests.
    let t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(prof.join("trace.json")).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(["M", "X", "b", "e", "C"].contains(&ph), "{e}");
        assert!(e["pid"].is_u64(), "{e}");
        if ph != "M" {
            assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        }
    }
    let tracks: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    for want in [
        "stoker-source",
        "stoker-tail",
        "stoker-cpu-0",
        "stoker-cpu-1",
    ] {
        assert!(tracks.contains(&want), "{want} not in {tracks:?}");
    }
    let gets = events
        .iter()
        .filter(|e| e["ph"] == "b" && e["cat"] == "store")
        .count();
    assert!(gets >= 40, "{gets} store spans");
    assert_eq!(
        gets,
        events
            .iter()
            .filter(|e| e["ph"] == "e" && e["cat"] == "store")
            .count()
    );
    assert!(events
        .iter()
        .any(|e| e["ph"] == "X" && e["cat"] == "operator"));

    assert_renders(&prof.join("report.html"), &stages);
}
