//! Per-sample operators: the [`SampleOp`] trait, closures, and the built-in native ops that
//! pipeline specs name.
//!
//! An operator takes a sample and returns it changed, or `None` to drop it (a filter). It
//! declares itself with [`OpMeta`] (deterministic or random, cost hints) for the
//! optimizer. A random operator draws only from [`OpContext::rng`], a generator seeded by
//! the pipeline seed, the epoch, the sample's position and the operator's place in the
//! pipeline: results do not depend on which worker ran it, or when.
//!
//! **Memory.** An operator that allocates large buffers for a sample (a decoded frame, a
//! resize's intermediates) charges them to the run's memory budget *before* it allocates
//! them, through [`OpContext::reserve`] (or [`OpContext::charger`], to hand to a kernel
//! that knows the size only once it has read a header): the context holds the sample's
//! reservation, tops it up to the sample's bytes plus what the operator charged, waiting
//! for room as the source does, and fails when the sample's need alone is more than the
//! whole budget. The executor gives the difference back when the operator returns (the
//! sample then holds what it is). An operator that charges nothing is counted after it
//! returns, by what the sample has become. The context and its charger are in `context.rs`.
//!
//! **Built-in operators, by modality.** [`Builtin`] is what a spec's `{op = "...", ...}`
//! names. It is an enum of modalities, each an enum of its operators in a file of its own
//! under `ops/` that owns everything about them: the variants and their arguments (with
//! their serde form), their names ([`FieldOp::NAMES`], ...), their plan names, their
//! [`OpMeta`] hints, argument checks, and how they run (per sample, and per batch column
//! for those that can):
//!
//! - `fields.rs` ([`FieldOp`]): rename, select, drop, small conversions, lengths, a
//!   random integer; no kernel.
//! - `image.rs` ([`ImageOp`]): decode, crops, resize, colour, blur, to float, over
//!   `stoker_ops::image`; also the fused decode + random resized crop kernel the optimizer
//!   substitutes.
//! - `text.rs` ([`TextOp`]): tokenization, over `stoker_ops::text`.
//! - `columns.rs` ([`ColumnOp`]): tabular column transforms, over `stoker_ops::tabular`.
//! - `audio.rs` ([`AudioOp`]): decode, resample, spectrograms, mel, dB, stretch, masks,
//!   over `stoker_ops::audio`.
//!
//! So a new image operator is a variant of [`ImageOp`], its name in `ImageOp::NAMES`, and
//! its arms in that file's matches, which the compiler lists; nothing here changes. This
//! file only dispatches: [`Builtin`]'s methods and its [`SampleOp`] impl call the
//! modality's. A kernel's parameters start from the kernel's own defaults in `stoker_ops`
//! (its constructor or `Default`) and take only what the spec gives, so each default is
//! written once, there.
//!
//! **The spec form.** A `Builtin` reads and writes exactly the form of the operator it
//! holds, `{"op": "decode_image", "field": "jpg", ...}`, with no level for the modality:
//! its `Deserialize` reads the object, looks its `op` up in the modalities' `NAMES`, and
//! hands the object to that modality's derived (internally tagged) deserializer, so a wrong
//! or missing argument is reported as that operator's, in serde's words, and an unknown
//! name as an unknown variant among all of them ([`Builtin::NAMES`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use stoker_core::{Batch, Error, OpMeta, Sample};

mod audio;
mod columns;
mod context;
mod fields;
mod image;
mod text;

pub use audio::{AudioOp, Rate};
pub use columns::{ColumnOp, FillValue};
pub(crate) use context::size;
pub use context::OpContext;
pub use fields::FieldOp;
pub(crate) use image::fuse;
pub use image::{ImageOp, Size};
pub use text::TextOp;

/// What operator `op` gave for one item (`what`: "sample" or "batch"), checked as every
/// chain of operators checks it (the executor's, the columnar path's): its error names the
/// operator as its stage, and `Ok(None)` comes only from an operator that declares itself a
/// filter (a map that drops an item is an error saying so).
pub(crate) fn checked<T>(
    op: &dyn SampleOp,
    r: Result<Option<T>, Error>,
    what: &str,
) -> Result<Option<T>, Error> {
    match r {
        Err(e) => Err(e.with_stage(op.meta().name)),
        Ok(None) if !op.meta().filters => Err(Error::invalid(format!(
            "the operator dropped a {what} but does not declare itself a filter (OpMeta::filter)"
        ))
        .with_stage(op.meta().name)),
        r => r,
    }
}

/// A per-sample operator.
pub trait SampleOp: Send + Sync + fmt::Debug {
    /// Its declaration.
    fn meta(&self) -> OpMeta;
    /// Transforms `sample`; `Ok(None)` drops it.
    fn apply(&self, sample: Sample, ctx: &mut OpContext) -> Result<Option<Sample>, Error>;

    /// The spec operator this is, if it is one (the optimizer fuses some pairs of them).
    fn as_builtin(&self) -> Option<&Builtin> {
        None
    }

    /// Where it chose to run, and why, for an operator that chooses while it runs (a
    /// Python function: threads or processes, from its first calls); `None` otherwise or
    /// before it has chosen. `Run::explain` shows it.
    fn placement(&self) -> Option<String> {
        None
    }

    /// Transforms a whole batch, column-wise, for operators that can (placed after a
    /// `batch`); `None` when the operator works only per sample. `Ok(None)` drops the
    /// batch (for an operator declared a filter). A batch that comes back has as many
    /// rows as it had: the pipeline's positions name its samples one to one.
    fn apply_batch(
        &self,
        _batch: Batch,
        _ctx: &mut OpContext,
    ) -> Option<Result<Option<Batch>, Error>> {
        None
    }
}

type MapFn = dyn Fn(Sample, &mut OpContext) -> Result<Option<Sample>, Error> + Send + Sync;

/// An operator from a closure.
#[derive(Clone)]
pub struct FnOp {
    meta: OpMeta,
    f: Arc<MapFn>,
}

impl fmt::Debug for FnOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FnOp({})", self.meta.name)
    }
}

impl FnOp {
    /// A map (or, returning `None`, a filter) declared by `meta`.
    pub fn new(
        meta: OpMeta,
        f: impl Fn(Sample, &mut OpContext) -> Result<Option<Sample>, Error> + Send + Sync + 'static,
    ) -> FnOp {
        FnOp {
            meta,
            f: Arc::new(f),
        }
    }
}

impl SampleOp for FnOp {
    fn meta(&self) -> OpMeta {
        self.meta.clone()
    }
    fn apply(&self, sample: Sample, ctx: &mut OpContext) -> Result<Option<Sample>, Error> {
        (self.f)(sample, ctx)
    }
}

/// The built-in operators a spec can name, with their arguments: one of each modality's
/// (see the module docs). Its serde form is the operator's own (`{"op": "resize", "field":
/// "jpg", "size": 224}`).
#[derive(Debug, Clone, PartialEq)]
pub enum Builtin {
    /// Field bookkeeping and small conversions (`rename`, `select`, `to_tensor`, ...).
    Fields(FieldOp),
    /// Image operators (`decode_image`, `random_resized_crop`, ...).
    Image(ImageOp),
    /// Text operators (`tokenize`).
    Text(TextOp),
    /// Tabular column operators (`fill_null`, `bucketize`, ...).
    Columns(ColumnOp),
    /// Audio operators (`decode_audio`, `mel_spectrogram`, ...).
    Audio(AudioOp),
}

/// The number of built-in operators.
const COUNT: usize = FieldOp::NAMES.len()
    + ImageOp::NAMES.len()
    + TextOp::NAMES.len()
    + ColumnOp::NAMES.len()
    + AudioOp::NAMES.len();

/// Every built-in operator's name, the modalities' `NAMES` one after another.
const ALL_NAMES: [&str; COUNT] = {
    let groups = [
        FieldOp::NAMES,
        ImageOp::NAMES,
        TextOp::NAMES,
        ColumnOp::NAMES,
        AudioOp::NAMES,
    ];
    let mut all = [""; COUNT];
    let (mut g, mut k) = (0, 0);
    while g < groups.len() {
        let mut i = 0;
        while i < groups[g].len() {
            all[k] = groups[g][i];
            k += 1;
            i += 1;
        }
        g += 1;
    }
    all
};

impl Builtin {
    /// Every built-in operator's name in a spec (its `op`), modality by modality.
    pub const NAMES: &'static [&'static str] = &ALL_NAMES;

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            Builtin::Fields(op) => op.name(),
            Builtin::Image(op) => op.name(),
            Builtin::Text(op) => op.name(),
            Builtin::Columns(op) => op.name(),
            Builtin::Audio(op) => op.name(),
        }
    }

    /// Checks arguments that can be checked before running.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            Builtin::Fields(op) => op.validate(),
            Builtin::Image(op) => op.validate(),
            Builtin::Text(op) => op.validate(),
            Builtin::Columns(op) => op.validate(),
            Builtin::Audio(op) => op.validate(),
        }
    }
}

impl From<FieldOp> for Builtin {
    fn from(op: FieldOp) -> Builtin {
        Builtin::Fields(op)
    }
}

impl From<ImageOp> for Builtin {
    fn from(op: ImageOp) -> Builtin {
        Builtin::Image(op)
    }
}

impl From<TextOp> for Builtin {
    fn from(op: TextOp) -> Builtin {
        Builtin::Text(op)
    }
}

impl From<ColumnOp> for Builtin {
    fn from(op: ColumnOp) -> Builtin {
        Builtin::Columns(op)
    }
}

impl From<AudioOp> for Builtin {
    fn from(op: AudioOp) -> Builtin {
        Builtin::Audio(op)
    }
}

impl serde::Serialize for Builtin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Builtin::Fields(op) => op.serialize(s),
            Builtin::Image(op) => op.serialize(s),
            Builtin::Text(op) => op.serialize(s),
            Builtin::Columns(op) => op.serialize(s),
            Builtin::Audio(op) => op.serialize(s),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Builtin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{Error as _, Unexpected};
        let v = serde_json::Value::deserialize(d)?;
        let name = match v.get("op") {
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(D::Error::invalid_type(
                    Unexpected::Other(&other.to_string()),
                    &"an operator's name",
                ))
            }
            None if v.is_object() => return Err(D::Error::missing_field("op")),
            None => {
                return Err(D::Error::invalid_type(
                    Unexpected::Other(&v.to_string()),
                    &"an operator (an object with its name in `op`)",
                ))
            }
        };
        let parsed = if FieldOp::NAMES.contains(&name) {
            FieldOp::deserialize(&v).map(Builtin::Fields)
        } else if ImageOp::NAMES.contains(&name) {
            ImageOp::deserialize(&v).map(Builtin::Image)
        } else if TextOp::NAMES.contains(&name) {
            TextOp::deserialize(&v).map(Builtin::Text)
        } else if ColumnOp::NAMES.contains(&name) {
            ColumnOp::deserialize(&v).map(Builtin::Columns)
        } else if AudioOp::NAMES.contains(&name) {
            AudioOp::deserialize(&v).map(Builtin::Audio)
        } else {
            return Err(D::Error::unknown_variant(name, Builtin::NAMES));
        };
        parsed.map_err(D::Error::custom)
    }
}

impl SampleOp for Builtin {
    fn meta(&self) -> OpMeta {
        match self {
            Builtin::Fields(op) => op.meta(),
            Builtin::Image(op) => op.meta(),
            Builtin::Text(op) => op.meta(),
            Builtin::Columns(op) => op.meta(),
            Builtin::Audio(op) => op.meta(),
        }
    }

    fn as_builtin(&self) -> Option<&Builtin> {
        Some(self)
    }

    fn apply_batch(
        &self,
        batch: Batch,
        _ctx: &mut OpContext,
    ) -> Option<Result<Option<Batch>, Error>> {
        match self {
            Builtin::Text(op) => Some(op.apply_batch(batch).map(Some)),
            Builtin::Columns(op) => Some(op.apply_batch(batch).map(Some)),
            Builtin::Fields(_) | Builtin::Image(_) | Builtin::Audio(_) => None,
        }
    }

    fn apply(&self, s: Sample, ctx: &mut OpContext) -> Result<Option<Sample>, Error> {
        match self {
            Builtin::Fields(op) => op.apply(s, ctx),
            Builtin::Image(op) => op.apply(s, ctx).map(Some),
            Builtin::Text(op) => op.apply(s, ctx).map(Some),
            Builtin::Columns(op) => op.apply(s).map(Some),
            Builtin::Audio(op) => op.apply(s, ctx).map(Some),
        }
    }
}

/// A process-wide cache of kernels that are costly to build (a tokenizer read from its
/// file, a vocabulary's hash map, a resampler's filter bank), by operator.
pub(crate) type Shared<T> = OnceLock<Mutex<HashMap<String, Arc<T>>>>;

/// The kernel for operator `op` from `cache`, built by `make` the first time: one per
/// distinct operator (its spec form), shared by every thread and run of the process.
pub(crate) fn cached<T>(
    cache: &'static Shared<T>,
    op: &impl serde::Serialize,
    make: impl FnOnce() -> Result<T, Error>,
) -> Result<Arc<T>, Error> {
    let key = serde_json::to_string(op).expect("builtins serialise");
    let map = cache.get_or_init(Default::default);
    if let Some(k) = map.lock().expect("kernel cache").get(&key) {
        return Ok(k.clone());
    }
    let k = Arc::new(make()?);
    map.lock()
        .expect("kernel cache")
        .entry(key)
        .or_insert_with(|| k.clone());
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The operator names a modality's derived deserializer knows: those its error for an
    /// unknown `op` lists.
    fn serde_names<T: serde::de::DeserializeOwned + fmt::Debug>() -> Vec<String> {
        let e = serde_json::from_value::<T>(json!({"op": "?"}))
            .unwrap_err()
            .to_string();
        let (_, list) = e.split_once("expected one of ").expect("a list of names");
        list.split(", ")
            .map(|n| n.trim_matches('`').to_string())
            .collect()
    }

    #[test]
    fn each_modality_s_names_are_its_variants_and_all_names_are_theirs() {
        assert_eq!(serde_names::<FieldOp>(), FieldOp::NAMES);
        assert_eq!(serde_names::<ImageOp>(), ImageOp::NAMES);
        assert_eq!(serde_names::<ColumnOp>(), ColumnOp::NAMES);
        assert_eq!(serde_names::<AudioOp>(), AudioOp::NAMES);
        // Two operators: serde says "expected `tokenize` or `embedding`".
        let e = serde_json::from_value::<TextOp>(json!({"op": "?"}))
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("expected `tokenize` or `embedding`"), "{e}");
        assert_eq!(TextOp::NAMES, ["tokenize", "embedding"]);
        let mut all: Vec<&str> = [
            FieldOp::NAMES,
            ImageOp::NAMES,
            TextOp::NAMES,
            ColumnOp::NAMES,
            AudioOp::NAMES,
        ]
        .concat();
        assert_eq!(Builtin::NAMES, all);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), Builtin::NAMES.len(), "a name in two modalities");
    }

    #[test]
    fn a_builtin_reads_and_writes_its_operator_s_own_form() {
        for v in [
            json!({"op": "rename", "from": "a", "to": "b"}),
            json!({
                "op": "resize", "field": "jpg", "size": [2, 3],
                "interpolation": null, "antialias": null
            }),
            json!({"op": "fill_null", "field": "x", "value": 0}),
            json!({
                "op": "time_masking", "field": "s", "mask_param": 4,
                "p": 1.0, "iid_channels": false, "mask_value": 0.0
            }),
        ] {
            let b: Builtin = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(serde_json::to_value(&b).unwrap(), v);
        }
        let b: Builtin =
            serde_json::from_value(json!({"op": "decode_image", "field": "jpg"})).unwrap();
        assert!(matches!(b, Builtin::Image(ImageOp::DecodeImage { .. })));
        assert_eq!(b.name(), "decode_image(jpg)");
        let e = |v| {
            serde_json::from_value::<Builtin>(v)
                .unwrap_err()
                .to_string()
        };
        assert!(
            e(json!({"op": "decode_png"}))
                .starts_with("unknown variant `decode_png`, expected one of `rename`, `select`"),
            "{}",
            e(json!({"op": "decode_png"}))
        );
        assert_eq!(
            e(json!({"op": "resize", "field": "x"})),
            "missing field `size`"
        );
        assert!(
            e(json!({"op": "tokenize", "field": "x", "tokenizer": "t", "shap": 1}))
                .starts_with("unknown field `shap`, expected one of `field`")
        );
        assert_eq!(e(json!({"field": "x"})), "missing field `op`");
    }
}
