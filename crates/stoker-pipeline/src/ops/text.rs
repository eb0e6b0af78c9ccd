//! The text operators of [`Builtin`](super::Builtin), from `stoker_ops::text`:
//! tokenization with a Hugging Face `tokenizer.json`, and a frozen embedding table's lookup
//! (`.npy` rows by token id). Both work per sample (before `batch`, on the workers: 1-D
//! tensors) and on a whole batch's column at once (after `batch`: `[N, L]` tensors). Placed
//! last before a `batch`, the lookup writes its rows straight into the batch's buffer (the
//! executor's batch slots), so it is also the batch's collation.
//!
//! The tokenizer and the table are opened once per distinct operator and shared by every
//! thread and run of the process (`cached` in `ops.rs`; the table is memory-mapped, so
//! processes share its pages). The tokenizer's parameters start from the kernel's own
//! defaults (`TokenizeParams::default`) and take only what the spec gives.

use std::sync::{Arc, OnceLock};

use stoker_core::{Batch, DType, Error, OpMeta, Sample, Value};
use stoker_ops::text::{Embedding, PadSide, Tokenize, TokenizeParams};

use super::{cached, OpContext, Shared};

/// `tokenize`'s `add_special_tokens` when the spec gives none: the kernel's.
fn add_special_tokens() -> bool {
    TokenizeParams::default().add_special_tokens
}

/// The text operators a spec can name, with their arguments (one modality of
/// [`Builtin`](super::Builtin)).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum TextOp {
    /// Tokenizes the text in `field` with a Hugging Face `tokenizer.json` into
    /// `input_ids` and `attention_mask` (the same ids as the Python `tokenizers` package).
    /// Per sample: 1-D tensors (of `pad_to` length when set). After a `batch`: the text
    /// column becomes `[N, L]` tensors, padded to `pad_to` or to the longest row.
    Tokenize {
        /// The text field (text, or bytes holding UTF-8).
        field: String,
        /// Path of the `tokenizer.json`.
        tokenizer: String,
        /// Truncate to this many tokens (special tokens included).
        #[serde(default)]
        max_length: Option<usize>,
        /// Pad to this many tokens.
        #[serde(default)]
        pad_to: Option<usize>,
        /// The padding id (default 0).
        #[serde(default)]
        pad_id: u32,
        /// `right` (default) or `left`.
        #[serde(default)]
        pad_side: Option<String>,
        /// The tokenizer's own special tokens ([CLS]/[SEP], ...) (default true).
        #[serde(default = "add_special_tokens")]
        add_special_tokens: bool,
        /// An id put first.
        #[serde(default)]
        bos_id: Option<u32>,
        /// An id put last.
        #[serde(default)]
        eos_id: Option<u32>,
        /// Output field of the ids (default `input_ids`).
        #[serde(default)]
        ids_field: Option<String>,
        /// Output field of the mask (default `attention_mask`).
        #[serde(default)]
        mask_field: Option<String>,
        /// `int64` (default) or `int32`.
        #[serde(default)]
        dtype: Option<String>,
    },
    /// Looks up each token id of `field` (an `int32`/`int64` tensor, `[L]` per sample or
    /// `[N, L]` after a batch) in a frozen embedding table, a 2-D `float32` or `float16`
    /// `.npy` file (`numpy.save`), memory-mapped: `[L, dim]` (`[N, L, dim]`) rows of the
    /// table's type. An id outside the table is an error naming it.
    Embedding {
        /// The ids field.
        field: String,
        /// Path of the `.npy` table (`[rows, dim]`).
        table: String,
        /// Output field (default: `field`, replaced).
        #[serde(default)]
        to: Option<String>,
    },
}

impl TextOp {
    /// The operators' names in a spec (their `op`), in the order of the variants.
    pub const NAMES: &'static [&'static str] = &["tokenize", "embedding"];

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            TextOp::Tokenize { field, .. } => format!("tokenize({field})"),
            TextOp::Embedding { field, .. } => format!("embedding({field})"),
        }
    }

    /// The operator's declaration for the optimizer.
    pub(crate) fn meta(&self) -> OpMeta {
        let m = OpMeta::new(self.name());
        match self {
            TextOp::Tokenize { .. } => m.with_cost_ns(300_000.0),
            // A row copied per id; ids of 8 bytes become rows of `dim` elements (known once
            // the table's header is read).
            TextOp::Embedding { .. } => {
                let m = m.with_cost_ns(20_000.0);
                match embedding(self) {
                    Ok(e) => m.with_size_ratio((e.dim() * e.dtype().size()) as f64 / 8.0),
                    Err(_) => m,
                }
            }
        }
    }

    /// Checks the operator's arguments by building its kernel.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            TextOp::Tokenize { .. } => tokenizer(self).map(drop),
            TextOp::Embedding { .. } => embedding(self).map(drop),
        }
    }

    /// Applies the operator to one sample.
    pub(crate) fn apply(&self, mut s: Sample, ctx: &mut OpContext) -> Result<Sample, Error> {
        match self {
            TextOp::Tokenize { .. } => tokenizer(self)?.apply(&mut s)?,
            TextOp::Embedding { field, to, .. } => {
                let e = embedding(self)?;
                let ids = match s.get(field) {
                    Some(Value::Tensor(t)) => t,
                    Some(v) => {
                        return Err(Error::operator(format!(
                            "embedding: field {field:?} is a {}, expected a tensor of ids",
                            v.kind()
                        )))
                    }
                    None => return Err(Error::operator(format!("embedding: no field {field:?}"))),
                };
                // Written into the batch's buffer when the executor has a slot for it;
                // else a tensor of its own, charged first.
                let len = e.output_len(ids.numel());
                let mut slot = ctx.output_slot(len);
                if slot.as_ref().is_none_or(|l| l.len() != len) {
                    ctx.reserve(len as u64)?;
                }
                let out = e.lookup_into(ids, &mut |_| slot.take())?;
                s.insert(to.as_deref().unwrap_or(field), Value::Tensor(out));
            }
        }
        Ok(s)
    }

    /// Applies the operator to a batch, column-wise.
    pub(crate) fn apply_batch(&self, mut batch: Batch) -> Result<Batch, Error> {
        match self {
            TextOp::Tokenize { field, .. } => {
                let t = tokenizer(self)?;
                let col = batch
                    .get(field)
                    .ok_or_else(|| Error::operator(format!("tokenize: no field {field:?}")))?;
                let out = t.encode_column(col)?;
                let p = t.params();
                batch.insert(p.ids_field.as_str(), Value::Tensor(out.input_ids))?;
                batch.insert(p.mask_field.as_str(), Value::Tensor(out.attention_mask))?;
            }
            TextOp::Embedding { field, to, .. } => {
                let e = embedding(self)?;
                let out = match batch.get(field) {
                    Some(Value::Tensor(ids)) => Value::Tensor(e.lookup(ids)?),
                    // Rows of different lengths (a list): each looked up alone, as the batch
                    // would have listed their rows.
                    Some(Value::List(rows)) => Value::List(
                        rows.iter()
                            .map(|v| match v {
                                Value::Tensor(ids) => e.lookup(ids).map(Value::Tensor),
                                v => Err(Error::operator(format!(
                                    "embedding: a row of {field:?} is a {}, expected ids",
                                    v.kind()
                                ))),
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                    Some(v) => {
                        return Err(Error::operator(format!(
                            "embedding: column {field:?} is a {}, expected ids",
                            v.kind()
                        )))
                    }
                    None => return Err(Error::operator(format!("embedding: no field {field:?}"))),
                };
                batch.insert(to.as_deref().unwrap_or(field), out)?;
            }
        }
        Ok(batch)
    }
}

impl TextOp {
    /// What `explain` says of a `tokenize` with a limit: whether it encodes only the prefix
    /// of a long text that the kept tokens need (see `stoker_ops::text`), and why not.
    pub(crate) fn prefix_note(&self) -> Option<String> {
        let TextOp::Tokenize {
            max_length, pad_to, ..
        } = self
        else {
            return None;
        };
        max_length.or(*pad_to)?;
        let t = tokenizer(self).ok()?;
        Some(if t.encodes_prefix() {
            format!(
                "{} encodes only as much of a long text as the tokens it keeps need (cut \
                 before a space, extended when short; exact for this tokenizer file)",
                self.name()
            )
        } else {
            format!(
                "{} encodes whole texts: a prefix cut is not known to be exact for its \
                 tokenizer file (its normalizer, pre-tokenizer, model or added tokens)",
                self.name()
            )
        })
    }
}

fn embedding(b: &TextOp) -> Result<Arc<Embedding>, Error> {
    static CACHE: Shared<Embedding> = OnceLock::new();
    let TextOp::Embedding { table, .. } = b else {
        unreachable!("an embedding")
    };
    cached(&CACHE, b, || Embedding::from_npy(table))
}

fn tokenizer(b: &TextOp) -> Result<Arc<Tokenize>, Error> {
    static CACHE: Shared<Tokenize> = OnceLock::new();
    let TextOp::Tokenize {
        field,
        tokenizer,
        max_length,
        pad_to,
        pad_id,
        pad_side,
        add_special_tokens,
        bos_id,
        eos_id,
        ids_field,
        mask_field,
        dtype,
    } = b
    else {
        unreachable!("a tokenize")
    };
    cached(&CACHE, b, || {
        let mut params = TokenizeParams::new()
            .field(field.clone())
            .max_length(*max_length)
            .pad_to(*pad_to)
            .pad_id(*pad_id)
            .add_special_tokens(*add_special_tokens)
            .bos_id(*bos_id)
            .eos_id(*eos_id);
        if let Some(s) = pad_side {
            params = params.pad_side(match s.as_str() {
                "right" => PadSide::Right,
                "left" => PadSide::Left,
                s => {
                    return Err(Error::invalid(format!(
                        "tokenize: pad_side {s:?} is not left or right"
                    )))
                }
            });
        }
        if let Some(d) = dtype {
            params = params.dtype(match d.as_str() {
                "int64" => DType::I64,
                "int32" => DType::I32,
                d => {
                    return Err(Error::invalid(format!(
                        "tokenize: dtype {d:?} is not int64 or int32"
                    )))
                }
            });
        }
        if let Some(f) = ids_field {
            params.ids_field = f.clone();
        }
        if let Some(f) = mask_field {
            params.mask_field = f.clone();
        }
        Tokenize::from_file(tokenizer, params)
    })
}
