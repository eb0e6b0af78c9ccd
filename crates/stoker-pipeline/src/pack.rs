//! The `pack` stage: tokenized documents in, fixed-length blocks out (sequence packing for
//! LLM pretraining), with the bookkeeping a model needs to keep documents apart.
//!
//! The kernel is [`stoker_ops::text::Packer`]; this module makes it a stage of the
//! executor's sequential tail, because it is many-to-many and keeps state from one sample
//! to the next. What the stage adds to the kernel:
//!
//! - **Samples out.** Each block becomes a sample (see [`Pack`] for its fields), numbered
//!   in the epoch: its position is `(BLOCK_SHARD, block number)`, which is what random
//!   operators after the stage draw from and what a batch of blocks records.
//! - **Epochs.** A block never spans an epoch boundary: at the end of an epoch the partial
//!   block is padded or dropped ([`PackRemainder`]), and the next epoch starts a new stream
//!   (document indices and block numbers restart at 0).
//! - **Exact resume, as positions.** A checkpoint holds no token ids. The stage keeps a
//!   log of the documents it was given since the start of the first block it has not yet
//!   handed to the next stage: the one being filled, and, when one document completes
//!   several blocks, those of them not yet handed on. A checkpoint is taken when an item
//!   reaches the consumer, and at that moment no later stage holds a block (the only one
//!   that could, a batch, has just emptied itself; a shuffle after `pack` makes `state()`
//!   refuse). So the checkpoint is the number of blocks handed on, the log's positions,
//!   how many tokens of the first logged document were in those blocks, and that
//!   document's index. On resume the documents are read again (as the shuffle buffer's
//!   are), their first tokens skipped, and pushed through the stage again: the blocks they
//!   complete go down the tail as they did the first time, and the rest is pending again.
//!   The log is pruned after every document, so it holds the documents of one block (plus
//!   the rest of a long document).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use stoker_core::{DType, Error, Sample, Tensor, Value};
use stoker_ops::text::{ids_of, Block, Packer, PackerParams, PackerState, Remainder};

use crate::state::Pos;
use crate::state::StageState;

/// The shard number in a block's position: blocks are no shard's records; the position's
/// `record` is the block's number in the epoch.
pub(crate) const BLOCK_SHARD: u32 = u32::MAX;

/// What happens to the last, partly filled block of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackRemainder {
    /// Padded to `block_size` with `pad_id` (attention mask 0, position 0, segment -1).
    #[default]
    Pad,
    /// Dropped: every block is full of real tokens.
    Drop,
}

/// The `pack` operator: concatenates the token ids in `field` of consecutive samples, each
/// followed by `separator` when there is one, and cuts them into blocks of `block_size`.
///
/// A document longer than the room left in a block is split: its tokens continue at the
/// start of the next block (and the one after, as long as it needs), where positions
/// restart at 0. Every sample out has:
///
/// | field | dtype, shape | what |
/// |---|---|---|
/// | `field` (default `input_ids`) | `dtype`, `[block_size]` | the ids, then `pad_id` padding in a padded last block |
/// | `position_ids` | `dtype`, `[block_size]` | position within the segment (0 for padding) |
/// | `segment_ids` | `dtype`, `[block_size]` | segment within the block, 0, 1, ...; -1 for padding |
/// | `attention_mask` | `dtype`, `[block_size]` | 1 real token, 0 padding |
/// | `cu_seqlens` | int32, `[segments + 1]` | segment starts, then the number of real tokens (flash-attention varlen) |
/// | `doc_index` | int64, `[segments]` | each segment's document: its index in the epoch's stream of documents (0 = the first that reached `pack`) |
/// | `doc_origin` | int64, `[segments, 2]` | each segment's document's position: shard (object) index and record index |
/// | `doc_keys` (with `keys`) | list | each segment's document's `__key__` (null when it has none) |
///
/// A segment is the part of one document (with its separator) inside one block. The other
/// fields of the input samples are not carried over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Pack {
    /// The field holding each document's ids (a 1-d integer tensor, as `tokenize` makes it
    /// without `pad_to`, or a list of ints); the block's ids go to the same field.
    #[serde(default = "input_ids")]
    pub field: String,
    /// Tokens per block.
    pub block_size: usize,
    /// An id appended after every document (its EOS), or none.
    #[serde(default)]
    pub separator: Option<u32>,
    /// The last partial block of an epoch: `pad` (default) or `drop`.
    #[serde(default)]
    pub remainder: PackRemainder,
    /// The padding id (default 0).
    #[serde(default)]
    pub pad_id: u32,
    /// `int64` (default) or `int32`, for the four per-token fields.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Also output `doc_keys`.
    #[serde(default)]
    pub keys: bool,
}

fn input_ids() -> String {
    "input_ids".into()
}

impl Pack {
    /// Blocks of `block_size` tokens from `input_ids`, no separator, the remainder padded
    /// with 0, int64 outputs.
    pub fn new(block_size: usize) -> Pack {
        Pack {
            field: input_ids(),
            block_size,
            separator: None,
            remainder: PackRemainder::Pad,
            pad_id: 0,
            dtype: None,
            keys: false,
        }
    }
    /// Sets the ids field.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }
    /// Sets the separator.
    pub fn separator(mut self, id: Option<u32>) -> Self {
        self.separator = id;
        self
    }
    /// Sets the remainder policy.
    pub fn remainder(mut self, r: PackRemainder) -> Self {
        self.remainder = r;
        self
    }
    /// Sets the padding id.
    pub fn pad_id(mut self, id: u32) -> Self {
        self.pad_id = id;
        self
    }
    /// Sets the output dtype (`int64` or `int32`).
    pub fn dtype(mut self, dtype: impl Into<String>) -> Self {
        self.dtype = Some(dtype.into());
        self
    }
    /// Outputs `doc_keys` too.
    pub fn keys(mut self, on: bool) -> Self {
        self.keys = on;
        self
    }

    /// Its name in plans, statistics and errors.
    pub fn name(&self) -> String {
        format!("pack({}, {})", self.field, self.block_size)
    }

    /// Checks the arguments.
    pub fn validate(&self) -> Result<(), Error> {
        if self.block_size == 0 || i32::try_from(self.block_size).is_err() {
            return Err(Error::invalid(format!(
                "pack: block_size must be between 1 and {}, not {}",
                i32::MAX,
                self.block_size
            )));
        }
        self.out_dtype()?;
        Ok(())
    }

    fn out_dtype(&self) -> Result<DType, Error> {
        match self.dtype.as_deref().unwrap_or("int64") {
            "int64" => Ok(DType::I64),
            "int32" => Ok(DType::I32),
            other => Err(Error::invalid(format!(
                "pack: dtype must be int64 or int32, not {other:?}"
            ))),
        }
    }

    fn params(&self) -> PackerParams {
        PackerParams::new(self.block_size)
            .separator(self.separator)
            .remainder(match self.remainder {
                PackRemainder::Pad => Remainder::Pad(self.pad_id),
                PackRemainder::Drop => Remainder::Drop,
            })
    }
}

/// `n` values (`values`, then `fill`) as a 1-d tensor of `dtype` (int64 or int32).
fn per_token(dtype: DType, n: usize, values: impl Iterator<Item = i64>) -> Result<Tensor, Error> {
    let mut out = Vec::with_capacity(n * dtype.size());
    match dtype {
        DType::I32 => values.for_each(|v| out.extend_from_slice(&(v as i32).to_le_bytes())),
        _ => values.for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
    }
    Tensor::new(dtype, vec![n], Bytes::from(out))
}

/// `values`, then `fill` up to `n` items.
fn pad(values: impl Iterator<Item = i64>, n: usize, fill: i64) -> impl Iterator<Item = i64> {
    values.chain(std::iter::repeat(fill)).take(n)
}

/// A document the stage was given, kept while a block not yet received may hold its tokens.
#[derive(Debug)]
struct Doc {
    pos: Pos,
    /// Its first token's offset in the epoch's stream.
    start: u64,
    /// Its tokens, separator included.
    len: u64,
    /// Its document index.
    index: u64,
    key: Option<Value>,
}

/// The stage's running state in one epoch.
#[derive(Debug)]
pub(crate) struct PackStage {
    pub spec: Arc<Pack>,
    dtype: DType,
    packer: Packer,
    /// Blocks made this epoch (the next block's number).
    made: u64,
    /// Blocks handed to the next stage this epoch.
    sent: u64,
    /// Tokens pushed this epoch (separators included).
    tokens: u64,
    /// Tokens of the next document already in earlier blocks (first document of a resume).
    skip_next: u64,
    log: VecDeque<Doc>,
}

impl PackStage {
    /// A stage at the start of an epoch.
    pub fn new(spec: Arc<Pack>) -> Result<PackStage, Error> {
        let dtype = spec.out_dtype()?;
        let packer = Packer::new(spec.params())?;
        Ok(PackStage {
            spec,
            dtype,
            packer,
            made: 0,
            sent: 0,
            tokens: 0,
            skip_next: 0,
            log: VecDeque::new(),
        })
    }

    /// A stage about to replay the documents of a checkpoint (see the module docs): its
    /// packer is empty, at the first replayed document's index.
    pub fn restore(spec: Arc<Pack>, state: &StageState) -> Result<PackStage, Error> {
        let StageState::Pack {
            blocks,
            docs,
            skip,
            next_doc,
        } = state
        else {
            return Err(Error::invalid(
                "this state was not taken from a run of this pipeline (no pack state where \
                 the pipeline packs)",
            ));
        };
        if docs.is_empty() && *skip != 0 {
            return Err(Error::invalid(
                "pack: inconsistent state: a skip without documents",
            ));
        }
        let mut st = PackStage::new(spec)?;
        let l = st.spec.block_size as u64;
        st.packer = Packer::from_state(
            st.spec.params(),
            PackerState {
                next_doc: *next_doc,
                ..PackerState::default()
            },
        )?;
        st.made = *blocks;
        st.sent = *blocks;
        st.tokens = blocks
            .checked_mul(l)
            .and_then(|t| t.checked_sub(*skip))
            .ok_or_else(|| Error::invalid("pack: inconsistent state: bad block count or skip"))?;
        st.skip_next = *skip;
        Ok(st)
    }

    /// Takes in one document; returns the blocks it completed, as `(position, sample)`.
    /// A refused document leaves the stage as it was.
    pub fn push(&mut self, pos: Pos, sample: &Sample) -> Result<Vec<(Pos, Sample)>, Error> {
        let field = &self.spec.field;
        let value = sample.get(field).ok_or_else(|| {
            Error::operator(format!(
                "pack: no field {field:?} (fields: {})",
                sample.names().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let ids = ids_of(value)
            .map_err(|e| Error::operator(format!("{} (field {field:?})", e.message)))?;
        let len = ids.len() as u64 + u64::from(self.spec.separator.is_some());
        let skip = self.skip_next;
        if skip > 0 && skip >= len {
            return Err(Error::invalid(format!(
                "pack: the checkpoint does not fit this document: it skips {skip} of its {len} \
                 tokens"
            )));
        }
        // With a skip, the tokens before it are in blocks made before the checkpoint (and
        // `tokens` was set to this document's start).
        self.skip_next = 0;
        let index = self.packer.state().next_doc;
        self.log.push_back(Doc {
            pos,
            start: self.tokens,
            len,
            index,
            key: self
                .spec
                .keys
                .then(|| sample.get("__key__").cloned().unwrap_or(Value::Null)),
        });
        self.tokens += len;
        let from = (skip as usize).min(ids.len());
        let blocks = self.packer.push(&ids[from..]);
        blocks.iter().map(|b| self.block(b)).collect()
    }

    /// Ends the epoch: the partial block, padded, or `None`.
    pub fn finish(&mut self) -> Result<Option<(Pos, Sample)>, Error> {
        match self.packer.finish()? {
            Some(b) => self.block(&b).map(Some),
            None => Ok(None),
        }
    }

    /// Whether tokens wait for the next block.
    pub fn has_pending(&self) -> bool {
        !self.packer.pending().is_empty()
    }

    /// Block `block` goes to the next stage.
    pub fn note_sent(&mut self, block: u64) {
        self.sent = block + 1;
    }

    /// Forgets the documents no checkpoint can need any more: those wholly in blocks
    /// handed on.
    pub fn prune(&mut self) {
        let at = self.sent * self.spec.block_size as u64;
        while self.log.front().is_some_and(|d| d.start + d.len <= at) {
            self.log.pop_front();
        }
    }

    /// The checkpoint of this stage, for a moment when the later stages hold none of its
    /// blocks (see the module docs).
    pub fn checkpoint(&self) -> Result<StageState, Error> {
        let at = self.sent * self.spec.block_size as u64;
        let k = self.log.partition_point(|d| d.start + d.len <= at);
        let (docs, skip, next_doc) = match self.log.get(k) {
            None => (Vec::new(), 0, self.packer.state().next_doc),
            Some(d) if d.start <= at => (
                self.log.range(k..).map(|d| d.pos).collect(),
                at - d.start,
                d.index,
            ),
            Some(_) => return Err(Error::invalid("pack: the replay log lost this position")),
        };
        Ok(StageState::Pack {
            blocks: self.sent,
            docs,
            skip,
            next_doc,
        })
    }

    /// A block as a sample, numbered.
    fn block(&mut self, b: &Block) -> Result<(Pos, Sample), Error> {
        let n = self.spec.block_size;
        let number = self.made;
        self.made += 1;
        let segments = b.doc_index.len();
        let mut s = Sample::with_capacity(8);
        let dtype = self.dtype;
        let real = b.real_len();
        s.insert(
            self.spec.field.as_str(),
            per_token(dtype, n, b.input_ids.iter().map(|&x| i64::from(x)))?,
        );
        let positions = b
            .cu_seqlens
            .windows(2)
            .flat_map(|w| 0..i64::from(w[1] - w[0]));
        s.insert("position_ids", per_token(dtype, n, pad(positions, n, 0))?);
        let segment_ids = (0..segments).flat_map(|k| {
            let w = &b.cu_seqlens[k..k + 2];
            std::iter::repeat_n(k as i64, (w[1] - w[0]) as usize)
        });
        s.insert("segment_ids", per_token(dtype, n, pad(segment_ids, n, -1))?);
        let mask = std::iter::repeat_n(1, real);
        s.insert("attention_mask", per_token(dtype, n, pad(mask, n, 0))?);
        let cu: Vec<i32> = b.cu_seqlens.iter().map(|&x| x as i32).collect();
        s.insert("cu_seqlens", Tensor::from_slice(vec![cu.len()], &cu)?);
        let index: Vec<i64> = b.doc_index.iter().map(|&d| d as i64).collect();
        s.insert("doc_index", Tensor::from_slice(vec![segments], &index)?);
        let mut origin = Vec::with_capacity(2 * segments);
        let mut keys = Vec::new();
        for &d in &b.doc_index {
            let k = self.log.partition_point(|x| x.index < d);
            let doc =
                self.log.get(k).filter(|x| x.index == d).ok_or_else(|| {
                    Error::invalid(format!("pack: document {d} is not in the log"))
                })?;
            origin.push(i64::from(doc.pos.shard));
            origin.push(doc.pos.record as i64);
            if let Some(key) = &doc.key {
                keys.push(key.clone());
            }
        }
        s.insert(
            "doc_origin",
            Tensor::from_slice(vec![segments, 2], &origin)?,
        );
        if self.spec.keys {
            s.insert("doc_keys", Value::List(keys));
        }
        Ok((
            Pos {
                shard: BLOCK_SHARD,
                record: number,
            },
            s,
        ))
    }
}
