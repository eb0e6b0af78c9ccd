//! Pipelines written down: the spec that `stoker run PIPELINE.toml` reads (and that the
//! Python package accepts as a dict).
//!
//! ```toml
//! source = "s3://bucket/train/"     # every object under the prefix (or one object)
//! glob = "*.tar"                     # optional
//! # keys = ["a.tar", "b/c.tar"]       # or: these objects under the prefix, in this order
//! format = "tar"                     # auto (default: by extension) | files | imagefolder | tar
//!                                    # | tfrecord | parquet | jsonl | csv
//! seed = 1
//! epochs = 1
//! first_epoch = 0                   # a run starts at this epoch (its random choices)
//! shuffle_shards = true
//! interleave = 4                     # shards read at once
//!
//! [format_options]                   # per format: parse_examples (tfrecord), columns
//! columns = ["image", "label"]       # (parquet), delimiter/has_header/infer_types (csv)
//!
//! [rank]                             # optional data-parallel split
//! rank = 0
//! world = 8
//! policy = "drop"                    # or "pad"
//! split = "auto"                     # or "interleaved", "contiguous" (sharded formats)
//! shard_index = "s3://bucket/train/index.json"   # record counts (`stoker index` writes it)
//!
//! [[ops]]
//! op = "decode_utf8"
//! field = "txt"
//! [[ops]]
//! op = "shuffle"
//! buffer = 1000
//! [[ops]]
//! op = "batch"
//! size = 32
//!
//! [options]
//! threads = 8
//! errors = "skip"                    # or "raise"
//! memory_limit = "2GiB"
//! columnar = true                    # Parquet straight into batches when identical
//! share_store = false                # true: the process's store, kept for later runs
//! disable = []                       # optimizer passes to turn off: "shuffle", "batching", "cache", "fusion"
//!
//! [store]                            # store options, the same keys as `--option`
//! endpoint = "http://127.0.0.1:9000"
//!
//! [distribute]                       # on Ray worker actors, from Python (docs/distributed.md)
//! workers = 4                        # or "auto" (with min_workers, max_workers)
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use stoker_core::{ByteSize, Collate, CollatePolicy, Error};
use stoker_store::StoreOptions;

pub use crate::format::{detect_format, FormatOptions, FORMAT_OPTION_KEYS};

use crate::format::named_format;
use crate::ops::Builtin;
use crate::pack::Pack;
use crate::plan::{ErrorPolicy, Pipeline, RankPolicy, RunOptions, SplitMode};

/// A pipeline spec (see the module docs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// The source URL.
    pub source: String,
    /// Only keys matching this glob.
    #[serde(default)]
    pub glob: Option<String>,
    /// These objects (keys relative to `source`'s prefix) instead of a listing.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// The record format (default `auto`: from the objects' extensions).
    #[serde(default = "auto")]
    pub format: String,
    /// Format options.
    #[serde(default)]
    pub format_options: FormatOptions,
    /// The seed.
    #[serde(default)]
    pub seed: u64,
    /// Epochs (default 1; 0 means forever).
    #[serde(default = "one")]
    pub epochs: u64,
    /// The epoch a run starts at (default 0): its random choices are that epoch's.
    #[serde(default)]
    pub first_epoch: u64,
    /// Shuffle shard (or object) order each epoch.
    #[serde(default)]
    pub shuffle_shards: bool,
    /// Shards read at once.
    #[serde(default = "one_usize")]
    pub interleave: usize,
    /// Data-parallel split.
    #[serde(default)]
    pub rank: Option<RankSpec>,
    /// Operators, in order.
    #[serde(default)]
    pub ops: Vec<OpSpec>,
    /// Run options.
    #[serde(default)]
    pub options: OptionsSpec,
    /// Store options (`endpoint`, `region`, `part_size`, ...).
    #[serde(default)]
    pub store: BTreeMap<String, toml_like::Scalar>,
    /// `[distribute]`: run on Ray worker actors, as the Python package's
    /// `Pipeline.distribute(...)` with these arguments (`stoker.from_spec` returns the
    /// distributed pipeline). The engine itself runs a spec on one machine: `build` ignores
    /// the table, and `stoker run` refuses a spec that has one unless told `--local`.
    #[serde(default)]
    pub distribute: Option<DistributeSpec>,
}

/// `[distribute]` (see `docs/distributed.md`): the arguments of `Pipeline.distribute`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DistributeSpec {
    /// Worker actors: a number, or `"auto"`.
    #[serde(default)]
    pub workers: Option<Workers>,
    /// Fewest workers (`"auto"`).
    #[serde(default)]
    pub min_workers: Option<u64>,
    /// Most workers.
    #[serde(default)]
    pub max_workers: Option<u64>,
    /// The Ray cluster to join (default: the one initialised in the process, else a local
    /// one).
    #[serde(default)]
    pub address: Option<String>,
    /// Entries a piece of the epoch (default: about four pieces a worker).
    #[serde(default)]
    pub piece: Option<u64>,
    /// Yield in the local run's order (default true).
    #[serde(default)]
    pub ordered: Option<bool>,
    /// CPUs a worker reserves (and its engine threads).
    #[serde(default)]
    pub cpus_per_worker: Option<f64>,
    /// Pieces a worker holds at once.
    #[serde(default)]
    pub depth: Option<u64>,
    /// Seconds between `"auto"`'s decisions.
    #[serde(default)]
    pub tune_s: Option<f64>,
}

/// `workers = N` or `workers = "auto"`.
#[derive(Debug, Clone, PartialEq)]
pub enum Workers {
    /// This many.
    Count(u64),
    /// Scaled from measurements.
    Auto,
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Workers, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(0) => Err(serde::de::Error::custom(
                "distribute.workers must be at least 1",
            )),
            Raw::Count(n) => Ok(Workers::Count(n)),
            Raw::Word(w) if w == "auto" => Ok(Workers::Auto),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "distribute.workers is a number or \"auto\", not {w:?}"
            ))),
        }
    }
}

fn auto() -> String {
    "auto".into()
}
fn one() -> u64 {
    1
}
fn one_usize() -> usize {
    1
}

/// `[rank]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankSpec {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// `drop` or `pad`.
    #[serde(default)]
    pub policy: RankPolicy,
    /// How sharded formats are split: `auto`, `interleaved` or `contiguous`.
    #[serde(default)]
    pub split: SplitMode,
    /// A shard index giving every shard's record count (for the contiguous split).
    #[serde(default)]
    pub shard_index: Option<String>,
}

/// `[options]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionsSpec {
    /// Worker threads.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Autotune the workers (default true).
    #[serde(default)]
    pub autotune: Option<bool>,
    /// Deterministic order (default true).
    #[serde(default)]
    pub deterministic: Option<bool>,
    /// `raise` or `skip`.
    #[serde(default)]
    pub errors: Option<ErrorPolicy>,
    /// The memory budget (`2GiB`).
    #[serde(default)]
    pub memory_limit: Option<String>,
    /// Allow the columnar path (default true).
    #[serde(default)]
    pub columnar: Option<bool>,
    /// Read through the process's shared store (default false; see [`crate::shared`]).
    #[serde(default)]
    pub share_store: Option<bool>,
    /// Optimizer passes to turn off (`"shuffle"`, `"cache"`, `"fusion"`; see
    /// [`RunOptions::disable`]).
    #[serde(default)]
    pub disable: Option<Vec<String>>,
}

impl OptionsSpec {
    /// The run options this table gives (defaults for what it leaves out).
    pub fn run_options(&self) -> Result<RunOptions, Error> {
        let mut ro = RunOptions::default();
        if let Some(t) = self.threads {
            ro = ro.with_threads(t);
        }
        if let Some(a) = self.autotune {
            ro = ro.with_autotune(a);
        }
        if let Some(d) = self.deterministic {
            ro = ro.with_deterministic(d);
        }
        if let Some(e) = self.errors {
            ro = ro.with_errors(e);
        }
        if let Some(c) = self.columnar {
            ro = ro.with_columnar(c);
        }
        if let Some(on) = self.share_store {
            ro = ro.with_share_store(on);
        }
        if let Some(d) = &self.disable {
            crate::optimize::check_disabled(d)?;
            ro = ro.with_disabled_passes(d.iter().cloned());
        }
        if let Some(m) = &self.memory_limit {
            let b: ByteSize = m
                .parse()
                .map_err(|e| Error::invalid(format!("memory_limit {m:?}: {e}")))?;
            ro = ro.with_memory_limit(b.bytes());
        }
        Ok(ro)
    }
}

/// One operator of the spec.
///
/// Deserialized by its `op` name first, so that a wrong or missing parameter is reported
/// for that operator (`operator "resize": missing field `size``) rather than as no variant
/// matching.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", tag = "op", rename_all = "snake_case")]
pub enum OpSpec {
    /// A shuffle buffer.
    Shuffle {
        /// Its size in samples.
        buffer: usize,
    },
    /// Batching.
    Batch {
        /// Samples per batch.
        size: usize,
        /// Drop a last smaller batch.
        #[serde(default)]
        drop_last: bool,
        /// `auto` (default), `stack`, `list`, or `pad` (with `pad_value`).
        #[serde(default)]
        collate: Option<String>,
        /// The pad value for `pad`.
        #[serde(default)]
        pad_value: Option<f64>,
    },
    /// Sequence packing: token ids of consecutive samples into fixed-length blocks.
    Pack(Pack),
    /// Split batches.
    Unbatch,
    /// At most n items per epoch.
    Take {
        /// n.
        n: u64,
    },
    /// Skip n items per epoch.
    Skip {
        /// n.
        n: u64,
    },
    /// Keep parsed records across epochs: in memory, or in files under `dir`.
    Cache {
        /// A local directory for a disk cache (default: memory).
        #[serde(default)]
        dir: Option<String>,
        /// The most the directory's files may take (`20GiB`; default: unbounded). Shards
        /// beyond it are read from the source every epoch.
        #[serde(default)]
        size: Option<String>,
    },
    /// Items kept ready ahead.
    Prefetch {
        /// How many.
        n: usize,
    },
    /// A built-in per-sample operator (deserialized by [`Builtin`]'s own derive, see
    /// below).
    #[serde(skip_deserializing)]
    Builtin(Builtin),
}

/// The operators that are stages of the pipeline rather than [`Builtin`] per-sample ones.
const STAGE_OPS: [&str; 8] = [
    "shuffle", "batch", "pack", "unbatch", "take", "skip", "cache", "prefetch",
];

impl<'de> Deserialize<'de> for OpSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = serde_json::Value::deserialize(d)?;
        let name = match v.get("op") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "an operator's `op` is its name, a string, not {other}"
                )))
            }
            None => {
                return Err(D::Error::custom(format!(
                    "an operator needs `op = \"name\"`: {v}"
                )))
            }
        };
        let parsed = if STAGE_OPS.contains(&name.as_str()) {
            OpSpec::deserialize(v)
        } else {
            Builtin::deserialize(v).map(OpSpec::Builtin)
        };
        parsed.map_err(|e| D::Error::custom(format!("operator {name:?}: {e}")))
    }
}

impl OpSpec {
    /// Appends this operator to `p`, checking its arguments.
    pub fn apply(&self, p: Pipeline) -> Result<Pipeline, Error> {
        Ok(match self {
            OpSpec::Shuffle { buffer } => p.shuffle(*buffer),
            OpSpec::Batch {
                size,
                drop_last,
                collate,
                pad_value,
            } => {
                let default = match collate.as_deref().unwrap_or("auto") {
                    "auto" => Collate::Auto,
                    "stack" => Collate::Stack,
                    "list" => Collate::List,
                    "pad" => Collate::Pad(pad_value.unwrap_or(0.0)),
                    other => {
                        return Err(Error::invalid(format!(
                            "unknown collate {other:?} (auto, stack, list, pad)"
                        )))
                    }
                };
                p.batch_with(
                    *size,
                    *drop_last,
                    CollatePolicy {
                        default,
                        fields: vec![],
                    },
                )
            }
            OpSpec::Pack(pack) => {
                pack.validate()?;
                p.pack(pack.clone())
            }
            OpSpec::Unbatch => p.unbatch(),
            OpSpec::Take { n } => p.take(*n),
            OpSpec::Skip { n } => p.skip(*n),
            OpSpec::Prefetch { n } => p.prefetch(*n),
            OpSpec::Cache {
                dir: None,
                size: None,
            } => p.cache(),
            OpSpec::Cache {
                dir: None,
                size: Some(_),
            } => {
                return Err(Error::invalid(
                    "cache: size limits a disk cache; give dir too (the memory cache is \
                     bounded by the memory budget)",
                ))
            }
            OpSpec::Cache {
                dir: Some(d),
                size: None,
            } => p.cache_on_disk(d),
            OpSpec::Cache {
                dir: Some(d),
                size: Some(z),
            } => {
                let b: ByteSize = z
                    .parse()
                    .map_err(|e| Error::invalid(format!("cache size {z:?}: {e}")))?;
                p.cache_on_disk_limited(d, b.bytes())
            }
            OpSpec::Builtin(b) => {
                b.validate()?;
                p.map(b.clone())
            }
        })
    }
}

/// Scalars of a `[store]` table (TOML strings, numbers and booleans).
pub mod toml_like {
    /// A string, number or boolean.
    #[derive(Debug, Clone, serde::Deserialize)]
    #[serde(untagged)]
    pub enum Scalar {
        /// A string.
        Str(String),
        /// An integer.
        Int(i64),
        /// A float.
        Float(f64),
        /// A boolean.
        Bool(bool),
    }

    impl std::fmt::Display for Scalar {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Scalar::Str(s) => f.write_str(s),
                Scalar::Int(i) => write!(f, "{i}"),
                Scalar::Float(x) => write!(f, "{x}"),
                Scalar::Bool(b) => write!(f, "{b}"),
            }
        }
    }
}

impl PipelineSpec {
    /// Builds the pipeline, on top of `store` options (from flags and the environment;
    /// the spec's `[store]` table wins).
    pub fn build(&self, mut store: StoreOptions) -> Result<Pipeline, Error> {
        for (k, v) in &self.store {
            store
                .set(k, &v.to_string())
                .map_err(|e| Error::invalid(format!("[store] {k}: {e}")))?;
        }
        let format = named_format(&self.format, &self.format_options)?;
        let mut p = Pipeline::from_url(&self.source, store, format)
            .shuffle_shards(self.shuffle_shards)
            .interleave(self.interleave)
            .seed(self.seed)
            .first_epoch(self.first_epoch)
            .epochs((self.epochs > 0).then_some(self.epochs));
        if let Some(g) = &self.glob {
            p = p.glob(g.clone());
        }
        if let Some(k) = &self.keys {
            if self.glob.is_some() {
                return Err(Error::invalid("give the source keys or a glob, not both"));
            }
            p = p.keys(k.clone());
        }
        if let Some(r) = &self.rank {
            p = p
                .split_mode(r.split)
                .shard_by_rank(r.rank, r.world, r.policy);
            if let Some(i) = &r.shard_index {
                p = p.shard_index(i.clone());
            }
        }
        p = self.apply_ops(p)?;
        let ro = self.options.run_options()?;
        Ok(p.options(ro))
    }

    /// Appends the spec's operators (only its `ops`) to `p`, checking their arguments.
    pub fn apply_ops(&self, mut p: Pipeline) -> Result<Pipeline, Error> {
        for op in &self.ops {
            p = op.apply(p)?;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::FieldOp;
    use crate::plan::FormatChoice;

    #[test]
    fn format_option_keys_are_the_fields() {
        // serde names the fields it expects when it meets an unknown one: exactly the list.
        let e = serde_json::from_value::<FormatOptions>(serde_json::json!({"nope": 1}))
            .unwrap_err()
            .to_string();
        let expected: Vec<&str> = e.split('`').skip(3).step_by(2).collect();
        let keys: Vec<&str> = FORMAT_OPTION_KEYS.iter().map(|(k, _)| *k).collect();
        assert_eq!(expected, keys, "{e}");
    }

    fn detected(keys: &[&str], fo: FormatOptions) -> Result<String, String> {
        match detect_format(keys.iter().copied(), &fo, "s3://b/d/") {
            Ok(FormatChoice::Files) => Ok("files".into()),
            Ok(FormatChoice::Fixed(f)) => Ok(f.name().into()),
            Ok(other) => Ok(format!("{other:?}")),
            Err(e) => Err(e.message),
        }
    }

    #[test]
    fn auto_reads_the_format_from_the_extensions_or_refuses_a_mix() {
        let none = FormatOptions::default;
        assert_eq!(detected(&["d/a.tar", "d/B.TAR"], none()).unwrap(), "tar");
        for (key, format) in [
            ("x.tfrecord", "tfrecord"),
            ("x.tfrecords", "tfrecord"),
            ("x.parquet", "parquet"),
            ("x.jsonl", "jsonl"),
            ("x.ndjson", "jsonl"),
            ("x.csv", "csv"),
        ] {
            assert_eq!(detected(&[key, key], none()).unwrap(), format, "{key}");
        }
        // No record format: every object is a sample (a .tar.gz is not read as tar).
        assert_eq!(
            detected(&["d/c1/a.jpg", "d/b.txt", "d/s.tar.gz"], none()).unwrap(),
            "files"
        );
        let e = detected(&["d/a.tar", "d/b.tar", "d/index.json"], none()).unwrap_err();
        assert!(
            e.contains("2 objects are tar (d/a.tar) and 1 are not (d/index.json)")
                && e.contains("glob"),
            "{e}"
        );
        let e = detected(&["d/a.tar", "d/b.parquet", "d/c.parquet"], none()).unwrap_err();
        assert!(
            e.contains("2 parquet (d/b.parquet), 1 tar (d/a.tar)"),
            "{e}"
        );
        // Options must be the chosen format's.
        let columns = || FormatOptions {
            columns: Some(vec!["a".into()]),
            ..Default::default()
        };
        assert_eq!(detected(&["d/a.parquet"], columns()).unwrap(), "parquet");
        let e = detected(&["d/a.tar"], columns()).unwrap_err();
        assert!(
            e.contains("columns is for the parquet format, not tar")
                && e.contains("auto\" chose tar"),
            "{e}"
        );
    }

    #[test]
    fn a_spec_with_every_kind_of_op_parses() {
        let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
            "source": "file:///tmp/x/",
            "format": "tfrecord",
            "format_options": {"parse_examples": false},
            "rank": {"rank": 1, "world": 4, "policy": "pad"},
            "ops": [
                {"op": "decode_utf8", "field": "txt"},
                {"op": "shuffle", "buffer": 10},
                {"op": "batch", "size": 4, "collate": "pad", "pad_value": -1.0},
                {"op": "take", "n": 3},
            ],
            "options": {"threads": 3, "errors": "skip", "memory_limit": "64MiB", "share_store": true},
            "store": {"part_size": "1MiB"}
        }))
        .unwrap();
        assert_eq!(spec.ops.len(), 4);
        let ro = spec.options.run_options().unwrap();
        assert!(ro.share_store && ro.threads == 3);
        assert!(matches!(
            spec.ops[0],
            OpSpec::Builtin(Builtin::Fields(FieldOp::DecodeUtf8 { .. }))
        ));
        let p = spec.build(StoreOptions::default()).unwrap();
        assert!(p.explain().contains("take(3)"));
    }

    #[test]
    fn unknown_things_are_named() {
        let e = serde_json::from_value::<PipelineSpec>(serde_json::json!({
            "source": "x", "format": "tar", "ops": [{"op": "decode_png", "field": "x"}]
        }))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("operator \"decode_png\": unknown variant `decode_png`"),
            "{e}"
        );
        // A wrong or missing parameter is reported for its operator, stage or per-sample.
        let op_err = |op: serde_json::Value| {
            serde_json::from_value::<OpSpec>(op)
                .unwrap_err()
                .to_string()
        };
        let e = op_err(serde_json::json!({"op": "to_tensor", "field": "x", "shap": [2]}));
        assert!(
            e.starts_with("operator \"to_tensor\": unknown field `shap`, expected one of"),
            "{e}"
        );
        let e = op_err(serde_json::json!({"op": "resize", "field": "x"}));
        assert_eq!(e, "operator \"resize\": missing field `size`");
        let e = op_err(serde_json::json!({"op": "batch", "sise": 4}));
        assert!(e.starts_with("operator \"batch\": "), "{e}");
        assert!(
            e.contains("sise") || e.contains("missing field `size`"),
            "{e}"
        );
        let e = op_err(serde_json::json!({"op": 3}));
        assert!(e.contains("not 3"), "{e}");
        let e = op_err(serde_json::json!({"field": "x"}));
        assert!(e.contains("needs `op"), "{e}");
        // And a TOML spec says where.
        let e = toml::from_str::<PipelineSpec>(
            "source = \"x\"\nformat = \"files\"\n[[ops]]\nop = \"resize\"\nfield = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("missing field `size`"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
            "source": "x", "format": "csv", "format_options": {"columns": ["a"]}
        }))
        .unwrap();
        let e = spec.build(StoreOptions::default()).unwrap_err().to_string();
        assert!(
            e.contains("format option columns is for the parquet format, not csv"),
            "{e}"
        );
        let spec: PipelineSpec =
            serde_json::from_value(serde_json::json!({"source": "x", "format": "avro"})).unwrap();
        let e = spec.build(StoreOptions::default()).unwrap_err().to_string();
        assert!(e.contains("avro"), "{e}");
    }
}
