//! `_native.Pipeline`: an immutable pipeline handle. Every builder method clones the
//! [`Pipeline`] (cheap: operators and in-memory samples are shared) and returns a new
//! handle, so a pipeline given to a function can never be changed behind its caller's back.
//!
//! Sources come from a spec: `stoker.from_url(...)` writes the spec's source part (`source`,
//! `format`, `glob`, `keys`, `format_options`) and `stoker.from_spec` passes a whole one, as JSON
//! text, so formats and their options are resolved by the same code as `stoker run`.
//! Per-sample operators come the same way, one `OpSpec` object at a time.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use stoker_core::{ByteSize, Collate, CollatePolicy, Error, Sample};
use stoker_pipeline::spec::{OpSpec, OptionsSpec};
use stoker_pipeline::{
    ErrorPolicy, Pipeline, PipelineSpec, PipelineState, RankPolicy, RunOptions, SampleOp, SplitMode,
};
use stoker_store::StoreOptions;

use crate::convert::py_to_sample;
use crate::error::{pipeline_error, store_error};
use crate::pymap::{Mode, PyOp};
use crate::run::PyRun;
use crate::wait;

/// An immutable pipeline (see the module docs).
#[pyclass(frozen, name = "Pipeline", module = "stoker._native")]
#[derive(Debug)]
pub struct PyPipeline {
    p: Pipeline,
    /// The run options in force: `Pipeline` takes them whole, so the handle keeps a copy
    /// that `options()` changes field by field.
    options: RunOptions,
    /// Where runs start (set by `with_state`); the beginning when `None`.
    start: Option<PipelineState>,
}

fn invalid(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Store options from `(key, value)` pairs, the keys of `StoreOptions::set`.
pub(crate) fn store_options(py: Python<'_>, pairs: &[(String, String)]) -> PyResult<StoreOptions> {
    let mut o = StoreOptions::default();
    for (k, v) in pairs {
        o.set(k, v).map_err(|e| store_error(py, e))?;
    }
    Ok(o)
}

fn parse_size(what: &str, v: &str) -> PyResult<u64> {
    v.parse::<ByteSize>()
        .map(|b| b.bytes())
        .map_err(|e| invalid(format!("{what} {v:?}: {e}")))
}

/// A number of bytes given as an int, an integral float (`2e9`) or a size (`"2GiB"`): a
/// `ValueError` for a negative or fractional one, a `TypeError` for anything else.
fn bytes_arg(what: &str, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(b) = v.extract::<u64>() {
        return Ok(b);
    }
    if let Ok(text) = v.extract::<String>() {
        return parse_size(what, &text);
    }
    if v.is_instance_of::<pyo3::types::PyInt>() {
        return Err(invalid(format!(
            "{what} must be a number of bytes at least 0, not {v}"
        )));
    }
    if let Ok(f) = v.extract::<f64>() {
        // Below 2^64: every such float that is whole converts exactly.
        if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 18_446_744_073_709_551_616.0 {
            return Ok(f as u64);
        }
        return Err(invalid(format!(
            "{what} must be a whole number of bytes at least 0, not {f}"
        )));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "{what}: expected a number of bytes or a size such as \"2GiB\", not {}",
        v.get_type().name()?
    )))
}

fn error_policy(v: &str) -> PyResult<ErrorPolicy> {
    match v {
        "raise" => Ok(ErrorPolicy::Raise),
        "skip" => Ok(ErrorPolicy::Skip),
        other => Err(invalid(format!(
            "errors must be \"raise\" or \"skip\", not {other:?}"
        ))),
    }
}

fn collate(v: &str, pad_value: f64) -> PyResult<Collate> {
    Ok(match v {
        "auto" => Collate::Auto,
        "stack" => Collate::Stack,
        "list" => Collate::List,
        "pad" => Collate::Pad(pad_value),
        other => {
            return Err(invalid(format!(
                "unknown collate {other:?} (auto, stack, list, pad)"
            )))
        }
    })
}

/// The run options a spec's `[options]` table gives (as `PipelineSpec::build` sets them).
fn run_options_of(o: &OptionsSpec) -> PyResult<RunOptions> {
    o.run_options().map_err(|e| invalid(e.to_string()))
}

/// Adds one spec operator to `p` (the spec's own code, so every operator the spec knows
/// is available here).
fn apply_op(p: Pipeline, op: &OpSpec) -> Result<Pipeline, Error> {
    op.apply(p)
}

impl PyPipeline {
    fn with(&self, f: impl FnOnce(Pipeline) -> Pipeline) -> PyPipeline {
        PyPipeline {
            p: f(self.p.clone()),
            options: self.options.clone(),
            start: self.start.clone(),
        }
    }

    fn start_run(&self, py: Python<'_>, state: Option<PipelineState>) -> PyResult<PyRun> {
        let p = self.p.clone();
        // Starting lists the source (network round trips): on a thread, so that the wait
        // can be interrupted.
        let started = wait::on_thread(py, "stoker-start", move || match state {
            Some(s) => p.resume(&s),
            None => p.run(),
        })?;
        started.map(PyRun::new).map_err(|e| pipeline_error(py, e))
    }
}

fn parse_state(state_json: &str) -> PyResult<PipelineState> {
    PipelineState::from_json(state_json)
        .map_err(|e| invalid(format!("not a Stoker pipeline state: {}", e.message)))
}

#[pymethods]
impl PyPipeline {
    /// A pipeline from a spec given as JSON text, on top of store options given as
    /// `(key, value)` pairs (the spec's `store` table wins).
    #[staticmethod]
    fn from_spec(py: Python<'_>, spec_json: &str, store: Vec<(String, String)>) -> PyResult<Self> {
        let spec: PipelineSpec = serde_json::from_str(spec_json)
            .map_err(|e| invalid(format!("not a pipeline spec: {e}")))?;
        let store = store_options(py, &store)?;
        let options = run_options_of(&spec.options)?;
        let mut p = spec.build(store).map_err(|e| pipeline_error(py, e))?;
        // `build` sets the same options; setting them again keeps handle and pipeline equal.
        p = p.options(options.clone());
        Ok(PyPipeline {
            p,
            options,
            start: None,
        })
    }

    /// A pipeline over samples in memory (a sequence of dicts; copied).
    #[staticmethod]
    fn from_samples(samples: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut out: Vec<Sample> = Vec::new();
        for s in samples.try_iter()? {
            out.push(py_to_sample(&s?)?);
        }
        let options = RunOptions::default();
        Ok(PyPipeline {
            p: Pipeline::from_samples(out).options(options.clone()),
            options,
            start: None,
        })
    }

    /// Adds one operator given as a spec object in JSON (`{"op": "decode_utf8", ...}`).
    /// `kind` is `"map"` (a per-sample operator), `"filter"` (one that may drop samples) or
    /// `"any"` (any operator the spec knows).
    fn op(&self, py: Python<'_>, op_json: &str, kind: &str) -> PyResult<Self> {
        let op: OpSpec =
            serde_json::from_str(op_json).map_err(|e| invalid(format!("{e} (in {op_json})")))?;
        match (kind, &op) {
            ("any", _) => {}
            ("map", OpSpec::Builtin(_)) => {}
            ("filter", OpSpec::Builtin(b)) if b.meta().filters => {}
            ("filter", OpSpec::Builtin(b)) => {
                return Err(invalid(format!(
                    "{} never drops samples: add it with map()",
                    b.name()
                )))
            }
            ("map" | "filter", _) => {
                return Err(invalid(format!(
                    "{op_json} is not a per-sample operator: use the pipeline method of its \
                     name (shuffle, batch, take, ...)"
                )))
            }
            (other, _) => return Err(invalid(format!("unknown operator kind {other:?}"))),
        }
        let p = apply_op(self.p.clone(), &op).map_err(|e| pipeline_error(py, e))?;
        Ok(self.with(|_| p))
    }

    /// Adds a Python function as a per-sample operator (`stoker.Pipeline.map(fn)`):
    /// `target` is the function itself (`mode="threads"`) or a `stoker._pymap.ProcessStage`
    /// (`mode="processes"`); `name` is what plans and errors show, `qualname` the
    /// function's. A filter keeps the samples for which the function is true. `seeded`:
    /// the target is also given the sample's seed (`target(sample, seed)`, or
    /// `target.call(sample, seed)`; else `None`).
    #[pyo3(signature = (target, name, qualname, filter, mode, seeded, stage = None, batch_safe = false))]
    #[allow(clippy::too_many_arguments)]
    fn py_op(
        &self,
        target: Py<PyAny>,
        name: String,
        qualname: String,
        filter: bool,
        mode: &str,
        seeded: bool,
        stage: Option<Py<PyAny>>,
        batch_safe: bool,
    ) -> PyResult<Self> {
        let mode = match (mode, stage) {
            ("threads", None) => Mode::Threads,
            ("processes", None) => Mode::Processes,
            ("auto", Some(stage)) => Mode::Auto(crate::pymap::Auto::new(stage)),
            (other, _) => {
                return Err(invalid(format!(
                    "workers must be \"auto\", \"processes\" or \"threads\", not {other:?} \
                     (auto with its process stage)"
                )))
            }
        };
        let op = PyOp::new(name, qualname, (filter, seeded, batch_safe), mode, target);
        Ok(self.with(|p| p.map(op)))
    }

    /// Only keys matching `glob` (URL sources).
    fn glob(&self, glob: String) -> Self {
        self.with(|p| p.glob(glob))
    }

    fn shuffle_shards(&self, on: bool) -> Self {
        self.with(|p| p.shuffle_shards(on))
    }

    fn interleave(&self, cycle: usize) -> PyResult<Self> {
        if cycle == 0 {
            return Err(invalid("interleave needs at least 1 shard at once"));
        }
        Ok(self.with(|p| p.interleave(cycle)))
    }

    #[pyo3(signature = (rank, world, policy, part = 0, parts = 1))]
    fn shard(&self, rank: u32, world: u32, policy: &str, part: u32, parts: u32) -> PyResult<Self> {
        if world == 0 || rank >= world {
            return Err(invalid(format!(
                "rank {rank} of world {world} is not a valid rank"
            )));
        }
        if parts == 0 || part >= parts {
            return Err(invalid(format!(
                "part {part} of {parts} parts is not a valid part"
            )));
        }
        let policy = match policy {
            "drop" => RankPolicy::Drop,
            "pad" => RankPolicy::Pad,
            other => {
                return Err(invalid(format!(
                    "policy must be \"drop\" or \"pad\", not {other:?}"
                )))
            }
        };
        Ok(self.with(|p| p.shard_by_rank_part(rank, world, policy, part, parts)))
    }

    /// How ranks split sharded formats: "auto", "interleaved" or "contiguous".
    fn split_mode(&self, mode: &str) -> PyResult<Self> {
        let mode = match mode {
            "auto" => SplitMode::Auto,
            "interleaved" => SplitMode::Interleaved,
            "contiguous" => SplitMode::Contiguous,
            other => {
                return Err(invalid(format!(
                    "split must be \"auto\", \"interleaved\" or \"contiguous\", not {other:?}"
                )))
            }
        };
        Ok(self.with(|p| p.split_mode(mode)))
    }

    /// A shard index (JSON at any store URL) with every shard's record count.
    fn shard_index(&self, url: &str) -> Self {
        let url = url.to_string();
        self.with(|p| p.shard_index(url))
    }

    fn shuffle(&self, buffer: usize) -> PyResult<Self> {
        if buffer == 0 {
            return Err(invalid("a shuffle buffer holds at least 1 sample"));
        }
        Ok(self.with(|p| p.shuffle(buffer)))
    }

    /// Batches of `size`; `collate` is the default policy, `fields` per-field overrides.
    fn batch(
        &self,
        size: usize,
        drop_last: bool,
        collate: &str,
        pad_value: f64,
        fields: Vec<(String, String)>,
    ) -> PyResult<Self> {
        if size == 0 {
            return Err(invalid("a batch holds at least 1 sample"));
        }
        let policy = CollatePolicy {
            default: self::collate(collate, pad_value)?,
            fields: fields
                .into_iter()
                .map(|(f, c)| Ok((f, self::collate(&c, pad_value)?)))
                .collect::<PyResult<_>>()?,
        };
        Ok(self.with(|p| p.batch_with(size, drop_last, policy)))
    }

    fn unbatch(&self) -> Self {
        self.with(|p| p.unbatch())
    }

    fn take(&self, n: u64) -> Self {
        self.with(|p| p.take(n))
    }

    fn skip(&self, n: u64) -> Self {
        self.with(|p| p.skip(n))
    }

    #[pyo3(signature = (dir=None, size=None))]
    fn cache(
        &self,
        dir: Option<std::path::PathBuf>,
        size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let size = match size {
            None => None,
            Some(s) => Some(bytes_arg("cache size", s)?),
        };
        Ok(match (dir, size) {
            (None, None) => self.with(|p| p.cache()),
            (None, Some(_)) => {
                return Err(invalid(
                    "cache: size limits a disk cache; give dir too (the memory cache is \
                     bounded by the memory budget)",
                ))
            }
            (Some(d), None) => self.with(|p| p.cache_on_disk(d)),
            (Some(d), Some(b)) => self.with(|p| p.cache_on_disk_limited(d, b)),
        })
    }

    fn prefetch(&self, n: usize) -> PyResult<Self> {
        if n == 0 {
            return Err(invalid("prefetch keeps at least 1 item ready"));
        }
        Ok(self.with(|p| p.prefetch(n)))
    }

    /// `None` repeats forever.
    #[pyo3(signature = (n))]
    fn epochs(&self, n: Option<u64>) -> PyResult<Self> {
        if n == Some(0) {
            return Err(invalid("epochs must be at least 1 (None: forever)"));
        }
        Ok(self.with(|p| p.epochs(n)))
    }

    fn seed(&self, seed: u64) -> Self {
        self.with(|p| p.seed(seed))
    }

    fn first_epoch(&self, k: u64) -> Self {
        self.with(|p| p.first_epoch(k))
    }

    /// Only entries `start..end` of each epoch's order (`stoker_pipeline::Pipeline::span`).
    fn span(&self, start: u64, end: u64) -> Self {
        self.with(|p| p.span(start, end))
    }

    /// `(epochs or None, first epoch, batch sizes, a shuffle buffer or pack)`: what a
    /// distributed run needs to cut the epochs into pieces.
    fn shape(&self) -> (Option<u64>, u64, Vec<usize>, bool) {
        let (epochs, first) = self.p.epoch_range();
        (epochs, first, self.p.batch_sizes(), self.p.holds_across())
    }

    /// The length of each epoch's order, listed (nothing read), and whether each entry is
    /// one sample. Interruptible, off the GIL.
    fn epoch_len(&self, py: Python<'_>) -> PyResult<(u64, bool)> {
        let p = self.p.clone();
        let n = wait::on_thread(py, "stoker-list", move || p.epoch_len())?;
        n.map_err(|e| pipeline_error(py, e))
    }

    /// Changes the given run options, keeping the others.
    #[pyo3(signature = (threads=None, memory_limit=None, deterministic=None, errors=None, autotune=None, window=None, columnar=None, share_store=None, disable=None))]
    #[allow(clippy::too_many_arguments)]
    fn options(
        &self,
        threads: Option<usize>,
        memory_limit: Option<&Bound<'_, PyAny>>,
        deterministic: Option<bool>,
        errors: Option<&str>,
        autotune: Option<bool>,
        window: Option<usize>,
        columnar: Option<bool>,
        share_store: Option<bool>,
        disable: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let mut o = self.options.clone();
        if let Some(t) = threads {
            if t == 0 {
                return Err(invalid("threads must be at least 1"));
            }
            o = o.with_threads(t);
        }
        if let Some(m) = memory_limit {
            let bytes = bytes_arg("memory_limit", m)?;
            o = o.with_memory_limit(bytes);
        }
        if let Some(d) = deterministic {
            o = o.with_deterministic(d);
        }
        if let Some(e) = errors {
            o = o.with_errors(error_policy(e)?);
        }
        if let Some(a) = autotune {
            o = o.with_autotune(a);
        }
        if let Some(w) = window {
            o = o.with_window(w);
        }
        if let Some(c) = columnar {
            o = o.with_columnar(c);
        }
        if let Some(s) = share_store {
            o = o.with_share_store(s);
        }
        if let Some(d) = disable {
            let known = stoker_pipeline::OPTIMIZER_PASSES;
            if let Some(bad) = d.iter().find(|d| !known.contains(&d.as_str())) {
                return Err(invalid(format!(
                    "unknown optimizer pass {bad:?} to disable (the passes that can be turned \
                     off: {})",
                    known.join(", ")
                )));
            }
            o = o.with_disabled_passes(d);
        }
        Ok(PyPipeline {
            p: self.p.clone().options(o.clone()),
            options: o,
            start: self.start.clone(),
        })
    }

    /// The run options in force, as a dict.
    fn run_options(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let o = &self.options;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("threads", o.threads)?;
        d.set_item("memory_limit", o.memory_limit)?;
        d.set_item("deterministic", o.deterministic)?;
        d.set_item(
            "errors",
            match o.errors {
                ErrorPolicy::Raise => "raise",
                ErrorPolicy::Skip => "skip",
            },
        )?;
        d.set_item("autotune", o.autotune)?;
        d.set_item("window", o.window)?;
        d.set_item("columnar", o.columnar)?;
        d.set_item("share_store", o.share_store)?;
        d.set_item("disable", o.disable.clone())?;
        Ok(d.into_any().unbind())
    }

    /// A pipeline whose runs start at `state` (JSON text of a run's state), or at the
    /// beginning for `None`.
    #[pyo3(signature = (state_json))]
    fn with_state(&self, state_json: Option<&str>) -> PyResult<Self> {
        let start = state_json.map(parse_state).transpose()?;
        Ok(PyPipeline {
            p: self.p.clone(),
            options: self.options.clone(),
            start,
        })
    }

    /// The JSON text of the state runs start at, if not the beginning.
    fn start_state(&self) -> Option<String> {
        self.start.as_ref().map(PipelineState::to_json)
    }

    /// Every shard with its record count (`(url, records)`), read whole; Parquet reads only
    /// its footers. Interruptible, off the GIL.
    fn count_records(&self, py: Python<'_>) -> PyResult<Vec<(String, u64)>> {
        let p = self.p.clone();
        let counted = wait::on_thread(py, "stoker-count", move || p.count_records())?;
        counted.map_err(|e| pipeline_error(py, e))
    }

    /// The optimizer's plan with its reasons.
    fn explain(&self) -> String {
        self.p.explain()
    }

    /// Starts a run (from the beginning, or from the state set by `with_state`).
    fn run(&self, py: Python<'_>) -> PyResult<PyRun> {
        self.start_run(py, self.start.clone())
    }

    /// Starts a run from a state (JSON text) taken from a run of the same pipeline.
    fn resume(&self, py: Python<'_>, state_json: &str) -> PyResult<PyRun> {
        let s = parse_state(state_json)?;
        self.start_run(py, Some(s))
    }
}
