//! What an operator says about itself, for the optimizer.
//!
//! The optimizer never special-cases an operator by name: it reorders, fuses and places
//! operators using only these declarations (and measured profiles).

/// An operator's declaration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OpMeta {
    /// The name shown in plans, stats and errors (`map(decode_utf8)`).
    pub name: String,
    /// Same input, same output. A random operator (augmentation) is not deterministic; it
    /// draws from a generator seeded by the pipeline seed, the epoch and the sample's
    /// position, so a pipeline stays reproducible (and resumable) whatever the parallelism.
    pub deterministic: bool,
    /// Keeps no state between samples (so it may run on any number of workers).
    pub stateless: bool,
    /// May drop samples (a filter). An operator that never drops keeps the number of
    /// samples, so it commutes with a shuffle buffer and the optimizer may move it there.
    pub filters: bool,
    /// Expected CPU time per sample, in nanoseconds, when known.
    pub cost_ns: Option<f64>,
    /// Output bytes per input byte, when known (a decode is > 1, a crop < 1).
    pub size_ratio: Option<f64>,
    /// Names of operators this one may be swapped with without changing results.
    pub commutes_with: Vec<String>,
    /// It has a batch form that gives the batch of what it gives each sample (its
    /// `apply_batch` on a batch equals batching its per-sample outputs, and it never drops):
    /// the optimizer may run it once per batch, after the batch stage, instead of on each
    /// sample before it.
    pub batch_form: bool,
    /// It runs Python on the engine's threads: each call holds the interpreter's lock (the
    /// GIL) unless the function lets it go, so more threads may not make it faster. The
    /// profiler tells which, from the CPU the process used, and suggests processes.
    pub gil: bool,
}

impl OpMeta {
    /// A deterministic, stateless operator named `name`, with nothing else known.
    pub fn new(name: impl Into<String>) -> OpMeta {
        OpMeta {
            name: name.into(),
            deterministic: true,
            stateless: true,
            filters: false,
            cost_ns: None,
            size_ratio: None,
            commutes_with: Vec::new(),
            batch_form: false,
            gil: false,
        }
    }

    /// Marks it random.
    pub fn random(mut self) -> OpMeta {
        self.deterministic = false;
        self
    }

    /// Marks it a filter (it may drop samples).
    pub fn filter(mut self) -> OpMeta {
        self.filters = true;
        self
    }

    /// Sets the cost hint.
    pub fn with_cost_ns(mut self, ns: f64) -> OpMeta {
        self.cost_ns = Some(ns);
        self
    }

    /// Sets the output-size hint.
    pub fn with_size_ratio(mut self, r: f64) -> OpMeta {
        self.size_ratio = Some(r);
        self
    }

    /// Declares that it runs Python on the engine's threads (see [`OpMeta::gil`]).
    pub fn with_gil(mut self) -> OpMeta {
        self.gil = true;
        self
    }

    /// Declares its batch form (see [`OpMeta::batch_form`]).
    pub fn with_batch_form(mut self) -> OpMeta {
        self.batch_form = true;
        self
    }

    /// Adds an operator it commutes with.
    pub fn commutes_with(mut self, other: impl Into<String>) -> OpMeta {
        self.commutes_with.push(other.into());
        self
    }
}
