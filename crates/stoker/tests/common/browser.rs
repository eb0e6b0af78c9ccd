//! The HTML report in a real browser: headless Chromium (Debian's package `chromium`)
//! loads the page twice, once to dump the DOM after its scripts ran (the report's own
//! check writes `data-charts-ok="N/M"` on the body: charts that drew something out of all
//! of them) with the console on stderr, once to take a screenshot, whose share of
//! non-white pixels tells a page that shows something from a blank one.
//!
//! Without Chromium the check is skipped ([`BrowserCheck::skipped`] says why), unless
//! `STOKER_REQUIRE_BROWSER=1` (CI sets it), where a missing browser fails the test.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one browser run may take.
const DEADLINE: Duration = Duration::from_secs(120);

/// What the browser saw.
#[derive(Debug, Default)]
pub struct BrowserCheck {
    /// `Some(why)`: no browser here, nothing was checked (the caller prints why).
    pub skipped: Option<String>,
    /// Charts that drew something with an extent, and all charts (`data-charts-ok`).
    pub charts_ok: usize,
    pub charts_total: usize,
    /// The console's messages (the report writes none: any is an error, a script's
    /// exception or a resource that failed to load).
    pub console_errors: Vec<String>,
    /// The screenshot's share of pixels that are not white (0..1).
    pub nonwhite_share: f64,
    /// The DOM after the page's scripts ran.
    pub dom: String,
}

/// The Chromium binary: `$STOKER_CHROMIUM`, else the first of the usual names on `PATH`.
pub fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STOKER_CHROMIUM").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
    .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Loads `html` in headless Chromium: the charts its script found drawn, the console's
/// messages, the screenshot's non-white share and the DOM. Panics when the browser fails,
/// or is missing while `STOKER_REQUIRE_BROWSER=1`.
pub fn check_report(html: &Path) -> BrowserCheck {
    let Some(bin) = chromium() else {
        let why = "no Chromium here (install Debian's `chromium`, or set STOKER_CHROMIUM)";
        if std::env::var("STOKER_REQUIRE_BROWSER").is_ok_and(|v| v == "1") {
            panic!("STOKER_REQUIRE_BROWSER=1 but {why}");
        }
        return BrowserCheck {
            skipped: Some(why.into()),
            ..BrowserCheck::default()
        };
    };
    let html = html
        .canonicalize()
        .unwrap_or_else(|e| panic!("the report {}: {e}", html.display()));
    let url = format!("file://{}", html.display());
    let tmp = tempfile::tempdir().unwrap();

    // The DOM once the scripts ran, and the console on stderr.
    let (dom, stderr) = run(
        &bin,
        &tmp.path().join("profile-dom"),
        &[
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            url.as_str(),
        ],
    );
    let console_errors: Vec<String> = stderr
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect();
    let (charts_ok, charts_total) = charts_ok(&dom).unwrap_or_else(|| {
        panic!(
            "no data-charts-ok on the body: the report's script did not run\n\
             console: {console_errors:?}\nDOM starts: {}",
            &dom[..dom.len().min(2000)]
        )
    });

    // The screenshot.
    let shot = tmp.path().join("shot.png");
    let arg = format!("--screenshot={}", shot.display());
    run(
        &bin,
        &tmp.path().join("profile-shot"),
        &[
            arg.as_str(),
            "--window-size=1400,4000",
            "--hide-scrollbars",
            url.as_str(),
        ],
    );
    let nonwhite_share = nonwhite_share(&shot);

    BrowserCheck {
        skipped: None,
        charts_ok,
        charts_total,
        console_errors,
        nonwhite_share,
        dom,
    }
}

/// Runs the browser headless with `args` and a profile directory of its own; returns its
/// stdout and stderr. Panics when it fails or outlasts [`DEADLINE`].
fn run(bin: &Path, profile: &Path, args: &[&str]) -> (String, String) {
    let mut child = Command::new(bin)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    // Read both pipes while it runs (a full pipe would stall it).
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} {args:?} ran past {DEADLINE:?}; stderr:\n{}",
                bin.display(),
                err_t.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (out_t.join().unwrap(), err_t.join().unwrap());
    assert!(
        status.success(),
        "{} {args:?} failed ({status}); stderr:\n{stderr}",
        bin.display()
    );
    (stdout, stderr)
}

/// `data-charts-ok="N/M"` from the body tag.
fn charts_ok(dom: &str) -> Option<(usize, usize)> {
    let body = &dom[dom.find("<body")?..];
    let body = &body[..body.find('>')?];
    let v = body.split("data-charts-ok=\"").nth(1)?;
    let (n, m) = v[..v.find('"')?].split_once('/')?;
    Some((n.trim().parse().ok()?, m.trim().parse().ok()?))
}

/// The share of a PNG's pixels that are not (nearly) white.
fn nonwhite_share(png_path: &Path) -> f64 {
    let file = std::fs::File::open(png_path)
        .unwrap_or_else(|e| panic!("the screenshot {}: {e}", png_path.display()));
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().expect("decode the screenshot");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("decode the screenshot");
    let data = &buf[..info.buffer_size()];
    // Colour channels per pixel, and the channels in all (an alpha channel is skipped).
    let (colours, channels) = match info.color_type {
        png::ColorType::Grayscale => (1, 1),
        png::ColorType::GrayscaleAlpha => (1, 2),
        png::ColorType::Rgb => (3, 3),
        png::ColorType::Rgba => (3, 4),
        png::ColorType::Indexed => panic!("an indexed screenshot after EXPAND"),
    };
    let pixels = data.len() / channels;
    if pixels == 0 {
        return 0.0;
    }
    let nonwhite = data
        .chunks_exact(channels)
        .filter(|px| px[..colours].iter().any(|&v| v < 245))
        .count();
    nonwhite as f64 / pixels as f64
}
