//! `stoker profile PIPELINE.toml --out DIR`: runs a pipeline spec under the profiler and
//! writes its report (see `stoker_pipeline::profile`).

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;
use stoker_pipeline::{PipelineSpec, Profile};

use crate::args::ProfileArgs;
use crate::run::Progress;

pub async fn profile(a: ProfileArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.spec)
        .with_context(|| format!("cannot read {}", a.spec.display()))?;
    let mut spec: PipelineSpec = toml::from_str(&text)
        .with_context(|| format!("{} is not a pipeline spec", a.spec.display()))?;
    crate::run::refuse_distributed(&spec, &a.spec, a.local)?;
    if let Some(e) = a.epochs {
        spec.epochs = e;
    }
    if let Some(t) = a.threads {
        spec.options.threads = Some(t);
    }
    let store = a.store.options()?;
    tokio::task::spawn_blocking(move || profile_blocking(a, spec, store)).await?
}

fn profile_blocking(
    a: ProfileArgs,
    spec: PipelineSpec,
    store: stoker_store::StoreOptions,
) -> anyhow::Result<()> {
    let p = spec.build(store)?;
    if !a.no_trace {
        stoker_core::trace::start();
    }
    let t0 = Instant::now();
    let mut run = p.run()?;
    let progress = Progress::new(a.json, a.limit);
    let step = Duration::from_secs_f64(a.step_ms.max(0.0) / 1000.0);
    let deadline = Duration::from_secs_f64(a.seconds.max(0.0));
    let mut items = 0u64;
    let mut samples = 0u64;
    loop {
        if a.limit.is_some_and(|l| items >= l) || t0.elapsed() >= deadline {
            break;
        }
        let Some(item) = run.next() else { break };
        let item = item?;
        items += 1;
        samples += item.samples() as u64;
        drop(item);
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        progress.tick(&run, items, samples, t0);
    }
    progress.finish();
    let prof = run.profile();
    drop(run);
    let (spans, dropped) = stoker_core::trace::stop();
    let written = prof
        .write(&a.out, &spans)
        .with_context(|| format!("cannot write the report into {}", a.out.display()))?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&prof)?)?;
        return Ok(());
    }
    print_verdict(&mut out, &prof)?;
    if dropped > 0 {
        writeln!(
            out,
            "trace: {} spans kept, {dropped} more dropped (the trace keeps at most {})",
            spans.len(),
            stoker_core::trace::MAX_SPANS
        )?;
    }
    for w in written {
        writeln!(out, "wrote {}", w.display())?;
    }
    Ok(())
}

/// The verdict and its recommendations, as a terminal reads them.
pub fn print_verdict(out: &mut impl Write, p: &Profile) -> std::io::Result<()> {
    let v = &p.verdict;
    writeln!(
        out,
        "{} samples in {:.2} s: {:.0} samples/s; first item after {}",
        p.samples,
        p.seconds,
        p.samples_per_s,
        p.first_item_s.map_or("-".into(), |s| format!("{:.3} s", s))
    )?;
    writeln!(out, "{}", v.summary)?;
    for (i, r) in v.recommendations.iter().enumerate() {
        writeln!(
            out,
            "{}. {} (expected x{:.2}): {}",
            i + 1,
            r.change,
            r.expected_gain,
            r.why
        )?;
        if let Some(s) = &r.spec {
            writeln!(out, "     spec:   {s}")?;
        }
        if let Some(py) = &r.python {
            writeln!(out, "     python: {py}")?;
        }
    }
    Ok(())
}
