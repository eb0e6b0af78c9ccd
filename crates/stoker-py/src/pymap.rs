//! Python functions as pipeline operators: `Pipeline.map(fn)` and `Pipeline.filter(fn)`.
//!
//! A [`PyOp`] is an ordinary [`SampleOp`], so the engine runs it where it runs native
//! operators: on its worker threads (before the first sequential stage, and as a parallel
//! stage after one), in sample order, with the sample's origin added to any error it
//! returns. After a `batch` it is a function on batches ([`SampleOp::apply_batch`]): it
//! gets the batch's dict of columns and returns one with as many rows (or `None`). What it calls
//! depends on the mode chosen in Python:
//!
//! - **threads**: the function itself. The engine thread takes the GIL for the call and the
//!   conversions around it, and for nothing else; every other engine thread and the
//!   iterating thread wait for the engine with the GIL released, so a function that
//!   releases the GIL itself (NumPy on large arrays) runs on several threads at once.
//! - **processes**: a `stoker._pymap.ProcessStage`, whose `call(sample)` hands the sample to
//!   a worker process through shared memory and waits for the answer (the wait releases the
//!   GIL), returning `(result, token)`; `release(token)` gives the worker back once the
//!   result (whose arrays are views of the worker's shared memory) has been copied into the
//!   engine.
//!
//! In both, the sample reaches Python as the iterator yields it (memoryviews, NumPy arrays,
//! no copy) and the result comes back as a [`Sample`] (one copy of each array or bytes).
//!
//! **Seeded functions** (`map(fn, seeded=True)`): the call also passes a 64-bit seed drawn
//! from the operator's per-sample generator ([`OpContext::rng`]: the pipeline's seed, the
//! epoch, the sample's origin and the operator's index), from which the Python side builds
//! the `numpy.random.Generator` handed to `fn(sample, rng)`. The draws then depend on the
//! sample, not on which thread or process ran it or when, so they repeat under any
//! parallelism and after a resume, as a native random operator's do.
//! An exception becomes an operator error holding the Python traceback.
//!
//! **Interpreter exit.** A thread that asks for the GIL while the interpreter finalizes is
//! ended by CPython mid-call (`pthread_exit`), which a Rust thread must never suffer. So
//! every call passes a [`GATE`]: an exit hook (`stoker._pymap`, through `atexit`) closes it
//! and waits, with the GIL released, until calls already inside have left; calls arriving
//! after that fail with an error instead of asking for the GIL.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use stoker_core::{Batch, Error, OpMeta, Sample};
use stoker_pipeline::{OpContext, SampleOp};

use crate::convert::{batch_to_py, py_to_batch_named, py_to_sample_named, sample_to_py};

/// Whether Python calls are still allowed, and how many are under way.
struct Gate {
    closed: AtomicBool,
    inside: AtomicUsize,
}

static GATE: Gate = Gate {
    closed: AtomicBool::new(false),
    inside: AtomicUsize::new(0),
};

/// Leaves the gate when dropped.
struct Pass;

impl Drop for Pass {
    fn drop(&mut self) {
        GATE.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    fn enter(&self) -> Option<Pass> {
        self.inside.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.inside.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Pass)
    }
}

/// Closes the gate and waits (GIL released) for calls inside it, at most `timeout_s`.
/// Called at interpreter exit.
#[pyfunction]
pub(crate) fn close_python_calls(py: Python<'_>, timeout_s: f64) {
    GATE.closed.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
    py.detach(|| {
        while GATE.inside.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    });
}

/// How a [`PyOp`] reaches its function.
pub(crate) enum Mode {
    /// Called on the engine's thread.
    Threads,
    /// Through a `ProcessStage` (`call` / `release`).
    Processes,
    /// Threads or processes, chosen from the function's first calls (see [`Auto`]).
    Auto(Auto),
}

/// Calls measured before `workers="auto"` chooses.
const PROBE_CALLS: u32 = 16;
/// Calls after which it chooses whatever it has seen.
const PROBE_LIMIT: u32 = 64;
/// A call cheaper than this stays on the engine's threads: handing a sample to a worker
/// process and its result back costs about as much.
const CHEAP_NS: f64 = 200_000.0;
/// What moving a byte to a worker process and back costs, in nanoseconds: the sample is
/// pickled into shared memory, the result's arrays are copied out of it (about 1 GB/s in
/// all, measured with a 768 KB result: 1,232 samples/s in processes against 2,235 on
/// threads for a call of 0.4 ms that holds the GIL).
const MOVE_NS_PER_BYTE: f64 = 1.0;
/// A function that holds the GIL moves to worker processes only when its call takes at
/// least this many times what moving its sample and result costs.
const MOVE_FACTOR: f64 = 2.0;
/// The monitor's tries needed to tell whether the function holds the GIL.
const TRIES: u32 = 8;
/// The tries enough at [`PROBE_LIMIT`] calls: a try waits for a call that holds the GIL to
/// give it up, so over 64 calls of 2 ms on two threads the monitor may get only 5 to 7.
const MIN_TRIES: u32 = 3;
/// A try that got the GIL within this while a call was inside got it because the call let
/// it go: a call that holds it gives it up only at the interpreter's switch interval
/// (5 ms) or when it returns.
const QUICK: Duration = Duration::from_millis(2);

const PROBING: u8 = 0;
const THREADS: u8 = 1;
const PROCESSES: u8 = 2;

/// `workers="auto"`: the function runs on the engine's threads for its first
/// [`PROBE_CALLS`] calls, which measure what a call costs, while a monitor thread tries,
/// every fraction of a millisecond, to take the GIL when a call is inside the function.
/// A function that releases the GIL (NumPy, decoders, I/O, `time.sleep`) lets the monitor
/// in at once; one that holds it (plain Python) lets it in only when it returns (or at the
/// interpreter's switch interval). Then the function stays on threads when calls are cheap
/// (below [`CHEAP_NS`]: a process hand-off costs as much) or it released the GIL for most
/// tries, and moves to the worker processes when it held it, unless moving its sample and
/// result costs too much next to the call (a lookup that returns a large array in less time
/// than the copy of that array takes: see [`MOVE_FACTOR`]). The outputs are the same
/// either way (a seeded function gets the same seeds); only where calls run changes. The
/// choice and its numbers are in `run.explain()`.
pub(crate) struct Auto {
    /// The `ProcessStage`, started only if chosen.
    stage: Py<PyAny>,
    state: std::sync::Arc<AutoState>,
}

/// What the calls and the monitor share.
struct AutoState {
    chosen: AtomicU8,
    /// Calls inside the function (holding the GIL, or inside and having let it go).
    inside: AtomicUsize,
    monitor: std::sync::Once,
    probe: parking_lot::Mutex<Probe>,
    why: parking_lot::Mutex<Option<String>>,
}

/// What the measured calls and the monitor showed.
#[derive(Default)]
struct Probe {
    calls: u32,
    call_ns: u64,
    /// The monitor's tries made while a call was inside, and those that got the GIL
    /// within [`QUICK`] while it still was.
    tries: u32,
    let_in: u32,
    /// The bytes of the calls' arguments and results.
    bytes: u64,
}

impl Auto {
    pub(crate) fn new(stage: Py<PyAny>) -> Auto {
        Auto {
            stage,
            state: std::sync::Arc::new(AutoState {
                chosen: AtomicU8::new(PROBING),
                inside: AtomicUsize::new(0),
                monitor: std::sync::Once::new(),
                probe: parking_lot::Mutex::new(Probe::default()),
                why: parking_lot::Mutex::new(None),
            }),
        }
    }

    fn chosen(&self) -> u8 {
        self.state.chosen.load(Ordering::Acquire)
    }

    /// Starts the monitor (once): while the choice is open, it tries to take the GIL when a
    /// call is inside, and counts whether it got in at once.
    fn watch(&self) {
        let st = self.state.clone();
        self.state.monitor.call_once(move || {
            let started = Instant::now();
            let spawned = std::thread::Builder::new()
                .name("stoker-gil-probe".into())
                .spawn(move || {
                    while st.chosen.load(Ordering::Acquire) == PROBING
                        && started.elapsed() < Duration::from_secs(60)
                    {
                        if st.inside.load(Ordering::Acquire) == 0 {
                            std::thread::sleep(Duration::from_micros(100));
                            continue;
                        }
                        let Some(pass) = GATE.enter() else { return };
                        let t = Instant::now();
                        let during = Python::attach(|_| st.inside.load(Ordering::Acquire) > 0);
                        drop(pass);
                        let quick = during && t.elapsed() < QUICK;
                        {
                            let mut p = st.probe.lock();
                            p.tries += 1;
                            p.let_in += u32::from(quick);
                        }
                        std::thread::sleep(Duration::from_micros(300));
                    }
                });
            // Without a monitor (no thread could start), the choice falls to what the calls
            // cost (see `note`: threads after `PROBE_LIMIT` calls without tries).
            drop(spawned);
        });
    }

    /// Counts one measured call; chooses after [`PROBE_CALLS`] once the monitor has made
    /// [`TRIES`] tries (or after [`PROBE_LIMIT`] calls).
    fn note(&self, call_ns: u64, bytes: u64) {
        let st = &*self.state;
        let mut p = st.probe.lock();
        if st.chosen.load(Ordering::Acquire) != PROBING {
            return;
        }
        p.calls += 1;
        p.call_ns += call_ns;
        p.bytes += bytes;
        let per_call = p.call_ns as f64 / p.calls as f64;
        let cheap = per_call < CHEAP_NS;
        if p.calls < PROBE_CALLS || (!cheap && p.tries < TRIES && p.calls < PROBE_LIMIT) {
            return;
        }
        let ms = per_call / 1e6;
        let bytes_per_call = p.bytes as f64 / p.calls as f64;
        let move_ns = bytes_per_call * MOVE_NS_PER_BYTE;
        let tries = format!(
            "the GIL was free for {} of {} tries to take it during its calls",
            p.let_in, p.tries
        );
        let (mode, why) = if cheap {
            (
                THREADS,
                format!(
                    "threads: its calls are cheap ({ms:.3} ms; a hand-off to a worker process \
                     costs about {:.1} ms)",
                    CHEAP_NS / 1e6
                ),
            )
        } else if p.tries < MIN_TRIES {
            (
                THREADS,
                format!(
                    "threads: over its first {} calls ({ms:.3} ms each) it could not be told \
                     whether it holds the GIL ({tries})",
                    p.calls
                ),
            )
        } else if p.let_in * 2 < p.tries && per_call < MOVE_FACTOR * move_ns {
            (
                THREADS,
                format!(
                    "threads: it holds the GIL, but moving its sample and result to a worker \
                     process ({:.0} KB, about {:.3} ms) costs too much next to its call \
                     ({ms:.3} ms; over its first {} calls, {tries})",
                    bytes_per_call / 1e3,
                    move_ns / 1e6,
                    p.calls
                ),
            )
        } else if p.let_in * 2 < p.tries {
            (
                PROCESSES,
                format!(
                    "worker processes: it holds the GIL (over its first {} calls of {ms:.3} \
                     ms, {tries})",
                    p.calls
                ),
            )
        } else {
            (
                THREADS,
                format!(
                    "threads: it releases the GIL (over its first {} calls of {ms:.3} ms, \
                     {tries})",
                    p.calls
                ),
            )
        };
        *st.why.lock() = Some(why);
        st.chosen.store(mode, Ordering::Release);
    }
}

/// A Python function as a per-sample operator (see the module docs).
pub(crate) struct PyOp {
    meta: OpMeta,
    qualname: String,
    filter: bool,
    /// Whether the call passes the sample's seed (see the module docs).
    seeded: bool,
    /// Declared to give, on a batch, the batch of what it gives each sample, and never to
    /// drop (`map(fn, batch_safe=True)`): the optimizer may run it once per batch.
    batch_safe: bool,
    mode: Mode,
    target: Py<PyAny>,
}

impl fmt::Debug for PyOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PyOp({})", self.meta.name)
    }
}

static FORMAT_EXCEPTION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The Python exception a function raised, kept with the engine's error so that the
/// `DataError` raised for it chains it as `__cause__` (see `error::pipeline_error`).
pub(crate) struct PyCause(pub(crate) Py<PyAny>);

/// The traceback text of a Python exception: the worker's (set by `stoker._pymap` as
/// `_stoker_traceback`) or `traceback.format_exception`'s.
fn traceback_text(py: Python<'_>, e: &PyErr) -> String {
    let v = e.value(py);
    if let Ok(t) = v.getattr("_stoker_traceback") {
        if let Ok(s) = t.extract::<String>() {
            return s;
        }
    }
    let formatted = FORMAT_EXCEPTION
        .import(py, "traceback", "format_exception")
        .and_then(|f| f.call1((e.get_type(py), v, e.traceback(py))))
        .and_then(|lines| lines.extract::<Vec<String>>());
    match formatted {
        Ok(lines) => lines.concat(),
        Err(_) => e.to_string(),
    }
}

impl PyOp {
    /// `name` is what plans, stats and errors show; `target` the function (threads) or the
    /// `ProcessStage` (processes).
    pub(crate) fn new(
        name: String,
        qualname: String,
        (filter, seeded, batch_safe): (bool, bool, bool),
        mode: Mode,
        target: Py<PyAny>,
    ) -> PyOp {
        // A map may return None to drop the sample, so both kinds declare themselves
        // filters: the optimizer then never moves them across a shuffle buffer. A batch-safe
        // map never drops (None is an error) and declares its batch form.
        let meta = match batch_safe {
            true => OpMeta::new(name).with_batch_form(),
            false => OpMeta::new(name).filter(),
        };
        // Pinned to threads, its calls take the GIL (`auto` measures that itself).
        let meta = match mode {
            Mode::Threads => meta.with_gil(),
            _ => meta,
        };
        PyOp {
            meta,
            qualname,
            filter,
            seeded,
            batch_safe,
            mode,
            target,
        }
    }

    fn raised(&self, py: Python<'_>, e: &PyErr) -> Error {
        // A failure of the worker pool itself (a worker that died, a result that cannot be
        // a sample) says so whole.
        if let Ok(m) = e.value(py).getattr("_stoker_message") {
            if let Ok(m) = m.extract::<String>() {
                return Error::operator(m);
            }
        }
        let original = match e.value(py).getattr("_stoker_exception") {
            // From a worker process: the exception it raised, unpickled (when it pickles).
            Ok(x) if !x.is_none() => x.unbind(),
            _ => e.value(py).clone().into_any().unbind(),
        };
        Error::operator(format!(
            "Python function {} raised an exception:\n{}",
            self.qualname,
            traceback_text(py, e).trim_end()
        ))
        .with_cause(PyCause(original))
    }

    /// A `None` result: the sample (or batch) dropped, unless the function declared it
    /// never drops.
    fn dropped<T>(&self) -> Result<Option<T>, Error> {
        if self.batch_safe {
            return Err(Error::operator(format!(
                "Python function {} returned None, but it was declared batch_safe, which \
                 promises it never drops (it may run once per batch, where None would drop \
                 the whole batch); use .filter() to drop samples",
                self.qualname
            )));
        }
        Ok(None)
    }

    /// What the function's result means for `sample`.
    fn outcome(&self, sample: Sample, out: &Bound<'_, PyAny>) -> Result<Option<Sample>, Error> {
        if self.filter {
            return match out.is_truthy() {
                Ok(true) => Ok(Some(sample)),
                Ok(false) => Ok(None),
                Err(e) => Err(self.raised(out.py(), &e)),
            };
        }
        if out.is_none() {
            return self.dropped();
        }
        if out.cast::<PyDict>().is_err() {
            return Err(Error::operator(format!(
                "Python function {} returned a {}: a map function returns the sample (a dict) \
                 or None to drop it",
                self.qualname,
                out.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "?".into())
            )));
        }
        py_to_sample_named(out).map(Some).map_err(|e| {
            Error::operator(format!(
                "the result of Python function {}: {}",
                self.qualname,
                e.value(out.py())
            ))
        })
    }

    /// What the function's result means for `batch` (a function on batches).
    fn batch_outcome(&self, batch: Batch, out: &Bound<'_, PyAny>) -> Result<Option<Batch>, Error> {
        if self.filter {
            return match out.is_truthy() {
                Ok(true) => Ok(Some(batch)),
                Ok(false) => Ok(None),
                Err(e) => Err(self.raised(out.py(), &e)),
            };
        }
        if out.is_none() {
            return self.dropped();
        }
        if out.cast::<PyDict>().is_err() {
            return Err(Error::operator(format!(
                "Python function {} returned a {}: a map function on batches returns the \
                 batch (a dict of columns) or None to drop it",
                self.qualname,
                out.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "?".into())
            )));
        }
        py_to_batch_named(out, batch.len()).map(Some).map_err(|e| {
            Error::operator(format!(
                "the result of Python function {}: {}",
                self.qualname,
                e.value(out.py())
            ))
        })
    }

    /// Calls the function on `arg` (a sample's or a batch's dict) and makes its result
    /// into what `outcome` says, before a worker process is given back (in processes
    /// mode the result's arrays are views of that worker's shared memory).
    fn call<T>(
        &self,
        py: Python<'_>,
        arg: Bound<'_, PyDict>,
        seed: Option<u64>,
        outcome: impl FnOnce(&Bound<'_, PyAny>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let (processes, target) = match &self.mode {
            Mode::Threads => (false, self.target.bind(py)),
            Mode::Processes => (true, self.target.bind(py)),
            Mode::Auto(a) => match a.chosen() {
                PROCESSES => (true, a.stage.bind(py)),
                _ => (false, self.target.bind(py)),
            },
        };
        match processes {
            false => {
                let out = match seed {
                    Some(s) => target.call1((arg, s)),
                    None => target.call1((arg,)),
                }
                .map_err(|e| self.raised(py, &e))?;
                outcome(&out)
            }
            true => {
                let got = target
                    .call_method1("call", (arg, seed))
                    .map_err(|e| self.raised(py, &e))?;
                let (out, token): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                    got.extract().map_err(|e| self.raised(py, &e))?;
                let result = outcome(&out);
                drop(out);
                drop(got);
                target
                    .call_method1("release", (token,))
                    .map_err(|e| self.raised(py, &e))?;
                result
            }
        }
    }

    /// Whether `workers="auto"` is still measuring calls (their argument's size is then
    /// wanted: see [`PyOp::attach`]).
    fn probing(&self) -> bool {
        matches!(&self.mode, Mode::Auto(a) if a.chosen() == PROBING)
    }

    /// Runs `f` with the GIL, unless the interpreter is exiting. While `workers="auto"`
    /// is choosing, the time in `f` and the bytes of its argument (`in_bytes`, measured
    /// by the caller only while [`PyOp::probing`]) and result are measured.
    fn attach<T>(
        &self,
        in_bytes: Option<usize>,
        out_bytes: impl Fn(&T) -> usize,
        f: impl FnOnce(Python<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let Some(_pass) = GATE.enter() else {
            return Err(Error::operator(format!(
                "Python function {} not called: the interpreter is exiting",
                self.qualname
            )));
        };
        let probing = match &self.mode {
            Mode::Auto(a) if a.chosen() == PROBING => Some(a),
            _ => None,
        };
        let Some(auto) = probing else {
            return Python::attach(f);
        };
        auto.watch();
        let mut call_ns = 0u64;
        let r = Python::attach(|py| {
            let t = Instant::now();
            auto.state.inside.fetch_add(1, Ordering::AcqRel);
            let r = f(py);
            auto.state.inside.fetch_sub(1, Ordering::AcqRel);
            call_ns = t.elapsed().as_nanos() as u64;
            r
        });
        let out = r.as_ref().map_or(0, &out_bytes);
        auto.note(call_ns, (in_bytes.unwrap_or(0) + out) as u64);
        r
    }
}

impl SampleOp for PyOp {
    fn meta(&self) -> OpMeta {
        self.meta.clone()
    }

    fn placement(&self) -> Option<String> {
        match &self.mode {
            Mode::Auto(a) => Some(format!(
                "{}: {}",
                self.meta.name,
                a.state.why.lock().clone().unwrap_or_else(|| format!(
                    "threads or worker processes, chosen after its first {PROBE_CALLS} calls \
                     (not made yet)"
                ))
            )),
            _ => None,
        }
    }

    fn apply(&self, sample: Sample, ctx: &mut OpContext) -> Result<Option<Sample>, Error> {
        let seed = self.seeded.then(|| ctx.rng().next_u64());
        let size = |s: &Option<Sample>| s.as_ref().map_or(0, Sample::size_bytes);
        let in_bytes = self.probing().then(|| sample.size_bytes());
        self.attach(in_bytes, size, |py| {
            let arg = sample_to_py(py, &sample).map_err(|e| self.raised(py, &e))?;
            self.call(py, arg, seed, |out| self.outcome(sample, out))
        })
    }

    /// A function on batches (placed after `batch`): it gets the batch as the iterator
    /// yields it, a dict of columns (stacked tensors as NumPy arrays, no copy; lists), and
    /// returns one with as many rows, or None to drop it.
    fn apply_batch(
        &self,
        batch: Batch,
        ctx: &mut OpContext,
    ) -> Option<Result<Option<Batch>, Error>> {
        let seed = self.seeded.then(|| ctx.rng().next_u64());
        let size = |b: &Option<Batch>| b.as_ref().map_or(0, Batch::size_bytes);
        let in_bytes = self.probing().then(|| batch.size_bytes());
        Some(self.attach(in_bytes, size, |py| {
            let arg = batch_to_py(py, &batch).map_err(|e| self.raised(py, &e))?;
            self.call(py, arg, seed, |out| self.batch_outcome(batch, out))
        }))
    }
}
