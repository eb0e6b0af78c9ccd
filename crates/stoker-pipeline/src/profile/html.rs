//! The report as one HTML page that needs nothing else: no network, no scripts or fonts
//! from elsewhere. The charts are SVG drawn here, the style is inline, and a few lines of
//! script at the end check that every chart drew something (`data-charts-ok="N/M"` on the
//! body, which the browser test reads).
//!
//! The timeline's counters are cumulative since the run started, so a rate is the
//! difference between two consecutive points over the time between them, drawn as a step
//! (constant over the interval it was measured on); levels (queues, memory) are drawn
//! through the points. A point at the start (every counter zero) is added when the
//! timeline has none, and one at the end from the profile's totals when it stops short
//! of [`Profile::seconds`], so that even a run shorter than one sampling interval has an
//! interval to plot. Every coordinate goes through [`fin`]: nothing that is not a finite
//! number reaches the page.

use std::fmt::Write as _;

use super::{Cause, LatencyBucket, MemoryPoint, Profile, StagePoint, StoragePoint, TimePoint};

/// `write!` into a `String`, which cannot fail.
macro_rules! w {
    ($dst:expr, $($arg:tt)*) => {{
        let _ = write!($dst, $($arg)*);
    }};
}

/// Series colours (Tableau 10), in order.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// The consumer's colour, and the memory limit's.
const INK: &str = "#222222";

/// A chart's geometry: the whole width, the margins and the plot's height.
const W: f64 = 960.0;
const ML: f64 = 70.0;
const MR: f64 = 24.0;
const MT: f64 = 14.0;
const PH: f64 = 220.0;
const PW: f64 = W - ML - MR;

/// The page.
pub(super) fn render(p: &Profile) -> String {
    let tl = timeline(p);
    let x_max = tl
        .last()
        .map_or(0.0, |t| t.t_s)
        .max(fin(p.seconds))
        .max(1e-3);
    let mut h = String::with_capacity(64 * 1024);
    h.push_str(HEAD);
    h.push_str("<body>\n<main>\n<h1>Stoker profile</h1>\n");
    verdict(&mut h, p);
    headline(&mut h, p);

    let n = p.stages.len();
    let stage_name = |i: usize| {
        p.stages
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("stage {i}"))
    };

    // (a) Throughput per stage, and the consumer's samples per second.
    let mut series: Vec<Series> = (0..n)
        .map(|i| {
            Series::new(
                stage_name(i),
                PALETTE[i % PALETTE.len()],
                Shape::Line,
                steps(&tl, |a, b| {
                    let (a, b) = (a.stages.get(i)?, b.stages.get(i)?);
                    Some(b.items_out.saturating_sub(a.items_out) as f64)
                }),
            )
        })
        .collect();
    series.push(Series::new(
        "consumer (samples/s)".into(),
        INK,
        Shape::Dashed,
        steps(&tl, |a, b| Some(b.samples.saturating_sub(a.samples) as f64)),
    ));
    let chart = Chart {
        label: "items per second",
        unit: Unit::Plain(""),
        y_max: None,
        x_max,
        series,
    };
    section(
        &mut h,
        "throughput",
        "Throughput",
        "Items per second out of each stage, per sampling interval (a batch stage counts \
         batches); dashed: the samples per second the consumer received.",
        chart.svg(),
    );

    // (b) Queue occupancy.
    let series = (0..n)
        .filter(|&i| {
            tl.iter()
                .any(|t| t.stages.get(i).is_some_and(|s| s.queue_cap > 0))
        })
        .map(|i| {
            Series::new(
                stage_name(i),
                PALETTE[i % PALETTE.len()],
                Shape::Line,
                levels(&tl, |t| {
                    let s = t.stages.get(i)?;
                    (s.queue_cap > 0).then(|| (s.queue as f64 / s.queue_cap as f64).min(1.0))
                }),
            )
        })
        .collect();
    let chart = Chart {
        label: "queue occupancy",
        unit: Unit::Percent,
        y_max: Some(1.0),
        x_max,
        series,
    };
    section(
        &mut h,
        "queues",
        "Queue occupancy",
        "Each stage's output queue: items in it over its capacity. A full queue waits for the \
         stage after it; an empty one starves it.",
        chart.svg(),
    );

    // (c) Busy threads per stage, and the worker threads the autotuner set.
    let mut series: Vec<Series> = (0..n)
        .map(|i| {
            Series::new(
                stage_name(i),
                PALETTE[i % PALETTE.len()],
                Shape::Line,
                steps(&tl, |a, b| {
                    let (a, b) = (a.stages.get(i)?, b.stages.get(i)?);
                    Some(b.busy_s - a.busy_s)
                }),
            )
        })
        .collect();
    series.push(Series::new(
        "worker threads".into(),
        INK,
        Shape::Dashed,
        levels(&tl, |t| Some(t.threads as f64)),
    ));
    series.push(Series::new(
        "CPU used by the process (cores)".into(),
        "#9c755f",
        Shape::Line,
        steps(&tl, |a, b| Some((b.cpu_s - a.cpu_s).max(0.0))),
    ));
    let chart = Chart {
        label: "busy threads",
        unit: Unit::Plain(""),
        y_max: None,
        x_max,
        series,
    };
    section(
        &mut h,
        "threads",
        "Busy threads",
        "Seconds each stage's threads worked per second (2.0: two threads busy all the time); \
         dashed: the worker threads the run had; brown: the CPU the whole process used, in \
         cores (below the busy threads: they wait on a lock, such as Python's GIL, or on I/O \
         inside an operator).",
        chart.svg(),
    );

    // (d) Memory budget by what holds it.
    memory(&mut h, &tl, x_max);

    // (e) The store.
    storage(&mut h, p, &tl, x_max);

    // (f) The consumer: waiting against stepping.
    let wait_share = |a: &TimePoint, b: &TimePoint| {
        let w = (b.consumer_wait_s - a.consumer_wait_s).max(0.0);
        let s = (b.consumer_step_s - a.consumer_step_s).max(0.0);
        (w + s > 1e-9).then(|| w / (w + s))
    };
    let share = |a: &TimePoint, b: &TimePoint| wait_share(a, b).map(|v| v * (b.t_s - a.t_s));
    let wait = steps(&tl, share);
    let step = steps(&tl, |a, b| {
        wait_share(a, b).map(|v| (1.0 - v) * (b.t_s - a.t_s))
    });
    let chart = Chart {
        label: "share of the consumer's time",
        unit: Unit::Percent,
        y_max: Some(1.0),
        x_max,
        series: vec![
            Series::new(
                "waiting for input".into(),
                "#e15759",
                Shape::Area,
                wait.clone(),
            ),
            Series::new(
                "own step".into(),
                "#4e79a7",
                Shape::Area,
                stack(&wait, &step),
            ),
        ],
    };
    section(
        &mut h,
        "consumer",
        "Consumer: waiting against stepping",
        "Per sampling interval, the share of the consumer's time spent waiting in next() for \
         the pipeline (red) and in its own step between items (blue).",
        chart.svg(),
    );

    // (g) Operators, stages, the autotuner, the plan.
    operators(&mut h, p);
    stages(&mut h, p);
    autotune(&mut h, p);
    h.push_str("<section id=\"explain\">\n<h2>Plan</h2>\n");
    if p.explain.trim().is_empty() {
        h.push_str("<p class=\"nodata\">No plan recorded.</p>\n");
    } else {
        w!(h, "<pre>{}</pre>\n", esc(&p.explain));
    }
    h.push_str("</section>\n");
    h.push_str("</main>\n");
    h.push_str(SCRIPT);
    h.push_str("</body>\n</html>\n");
    h
}

/// Text for HTML, in elements and attributes alike.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A finite number: anything else is 0.
fn fin(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// `x` with `d` decimals, or a dash when it is not a number.
fn num(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "–".into()
    }
}

/// `x` with three significant digits (at most six decimals), or a dash.
fn sig(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let d = (2.0 - x.abs().log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{x:.d$}")
}

fn opt_sig(x: Option<f64>) -> String {
    x.map_or_else(|| "–".into(), sig)
}

/// Bytes in binary units (as the rest of stoker writes them).
fn bytes(b: f64) -> String {
    if !b.is_finite() {
        return "–".into();
    }
    let (scale, unit) = byte_unit(b);
    if scale == 1.0 {
        format!("{b:.0} B")
    } else {
        format!("{:.1} {unit}", b / scale)
    }
}

/// The binary unit that suits `b`.
fn byte_unit(b: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 5] = [
        (1099511627776.0, "TiB"),
        (1073741824.0, "GiB"),
        (1048576.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "B"),
    ];
    UNITS
        .into_iter()
        .find(|&(s, _)| b.abs() >= s)
        .unwrap_or((1.0, "B"))
}

/// A speed-up as the report writes it: `×1.8` (two decimals under 1.1, where one would
/// round a small gain away).
fn gain(g: f64) -> String {
    if !g.is_finite() {
        "–".into()
    } else if g < 1.1 {
        format!("×{g:.2}")
    } else {
        format!("×{g:.1}")
    }
}

/// The timeline to plot: the profile's points with finite times, in order, with a zero
/// point at the start and the profile's totals at the end when the timeline lacks them,
/// and points too close to the one before (a fraction of the usual interval, which would
/// make a rate of a handful of items over microseconds) merged into their successor.
fn timeline(p: &Profile) -> Vec<TimePoint> {
    let mut pts: Vec<TimePoint> = p
        .timeline
        .iter()
        .filter(|t| t.t_s.is_finite() && t.t_s >= 0.0)
        .cloned()
        .collect();
    pts.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    let end = fin(p.seconds);
    if end > 0.0 && pts.last().is_none_or(|l| l.t_s < end - 1e-6) {
        let last = pts.last();
        let stages = if p.stage_stats.len() == p.stages.len() || last.is_none() {
            p.stage_stats
                .iter()
                .map(|s| StagePoint {
                    items_out: s.items_out,
                    busy_s: s.busy_s,
                    wait_s: s.wait_s,
                    queue: s.queue.0,
                    queue_cap: s.queue.1,
                })
                .collect()
        } else {
            last.map(|l| l.stages.clone()).unwrap_or_default()
        };
        let memory = last.map_or(
            MemoryPoint {
                held: p.memory.held,
                limit: p.memory.limit,
                samples: p.memory.samples,
                read_ahead: p.memory.held.saturating_sub(p.memory.samples),
                ..MemoryPoint::default()
            },
            |l| l.memory,
        );
        let end_point = TimePoint {
            t_s: end,
            samples: p.samples,
            items: p.items,
            epoch: last.map_or(0, |l| l.epoch),
            threads: p.threads,
            stages,
            memory,
            storage: p.storage.as_ref().map(|s| StoragePoint {
                requests: s.get_requests,
                bytes: s.bytes_read,
                cache_hits: s.cache_hits,
                cache_misses: s.cache_misses,
            }),
            consumer_wait_s: p.consumer.wait_s,
            consumer_step_s: p.consumer.step_s,
            budget_wait_s: p.budget_wait_s,
            cpu_s: p.cpu_s,
        };
        pts.push(end_point);
    }
    if let Some(first) = pts.first().filter(|f| f.t_s > 0.0) {
        let zero = TimePoint {
            t_s: 0.0,
            samples: 0,
            items: 0,
            epoch: 0,
            threads: first.threads,
            stages: first
                .stages
                .iter()
                .map(|s| StagePoint {
                    items_out: 0,
                    busy_s: 0.0,
                    wait_s: 0.0,
                    queue: 0,
                    queue_cap: s.queue_cap,
                })
                .collect(),
            memory: MemoryPoint {
                limit: first.memory.limit,
                ..MemoryPoint::default()
            },
            storage: first.storage.map(|_| StoragePoint::default()),
            consumer_wait_s: 0.0,
            consumer_step_s: 0.0,
            budget_wait_s: 0.0,
            cpu_s: 0.0,
        };
        pts.insert(0, zero);
    }
    // Merge intervals much shorter than the usual one into the next.
    let mut dts: Vec<f64> = pts
        .windows(2)
        .map(|w| w[1].t_s - w[0].t_s)
        .filter(|&d| d > 0.0)
        .collect();
    if dts.len() < 2 {
        return pts;
    }
    dts.sort_by(f64::total_cmp);
    let min_gap = 0.25 * dts[dts.len() / 2];
    let mut out: Vec<TimePoint> = Vec::with_capacity(pts.len());
    for t in pts {
        match out.last() {
            Some(l) if t.t_s - l.t_s < min_gap => {
                if out.len() > 1 {
                    // Drop the earlier of the two: counters are cumulative, so the next
                    // interval covers it.
                    out.pop();
                    out.push(t);
                }
            }
            _ => out.push(t),
        }
    }
    out
}

/// A run of points, `(x, low, high)`; a line is drawn through the highs.
type Seg = Vec<(f64, f64, f64)>;

/// Per interval between consecutive points, `f(a, b)` (a difference of counters) over the
/// interval's length, as a step: `(t_a, v)`, `(t_b, v)`. `None` or an empty interval
/// leaves a gap.
fn steps(tl: &[TimePoint], f: impl Fn(&TimePoint, &TimePoint) -> Option<f64>) -> Vec<Seg> {
    let mut segs: Vec<Seg> = Vec::new();
    let mut cur: Seg = Vec::new();
    for w in tl.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let dt = b.t_s - a.t_s;
        let v = (dt > 0.0)
            .then(|| f(a, b))
            .flatten()
            .map(|d| fin(d / dt).max(0.0));
        match v {
            Some(v) => {
                if cur.last().is_some_and(|l| l.0 != a.t_s) {
                    segs.push(std::mem::take(&mut cur));
                }
                cur.push((a.t_s, 0.0, v));
                cur.push((b.t_s, 0.0, v));
            }
            None if dt > 0.0 && !cur.is_empty() => segs.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

/// `f(t)` at every point (a level); `None` leaves a gap.
fn levels(tl: &[TimePoint], f: impl Fn(&TimePoint) -> Option<f64>) -> Vec<Seg> {
    let mut segs: Vec<Seg> = Vec::new();
    let mut cur: Seg = Vec::new();
    for t in tl {
        match f(t) {
            Some(v) => cur.push((t.t_s, 0.0, fin(v).max(0.0))),
            None if !cur.is_empty() => segs.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

/// `top` stacked on `under` (the same points, as `steps` or `levels` made both from the
/// same timeline): each point's low is the one under's high.
fn stack(under: &[Seg], top: &[Seg]) -> Vec<Seg> {
    top.iter()
        .zip(under)
        .map(|(t, u)| {
            t.iter()
                .zip(u)
                .map(|(&(x, _, v), &(_, _, base))| (x, base, base + v))
                .collect()
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Line,
    Dashed,
    Area,
}

/// One thing a chart draws.
struct Series {
    name: String,
    color: &'static str,
    shape: Shape,
    segs: Vec<Seg>,
}

impl Series {
    fn new(name: String, color: &'static str, shape: Shape, segs: Vec<Seg>) -> Series {
        Series {
            name,
            color,
            shape,
            segs: segs.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    fn max(&self) -> f64 {
        self.segs
            .iter()
            .flatten()
            .map(|&(_, _, v)| fin(v))
            .fold(0.0, f64::max)
    }
}

/// How a chart labels its values.
#[derive(Clone, Copy)]
enum Unit {
    /// Numbers (with k, M, G) and this suffix.
    Plain(&'static str),
    /// Shares, 0..1, written as percentages.
    Percent,
}

/// A chart over the run's time.
struct Chart<'a> {
    /// What the y axis shows.
    label: &'a str,
    unit: Unit,
    /// The top of the y axis, when fixed (shares); else from the data.
    y_max: Option<f64>,
    /// The end of the x axis, in seconds.
    x_max: f64,
    series: Vec<Series>,
}

/// A step of 1, 2 or 5 times a power of ten that cuts `range` into about `n` parts.
fn nice_step(range: f64, n: f64) -> f64 {
    let raw = fin(range / n);
    if raw <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let m = if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Decimals that tell ticks `step` apart.
fn decimals(step: f64) -> usize {
    (-fin(step.log10()).floor()).clamp(0.0, 6.0) as usize
}

/// A tick label on an axis of ticks `step` apart up to `top`.
fn tick(v: f64, step: f64, top: f64, unit: Unit) -> String {
    match unit {
        Unit::Percent => format!("{}%", num(v * 100.0, decimals(step * 100.0))),
        Unit::Plain(suffix) => {
            let (scale, si) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")]
                .into_iter()
                .find(|&(s, _)| top >= s)
                .map_or((1.0, ""), |(s, si)| (if si == "k" { 1e3 } else { s }, si));
            format!("{}{si}{suffix}", num(v / scale, decimals(step / scale)))
        }
    }
}

/// A number for an SVG coordinate.
fn c(x: f64) -> String {
    format!("{:.1}", fin(x))
}

/// The legend's entries, laid out in rows under the plot from `y0`; returns the markup
/// and the height it takes.
fn legend(items: &[(String, &'static str, Shape)], y0: f64) -> (String, f64) {
    let mut s = String::from("<g class=\"legend\">");
    let (mut x, mut y) = (ML, y0 + 12.0);
    for (name, color, shape) in items {
        let short: String = if name.chars().count() > 60 {
            name.chars().take(59).collect::<String>() + "…"
        } else {
            name.clone()
        };
        let width = 30.0 + 6.8 * short.chars().count() as f64 + 18.0;
        if x > ML && x + width > W - MR {
            x = ML;
            y += 18.0;
        }
        match shape {
            Shape::Area => w!(
                s,
                "<rect x=\"{}\" y=\"{}\" width=\"22\" height=\"10\" fill=\"{color}\" \
                 fill-opacity=\"0.75\"/>",
                c(x),
                c(y - 9.0)
            ),
            Shape::Line | Shape::Dashed => w!(
                s,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{color}\" \
                 stroke-width=\"2.5\"{}/>",
                c(x),
                c(y - 4.0),
                c(x + 22.0),
                c(y - 4.0),
                if *shape == Shape::Dashed {
                    " stroke-dasharray=\"6 3\""
                } else {
                    ""
                }
            ),
        }
        w!(
            s,
            "<text x=\"{}\" y=\"{}\"><title>{}</title>{}</text>",
            c(x + 28.0),
            c(y),
            esc(name),
            esc(&short)
        );
        x += width;
    }
    s.push_str("</g>");
    (s, y - y0 + 10.0)
}

impl Chart<'_> {
    /// The chart, or `None` when no series has a point to draw.
    fn svg(&self) -> Option<String> {
        let drawn: Vec<&Series> = self.series.iter().filter(|s| !s.segs.is_empty()).collect();
        if drawn.is_empty() {
            return None;
        }
        let data_max = drawn.iter().map(|s| s.max()).fold(0.0, f64::max);
        let (y_top, y_step) = match self.y_max {
            Some(m) => (m, nice_step(m, 4.0)),
            None => {
                let m = if data_max > 0.0 { data_max } else { 1.0 };
                let step = nice_step(m, 5.0);
                ((m / step).ceil() * step, step)
            }
        };
        let x_top = if self.x_max > 0.0 { self.x_max } else { 1.0 };
        let x_step = nice_step(x_top, 8.0);
        let px = |t: f64| ML + fin(t / x_top).clamp(0.0, 1.0) * PW;
        let py = |v: f64| MT + PH - fin(v / y_top).clamp(0.0, 1.05) * PH;

        let mut body = String::new();
        // Grid and y ticks.
        body.push_str("<g class=\"axis\">");
        let mut i = 0.0;
        while i * y_step <= y_top * (1.0 + 1e-9) && i <= 20.0 {
            let v = i * y_step;
            w!(
                body,
                "<line class=\"grid\" x1=\"{ML}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\"/>\
                 <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                c(W - MR),
                c(ML - 6.0),
                c(py(v) + 4.0),
                esc(&tick(v, y_step, y_top, self.unit)),
                y = c(py(v)),
            );
            i += 1.0;
        }
        let mut i = 0.0;
        while i * x_step <= x_top * (1.0 + 1e-9) && i <= 20.0 {
            let t = i * x_step;
            w!(
                body,
                "<line x1=\"{x}\" x2=\"{x}\" y1=\"{}\" y2=\"{}\"/>\
                 <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                c(MT + PH),
                c(MT + PH + 4.0),
                c(MT + PH + 17.0),
                num(t, decimals(x_step)),
                x = c(px(t)),
            );
            i += 1.0;
        }
        w!(
            body,
            "<line x1=\"{ML}\" x2=\"{ML}\" y1=\"{MT}\" y2=\"{}\"/>\
             <line x1=\"{ML}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">seconds</text>\
             <text transform=\"translate(14 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            c(MT + PH),
            c(W - MR),
            c(ML + PW / 2.0),
            c(MT + PH + 32.0),
            c(MT + PH / 2.0),
            esc(self.label),
            y = c(MT + PH),
        );
        body.push_str("</g>\n<g class=\"data\">");
        // Areas first, so that lines stay on top.
        let mut order: Vec<&&Series> = drawn.iter().collect();
        order.sort_by_key(|s| s.shape != Shape::Area);
        for s in order {
            let mut d = String::new();
            for seg in &s.segs {
                if s.shape == Shape::Area {
                    for (k, &(x, _, hi)) in seg.iter().enumerate() {
                        w!(
                            d,
                            "{}{} {} ",
                            if k == 0 { "M" } else { "L" },
                            c(px(x)),
                            c(py(hi))
                        );
                    }
                    for &(x, lo, _) in seg.iter().rev() {
                        w!(d, "L{} {} ", c(px(x)), c(py(lo)));
                    }
                    d.push_str("Z ");
                } else if seg.len() == 1 {
                    // One point: a short mark, so that it shows.
                    let (x, _, v) = seg[0];
                    w!(d, "M{} {} h4 ", c(px(x) - 2.0), c(py(v)));
                } else {
                    for (k, &(x, _, v)) in seg.iter().enumerate() {
                        w!(
                            d,
                            "{}{} {} ",
                            if k == 0 { "M" } else { "L" },
                            c(px(x)),
                            c(py(v))
                        );
                    }
                }
            }
            let style = match s.shape {
                Shape::Area => format!(
                    "fill=\"{}\" fill-opacity=\"0.75\" stroke=\"{}\" stroke-width=\"1\"",
                    s.color, s.color
                ),
                Shape::Line => format!(
                    "fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-linejoin=\"round\"",
                    s.color
                ),
                Shape::Dashed => format!(
                    "fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"6 3\"",
                    s.color
                ),
            };
            w!(
                body,
                "<path class=\"series\" d=\"{}\" {style}><title>{}</title></path>",
                d.trim_end(),
                esc(&s.name)
            );
        }
        body.push_str("</g>\n");
        let items: Vec<(String, &'static str, Shape)> = drawn
            .iter()
            .map(|s| (s.name.clone(), s.color, s.shape))
            .collect();
        let (leg, leg_h) = legend(&items, MT + PH + 40.0);
        let height = MT + PH + 40.0 + leg_h + 6.0;
        Some(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {}\" width=\"{W}\" \
             height=\"{}\" role=\"img\" aria-label=\"{}\" data-series=\"{}\">\n\
             {body}{leg}\n</svg>\n",
            c(height),
            c(height),
            esc(self.label),
            drawn.len()
        ))
    }
}

/// A chart's section: its heading, a line on what it shows, and the chart (or a note
/// that there was nothing to draw).
fn section(h: &mut String, id: &str, title: &str, note: &str, svg: Option<String>) {
    w!(
        h,
        "<section class=\"chart\" id=\"{id}\">\n<h2>{}</h2>\n<p class=\"note\">{}</p>\n",
        esc(title),
        esc(note)
    );
    match svg {
        Some(s) => h.push_str(&s),
        None => {
            h.push_str("<p class=\"nodata\">No data: the timeline has no interval to plot.</p>\n")
        }
    }
    h.push_str("</section>\n");
}

/// The verdict box.
fn verdict(h: &mut String, p: &Profile) {
    let v = &p.verdict;
    let share = 100.0 * fin(v.wait_share);
    w!(
        h,
        "<section id=\"verdict\" class=\"verdict {}\">\n",
        if v.input_bound {
            "input-bound"
        } else {
            "not-input-bound"
        }
    );
    if v.input_bound {
        w!(
            h,
            "<p class=\"call\"><strong>Input-bound.</strong> The consumer waited for input \
             {}% of its time; a pipeline that never kept it waiting would make it up to \
             <strong>{}</strong> faster.</p>\n",
            num(share, 1),
            gain(v.max_gain)
        );
    } else {
        w!(
            h,
            "<p class=\"call\"><strong>Not input-bound.</strong> The consumer waited for input \
             {}% of its time; a faster pipeline would make it at most <strong>{}</strong> \
             faster.</p>\n",
            num(share, 1),
            gain(v.max_gain)
        );
    }
    let cause = match v.cause {
        Cause::Cpu => "CPU work",
        Cause::Io => "waiting for the store",
        Cause::Memory => "waiting for room in the memory budget",
        Cause::Consumer => "the consumer is the slower side",
    };
    w!(
        h,
        "<p class=\"bottleneck\">Bottleneck: <b>{}</b> &middot; cause: <b>{}</b> ({})</p>\n",
        if v.bottleneck.is_empty() {
            "–".into()
        } else {
            esc(&v.bottleneck)
        },
        v.cause.as_str(),
        cause
    );
    if !v.summary.is_empty() {
        w!(h, "<p class=\"summary\">{}</p>\n", esc(&v.summary));
    }
    if v.recommendations.is_empty() {
        h.push_str("<p class=\"recs-none\">Nothing to change.</p>\n");
    } else {
        h.push_str("<h2>What to change</h2>\n<ol class=\"recs\">\n");
        for r in &v.recommendations {
            w!(
                h,
                "<li><div class=\"rec-head\"><span class=\"change\">{}</span>\
                 <span class=\"gain\" title=\"expected speed-up of the consumer\">{}</span></div>\n\
                 <p class=\"why\">{}</p>\n",
                esc(&r.change),
                gain(r.expected_gain),
                esc(&r.why)
            );
            for (lang, code) in [("spec", &r.spec), ("python", &r.python)] {
                if let Some(code) = code {
                    w!(
                        h,
                        "<div class=\"code\"><span class=\"lang\">{lang}</span>\
                         <pre><code class=\"{lang}\">{}</code></pre></div>\n",
                        esc(code)
                    );
                }
            }
            h.push_str("</li>\n");
        }
        h.push_str("</ol>\n");
    }
    h.push_str("</section>\n");
}

/// The headline numbers.
fn headline(h: &mut String, p: &Profile) {
    let first = p
        .first_item_s
        .map_or_else(|| "none came".into(), |s| format!("{} s", num(s, 3)));
    let peak_share = if p.memory.limit > 0 {
        format!(
            " ({}%)",
            num(100.0 * p.memory.peak as f64 / p.memory.limit as f64, 0)
        )
    } else {
        String::new()
    };
    let consumer = {
        let c = &p.consumer;
        format!(
            "{} s waiting, {} s stepping",
            num(c.wait_s, 2),
            num(c.step_s, 2)
        )
    };
    let cards = [
        ("samples/s", num(p.samples_per_s, 1)),
        ("seconds", num(p.seconds, 2)),
        ("samples · items", format!("{} · {}", p.samples, p.items)),
        ("first item", first),
        (
            "CPUs · worker threads",
            format!("{} · {}", p.cpus, p.threads),
        ),
        (
            "memory peak / limit",
            format!(
                "{} / {}{peak_share}",
                bytes(p.memory.peak as f64),
                bytes(p.memory.limit as f64)
            ),
        ),
        ("consumer", consumer),
        (
            "budget wait · skipped",
            format!("{} s · {}", num(p.budget_wait_s, 2), p.skipped),
        ),
    ];
    h.push_str("<section id=\"headline\" class=\"cards\">\n");
    for (k, v) in cards {
        w!(
            h,
            "<div class=\"card\"><div class=\"k\">{}</div><div class=\"v\">{}</div></div>\n",
            esc(k),
            esc(&v)
        );
    }
    h.push_str("</section>\n");
}

/// (d): the memory budget's use by what holds it, stacked, and its limit.
fn memory(h: &mut String, tl: &[TimePoint], x_max: f64) {
    let peak = tl
        .iter()
        .map(|t| {
            let m = t.memory;
            (m.block_cache + m.sample_cache + m.samples + m.read_ahead).max(m.held) as f64
        })
        .fold(0.0, f64::max);
    let limit = tl.iter().map(|t| t.memory.limit).max().unwrap_or(0) as f64;
    // The limit is drawn when it is on the same scale as the use; far above, it would
    // flatten everything else, and the legend tells it instead.
    let show_limit = limit > 0.0 && (peak == 0.0 || limit <= 8.0 * peak);
    let top = if show_limit { peak.max(limit) } else { peak };
    let (scale, unit) = byte_unit(top);
    let level = |f: fn(&MemoryPoint) -> u64| levels(tl, move |t| Some(f(&t.memory) as f64 / scale));
    let block = level(|m| m.block_cache);
    let sample = stack(&block, &level(|m| m.sample_cache));
    let flight = stack(&sample, &level(|m| m.samples));
    let ahead = stack(&flight, &level(|m| m.read_ahead));
    let mut series = vec![
        Series::new("block cache".into(), "#4e79a7", Shape::Area, block),
        Series::new("sample cache".into(), "#59a14f", Shape::Area, sample),
        Series::new(
            "samples, queues, batches".into(),
            "#f28e2b",
            Shape::Area,
            flight,
        ),
        Series::new("read-ahead".into(), "#b07aa1", Shape::Area, ahead),
    ];
    let limit_name = if show_limit {
        "limit".into()
    } else if limit > 0.0 {
        format!("limit {} (above the chart)", bytes(limit))
    } else {
        "limit".into()
    };
    series.push(Series::new(
        limit_name,
        INK,
        Shape::Dashed,
        if show_limit {
            levels(tl, |t| Some(t.memory.limit as f64 / scale))
        } else {
            Vec::new()
        },
    ));
    let unit: &'static str = match unit {
        "B" => " B",
        "KiB" => " KiB",
        "MiB" => " MiB",
        "GiB" => " GiB",
        _ => " TiB",
    };
    let chart = Chart {
        label: "memory held",
        unit: Unit::Plain(unit),
        y_max: None,
        x_max,
        series,
    };
    let mut svg = chart.svg();
    if !show_limit && limit > 0.0 {
        if let Some(s) = svg.as_mut() {
            s.push_str(&format!(
                "<p class=\"note\">The budget's limit, {}, is far above what the run held.</p>\n",
                bytes(limit)
            ));
        }
    }
    section(
        h,
        "memory",
        "Memory budget",
        "What the memory budget held, by what holds it (stacked): the store's block cache, \
         the caches of samples, the run's samples in flight (admitted, in queues, in batches \
         being filled) and the store's read-ahead and fetches; dashed: the budget's limit.",
        svg,
    );
}

/// (e): the store's requests, bytes, cache and latency.
fn storage(h: &mut String, p: &Profile, tl: &[TimePoint], x_max: f64) {
    h.push_str("<section class=\"chart\" id=\"storage\">\n<h2>Store</h2>\n");
    let Some(s) = &p.storage else {
        h.push_str(
            "<p class=\"nodata\">No store: the source is in memory or local.</p>\n</section>\n",
        );
        return;
    };
    let lookups = s.cache_hits + s.cache_misses;
    let hit_rate = if lookups > 0 {
        format!("{}%", num(100.0 * s.cache_hits as f64 / lookups as f64, 1))
    } else {
        "–".into()
    };
    h.push_str("<table class=\"kv\"><tbody>\n");
    let rows = [
        (
            "requests (GET · HEAD · LIST)",
            format!(
                "{} · {} · {}",
                s.get_requests, s.head_requests, s.list_requests
            ),
        ),
        ("bytes read", bytes(s.bytes_read as f64)),
        (
            "retries · failed reads",
            format!("{} · {}", s.retries, s.failed_reads),
        ),
        (
            "time to first byte p50 · p90 · p99",
            format!(
                "{} · {} · {} ms",
                sig(s.latency_p50_ms),
                sig(s.latency_p90_ms),
                sig(s.latency_p99_ms)
            ),
        ),
        (
            "block cache hits · misses",
            format!("{} · {} ({hit_rate} hits)", s.cache_hits, s.cache_misses),
        ),
        ("requests at once, at most", s.max_concurrency.to_string()),
    ];
    for (k, v) in rows {
        w!(h, "<tr><th>{}</th><td>{}</td></tr>\n", esc(k), esc(&v));
    }
    h.push_str("</tbody></table>\n");

    let st = |f: fn(&StoragePoint) -> u64| {
        steps(tl, move |a, b| {
            Some(f(&b.storage?).saturating_sub(f(&a.storage?)) as f64)
        })
    };
    let chart = Chart {
        label: "per second",
        unit: Unit::Plain(""),
        y_max: None,
        x_max,
        series: vec![
            Series::new(
                "GET requests/s".into(),
                "#4e79a7",
                Shape::Line,
                st(|s| s.requests),
            ),
            Series::new(
                "block cache hits/s".into(),
                "#59a14f",
                Shape::Line,
                st(|s| s.cache_hits),
            ),
            Series::new(
                "block cache misses/s".into(),
                "#e15759",
                Shape::Dashed,
                st(|s| s.cache_misses),
            ),
        ],
    };
    h.push_str("<h3>Requests and block cache</h3>\n");
    match chart.svg() {
        Some(svg) => h.push_str(&svg),
        None => {
            h.push_str("<p class=\"nodata\">No data: the timeline has no interval to plot.</p>\n")
        }
    }
    let chart = Chart {
        label: "MiB/s",
        unit: Unit::Plain(""),
        y_max: None,
        x_max,
        series: vec![Series::new(
            "MiB/s received".into(),
            "#f28e2b",
            Shape::Line,
            steps(tl, |a, b| {
                Some(b.storage?.bytes.saturating_sub(a.storage?.bytes) as f64 / 1048576.0)
            }),
        )],
    };
    h.push_str("<h3>Bytes received</h3>\n");
    match chart.svg() {
        Some(svg) => h.push_str(&svg),
        None => {
            h.push_str("<p class=\"nodata\">No data: the timeline has no interval to plot.</p>\n")
        }
    }
    h.push_str("<h3>Time to first byte</h3>\n");
    match latency(&s.latency) {
        Some(svg) => h.push_str(&svg),
        None => h.push_str("<p class=\"nodata\">No requests timed.</p>\n"),
    }
    h.push_str("</section>\n");
}

/// The latency histogram: a bar per bucket, on a logarithmic axis of milliseconds.
fn latency(buckets: &[LatencyBucket]) -> Option<String> {
    // Each bucket's span on the plot: a zero lower bound is half the upper one, a missing
    // upper one twice the lower.
    let spans: Vec<(f64, f64, f64)> = buckets
        .iter()
        .filter_map(|b| {
            let lo = fin(b.lo_ms).max(0.0);
            let mut hi = fin(b.hi_ms);
            if hi <= lo {
                hi = if lo > 0.0 { lo * 2.0 } else { 1.0 };
            }
            let lo = if lo > 0.0 { lo } else { hi / 2.0 };
            (lo > 0.0 && hi > lo).then_some((lo, hi, b.count as f64))
        })
        .collect();
    if spans.is_empty() {
        return None;
    }
    let x_lo = spans
        .iter()
        .map(|s| s.0)
        .fold(f64::MAX, f64::min)
        .log10()
        .floor();
    let x_hi = spans
        .iter()
        .map(|s| s.1)
        .fold(0.0, f64::max)
        .log10()
        .ceil()
        .max(x_lo + 1.0);
    let px = |ms: f64| ML + fin((ms.log10() - x_lo) / (x_hi - x_lo)).clamp(0.0, 1.0) * PW;
    let y_max = spans.iter().map(|s| s.2).fold(0.0, f64::max).max(1.0);
    let y_step = nice_step(y_max, 5.0).max(1.0);
    let y_top = (y_max / y_step).ceil() * y_step;
    let py = |v: f64| MT + PH - fin(v / y_top).clamp(0.0, 1.0) * PH;
    let mut body = String::from("<g class=\"axis\">");
    let mut i = 0.0;
    while i * y_step <= y_top * (1.0 + 1e-9) && i <= 20.0 {
        let v = i * y_step;
        w!(
            body,
            "<line class=\"grid\" x1=\"{ML}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            c(W - MR),
            c(ML - 6.0),
            c(py(v) + 4.0),
            esc(&tick(v, y_step, y_top, Unit::Plain(""))),
            y = c(py(v)),
        );
        i += 1.0;
    }
    // Ticks at 1, 2 and 5 times the powers of ten in range (only the powers on a wide
    // range).
    let decades = (x_hi - x_lo) as i32;
    let mults: &[f64] = if decades <= 3 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    for e in (x_lo as i32)..=(x_hi as i32) {
        for &m in mults {
            let ms = m * 10f64.powi(e);
            if ms.log10() > x_hi + 1e-9 {
                continue;
            }
            let label = if ms >= 1.0 {
                format!("{ms:.0}")
            } else {
                num(ms, (-ms.log10().floor()) as usize)
            };
            w!(
                body,
                "<line x1=\"{x}\" x2=\"{x}\" y1=\"{}\" y2=\"{}\"/>\
                 <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                c(MT + PH),
                c(MT + PH + 4.0),
                c(MT + PH + 17.0),
                label,
                x = c(px(ms)),
            );
        }
    }
    w!(
        body,
        "<line x1=\"{ML}\" x2=\"{ML}\" y1=\"{MT}\" y2=\"{}\"/>\
         <line x1=\"{ML}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">milliseconds (logarithmic)</text>\
         <text transform=\"translate(14 {}) rotate(-90)\" text-anchor=\"middle\">requests</text>",
        c(MT + PH),
        c(W - MR),
        c(ML + PW / 2.0),
        c(MT + PH + 32.0),
        c(MT + PH / 2.0),
        y = c(MT + PH),
    );
    body.push_str("</g>\n<g class=\"data\">");
    for &(lo, hi, n) in &spans {
        let (x0, x1) = (px(lo), px(hi));
        let width = (x1 - x0 - 1.0).max(1.0);
        w!(
            body,
            "<rect class=\"series\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#4e79a7\">\
             <title>{}–{} ms: {n} requests</title></rect>",
            c(x0),
            c(py(n)),
            c(width),
            c(MT + PH - py(n)),
            sig(lo),
            sig(hi),
        );
    }
    body.push_str("</g>\n");
    let (leg, leg_h) = legend(
        &[(
            "requests by time to first byte".into(),
            "#4e79a7",
            Shape::Area,
        )],
        MT + PH + 40.0,
    );
    let height = MT + PH + 40.0 + leg_h + 6.0;
    Some(format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {}\" width=\"{W}\" \
         height=\"{}\" role=\"img\" aria-label=\"latency histogram\" data-series=\"1\">\n\
         {body}{leg}\n</svg>\n",
        c(height),
        c(height),
    ))
}

/// (g): each operator's cost.
fn operators(h: &mut String, p: &Profile) {
    h.push_str(
        "<section id=\"operators\" class=\"table\">\n<h2>Operators</h2>\n<p class=\"note\">\
         Measured on one sample in eight (every row of a batch). Share: the operator's time \
         per sample over all operators' (its share of the CPU time the operators take).</p>\n",
    );
    if p.operators.is_empty() {
        h.push_str("<p class=\"nodata\">No operators measured.</p>\n</section>\n");
        return;
    }
    let total: f64 = p
        .operators
        .iter()
        .filter_map(|o| o.ns_per_sample)
        .map(fin)
        .filter(|&x| x > 0.0)
        .sum();
    h.push_str(
        "<table class=\"grid\"><thead><tr><th>#</th><th class=\"name\">operator</th>\
         <th>samples measured</th><th>ms/sample</th><th>declared ms</th><th>KiB in</th>\
         <th>KiB out</th><th>ratio</th>\
         <th>declared ratio</th><th>share of CPU</th></tr></thead><tbody>\n",
    );
    for o in &p.operators {
        let ms = |ns: Option<f64>| opt_sig(ns.map(|n| n / 1e6));
        let kib = |b: Option<f64>| opt_sig(b.map(|b| b / 1024.0));
        let share = o
            .ns_per_sample
            .map(fin)
            .filter(|_| total > 0.0)
            .map(|n| (n.max(0.0) / total).clamp(0.0, 1.0));
        let share_cell = match share {
            Some(s) => format!(
                "<div class=\"bar\"><span style=\"width:{:.1}%\"></span></div>{}%",
                100.0 * s,
                num(100.0 * s, 1)
            ),
            None => "–".into(),
        };
        w!(
            h,
            "<tr><td>{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"share\">{share_cell}</td></tr>\n",
            o.index,
            esc(&o.name),
            o.samples,
            ms(o.ns_per_sample),
            ms(o.hint_ns),
            kib(o.bytes_in_per_sample),
            kib(o.bytes_out_per_sample),
            opt_sig(o.size_ratio),
            opt_sig(o.hint_size_ratio),
        );
    }
    h.push_str("</tbody></table>\n</section>\n");
}

/// The stages' final numbers.
fn stages(h: &mut String, p: &Profile) {
    h.push_str("<section id=\"stages\" class=\"table\">\n<h2>Stages</h2>\n");
    if p.stage_stats.is_empty() {
        h.push_str("<p class=\"nodata\">No stages.</p>\n</section>\n");
        return;
    }
    h.push_str(
        "<table class=\"grid\"><thead><tr><th class=\"name\">stage</th><th>items in</th>\
         <th>items out</th><th>dropped</th><th>busy s</th><th>wait s</th><th>busy share</th>\
         <th>bytes</th>\
         <th>queue</th></tr></thead><tbody>\n",
    );
    for s in &p.stage_stats {
        let both = fin(s.busy_s) + fin(s.wait_s);
        let busy = if both > 0.0 {
            format!("{}%", num(100.0 * fin(s.busy_s) / both, 0))
        } else {
            "–".into()
        };
        w!(
            h,
            "<tr><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{busy}</td><td>{}</td><td>{} / {}</td></tr>\n",
            esc(&s.name),
            s.items_in,
            s.items_out,
            s.dropped,
            num(s.busy_s, 3),
            num(s.wait_s, 3),
            bytes(s.bytes as f64),
            s.queue.0,
            s.queue.1
        );
    }
    h.push_str("</tbody></table>\n</section>\n");
}

/// The autotuner's decisions.
fn autotune(h: &mut String, p: &Profile) {
    h.push_str("<section id=\"autotune\" class=\"table\">\n<h2>Autotuner</h2>\n");
    if p.autotune.is_empty() {
        h.push_str("<p class=\"nodata\">The autotuner changed nothing.</p>\n</section>\n");
        return;
    }
    h.push_str(
        "<table class=\"grid\"><thead><tr><th>at (s)</th><th>threads after</th>\
         <th class=\"name\">why</th></tr></thead><tbody>\n",
    );
    for (t, threads, why) in &p.autotune {
        w!(
            h,
            "<tr><td>{}</td><td>{threads}</td><td class=\"name\">{}</td></tr>\n",
            num(*t, 2),
            esc(why)
        );
    }
    h.push_str("</tbody></table>\n</section>\n");
}

const HEAD: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Stoker profile</title>
<style>
body {
  margin: 0;
  background: #fff;
  color: #222;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
}
main { max-width: 1000px; margin: 0 auto; padding: 16px 20px 48px; }
h1 { font-size: 26px; margin: 8px 0 14px; }
h2 { font-size: 18px; margin: 0 0 6px; }
h3 { font-size: 15px; margin: 14px 0 4px; }
section { margin: 0 0 26px; }
.note { color: #555; margin: 0 0 8px; }
.nodata {
  color: #777;
  font-style: italic;
  background: #f6f6f6;
  padding: 10px 12px;
  border-radius: 4px;
}
.verdict { border: 2px solid #59a14f; background: #f3faf1; border-radius: 8px; padding: 12px 16px; }
.verdict.input-bound { border-color: #e15759; background: #fdf2f2; }
.verdict .call { font-size: 17px; margin: 0 0 6px; }
.verdict .summary { margin: 6px 0 10px; }
.recs { padding-left: 22px; margin: 4px 0 0; }
.recs li { margin: 0 0 12px; }
.rec-head { display: flex; gap: 12px; align-items: baseline; justify-content: space-between; }
.change { font-weight: 600; }
.gain {
  font-weight: 700;
  color: #fff;
  background: #4e79a7;
  border-radius: 10px;
  padding: 1px 9px;
  white-space: nowrap;
}
.why { margin: 2px 0 4px; color: #444; }
.code { display: flex; gap: 8px; align-items: flex-start; margin: 2px 0; }
.code .lang {
  font-size: 11px;
  text-transform: uppercase;
  color: #777;
  min-width: 48px;
  padding-top: 5px;
}
pre {
  background: #f4f4f6;
  border: 1px solid #e2e2e6;
  border-radius: 4px;
  padding: 6px 9px;
  margin: 0;
  overflow-x: auto;
  font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
}
.code pre { flex: 1; }
.cards { display: grid; grid-template-columns: repeat(4, 1fr); gap: 10px; }
.card { border: 1px solid #e2e2e6; border-radius: 6px; padding: 8px 10px; }
.card .k { color: #666; font-size: 12px; }
.card .v { font-size: 17px; font-weight: 600; }
svg {
  display: block;
  max-width: 100%;
  height: auto;
  font: 12px system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
}
svg .axis line { stroke: #888; stroke-width: 1; }
svg .axis line.grid { stroke: #e6e6e6; }
svg .axis text, svg .legend text { fill: #333; }
table { border-collapse: collapse; margin: 4px 0; }
table.grid { width: 100%; }
table.grid th, table.grid td {
  border-bottom: 1px solid #e6e6e6;
  padding: 4px 8px;
  text-align: right;
}
table.grid th { background: #f6f6f8; font-weight: 600; }
table.grid .name { text-align: left; }
table.kv th { text-align: left; font-weight: normal; color: #555; padding: 2px 16px 2px 0; }
table.kv td { padding: 2px 0; }
td.share { white-space: nowrap; }
.bar {
  display: inline-block;
  width: 70px;
  height: 9px;
  background: #eee;
  margin-right: 6px;
  vertical-align: middle;
}
.bar span { display: block; height: 100%; background: #4e79a7; }
</style>
</head>
"#;

/// Checks, once loaded, that every chart drew something with an extent, and says so on
/// the body (`data-charts-ok="N/M"`); each chart's SVG gets `data-ok` 1 or 0.
const SCRIPT: &str = r#"<script>
window.addEventListener("load", function () {
  var svgs = document.querySelectorAll("section.chart svg");
  var ok = 0;
  for (var i = 0; i < svgs.length; i++) {
    var drawn = svgs[i].querySelectorAll(".series");
    var good = false;
    for (var j = 0; j < drawn.length && !good; j++) {
      var b = drawn[j].getBBox();
      good = b.width > 0 || b.height > 0;
    }
    svgs[i].setAttribute("data-ok", good ? "1" : "0");
    if (good) { ok += 1; }
  }
  document.body.dataset.chartsOk = ok + "/" + svgs.length;
});
</script>
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ConsumerStats, Recommendation, StorageSummary, Verdict};
    use crate::stats::{MemoryStats, OperatorStats, StageStats};

    const NAMES: [&str; 3] = ["source(mem)", "map[a<b & \"c\"]", "prefetch('x')"];

    fn point(i: u64) -> TimePoint {
        let t = 0.1 * (i + 1) as f64;
        TimePoint {
            t_s: t,
            samples: 100 * i,
            items: 10 * i,
            epoch: 0,
            threads: 2 + i % 2,
            stages: (0..3)
                .map(|s| StagePoint {
                    items_out: 100 * i + s,
                    busy_s: 0.05 * i as f64 * (s + 1) as f64,
                    wait_s: 0.01 * i as f64,
                    queue: (i + s) % 5,
                    queue_cap: if s == 0 { 0 } else { 4 },
                })
                .collect(),
            memory: MemoryPoint {
                held: 3000 * i,
                limit: 20_000,
                block_cache: 1000 * i,
                sample_cache: 500 * i,
                samples: 1000 * i,
                read_ahead: 500 * i,
            },
            storage: Some(StoragePoint {
                requests: 7 * i,
                bytes: 300_000 * i,
                cache_hits: 3 * i,
                cache_misses: 4 * i,
            }),
            consumer_wait_s: 0.03 * i as f64,
            consumer_step_s: 0.06 * i as f64,
            budget_wait_s: 0.0,
            cpu_s: 0.15 * i as f64,
        }
    }

    fn op(name: &str, index: usize, ns: Option<f64>) -> OperatorStats {
        OperatorStats {
            name: name.into(),
            index,
            samples: 40,
            ns_per_sample: ns,
            bytes_in_per_sample: Some(2048.0),
            bytes_out_per_sample: Some(4096.0),
            size_ratio: Some(2.0),
            hint_ns: None,
            hint_size_ratio: Some(1.5),
            gil: false,
        }
    }

    fn profile() -> Profile {
        let timeline: Vec<TimePoint> = (0..6).map(point).collect();
        Profile {
            verdict: Verdict {
                input_bound: true,
                wait_share: 0.33,
                max_gain: 1.5,
                bottleneck: NAMES[1].into(),
                cause: Cause::Cpu,
                summary: "The map <holds> it back & more.".into(),
                recommendations: vec![
                    Recommendation {
                        change: "More threads".into(),
                        why: "the workers were busy 98% of the time".into(),
                        expected_gain: 1.8,
                        spec: Some("[options] threads = 4".into()),
                        python: Some("p = p.options(threads=4)".into()),
                    },
                    Recommendation {
                        change: "Cache after <decode>".into(),
                        why: "decoding repeats every epoch".into(),
                        expected_gain: 1.04,
                        spec: None,
                        python: Some("p = p.cache(\"mem\")".into()),
                    },
                ],
            },
            seconds: 0.6,
            samples: 500,
            items: 50,
            samples_per_s: 833.3,
            first_item_s: Some(0.02),
            cpus: 4,
            threads: 3,
            stages: NAMES.iter().map(|s| s.to_string()).collect(),
            stage_stats: NAMES
                .iter()
                .enumerate()
                .map(|(i, n)| StageStats {
                    name: n.to_string(),
                    items_in: 500,
                    items_out: 500 + i as u64,
                    dropped: 0,
                    busy_s: 0.25,
                    wait_s: 0.05,
                    bytes: 1 << 20,
                    queue: (1, 4),
                })
                .collect(),
            operators: vec![
                op("decode<jpeg>", 1, Some(2.0e6)),
                op("resize", 2, Some(5.0e5)),
            ],
            timeline,
            consumer: ConsumerStats {
                wait_s: 0.15,
                step_s: 0.3,
                items: 50,
            },
            budget_wait_s: 0.0,
            cpu_s: 1.5,
            memory: MemoryStats {
                held: 0,
                peak: 15_000,
                limit: 20_000,
                samples: 0,
            },
            storage: Some(StorageSummary {
                get_requests: 35,
                head_requests: 1,
                list_requests: 1,
                bytes_read: 1_500_000,
                retries: 0,
                failed_reads: 0,
                latency_p50_ms: 4.0,
                latency_p90_ms: 9.0,
                latency_p99_ms: 20.0,
                latency: vec![
                    LatencyBucket {
                        lo_ms: 2.0,
                        hi_ms: 4.0,
                        count: 10,
                    },
                    LatencyBucket {
                        lo_ms: 4.0,
                        hi_ms: 8.0,
                        count: 20,
                    },
                    LatencyBucket {
                        lo_ms: 16.0,
                        hi_ms: 32.0,
                        count: 5,
                    },
                ],
                cache_hits: 15,
                cache_misses: 20,
                max_concurrency: 16,
            }),
            autotune: vec![(0.3, 3, "workers saturated: one more".into())],
            explain: "source(mem)\n  map[a<b & \"c\"]\n".into(),
            skipped: 0,
            run_start_us: 0.0,
        }
    }

    /// No number that is not one, anywhere.
    fn assert_finite(h: &str) {
        assert!(!h.contains("NaN"), "NaN in the report");
        assert!(!h.contains("inf"), "inf in the report");
    }

    /// The `data-series` counts of the page's charts.
    fn series_counts(h: &str) -> Vec<usize> {
        h.split("data-series=\"")
            .skip(1)
            .map(|r| r[..r.find('"').unwrap()].parse().unwrap())
            .collect()
    }

    #[test]
    fn renders_a_full_profile() {
        let h = render(&profile());
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(h.contains("<h1>Stoker profile</h1>"));
        for id in [
            "verdict",
            "headline",
            "throughput",
            "queues",
            "threads",
            "memory",
            "storage",
            "consumer",
            "operators",
            "stages",
            "autotune",
            "explain",
        ] {
            assert!(h.contains(&format!("id=\"{id}\"")), "no section {id}");
        }
        for id in [
            "throughput",
            "queues",
            "threads",
            "memory",
            "storage",
            "consumer",
        ] {
            assert!(
                h.contains(&format!("<section class=\"chart\" id=\"{id}\">")),
                "{id} is not a chart section"
            );
        }
        // Names escaped everywhere; none raw.
        assert!(h.contains("map[a&lt;b &amp; &quot;c&quot;]"));
        assert!(h.contains("prefetch(&#39;x&#39;)"));
        assert!(h.contains("decode&lt;jpeg&gt;"));
        assert!(!h.contains("a<b"));
        assert!(!h.contains("<holds>") && !h.contains("<decode>"));
        // The verdict and its recommendations, gains and code.
        assert!(h.contains("class=\"verdict input-bound\""));
        assert!(h.contains("33.0%"));
        assert!(h.contains("×1.8") && h.contains("×1.04") && h.contains("×1.5"));
        assert!(h.contains("<code class=\"spec\">[options] threads = 4</code>"));
        assert!(h.contains("<code class=\"python\">p = p.cache(&quot;mem&quot;)</code>"));
        // Eight charts (three in the store's section), each drawing something.
        let counts = series_counts(&h);
        assert_eq!(counts.len(), 8, "{counts:?}");
        assert!(counts.iter().all(|&n| n > 0), "{counts:?}");
        // Throughput: three stages and the consumer; queues: the two with a capacity.
        assert_eq!(counts[0], 4);
        assert_eq!(counts[1], 2);
        assert!(h.matches("class=\"series\"").count() >= 8 + 3);
        // The operators' shares: 80% and 20%.
        assert!(h.contains("80.0%") && h.contains("20.0%"));
        assert!(h.contains("document.body.dataset.chartsOk"));
        assert!(!h.contains("No store"));
        assert_finite(&h);
    }

    #[test]
    fn renders_an_empty_timeline() {
        let mut p = profile();
        p.timeline.clear();
        p.seconds = 0.0;
        p.storage = None;
        p.operators.clear();
        p.autotune.clear();
        p.verdict.recommendations.clear();
        p.first_item_s = None;
        let h = render(&p);
        assert!(h.contains("No store: the source is in memory or local."));
        assert!(h.contains("id=\"throughput\"") && h.contains("id=\"consumer\""));
        assert!(series_counts(&h).is_empty());
        assert!(h.contains("No data"));
        assert_finite(&h);
    }

    #[test]
    fn an_empty_timeline_with_a_duration_plots_the_totals() {
        let mut p = profile();
        p.timeline.clear();
        let h = render(&p);
        let counts = series_counts(&h);
        assert!(
            counts.len() >= 5 && counts.iter().all(|&n| n > 0),
            "{counts:?}"
        );
        assert_finite(&h);
    }

    #[test]
    fn renders_a_single_point() {
        let mut p = profile();
        p.timeline.truncate(1);
        p.seconds = p.timeline[0].t_s;
        let h = render(&p);
        // The zero point at the start makes one interval.
        let counts = series_counts(&h);
        assert!(
            !counts.is_empty() && counts.iter().all(|&n| n > 0),
            "{counts:?}"
        );
        assert_finite(&h);
    }

    #[test]
    fn no_nan_or_inf_from_bad_numbers() {
        let mut p = profile();
        p.seconds = f64::NAN;
        p.samples_per_s = f64::INFINITY;
        p.verdict.wait_share = f64::NAN;
        p.verdict.max_gain = f64::INFINITY;
        p.verdict.recommendations[0].expected_gain = f64::NAN;
        p.operators[0].ns_per_sample = Some(f64::INFINITY);
        p.operators[1].size_ratio = Some(f64::NAN);
        p.timeline[2].t_s = f64::NAN;
        p.timeline[3].stages[1].busy_s = f64::INFINITY;
        p.timeline[4].consumer_wait_s = f64::NAN;
        p.stage_stats[0].busy_s = f64::NAN;
        p.autotune[0].0 = f64::INFINITY;
        if let Some(s) = p.storage.as_mut() {
            s.latency_p99_ms = f64::NAN;
            s.latency[2].hi_ms = f64::INFINITY;
            s.latency[0].lo_ms = 0.0;
        }
        let h = render(&p);
        assert_finite(&h);
        assert!(!series_counts(&h).is_empty());
    }

    #[test]
    fn all_zero_counters() {
        let mut p = profile();
        for t in &mut p.timeline {
            let t_s = t.t_s;
            *t = TimePoint {
                t_s,
                samples: 0,
                items: 0,
                epoch: 0,
                threads: 0,
                stages: t
                    .stages
                    .iter()
                    .map(|s| StagePoint {
                        items_out: 0,
                        busy_s: 0.0,
                        wait_s: 0.0,
                        queue: 0,
                        queue_cap: s.queue_cap,
                    })
                    .collect(),
                memory: MemoryPoint::default(),
                storage: Some(StoragePoint::default()),
                consumer_wait_s: 0.0,
                consumer_step_s: 0.0,
                budget_wait_s: 0.0,
                cpu_s: 0.0,
            };
        }
        p.seconds = 0.6;
        p.samples = 0;
        p.items = 0;
        p.consumer = ConsumerStats::default();
        p.memory = MemoryStats {
            held: 0,
            peak: 0,
            limit: 0,
            samples: 0,
        };
        p.operators
            .iter_mut()
            .for_each(|o| o.ns_per_sample = Some(0.0));
        if let Some(s) = p.storage.as_mut() {
            s.latency.clear();
        }
        let h = render(&p);
        assert_finite(&h);
        assert!(h.contains("No requests timed."));
    }

    #[test]
    fn close_points_merge_into_the_next() {
        let mut p = profile();
        // A last point 1 ms after the one before: merged, not a spike.
        let mut last = point(6);
        last.t_s = p.timeline[5].t_s + 0.001;
        p.timeline.push(last.clone());
        p.seconds = last.t_s;
        let tl = timeline(&p);
        assert_eq!(tl.last().unwrap().t_s, last.t_s);
        assert!(tl.windows(2).all(|w| w[1].t_s - w[0].t_s > 0.02));
        assert_eq!(tl[0].t_s, 0.0);
    }

    #[test]
    fn escapes() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(gain(1.8), "×1.8");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(12.0), "12 B");
        assert_eq!(sig(0.012345), "0.0123");
        assert_eq!(num(f64::NAN, 2), "–");
        assert_eq!(tick(2_000_000.0, 500_000.0, 2e6, Unit::Plain("")), "2.0M");
        assert_eq!(tick(20_000.0, 10_000.0, 5e4, Unit::Plain("")), "20k");
        assert_eq!(tick(3000.0, 1000.0, 5e3, Unit::Plain(" MiB")), "3000 MiB");
        assert_eq!(tick(0.25, 0.25, 1.0, Unit::Percent), "25%");
    }
}
