//! The verdict: is the consumer waiting for input, which part of the pipeline holds it back
//! and why, and what to change, ranked by the gain the measurements predict.

use serde::{Deserialize, Serialize};

/// Why the bottleneck is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// CPU work: an operator or a stage's thread is busy all the time.
    Cpu,
    /// Storage: the source waits for the store's requests.
    Io,
    /// The memory budget: the source waits for room to admit samples.
    Memory,
    /// Not the input: the consumer is slower than the pipeline.
    Consumer,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Cpu => "cpu",
            Cause::Io => "io",
            Cause::Memory => "memory",
            Cause::Consumer => "consumer",
        }
    }
}

/// One change to make, with what it is expected to give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// What to change, in a sentence.
    pub change: String,
    /// Why: the measurements behind it.
    pub why: String,
    /// The expected speed-up of the consumer's steps (1.0: none), from the cost model.
    pub expected_gain: f64,
    /// The line of a pipeline spec (TOML) that makes it, when a spec can.
    pub spec: Option<String>,
    /// The Python that makes it, when Python can.
    pub python: Option<String>,
}

/// The answer to "am I input-bound, where, and what do I change".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The consumer waited for input for a noticeable share of the run
    /// ([`INPUT_BOUND_SHARE`] or more).
    pub input_bound: bool,
    /// The share of the consumer's time spent waiting for input (0..1).
    pub wait_share: f64,
    /// The most a faster pipeline could speed the consumer up: its time with waiting over
    /// its time without.
    pub max_gain: f64,
    /// What holds the run back: an operator or a stage as `explain()` names it, `storage`,
    /// `memory budget`, or `consumer`.
    pub bottleneck: String,
    /// Why.
    pub cause: Cause,
    /// The verdict in a sentence or two, with its numbers.
    pub summary: String,
    /// Changes, the largest expected gain first.
    pub recommendations: Vec<Recommendation>,
}

/// The share of its time a consumer must wait for input to be called input-bound.
pub const INPUT_BOUND_SHARE: f64 = 0.10;

/// A worker pool this busy (its threads' busy time over their wall time) is saturated.
const SATURATED: f64 = 0.75;

/// A source this busy reading (or waiting for the store) holds the run back, when the
/// workers are not saturated.
const SOURCE_BUSY: f64 = 0.5;

impl Verdict {
    /// A verdict not yet judged (while a profile is assembled).
    pub(crate) fn pending() -> Verdict {
        Verdict {
            input_bound: false,
            wait_share: 0.0,
            max_gain: 1.0,
            bottleneck: String::new(),
            cause: Cause::Consumer,
            summary: String::new(),
            recommendations: Vec::new(),
        }
    }
}

/// How busy each part of the run was.
struct Load {
    /// The source thread: its busy share of the run.
    source: f64,
    /// The worker pool (the producer's operators and the parallel stages): busy over
    /// threads x seconds.
    workers: f64,
    /// The tail thread (the sequential stages): busy share, and its busiest stage.
    tail: f64,
    tail_stage: Option<usize>,
    /// The source's share of time waiting for budget.
    budget_wait: f64,
    /// The memory budget's mean use over the timeline (0..1).
    memory_use: f64,
}

fn load(p: &super::Profile) -> Load {
    let e = p.seconds.max(1e-9);
    let threads = p.threads.max(1) as f64;
    let last = p.stage_stats.len().saturating_sub(1);
    let (mut workers, mut tail, mut tail_stage) = (0.0, 0.0, None::<(usize, f64)>);
    for (i, s) in p.stage_stats.iter().enumerate() {
        if i == 0 || i == last {
            continue;
        }
        if s.name.starts_with("map[") {
            workers += s.busy_s;
        } else {
            tail += s.busy_s;
            if tail_stage.is_none_or(|(_, b)| s.busy_s > b) {
                tail_stage = Some((i, s.busy_s));
            }
        }
    }
    let memory_use = if p.timeline.is_empty() {
        0.0
    } else {
        p.timeline
            .iter()
            .map(|t| t.memory.held as f64 / t.memory.limit.max(1) as f64)
            .sum::<f64>()
            / p.timeline.len() as f64
    };
    Load {
        source: p.stage_stats.first().map_or(0.0, |s| s.busy_s / e),
        workers: workers / (threads * e),
        tail: tail / e,
        tail_stage: tail_stage.map(|(i, _)| i),
        budget_wait: p.budget_wait_s / e,
        memory_use,
    }
}

/// Whether the source reads whole objects (files, ImageFolder: the store's
/// `fetch_concurrency` bounds it) rather than streams of records (`max_concurrency`).
pub(crate) fn per_object(p: &crate::Pipeline) -> bool {
    matches!(
        p.format,
        crate::FormatChoice::Files | crate::FormatChoice::ImageFolder
    )
}

/// Rounds up to a power of two.
fn pow2(x: f64) -> u64 {
    (x.max(1.0).ceil() as u64).next_power_of_two()
}

/// The verdict on a profile of a run of `pipeline`.
pub(crate) fn judge(p: &super::Profile, pipeline: &crate::Pipeline) -> Verdict {
    let c = p.consumer;
    // The wait for the first item is start-up (listing, the first reads), not the
    // pipeline's pace: left out.
    let wait = (c.wait_s - p.first_item_s.unwrap_or(0.0)).max(0.0);
    let total = wait + c.step_s;
    let wait_share = if total > 0.0 { wait / total } else { 0.0 };
    let max_gain = if c.step_s > 0.0 {
        (total / c.step_s).min(100.0)
    } else {
        100.0
    };
    let l = load(p);
    let input_bound = wait_share >= INPUT_BOUND_SHARE;
    let mut recs = Vec::new();
    let per_item_ms = |s: f64| 1e3 * s / c.items.max(1) as f64;
    if !input_bound {
        let summary = format!(
            "Not input-bound: the consumer waited {:.1}% of its time for input; its own step \
             ({:.2} ms an item) sets the pace. The workers were {:.0}% busy.",
            100.0 * wait_share,
            per_item_ms(c.step_s),
            100.0 * l.workers
        );
        if l.workers < 0.5 && p.threads > 1 {
            let fewer = ((p.threads as f64 * l.workers * 1.5).ceil() as u64).clamp(1, p.threads);
            if fewer < p.threads {
                recs.push(Recommendation {
                    change: format!(
                        "Give the pipeline fewer threads ({fewer} instead of {}): the input keeps \
                         up with less, and the CPUs it frees can go to the training step",
                        p.threads
                    ),
                    why: format!(
                        "the workers were busy {:.0}% of the time",
                        100.0 * l.workers
                    ),
                    expected_gain: 1.0,
                    spec: Some(format!("[options] threads = {fewer}")),
                    python: Some(format!("p = p.options(threads={fewer})")),
                });
            }
        }
        return Verdict {
            input_bound,
            wait_share,
            max_gain,
            bottleneck: "consumer".into(),
            cause: Cause::Consumer,
            summary,
            recommendations: recs,
        };
    }
    // A consumer that spends under 1% of its time between items does no work of its own:
    // it drains the pipeline to measure it (`stoker run`, `stoker profile` without a step).
    let drains = c.step_s < 0.01 * total;
    let waiting = format!(
        "Input-bound: the consumer waited {:.0}% of its time for input{}",
        100.0 * wait_share,
        if !drains {
            format!(" (a pipeline that kept up would make its steps up to {max_gain:.1}x faster)")
        } else {
            " (it does almost no work of its own between items: this measures the pipeline \
             alone)"
                .into()
        }
    );
    let memory_bound = l.budget_wait >= 0.2
        || (l.source >= SOURCE_BUSY && l.memory_use >= 0.85 && l.workers < SATURATED);
    let (bottleneck, cause, why) = if memory_bound {
        (
            "memory budget".to_string(),
            Cause::Memory,
            format!(
                "the memory budget ({:.1} MiB) was {:.0}% full on average and the source \
                 waited {:.1} s for room in it",
                p.memory.limit as f64 / 1048576.0,
                100.0 * l.memory_use,
                p.budget_wait_s
            ),
        )
    } else if l.workers >= SATURATED {
        let op = p
            .operators
            .iter()
            .filter(|o| o.ns_per_sample.is_some())
            .max_by(|a, b| {
                a.ns_per_sample
                    .partial_cmp(&b.ns_per_sample)
                    .expect("finite")
            });
        let name = op.map_or_else(
            || p.stages.get(1).cloned().unwrap_or_default(),
            |o| o.name.clone(),
        );
        let total_ns: f64 = p.operators.iter().filter_map(|o| o.ns_per_sample).sum();
        let detail =
            op.and_then(|o| o.ns_per_sample.map(|ns| (o, ns)))
                .map_or(String::new(), |(o, ns)| {
                    format!(
                        "; {} takes {:.2} ms a sample, {:.0}% of the operators' time",
                        o.name,
                        ns / 1e6,
                        100.0 * ns / total_ns.max(1.0)
                    )
                });
        (
            name,
            Cause::Cpu,
            format!(
                "the {} worker threads were {:.0}% busy{detail}",
                p.threads,
                100.0 * l.workers
            ),
        )
    } else if l.tail >= SATURATED {
        let i = l.tail_stage.unwrap_or(0);
        (
            p.stages.get(i).cloned().unwrap_or_default(),
            Cause::Cpu,
            format!(
                "the tail thread, which runs the sequential stages, was {:.0}% busy",
                100.0 * l.tail
            ),
        )
    } else if l.source >= SOURCE_BUSY && p.storage.is_some() {
        let s = p.storage.as_ref().expect("checked");
        (
            p.stages.first().cloned().unwrap_or_default(),
            Cause::Io,
            format!(
                "the source spent {:.0}% of the run reading while the workers were {:.0}% \
                 busy; the store answered in {:.1} ms (median, {:.1} ms p90) with at most {} \
                 requests at once",
                100.0 * l.source,
                100.0 * l.workers,
                s.latency_p50_ms,
                s.latency_p90_ms,
                s.max_concurrency
            ),
        )
    } else if l.source >= SOURCE_BUSY {
        (
            p.stages.first().cloned().unwrap_or_default(),
            Cause::Cpu,
            format!(
                "the source thread (reading and parsing records) was {:.0}% busy",
                100.0 * l.source
            ),
        )
    } else {
        // Nothing is saturated: the pipeline runs below what its threads could do, as when
        // too few samples are in flight.
        (
            p.stages.get(1).cloned().unwrap_or_default(),
            Cause::Cpu,
            format!(
                "no part is saturated (source {:.0}%, workers {:.0}%, tail {:.0}% busy): too \
                 few samples in flight",
                100.0 * l.source,
                100.0 * l.workers,
                100.0 * l.tail
            ),
        )
    };
    recommend(p, pipeline, &l, cause, max_gain, &mut recs);
    recs.sort_by(|a, b| b.expected_gain.total_cmp(&a.expected_gain));
    Verdict {
        input_bound,
        wait_share,
        max_gain,
        summary: format!(
            "{waiting}. Bottleneck: {bottleneck} ({}): {why}.",
            cause.as_str()
        ),
        bottleneck,
        cause,
        recommendations: recs,
    }
}

/// The changes that address `cause`, with their expected gains (never more than
/// `max_gain`, what a pipeline that always kept up would give).
fn recommend(
    p: &super::Profile,
    pipeline: &crate::Pipeline,
    l: &Load,
    cause: Cause,
    max_gain: f64,
    recs: &mut Vec<Recommendation>,
) {
    let cap = |g: f64| g.clamp(1.0, max_gain.max(1.0));
    let threads = p.threads.max(1);
    let cpus = p.cpus.max(1) as u64;
    match cause {
        Cause::Memory => {
            let limit = p.memory.limit.max(1);
            let new = (limit * 2).max(p.memory.peak * 2);
            let mib = new.div_ceil(1 << 20);
            recs.push(Recommendation {
                change: format!("Raise the memory budget to {mib} MiB"),
                why: format!(
                    "the source waited {:.0}% of the run for room in the budget",
                    100.0 * l.budget_wait
                ),
                expected_gain: cap(1.0 / (1.0 - l.budget_wait.min(0.9)).max(0.1)).max(cap(1.5)),
                spec: Some(format!("[options] memory_limit = \"{mib}MiB\"")),
                python: Some(format!("p = p.options(memory_limit=\"{mib}MiB\")")),
            });
            if pipeline
                .ops
                .iter()
                .any(|o| matches!(o, crate::Op::Shuffle(n) if *n > 1024))
            {
                recs.push(Recommendation {
                    change: "Make the shuffle buffer smaller, or shuffle the objects instead \
                             (shuffle_shards)"
                        .into(),
                    why: "a shuffle buffer holds its samples in the budget".into(),
                    expected_gain: cap(1.2),
                    spec: Some("shuffle_shards = true".into()),
                    python: Some("p = p.shuffle_shards()".into()),
                });
            }
        }
        Cause::Io => {
            let s = p.storage.as_ref().expect("io needs a store");
            let reqs_per_sample = s.get_requests as f64 / p.samples.max(1) as f64;
            let target_rate = p.samples_per_s * max_gain.min(8.0);
            // Little's law: requests in flight = arrival rate x latency.
            let need = target_rate * reqs_per_sample * s.latency_p50_ms.max(0.1) / 1e3;
            let now = s.max_concurrency.max(1) as f64;
            let conc = pow2(need.max(now * 2.0)).min(1024);
            let knob = match per_object(pipeline) {
                true => "fetch_concurrency",
                false => "max_concurrency",
            };
            recs.push(Recommendation {
                change: format!("Let the store run {conc} requests at once (now {now}: {knob})"),
                why: format!(
                    "at {:.1} ms a request and {reqs_per_sample:.2} requests a sample, feeding \
                     the consumer takes about {need:.0} requests in flight",
                    s.latency_p50_ms
                ),
                expected_gain: cap((conc as f64 / now).min(need / now.min(need).max(1.0))),
                spec: Some(format!("[store] {knob} = {conc}")),
                python: Some(format!(
                    "p = stoker.from_url(url, {knob}={conc})  # with the other arguments"
                )),
            });
            if pipeline.epochs.is_none_or(|e| e > 1) && !pipeline.cache {
                recs.push(Recommendation {
                    change: "Cache the objects on local disk for the later epochs".into(),
                    why: "every epoch reads the same objects from the store again".into(),
                    expected_gain: cap(max_gain),
                    spec: Some("[store] cache_dir = \"/tmp/stoker-cache\"".into()),
                    python: Some("p = p.cache(\"/tmp/stoker-cache\")".into()),
                });
            }
        }
        Cause::Cpu => {
            if threads < cpus {
                let g = cpus as f64 / threads as f64;
                recs.push(Recommendation {
                    change: format!("Run {cpus} worker threads instead of {threads} (one per CPU)"),
                    why: format!(
                        "the workers were {:.0}% busy and {} of the {cpus} CPUs had none",
                        100.0 * l.workers,
                        cpus - threads
                    ),
                    expected_gain: cap(g * l.workers.max(0.5)),
                    spec: Some(format!("[options] threads = {cpus}")),
                    python: Some(format!("p = p.options(threads={cpus})")),
                });
            }
            // Every CPU of the machine was busy: more CPUs, on other machines, through Ray
            // worker actors (each hosting the engine over a piece of the epoch).
            let cores = p.cpu_s / p.seconds.max(1e-9);
            if threads >= cpus && l.workers >= SATURATED && cores >= 0.8 * cpus as f64 {
                let want = (cpus as f64 * max_gain.clamp(1.0, 8.0)).ceil() as u64;
                recs.push(Recommendation {
                    change: format!(
                        "Run the pipeline on more CPUs than this machine has: Ray worker \
                         actors on other machines (about {want} CPUs in all would keep up)"
                    ),
                    why: format!(
                        "the {threads} worker threads were busy and the process used \
                         {cores:.1} of the machine's {cpus} CPUs"
                    ),
                    expected_gain: cap(want as f64 / cpus as f64),
                    spec: None,
                    python: Some(format!(
                        "dp = p.distribute(workers=\"auto\", cpus_per_worker={cpus})  \
                         # on Ray: docs/distributed.md"
                    )),
                });
            }
            if l.workers < 0.5 && l.tail < SATURATED && l.source < SOURCE_BUSY {
                recs.push(Recommendation {
                    change: "Let more samples be in flight (a larger window)".into(),
                    why: "no stage is saturated while the consumer waits".into(),
                    expected_gain: cap(1.0 / l.workers.max(l.source).max(0.25)),
                    spec: Some("[options] window = 4096".into()),
                    python: Some("p = p.options(window=4096)".into()),
                });
            }
            // A Python function on threads: its calls take the GIL, so busy threads may be
            // waiting for it. The CPU the process used tells: about one core for busy
            // threads that hold the GIL in turn, next to none for calls that wait
            // (sleeps, I/O) with it released.
            if let Some(py) = p
                .operators
                .iter()
                .filter(|o| o.gil && o.ns_per_sample.is_some())
                .max_by(|a, b| {
                    a.ns_per_sample
                        .unwrap_or(0.0)
                        .total_cmp(&b.ns_per_sample.unwrap_or(0.0))
                })
            {
                let busy = l.workers * threads as f64;
                let cores = p.cpu_s / p.seconds.max(1e-9);
                if l.workers >= SATURATED && busy >= 1.5 && cores < 0.7 * busy {
                    let name = &py.name;
                    if cores >= 0.6 {
                        let procs = threads.min(cpus).max(2);
                        recs.push(Recommendation {
                            change: format!(
                                "Run {name} in worker processes: on threads its calls take \
                                 turns holding the GIL"
                            ),
                            why: format!(
                                "the {threads} worker threads were busy {busy:.1} threads' \
                                 worth but the process used {cores:.1} CPUs"
                            ),
                            expected_gain: cap(procs as f64 / cores.max(0.5)),
                            spec: None,
                            python: Some(format!(
                                "p = <the pipeline before it>.map(fn, workers=\"processes\", \
                                 processes={procs})  # fn: {name}; or workers=\"auto\""
                            )),
                        });
                    } else {
                        let more = threads * 4;
                        recs.push(Recommendation {
                            change: format!(
                                "Give {name} more threads ({more}): its calls wait (sleeps, \
                                 I/O) with the CPU idle"
                            ),
                            why: format!(
                                "the {threads} worker threads were busy {busy:.1} threads' \
                                 worth but the process used {cores:.1} CPUs"
                            ),
                            expected_gain: cap(more as f64 / threads as f64 * 0.8),
                            spec: Some(format!("[options] threads = {more}")),
                            python: Some(format!("p = p.options(threads={more})")),
                        });
                    }
                }
            }
            // The most expensive deterministic operator's work can be kept across epochs.
            let det: Vec<_> = p
                .operators
                .iter()
                .filter(|o| o.ns_per_sample.is_some())
                .collect();
            let total: f64 = det.iter().filter_map(|o| o.ns_per_sample).sum();
            if let Some(o) = det.iter().max_by(|a, b| {
                a.ns_per_sample
                    .partial_cmp(&b.ns_per_sample)
                    .expect("finite")
            }) {
                let share = o.ns_per_sample.unwrap_or(0.0) / total.max(1.0);
                if l.workers >= SATURATED && share > 0.3 {
                    recs.push(Recommendation {
                        change: format!(
                            "Make {} cheaper (a cheaper form of it, or a smaller input), or \
                             give the pipeline more CPUs: it is {:.0}% of the operators' time",
                            o.name,
                            100.0 * share
                        ),
                        why: format!(
                            "{:.2} ms a sample on each of {threads} busy threads; the gain \
                             is what making it twice as cheap would give",
                            o.ns_per_sample.unwrap_or(0.0) / 1e6
                        ),
                        expected_gain: cap(1.0 / (1.0 - share * 0.5)),
                        spec: None,
                        python: None,
                    });
                }
            }
        }
        Cause::Consumer => {}
    }
}
