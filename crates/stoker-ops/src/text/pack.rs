//! [`Packer`]: documents' token ids concatenated and cut into fixed-length blocks.
//!
//! The layout of a block, for `block_size` 8, separator `0`, documents `a b c`, `d e f g h`:
//!
//! ```text
//! input_ids     a b c 0 d e f g | h 0 ...
//! position_ids  0 1 2 3 0 1 2 3 | 0 1 ...
//! cu_seqlens    [0, 4, 8]       | [0, 2, ...]
//! doc_index     [0, 1]          | [1, ...]
//! ```
//!
//! A segment is the part of one document (with its separator) inside one block. Positions
//! restart at 0 at every segment: at each document boundary, and at the start of each
//! block, so a long document continued in the next block starts there at 0 again and
//! positions stay below `block_size` (models with learned position embeddings of size
//! `block_size` never see a larger one). `cu_seqlens` is the flash-attention "varlen"
//! convention: segment starts plus the end of the real tokens, for a block-diagonal
//! attention mask; `doc_index` says which pushed document (counting from 0) each segment
//! belongs to.

use serde::{Deserialize, Serialize};
use stoker_core::{DType, Error, Tensor, Value};

/// What [`Packer::finish`] does with a last, partly filled block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Remainder {
    /// Drop it (every block is full of real tokens).
    Drop,
    /// Pad it to `block_size` with this id; padding has attention mask 0, position 0,
    /// segment id -1, and is not part of any segment in `cu_seqlens`.
    Pad(u32),
}

/// Parameters of a [`Packer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PackerParams {
    /// Tokens per block (at least 1).
    pub block_size: usize,
    /// An id appended after every document (its EOS), or none.
    pub separator: Option<u32>,
    /// What to do with the last partial block. Default `Pad(0)`.
    pub remainder: Remainder,
}

impl PackerParams {
    /// Blocks of `block_size`, no separator, the remainder padded with 0.
    pub fn new(block_size: usize) -> PackerParams {
        PackerParams {
            block_size,
            separator: None,
            remainder: Remainder::Pad(0),
        }
    }
    /// Sets the separator.
    pub fn separator(mut self, id: Option<u32>) -> Self {
        self.separator = id;
        self
    }
    /// Sets the remainder policy.
    pub fn remainder(mut self, r: Remainder) -> Self {
        self.remainder = r;
        self
    }
}

/// One packed block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// `block_size` ids (real tokens, then padding if this is a padded last block).
    pub input_ids: Vec<u32>,
    /// Segment starts, then the number of real tokens: `[0, s1, s2, ..., real_len]`.
    pub cu_seqlens: Vec<u32>,
    /// For each segment, the index of its document (0 = the first pushed).
    pub doc_index: Vec<u64>,
}

impl Block {
    /// Tokens that are not padding.
    pub fn real_len(&self) -> usize {
        self.cu_seqlens.last().map_or(0, |&e| e as usize)
    }

    /// Position of each token within its segment (0 for padding).
    pub fn position_ids(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.input_ids.len());
        for w in self.cu_seqlens.windows(2) {
            out.extend(0..w[1] - w[0]);
        }
        out.resize(self.input_ids.len(), 0);
        out
    }

    /// Segment of each token within the block (0, 1, ...; -1 for padding).
    pub fn segment_ids(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.input_ids.len());
        for (s, w) in self.cu_seqlens.windows(2).enumerate() {
            out.extend(std::iter::repeat_n(s as i64, (w[1] - w[0]) as usize));
        }
        out.resize(self.input_ids.len(), -1);
        out
    }

    /// 1 for real tokens, 0 for padding.
    pub fn attention_mask(&self) -> Vec<u8> {
        let mut out = vec![1u8; self.real_len()];
        out.resize(self.input_ids.len(), 0);
        out
    }

    /// The block as tensors (see [`BlockTensors`]).
    pub fn to_tensors(&self) -> Result<BlockTensors, Error> {
        let n = self.input_ids.len();
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        let mask: Vec<i64> = self.attention_mask().into_iter().map(i64::from).collect();
        let cu: Vec<i32> = self
            .cu_seqlens
            .iter()
            .map(|&x| {
                i32::try_from(x)
                    .map_err(|_| Error::operator("pack: block too large for int32 cu_seqlens"))
            })
            .collect::<Result<_, _>>()?;
        Ok(BlockTensors {
            input_ids: Tensor::from_slice(vec![n], &widen(&self.input_ids))?,
            position_ids: Tensor::from_slice(vec![n], &widen(&self.position_ids()))?,
            segment_ids: Tensor::from_slice(vec![n], &self.segment_ids())?,
            attention_mask: Tensor::from_slice(vec![n], &mask)?,
            cu_seqlens: Tensor::from_slice(vec![cu.len()], &cu)?,
        })
    }
}

/// A [`Block`] as tensors. The first four have shape `[block_size]` and stack into
/// `[N, block_size]`; `cu_seqlens` varies in length from block to block (collate it as a
/// list, or rebuild a batch-level one from `segment_ids`).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockTensors {
    /// int64 `[block_size]`.
    pub input_ids: Tensor,
    /// int64 `[block_size]`, restarting at 0 at every segment.
    pub position_ids: Tensor,
    /// int64 `[block_size]`, the segment of each token, -1 for padding.
    pub segment_ids: Tensor,
    /// int64 `[block_size]`, 1 real, 0 padding.
    pub attention_mask: Tensor,
    /// int32 `[segments + 1]`.
    pub cu_seqlens: Tensor,
}

/// Everything a [`Packer`] holds between calls: the partial block being filled. Serialise
/// it into a checkpoint; [`Packer::from_state`] resumes exactly.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PackerState {
    /// Ids of the partial block (fewer than `block_size`).
    pub pending: Vec<u32>,
    /// Segment starts within `pending` (no end entry; empty when `pending` is).
    pub starts: Vec<u32>,
    /// Document of each pending segment.
    pub doc_index: Vec<u64>,
    /// Index the next pushed document gets.
    pub next_doc: u64,
}

/// Concatenates documents' ids (each followed by the separator) and cuts them into blocks.
///
/// Every id pushed lands in exactly one block, in order; a block is emitted as soon as it
/// is full. Not thread-safe by design: one packer per stream, driven in order.
#[derive(Debug, Clone)]
pub struct Packer {
    params: PackerParams,
    state: PackerState,
}

impl Packer {
    /// A packer with nothing pending.
    pub fn new(params: PackerParams) -> Result<Packer, Error> {
        Packer::from_state(params, PackerState::default())
    }

    /// A packer resuming from a saved state (checked against `params`).
    pub fn from_state(params: PackerParams, state: PackerState) -> Result<Packer, Error> {
        if params.block_size == 0 {
            return Err(Error::invalid("pack: block_size must be at least 1"));
        }
        if u32::try_from(params.block_size).is_err() {
            return Err(Error::invalid(format!(
                "pack: block_size {} is too large",
                params.block_size
            )));
        }
        let bad = |why: &str| Err(Error::invalid(format!("pack: inconsistent state: {why}")));
        let s = &state;
        if s.pending.len() >= params.block_size {
            return bad("pending holds a full block");
        }
        if s.starts.len() != s.doc_index.len() {
            return bad("starts and doc_index differ in length");
        }
        if s.pending.is_empty() != s.starts.is_empty() {
            return bad("segments without tokens, or tokens without segments");
        }
        if s.starts.first().is_some_and(|&x| x != 0)
            || s.starts.windows(2).any(|w| w[0] >= w[1])
            || s.starts
                .last()
                .is_some_and(|&x| x as usize >= s.pending.len())
        {
            return bad("segment starts are not increasing within pending");
        }
        if s.doc_index.windows(2).any(|w| w[0] >= w[1])
            || s.doc_index.last().is_some_and(|&d| d >= s.next_doc)
        {
            return bad("document indices are not increasing");
        }
        Ok(Packer { params, state })
    }

    /// Its parameters.
    pub fn params(&self) -> &PackerParams {
        &self.params
    }

    /// The ids waiting for the next block.
    pub fn pending(&self) -> &[u32] {
        &self.state.pending
    }

    /// The whole state, to checkpoint.
    pub fn state(&self) -> &PackerState {
        &self.state
    }

    /// Appends one document (and the separator); returns the blocks it completed, in
    /// order (none, one, or many for a long document).
    pub fn push(&mut self, ids: &[u32]) -> Vec<Block> {
        let doc = self.state.next_doc;
        self.state.next_doc += 1;
        let sep = self.params.separator;
        let mut rest = ids.iter().copied().chain(sep);
        let total = ids.len() + usize::from(sep.is_some());
        let mut left = total;
        let mut out = Vec::new();
        while left > 0 {
            let room = self.params.block_size - self.state.pending.len();
            let take = room.min(left);
            self.state.starts.push(self.state.pending.len() as u32);
            self.state.doc_index.push(doc);
            self.state.pending.extend(rest.by_ref().take(take));
            left -= take;
            if self.state.pending.len() == self.params.block_size {
                out.push(self.take_block());
            }
        }
        out
    }

    /// [`Packer::push`] for a document's ids as a pipeline holds them (see [`ids_of`]).
    /// Refused ids leave the packer as it was.
    pub fn push_value(&mut self, ids: &Value) -> Result<Vec<Block>, Error> {
        let ids = ids_of(ids)?;
        Ok(self.push(&ids))
    }

    /// Ends the stream: the partial block under the remainder policy (`None` if nothing
    /// is pending or the policy drops it). The packer is empty afterwards; document
    /// indices go on counting.
    pub fn finish(&mut self) -> Result<Option<Block>, Error> {
        if self.state.pending.is_empty() {
            return Ok(None);
        }
        let mut block = self.take_block();
        match self.params.remainder {
            Remainder::Drop => Ok(None),
            Remainder::Pad(id) => {
                block.input_ids.resize(self.params.block_size, id);
                Ok(Some(block))
            }
        }
    }

    fn take_block(&mut self) -> Block {
        let s = &mut self.state;
        let mut cu_seqlens = std::mem::take(&mut s.starts);
        cu_seqlens.push(s.pending.len() as u32);
        Block {
            input_ids: std::mem::replace(
                &mut s.pending,
                Vec::with_capacity(self.params.block_size),
            ),
            cu_seqlens,
            doc_index: std::mem::take(&mut s.doc_index),
        }
    }
}

/// A document's token ids as a pipeline holds them: a 1-d integer tensor (what
/// [`crate::text::Tokenize`] makes, without padding) or a list of `Int` (a pre-tokenized
/// Parquet or JSON column). Ids must fit `u32`; anything else is an operator error that says
/// what the value is.
pub fn ids_of(ids: &Value) -> Result<Vec<u32>, Error> {
    let id = |i: usize, x: i64| {
        u32::try_from(x)
            .map_err(|_| Error::operator(format!("pack: id {i} ({x}) is not a token id")))
    };
    // One pass from the tensor's little-endian bytes to the ids.
    fn each<const N: usize>(
        t: &Tensor,
        wide: impl Fn([u8; N]) -> i64,
        id: impl Fn(usize, i64) -> Result<u32, Error>,
    ) -> Result<Vec<u32>, Error> {
        t.data()
            .chunks_exact(N)
            .enumerate()
            .map(|(i, c)| id(i, wide(c.try_into().expect("element size"))))
            .collect()
    }
    match ids {
        Value::Tensor(t) if t.shape().len() == 1 => match t.dtype() {
            DType::I64 => each(t, i64::from_le_bytes, id),
            DType::I32 => each(t, |b| i64::from(i32::from_le_bytes(b)), id),
            DType::I16 => each(t, |b| i64::from(i16::from_le_bytes(b)), id),
            DType::U8 => each(t, |b: [u8; 1]| i64::from(b[0]), id),
            d => Err(Error::operator(format!(
                "pack: ids are a {d} tensor, expected integers"
            ))),
        },
        Value::List(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let x = v.as_int().ok_or_else(|| {
                    Error::operator(format!("pack: id {i} is {}, expected an int", v.kind()))
                })?;
                id(i, x)
            })
            .collect(),
        other => Err(Error::operator(format!(
            "pack: ids are {} {}, expected a 1-d integer tensor or a list of ints",
            if let Value::Tensor(t) = other {
                format!("a tensor of shape {:?},", t.shape())
            } else {
                "a".into()
            },
            other.kind()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_doc_layout() {
        let mut p = Packer::new(PackerParams::new(8).separator(Some(0))).unwrap();
        assert!(p.push(&[1, 2, 3]).is_empty());
        let b = p.push(&[4, 5, 6, 7, 8]);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].input_ids, vec![1, 2, 3, 0, 4, 5, 6, 7]);
        assert_eq!(b[0].position_ids(), vec![0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(b[0].segment_ids(), vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(b[0].cu_seqlens, vec![0, 4, 8]);
        assert_eq!(b[0].doc_index, vec![0, 1]);
        assert_eq!(p.pending(), &[8, 0]);
        assert_eq!(p.state().doc_index, vec![1]);
        let last = p.finish().unwrap().unwrap();
        assert_eq!(last.input_ids, vec![8, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(last.position_ids(), vec![0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(last.segment_ids(), vec![0, 0, -1, -1, -1, -1, -1, -1]);
        assert_eq!(last.attention_mask(), vec![1, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(last.real_len(), 2);
        assert!(p.pending().is_empty());
        assert_eq!(p.finish().unwrap(), None);
    }

    #[test]
    fn a_long_document_spans_blocks() {
        let mut p = Packer::new(PackerParams::new(3).remainder(Remainder::Drop)).unwrap();
        let b = p.push(&[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(b.len(), 2);
        assert_eq!(b[1].input_ids, vec![4, 5, 6]);
        assert_eq!(b[1].position_ids(), vec![0, 1, 2]);
        assert_eq!(b[1].doc_index, vec![0]);
        assert_eq!(p.pending(), &[7]);
        assert_eq!(p.finish().unwrap(), None);
    }

    #[test]
    fn empty_documents() {
        // Without a separator an empty document adds nothing but still counts.
        let mut p = Packer::new(PackerParams::new(2)).unwrap();
        assert!(p.push(&[]).is_empty());
        let b = p.push(&[9, 9]);
        assert_eq!(b[0].doc_index, vec![1]);
        // With one it is a segment of one separator.
        let mut p = Packer::new(PackerParams::new(2).separator(Some(7))).unwrap();
        assert!(p.push(&[]).is_empty());
        let b = p.push(&[]);
        assert_eq!(b[0].input_ids, vec![7, 7]);
        assert_eq!(b[0].cu_seqlens, vec![0, 1, 2]);
    }

    #[test]
    fn tensors_have_the_stated_shapes() {
        let mut p = Packer::new(PackerParams::new(4).separator(Some(0))).unwrap();
        p.push(&[5]);
        let t = p.finish().unwrap().unwrap().to_tensors().unwrap();
        assert_eq!(t.input_ids.to_vec::<i64>().unwrap(), vec![5, 0, 0, 0]);
        assert_eq!(t.position_ids.to_vec::<i64>().unwrap(), vec![0, 1, 0, 0]);
        assert_eq!(t.segment_ids.to_vec::<i64>().unwrap(), vec![0, 0, -1, -1]);
        assert_eq!(t.attention_mask.to_vec::<i64>().unwrap(), vec![1, 1, 0, 0]);
        assert_eq!(t.cu_seqlens.to_vec::<i32>().unwrap(), vec![0, 2]);
    }

    #[test]
    fn ids_from_tensors_and_lists() {
        let mut p = Packer::new(PackerParams::new(3)).unwrap();
        let t = Value::Tensor(Tensor::from_slice(vec![2], &[5i32, 6]).unwrap());
        assert!(p.push_value(&t).unwrap().is_empty());
        let l = Value::List(vec![Value::Int(7), Value::Int(8)]);
        let b = p.push_value(&l).unwrap();
        assert_eq!(b[0].input_ids, vec![5, 6, 7]);
        assert_eq!(p.pending(), &[8]);
        let bad = [
            (
                Value::List(vec![Value::Int(-1)]),
                "id 0 (-1) is not a token id",
            ),
            (Value::List(vec![Value::Null]), "id 0 is null"),
            (Value::Tensor(Tensor::scalar(1i64)), "shape []"),
            (
                Value::Tensor(Tensor::from_slice(vec![1], &[1f32]).unwrap()),
                "float32",
            ),
            (Value::from("text"), "are a str"),
        ];
        for (v, want) in bad {
            let e = p.push_value(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        // Refused ids leave the state alone.
        assert_eq!(p.pending(), &[8]);
    }

    #[test]
    fn bad_params_and_states_are_refused() {
        assert!(Packer::new(PackerParams::new(0)).is_err());
        let p = PackerParams::new(4);
        let full = PackerState {
            pending: vec![1, 2, 3, 4],
            starts: vec![0],
            doc_index: vec![0],
            next_doc: 1,
        };
        assert!(Packer::from_state(p.clone(), full).is_err());
        let no_segment = PackerState {
            pending: vec![1],
            starts: vec![],
            doc_index: vec![],
            next_doc: 1,
        };
        assert!(Packer::from_state(p.clone(), no_segment).is_err());
        let future_doc = PackerState {
            pending: vec![1],
            starts: vec![0],
            doc_index: vec![3],
            next_doc: 1,
        };
        let e = Packer::from_state(p, future_doc).unwrap_err().to_string();
        assert!(e.contains("pack"), "{e}");
    }
}
