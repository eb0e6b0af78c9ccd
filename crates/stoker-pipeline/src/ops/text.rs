//! The text operator of [`Builtin`](super::Builtin): tokenization with a Hugging Face
//! `tokenizer.json`, from `stoker_ops::text`. It works per sample (before `batch`, on the
//! workers: 1-D tensors) and on a whole batch's text column at once (after `batch`: `[N,
//! L]` tensors).
//!
//! The tokenizer is read from its file once per distinct operator and shared by every
//! thread and run of the process (`cached` in `ops.rs`). Its parameters start from the
//! kernel's own defaults (`TokenizeParams::default`) and take only what the spec gives.

use std::sync::{Arc, OnceLock};

use stoker_core::{Batch, DType, Error, OpMeta, Sample, Value};
use stoker_ops::text::{PadSide, Tokenize, TokenizeParams};

use super::{cached, Shared};

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
}

impl TextOp {
    /// The operators' names in a spec (their `op`), in the order of the variants.
    pub const NAMES: &'static [&'static str] = &["tokenize"];

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            TextOp::Tokenize { field, .. } => format!("tokenize({field})"),
        }
    }

    /// The operator's declaration for the optimizer.
    pub(crate) fn meta(&self) -> OpMeta {
        let m = OpMeta::new(self.name());
        match self {
            TextOp::Tokenize { .. } => m.with_cost_ns(300_000.0),
        }
    }

    /// Checks the operator's arguments by building its kernel.
    pub fn validate(&self) -> Result<(), Error> {
        tokenizer(self).map(drop)
    }

    /// Applies the operator to one sample.
    pub(crate) fn apply(&self, mut s: Sample) -> Result<Sample, Error> {
        tokenizer(self)?.apply(&mut s)?;
        Ok(s)
    }

    /// Applies the operator to a batch, column-wise.
    pub(crate) fn apply_batch(&self, mut batch: Batch) -> Result<Batch, Error> {
        let TextOp::Tokenize { field, .. } = self;
        let t = tokenizer(self)?;
        let col = batch
            .get(field)
            .ok_or_else(|| Error::operator(format!("tokenize: no field {field:?}")))?;
        let out = t.encode_column(col)?;
        let p = t.params();
        batch.insert(p.ids_field.as_str(), Value::Tensor(out.input_ids))?;
        batch.insert(p.mask_field.as_str(), Value::Tensor(out.attention_mask))?;
        Ok(batch)
    }
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
    } = b;
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
