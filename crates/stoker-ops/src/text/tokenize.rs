//! [`Tokenize`]: a text field to `input_ids` and `attention_mask` tensors.

use std::path::Path;

use stoker_core::{DType, Error, OpMeta, Sample, Tensor, Value};
use tokenizers::normalizers::{NormalizerWrapper, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{
    Encoding, ModelWrapper, NormalizedString, Normalizer, PostProcessor, Tokenizer,
    TruncationDirection, TruncationParams, TruncationStrategy,
};

/// Which end of a sequence padding goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PadSide {
    /// After the tokens (training; the default).
    #[default]
    Right,
    /// Before the tokens (batched generation with decoder-only models).
    Left,
}

/// Parameters of [`Tokenize`].
///
/// The defaults encode with the tokenizer's special-token template (`[CLS] ... [SEP]` for
/// BERT; nothing for GPT-2), without truncation or padding, as `int64`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TokenizeParams {
    /// The text field (for [`Tokenize::apply`] and for error messages). Default `text`.
    pub field: String,
    /// Where [`Tokenize::apply`] writes the ids. Default `input_ids`.
    pub ids_field: String,
    /// Where [`Tokenize::apply`] writes the attention mask. Default `attention_mask`.
    pub mask_field: String,
    /// Keep at most this many tokens, counting special tokens and `bos_id`/`eos_id`; the
    /// end of the text is cut (the tokenizer's `LongestFirst`, right side, stride 0). When
    /// `None` and `pad_to` is set, `pad_to` is the limit.
    pub max_length: Option<usize>,
    /// Pad every sequence to exactly this many tokens (the output shape is `[pad_to]`).
    pub pad_to: Option<usize>,
    /// The id padding uses. Default 0 (BERT's `[PAD]`; pick the model's own for others).
    pub pad_id: u32,
    /// Which side padding goes to.
    pub pad_side: PadSide,
    /// Apply the tokenizer file's post-processor template (BERT's `[CLS]`/`[SEP]`).
    /// Default true.
    pub add_special_tokens: bool,
    /// An id put before the tokens (after truncation), e.g. a BOS for models whose
    /// tokenizer file adds none.
    pub bos_id: Option<u32>,
    /// An id put after the tokens (after truncation), e.g. GPT-2's `<|endoftext|>` 50256.
    pub eos_id: Option<u32>,
    /// dtype of `input_ids` and `attention_mask`: `int64` (default) or `int32`.
    pub dtype: DType,
}

impl Default for TokenizeParams {
    fn default() -> TokenizeParams {
        TokenizeParams {
            field: "text".into(),
            ids_field: "input_ids".into(),
            mask_field: "attention_mask".into(),
            max_length: None,
            pad_to: None,
            pad_id: 0,
            pad_side: PadSide::Right,
            add_special_tokens: true,
            bos_id: None,
            eos_id: None,
            dtype: DType::I64,
        }
    }
}

impl TokenizeParams {
    /// The defaults.
    pub fn new() -> TokenizeParams {
        TokenizeParams::default()
    }
    /// Sets the text field.
    pub fn field(mut self, f: impl Into<String>) -> Self {
        self.field = f.into();
        self
    }
    /// Sets the output fields of [`Tokenize::apply`].
    pub fn output_fields(mut self, ids: impl Into<String>, mask: impl Into<String>) -> Self {
        self.ids_field = ids.into();
        self.mask_field = mask.into();
        self
    }
    /// Sets `max_length`.
    pub fn max_length(mut self, n: Option<usize>) -> Self {
        self.max_length = n;
        self
    }
    /// Sets `pad_to`.
    pub fn pad_to(mut self, n: Option<usize>) -> Self {
        self.pad_to = n;
        self
    }
    /// Sets the pad id.
    pub fn pad_id(mut self, id: u32) -> Self {
        self.pad_id = id;
        self
    }
    /// Sets the padding side.
    pub fn pad_side(mut self, side: PadSide) -> Self {
        self.pad_side = side;
        self
    }
    /// Whether to apply the tokenizer's special-token template.
    pub fn add_special_tokens(mut self, yes: bool) -> Self {
        self.add_special_tokens = yes;
        self
    }
    /// Sets the explicit BOS id.
    pub fn bos_id(mut self, id: Option<u32>) -> Self {
        self.bos_id = id;
        self
    }
    /// Sets the explicit EOS id.
    pub fn eos_id(mut self, id: Option<u32>) -> Self {
        self.eos_id = id;
        self
    }
    /// Sets the output dtype (`int32` or `int64`).
    pub fn dtype(mut self, d: DType) -> Self {
        self.dtype = d;
        self
    }
}

/// The result of [`Tokenize::encode`] (shapes `[L]`) or [`Tokenize::encode_column`]
/// (shapes `[N, L]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenized {
    /// Token ids, padded.
    pub input_ids: Tensor,
    /// 1 for a token, 0 for padding; same shape and dtype as `input_ids`.
    pub attention_mask: Tensor,
    /// Tokens before padding, per row.
    pub lengths: Vec<usize>,
}

/// Tokenizes a text field with a Hugging Face `tokenizer.json`.
///
/// Deterministic and stateless; cheap to share between threads (`&self` everywhere). It
/// encodes one text at a time on the calling thread (never the tokenizer's own rayon pool):
/// the pipeline's CPU pool owns parallelism.
///
/// The tokenizer file's own `truncation` and `padding` sections are ignored; `max_length`
/// and `pad_to` decide. Ids are what Python's `Tokenizer.encode(text,
/// add_special_tokens=...)` returns with `enable_truncation(max_length)`.
///
/// When a limit applies and the tokenizer file is of a kind for which it is exact (see
/// [`Tokenize::encodes_prefix`] and the module essay), only a prefix of a long text is
/// encoded: about six bytes a kept token, cut before a space that follows a non-space,
/// doubled until the prefix yields every kept token. The ids are the same as the whole
/// text's; a 20 KB document cut to 254 tokens costs a tenth of its full encode.
#[derive(Debug, Clone)]
pub struct Tokenize {
    tokenizer: Tokenizer,
    params: TokenizeParams,
    /// Ids to keep when truncating without the template (the tokenizer truncates with it).
    cut: Option<usize>,
    /// How to encode only a prefix of a long text; `None` encodes every text whole.
    prefix: Option<Prefix>,
}

/// The prefix path of [`Tokenize`]: the text the kept tokens need, not all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefix {
    /// Content tokens the truncation keeps (the limit less the template's tokens).
    tokens: usize,
    /// The length of an encoding once the truncation bit: the whole limit with the
    /// template, `tokens` without it.
    full: usize,
    /// The first prefix is `tokens * bytes_per_token + min_bytes` bytes, to the next cut.
    bytes_per_token: usize,
    /// See `bytes_per_token`.
    min_bytes: usize,
}

/// Bytes a kept token for the first prefix: English is about 4.3 bytes a token with GPT-2
/// and BERT, so most texts need one encode, and denser ones (code, digits, CJK) a second.
const BYTES_PER_TOKEN: usize = 6;
/// Bytes added to the first prefix, so that a few kept tokens still get a fair piece.
const MIN_BYTES: usize = 64;

impl Tokenize {
    /// Loads a `tokenizer.json` from a file.
    pub fn from_file(path: impl AsRef<Path>, params: TokenizeParams) -> Result<Tokenize, Error> {
        let path = path.as_ref();
        let t = Tokenizer::from_file(path).map_err(|e| {
            Error::invalid(format!(
                "tokenize: cannot load tokenizer {}: {e}",
                path.display()
            ))
        })?;
        Tokenize::with_tokenizer(t, params)
    }

    /// Loads a `tokenizer.json` from its bytes.
    pub fn from_json(json: &[u8], params: TokenizeParams) -> Result<Tokenize, Error> {
        let t = Tokenizer::from_bytes(json)
            .map_err(|e| Error::invalid(format!("tokenize: cannot load tokenizer: {e}")))?;
        Tokenize::with_tokenizer(t, params)
    }

    fn with_tokenizer(mut tokenizer: Tokenizer, params: TokenizeParams) -> Result<Tokenize, Error> {
        if !matches!(params.dtype, DType::I32 | DType::I64) {
            return Err(Error::invalid(format!(
                "tokenize: dtype must be int32 or int64, not {}",
                params.dtype
            )));
        }
        let max_length = match (params.max_length, params.pad_to) {
            (Some(m), Some(p)) if m > p => {
                return Err(Error::invalid(format!(
                    "tokenize: max_length {m} is more than pad_to {p}"
                )))
            }
            (m, p) => m.or(p),
        };
        let explicit = usize::from(params.bos_id.is_some()) + usize::from(params.eos_id.is_some());
        let template = if params.add_special_tokens {
            tokenizer
                .get_post_processor()
                .map_or(0, |p: &PostProcessorWrapper| p.added_tokens(false))
        } else {
            0
        };
        let limit = match max_length {
            Some(m) if m < explicit + template => {
                return Err(Error::invalid(format!(
                    "tokenize: max_length {m} leaves no room for the {} special tokens \
                     (template {template}, bos/eos {explicit})",
                    explicit + template
                )))
            }
            Some(m) => Some(m - explicit),
            None => None,
        };
        tokenizer.with_padding(None);
        // With the template, the tokenizer truncates (it knows how many ids the template
        // adds). Without it, keeping the first `limit` ids is what its truncation would do;
        // we cut ourselves because `with_truncation` subtracts the template's size even
        // when it will not be applied (and underflows below it).
        let (in_tokenizer, cut) = if params.add_special_tokens {
            (limit, None)
        } else {
            (None, limit)
        };
        tokenizer
            .with_truncation(in_tokenizer.map(|max_length| TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| Error::invalid(format!("tokenize: {e}")))?;
        let prefix = match (limit, prefix_exact(&tokenizer)) {
            (Some(limit), true) => Some(Prefix {
                tokens: limit - template,
                full: limit,
                bytes_per_token: BYTES_PER_TOKEN,
                min_bytes: MIN_BYTES,
            }),
            _ => None,
        };
        Ok(Tokenize {
            tokenizer,
            params,
            cut,
            prefix,
        })
    }

    /// Whether a long text is encoded only as far as the kept tokens need (the prefix
    /// path): true when `max_length` (or `pad_to`) limits the tokens and the tokenizer file
    /// is one for which a prefix cut before a space gives exactly the leading tokens of the
    /// whole text. That is a normalizer of none, `Lowercase`, `NFC`/`NFD`/`NFKC`/`NFKD`,
    /// `StripAccents`, `BertNormalizer` or a `Sequence` of these; a pre-tokenizer whose
    /// first step splits at spaces (`ByteLevel` with its regex, GPT-2's and RoBERTa's, when
    /// the normalizer removes nothing; `Whitespace`, `WhitespaceSplit`, `BertPreTokenizer`,
    /// `Metaspace` with `split`); a BPE without dropout, WordPiece, WordLevel or Unigram
    /// without sampling; and added tokens without whitespace. The ids do not depend on it.
    pub fn encodes_prefix(&self) -> bool {
        self.prefix.is_some()
    }

    /// Turns the prefix path off: every text is encoded whole. The ids are the same; this is
    /// for measuring the prefix path and testing it.
    pub fn whole_text(mut self) -> Tokenize {
        self.prefix = None;
        self
    }

    /// Sets the first prefix's size (`tokens * bytes_per_token + min_bytes` bytes), for
    /// tests that cut texts everywhere. No effect when the prefix path is off.
    #[doc(hidden)]
    pub fn prefix_estimate(mut self, bytes_per_token: usize, min_bytes: usize) -> Tokenize {
        if let Some(p) = &mut self.prefix {
            p.bytes_per_token = bytes_per_token;
            p.min_bytes = min_bytes;
        }
        self
    }

    /// Every position the prefix path may cut `text` at, in order: for tests.
    #[doc(hidden)]
    pub fn prefix_cuts(text: &str) -> Vec<usize> {
        std::iter::successors(cut_at_or_after(text, 0), |&c| cut_at_or_after(text, c + 1)).collect()
    }

    /// [`Tokenize::encode_ids`], and how many bytes of text the tokenizer was given in all
    /// (every prefix tried, and the whole text if it came to that): for tests.
    #[doc(hidden)]
    pub fn encode_ids_counted(&self, value: &Value) -> Result<(Vec<u32>, usize), Error> {
        let text = self.text_of(value, None)?;
        self.ids_counted(text, None)
    }

    /// Its parameters.
    pub fn params(&self) -> &TokenizeParams {
        &self.params
    }

    /// What the optimizer needs to know: deterministic, stateless.
    pub fn meta(&self) -> OpMeta {
        OpMeta::new("tokenize")
    }

    /// The id of a token (`"<|endoftext|>"`, `"[PAD]"`), to fill `eos_id` or `pad_id`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Vocabulary size, including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The ids of one text: template, truncation, BOS/EOS, no padding. This is the input
    /// of a [`crate::text::Packer`].
    pub fn encode_ids(&self, value: &Value) -> Result<Vec<u32>, Error> {
        self.ids_of(value, None)
    }

    /// Tokenizes one sample's text: `input_ids` and `attention_mask` of shape `[L]`, where
    /// `L` is `pad_to` if set, else the number of tokens.
    pub fn encode(&self, value: &Value) -> Result<Tokenized, Error> {
        let ids = self.ids_of(value, None)?;
        let len = self.params.pad_to.unwrap_or(ids.len());
        self.tensors(&[ids], len, false)
    }

    /// Tokenizes a batch's text column (a `List` of `Str`/`Bytes`): tensors of shape
    /// `[N, L]`, where `L` is `pad_to` if set, else the longest row (shorter rows padded).
    pub fn encode_column(&self, column: &Value) -> Result<Tokenized, Error> {
        let rows = match column {
            Value::List(rows) => rows,
            other => {
                return Err(Error::operator(format!(
                    "tokenize: field '{}' is a {} column, expected a list of texts",
                    self.params.field,
                    other.kind()
                )))
            }
        };
        let ids = rows
            .iter()
            .enumerate()
            .map(|(i, v)| self.ids_of(v, Some(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let len = self
            .params
            .pad_to
            .unwrap_or_else(|| ids.iter().map(Vec::len).max().unwrap_or(0));
        self.tensors(&ids, len, true)
    }

    /// Reads `params.field` of `sample` and writes `params.ids_field` and
    /// `params.mask_field` (shapes `[L]`).
    pub fn apply(&self, sample: &mut Sample) -> Result<(), Error> {
        let value = sample.get(&self.params.field).ok_or_else(|| {
            Error::operator(format!("tokenize: no field '{}'", self.params.field))
        })?;
        let out = self.encode(value)?;
        sample.insert(self.params.ids_field.as_str(), out.input_ids);
        sample.insert(self.params.mask_field.as_str(), out.attention_mask);
        Ok(())
    }

    fn ids_of(&self, value: &Value, row: Option<usize>) -> Result<Vec<u32>, Error> {
        let text = self.text_of(value, row)?;
        Ok(self.ids_counted(text, row)?.0)
    }

    fn text_of<'a>(&self, value: &'a Value, row: Option<usize>) -> Result<&'a str, Error> {
        let field = &self.params.field;
        let at = |row: Option<usize>| row.map(|r| format!(" row {r}")).unwrap_or_default();
        Ok(match value {
            Value::Str(s) => &**s,
            Value::Bytes(b) => std::str::from_utf8(b).map_err(|e| {
                Error::operator(format!(
                    "tokenize: field '{field}'{} is not valid UTF-8 at byte {}",
                    at(row),
                    e.valid_up_to()
                ))
            })?,
            other => {
                return Err(Error::operator(format!(
                    "tokenize: field '{field}'{} is {}, expected str or bytes",
                    at(row),
                    other.kind()
                )))
            }
        })
    }

    /// The ids of a text, and the bytes the tokenizer was given.
    fn ids_counted(&self, text: &str, row: Option<usize>) -> Result<(Vec<u32>, usize), Error> {
        let (enc, spent) = self.encode_text(text).map_err(|e| {
            let at = row.map(|r| format!(" row {r}")).unwrap_or_default();
            Error::operator(format!("tokenize: field '{}'{at}: {e}", self.params.field))
        })?;
        let body = enc.get_ids();
        let body = &body[..self.cut.map_or(body.len(), |c| c.min(body.len()))];
        let mut ids = Vec::with_capacity(body.len() + 2);
        ids.extend(self.params.bos_id);
        ids.extend_from_slice(body);
        ids.extend(self.params.eos_id);
        Ok((ids, spent))
    }

    /// The tokenizer's encoding of `text` (truncated, with the template if asked for), and
    /// the bytes it was given: prefixes of `text` while the prefix path is on and a prefix
    /// may do, then the whole text if none did.
    fn encode_text(&self, text: &str) -> tokenizers::Result<(Encoding, usize)> {
        let add = self.params.add_special_tokens;
        let mut spent = 0;
        if let Some(p) = self.prefix {
            let mut want = p
                .tokens
                .saturating_mul(p.bytes_per_token)
                .saturating_add(p.min_bytes);
            while want < text.len() {
                let Some(end) = cut_at_or_after(text, want) else {
                    break;
                };
                let enc = self.tokenizer.encode_fast(&text[..end], add)?;
                spent += end;
                // The prefix's tokens are the leading tokens of the text's (the essay);
                // once they are as many as the truncation keeps, they are the ids kept.
                if enc.len() >= p.full {
                    return Ok((enc, spent));
                }
                want = end.saturating_mul(2);
            }
        }
        let enc = self.tokenizer.encode_fast(text, add)?;
        Ok((enc, spent + text.len()))
    }

    fn tensors(&self, rows: &[Vec<u32>], len: usize, column: bool) -> Result<Tokenized, Error> {
        let n = rows.len();
        let mut ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for r in rows {
            // Only reachable without truncation: pad_to always bounds max_length.
            if r.len() > len {
                return Err(Error::operator(format!(
                    "tokenize: field '{}' has {} tokens, more than pad_to {len}",
                    self.params.field,
                    r.len()
                )));
            }
            let pad = len - r.len();
            let (pad_ids, pad_mask) = (
                std::iter::repeat_n(i64::from(self.params.pad_id), pad),
                std::iter::repeat_n(0i64, pad),
            );
            let (tok_ids, tok_mask) = (
                r.iter().map(|&t| i64::from(t)),
                std::iter::repeat_n(1i64, r.len()),
            );
            match self.params.pad_side {
                PadSide::Right => {
                    ids.extend(tok_ids.chain(pad_ids));
                    mask.extend(tok_mask.chain(pad_mask));
                }
                PadSide::Left => {
                    ids.extend(pad_ids.chain(tok_ids));
                    mask.extend(pad_mask.chain(tok_mask));
                }
            }
        }
        let shape = if column { vec![n, len] } else { vec![len] };
        let (input_ids, attention_mask) = match self.params.dtype {
            DType::I32 => {
                let narrow = |v: Vec<i64>| -> Result<Vec<i32>, Error> {
                    v.into_iter()
                        .map(|x| {
                            i32::try_from(x).map_err(|_| {
                                Error::operator(format!(
                                    "tokenize: id {x} does not fit int32 (use dtype int64)"
                                ))
                            })
                        })
                        .collect()
                };
                (
                    Tensor::from_slice(shape.clone(), &narrow(ids)?)?,
                    Tensor::from_slice(shape, &narrow(mask)?)?,
                )
            }
            _ => (
                Tensor::from_slice(shape.clone(), &ids)?,
                Tensor::from_slice(shape, &mask)?,
            ),
        };
        Ok(Tokenized {
            input_ids,
            attention_mask,
            lengths: rows.iter().map(Vec::len).collect(),
        })
    }
}

/// The first position at or after `from` where `text` may be cut for the prefix path: an
/// ASCII space that follows a character that is not whitespace (the cut goes before the
/// space). `None` if there is none.
fn cut_at_or_after(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = from.max(1);
    while i < bytes.len() {
        let at = i + bytes[i..].iter().position(|&b| b == b' ')?;
        // A 0x20 byte is always a whole character in UTF-8, so `at` is a char boundary.
        if text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| !c.is_whitespace())
        {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

/// What a normalizer makes of a text `a + b` cut before an ASCII space (`b` starts with
/// it, `a` ends with a non-whitespace character). For all of these `N(a + b) = N(a) +
/// N(b)` and `N(b)` still starts with the space; they differ on the end of `N(a)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NormalizedCut {
    /// `N(a)` still ends with a non-whitespace character.
    Kept,
    /// `N(a)` may end with whitespace (characters were removed or spaces inserted).
    MayEndInSpace,
}

/// `None` when the normalizer is not known to keep a cut before a space.
fn normalized_cut(n: Option<&NormalizerWrapper>) -> Option<NormalizedCut> {
    use NormalizedCut::{Kept, MayEndInSpace};
    let Some(n) = n else {
        return Some(Kept);
    };
    match n {
        // Per character (Rust's `char::to_lowercase`), and no character lowercases to or
        // from whitespace.
        NormalizerWrapper::Lowercase(_) => Some(Kept),
        // A space is a starter that neither decomposes nor composes with what precedes it,
        // so Unicode normalization does not cross it; no non-whitespace character
        // decomposes to a sequence ending in whitespace (tested over every character).
        NormalizerWrapper::NFC(_)
        | NormalizerWrapper::NFD(_)
        | NormalizerWrapper::NFKC(_)
        | NormalizerWrapper::NFKD(_) => Some(Kept),
        // NFD, then combining marks removed: `a` may end in a space once its last marks go.
        NormalizerWrapper::StripAccents(_) => Some(MayEndInSpace),
        // Per character (controls removed, whitespace to a space, CJK surrounded by spaces)
        // and NFD and lowercasing as above.
        NormalizerWrapper::BertNormalizer(b) => Some(
            if b.clean_text || b.handle_chinese_chars || b.strip_accents.unwrap_or(b.lowercase) {
                MayEndInSpace
            } else {
                Kept
            },
        ),
        NormalizerWrapper::Sequence(seq) => {
            let seq: &NormalizerSequence = seq;
            seq.as_ref().iter().try_fold(Kept, |acc, n| {
                Some(match normalized_cut(Some(n))? {
                    Kept => acc,
                    MayEndInSpace => MayEndInSpace,
                })
            })
        }
        // Strip, Replace, Prepend, Precompiled (a SentencePiece table), Nmt, ByteLevel:
        // not shown to keep the cut (Replace and ByteLevel turn the space into something
        // else; Strip after a removal may eat whitespace the pre-tokenizer needs).
        _ => None,
    }
}

/// Whether a pre-tokenizer's first step splits a text cut before a space (its normalized
/// form cut as `normalized_cut` says) into exactly the leading pre-tokens of the whole, so
/// that every later step, which works on one pre-token at a time, keeps them.
fn pre_tokenizer_cuts(p: &PreTokenizerWrapper, n: NormalizedCut) -> bool {
    match p {
        PreTokenizerWrapper::Sequence(seq) => {
            let seq: &PreTokenizerSequence = seq;
            // The first member decides; later ones see whole pre-tokens.
            seq.as_ref()
                .first()
                .is_some_and(|p| pre_tokenizer_cuts(p, n))
        }
        // Whitespace is dropped: the pre-tokens of `a + b` are those of `a` and then those
        // of `b` (`\w+|[^\w\s]+` matches never hold a space; the others split at
        // `char::is_whitespace`).
        PreTokenizerWrapper::Whitespace(_)
        | PreTokenizerWrapper::WhitespaceSplit(_)
        | PreTokenizerWrapper::BertPreTokenizer(_) => true,
        // The space becomes the replacement, which starts a new pre-token.
        PreTokenizerWrapper::Metaspace(m) => m.get_split(),
        // GPT-2's regex: no match crosses from a non-space into a space, and the one match
        // that looks ahead (`\s+(?!\S)`) sees the same in the prefix as in the whole when
        // the prefix ends in a non-space, which a removing normalizer cannot promise.
        PreTokenizerWrapper::ByteLevel(b) => b.use_regex && n == NormalizedCut::Kept,
        _ => false,
    }
}

/// Whether the prefix path gives exactly the whole text's ids with this tokenizer (the
/// module essay has the argument).
fn prefix_exact(t: &Tokenizer) -> bool {
    let Some(n) = normalized_cut(t.get_normalizer()) else {
        return false;
    };
    if !t
        .get_pre_tokenizer()
        .is_some_and(|p| pre_tokenizer_cuts(p, n))
    {
        return false;
    }
    let model = match t.get_model() {
        ModelWrapper::BPE(bpe) => bpe.dropout.is_none_or(|d| d <= 0.0),
        ModelWrapper::Unigram(u) => u.alpha.is_none_or(|a| a == 0.0),
        ModelWrapper::WordPiece(_) | ModelWrapper::WordLevel(_) => true,
    };
    // An added token is matched in the text before (or, `normalized`, right after)
    // normalization; one without whitespace cannot straddle the cut, and its
    // `single_word`, `lstrip` and `rstrip` see a space or the end of the text alike.
    let added = t.get_added_tokens_decoder().values().all(|tok| {
        let spaced = |s: &str| s.chars().any(char::is_whitespace);
        if spaced(&tok.content) {
            return false;
        }
        match (tok.normalized, t.get_normalizer()) {
            (true, Some(n)) => {
                let mut s = NormalizedString::from(tok.content.as_str());
                n.normalize(&mut s).is_ok() && !spaced(s.get())
            }
            _ => true,
        }
    });
    model && added
}
