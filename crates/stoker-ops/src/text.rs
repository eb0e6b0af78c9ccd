//! Text kernels: tokenization and sequence packing.
//!
//! Two steps of an LLM or encoder input pipeline, kept apart because they have different
//! shapes:
//!
//! - [`Tokenize`] is one-to-one: a text field (a `Str`, or `Bytes` holding UTF-8) becomes
//!   `input_ids` and `attention_mask` tensors. It runs a Hugging Face `tokenizer.json`
//!   through the `tokenizers` crate, the same Rust code the Python `tokenizers` package
//!   wraps, so the ids are the ones Python produces (checked against fixtures made by
//!   Python, `tests/text_parity.rs`). Truncation, BOS/EOS ids and padding to a fixed length
//!   are parameters, so every sample of a field has the same shape and a batch stacks them
//!   into `[N, L]` tensors.
//! - [`Packer`] is many-to-many: the token ids of a stream of documents are concatenated,
//!   with a separator (EOS) after each, and cut into fixed-length [`Block`]s, as LLM
//!   pretraining does. It is a streaming state machine (`push` a document, get the blocks it
//!   completed; `finish` for the remainder), and its whole state is a small serialisable
//!   [`PackerState`], so a pipeline checkpoint can hold it and resume exactly.
//!
//! Why the tokenizer's own truncation and not ours: a template such as BERT's
//! `[CLS] ... [SEP]` is added after truncation, and `max_length` counts those tokens, so
//! truncating afterwards would cut the `[SEP]` off. We hand `max_length` to the tokenizer
//! (which subtracts the template's tokens, exactly as Python does) and do only what the
//! tokenizer file cannot express ourselves: explicit BOS/EOS ids and padding.
//!
//! ```
//! use stoker_ops::text::{Packer, PackerParams, Remainder};
//! let mut packer = Packer::new(PackerParams::new(4).separator(Some(0))).unwrap();
//! assert!(packer.push(&[5, 6]).is_empty()); // 5 6 0: not a full block yet
//! let blocks = packer.push(&[7, 8, 9]); // 5 6 0 7 | 8 9 0
//! assert_eq!(blocks.len(), 1);
//! assert_eq!(blocks[0].input_ids, vec![5, 6, 0, 7]);
//! assert_eq!(blocks[0].position_ids(), vec![0, 1, 2, 0]);
//! assert_eq!(blocks[0].cu_seqlens, vec![0, 3, 4]);
//! assert_eq!(packer.pending(), &[8, 9, 0]);
//! let last = packer.finish().unwrap().unwrap(); // `Remainder::Pad` by default
//! assert_eq!(last.input_ids, vec![8, 9, 0, 0]);
//! assert_eq!(last.attention_mask(), vec![1, 1, 1, 0]);
//! # let _ = Remainder::Drop;
//! ```

mod embedding;
mod pack;
mod tokenize;

pub use embedding::Embedding;
pub use pack::{ids_of, Block, BlockTensors, Packer, PackerParams, PackerState, Remainder};
pub use tokenize::{PadSide, Tokenize, TokenizeParams, Tokenized};
