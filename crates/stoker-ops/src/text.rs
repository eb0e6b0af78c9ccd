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
//! Only the text the kept tokens need. With a limit, a 20 KB document cut to 254 tokens
//! would be normalized, pre-tokenized and run through BPE whole, to keep its first 1.5 KB.
//! [`Tokenize`] encodes a prefix instead: about six bytes a kept token, moved forward to
//! the next *cut*, a position holding an ASCII space whose previous character is not
//! whitespace (the cut goes before the space). If the prefix yields fewer tokens than the
//! limit keeps, its length doubles (to the next cut again); with no cut left, the whole
//! text. The ids are the whole text's when the tokens of the text before any cut are the
//! leading tokens of the whole text's, for then a prefix that yields the kept number
//! yields the kept tokens. That holds step by step for the tokenizer files
//! [`Tokenize::encodes_prefix`] accepts; any other encodes whole texts, as before:
//!
//! - Added tokens are matched first, in the raw text. None of them holds whitespace (their
//!   normalized form neither, for those matched after normalization), so no match
//!   straddles the cut, and `single_word`, `lstrip` and `rstrip` see a space after the
//!   prefix's end in the whole and the end of the text in the prefix, which they treat
//!   alike. Only the piece of text the cut falls in differs: the prefix has `a`, the whole
//!   `a + b`, `b` starting with the space.
//! - The normalizer gives `N(a + b) = N(a) + N(b)`, `N(b)` still starting with the space:
//!   lowercasing and BERT's cleaning work per character; Unicode normalization does not
//!   cross a space (a starter that neither decomposes nor composes with what precedes it);
//!   accent stripping removes marks. With none of them removing characters (none, NFC,
//!   NFD, NFKC, NFKD, `Lowercase`), `N(a)` also still ends in a non-space; tests check
//!   both for every character.
//! - The pre-tokenizer's first step splits `N(a)` into the leading pre-tokens of `N(a + b)`:
//!   `Whitespace`, `WhitespaceSplit` and `BertPreTokenizer` drop whitespace and never join
//!   across it; `Metaspace` (with `split`) starts a pre-token at the space. GPT-2's regex
//!   (`ByteLevel` with `use_regex`) is the delicate one: its letter, digit and punctuation
//!   runs stop at the space either way, but `\s+(?!\S)` looks ahead, and a run of
//!   whitespace ending the prefix would join the space after the cut in the whole (`"x\n"`
//!   alone against `"x\n  y"`, which GPT-2 splits `x`, `\n `, ` y`). Hence the previous
//!   character must not be whitespace, after normalization too, which is why `ByteLevel`
//!   takes only normalizers that remove nothing. Later steps of a `Sequence` see whole
//!   pre-tokens.
//! - The model works on one pre-token at a time (BPE without dropout, WordPiece,
//!   WordLevel, Unigram without sampling), and truncation keeps the first tokens.
//!
//! Refused (whole texts): no pre-tokenizer (Llama 2's SentencePiece layout), `ByteLevel`
//! without its regex, `Split` patterns (Llama 3's), `Replace`, `Prepend`, `Strip` and
//! `Precompiled` normalizers, BPE dropout.
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
