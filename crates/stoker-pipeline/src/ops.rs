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
//! returns, by what the sample has become.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stoker_core::{
    Batch, BatchSlots, DType, Error, Lease, MemoryBudget, OpMeta, Reservation, Sample, Tensor,
    Value,
};

use crate::rng::Rng;

/// What an operator may use besides the sample.
#[derive(Debug)]
pub struct OpContext {
    words: [u64; 5],
    rng: Option<Rng>,
    /// Where the batch stage will stack this sample: (slots, the sample's sequence number
    /// in the epoch).
    slot: Option<(Arc<BatchSlots>, u64)>,
    /// The run's memory budget and the sample's part of it (see [`OpContext::reserve`]).
    memory: Option<Charge>,
}

/// The sample's reservation in the run's budget while an operator runs on it.
#[derive(Debug)]
struct Charge {
    budget: MemoryBudget,
    /// What the sample holds (`None` when it holds nothing: then only what the operator
    /// charges is held, until it returns).
    hold: Option<Reservation>,
    /// Whether the sample held a reservation when the operator began.
    counted: bool,
    /// The sample's bytes when the operator began (0 when it holds nothing).
    base: u64,
    /// What the operator charged so far.
    charged: u64,
    /// How long to wait for room before giving up.
    wait: Duration,
}

/// Charges what an operator is about to allocate for its sample to the run's memory budget
/// (from [`OpContext::charger`]; see [`OpContext::reserve`]). Without a budget (an
/// operator called outside a run) it charges nothing and never fails.
#[derive(Debug)]
pub struct Charger<'a>(Option<&'a mut Charge>);

impl Charger<'_> {
    /// Charges `bytes` more (see [`OpContext::reserve`]).
    pub fn charge(&mut self, bytes: u64) -> Result<(), Error> {
        let Some(c) = self.0.as_deref_mut() else {
            return Ok(());
        };
        c.charged = c.charged.saturating_add(bytes);
        let need = c.base.saturating_add(c.charged);
        let held = c.hold.as_ref().map_or(0, Reservation::bytes);
        if need <= held {
            return Ok(());
        }
        let limit = c.budget.limit();
        if need > limit {
            return Err(Error::operator(format!(
                "the sample needs {} at once ({} it holds and {} its operator allocates: \
                 decoded frames, resize buffers), more than the whole memory budget ({}); \
                 raise memory_limit, or lower decode_image's max_pixels to refuse such images",
                size(need),
                size(c.base),
                size(c.charged),
                size(limit)
            )));
        }
        if let Some(more) = c.budget.try_reserve(need - held) {
            match c.hold.as_mut() {
                Some(h) => h.merge(more),
                None => c.hold = Some(more),
            }
            return Ok(());
        }
        // No room: give back what the sample holds and wait for all it needs at once, first
        // in line (the source admits nothing meanwhile). Samples that each hold a part and
        // wait for the rest would otherwise wait on each other.
        c.hold = None;
        match c.budget.reserve_blocking(need, c.wait) {
            Some(r) => {
                c.hold = Some(r);
                Ok(())
            }
            None => Err(Error::invalid(format!(
                "the memory budget ({}) stayed full for {} s while this sample's operator \
                 waited for the {} the sample needs at once ({} for its buffers): the samples \
                 ahead of it, the shuffle buffer and the batch being filled hold the rest; \
                 raise memory_limit or make the shuffle buffer or the batch smaller",
                size(limit),
                c.wait.as_secs_f64(),
                size(need),
                size(c.charged)
            ))),
        }
    }
}

/// `bytes` for a message: MiB with one decimal, or bytes when under one KiB.
pub(crate) fn size(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

impl OpContext {
    /// The context of operator `op` on the sample at `(shard, record)` in `epoch`.
    pub fn new(seed: u64, epoch: u64, shard: u32, record: u64, op: usize) -> OpContext {
        OpContext {
            words: [seed, epoch, shard as u64, record, op as u64],
            rng: None,
            slot: None,
            memory: None,
        }
    }

    /// This context, charging what the operator reserves to `budget` (see
    /// [`reserve`](Self::reserve)): the sample holds `hold` in it and is `sample_bytes`
    /// bytes now; a reservation waits at most `wait` for room. [`take_hold`](Self::take_hold)
    /// gives the sample's reservation back when the operator has returned. (The executor
    /// sets this up for every operator in a run; it is public for testing what an operator
    /// charges.)
    pub fn with_budget(
        mut self,
        budget: &MemoryBudget,
        hold: Option<Reservation>,
        sample_bytes: u64,
        wait: Duration,
    ) -> OpContext {
        let counted = hold.is_some();
        self.memory = Some(Charge {
            budget: budget.clone(),
            hold,
            counted,
            base: if counted { sample_bytes } else { 0 },
            charged: 0,
            wait,
        });
        self
    }

    /// The sample's reservation after the operator ran (what it held, topped up by what
    /// the operator charged), and the most the sample needed at once while it ran (its
    /// bytes when it began plus what the operator charged; `None` without a budget). A
    /// sample that held nothing gets back nothing: what its operator charged is released.
    pub fn take_hold(&mut self) -> (Option<Reservation>, Option<u64>) {
        match self.memory.take() {
            Some(c) => {
                let peak = c.base.saturating_add(c.charged);
                (c.hold.filter(|_| c.counted), Some(peak))
            }
            None => (None, None),
        }
    }

    /// Charges `bytes` that the operator is about to allocate for this sample (beyond the
    /// sample's own bytes, which it holds already) to the run's memory budget, before it
    /// allocates them: decoded frames, a resize's intermediates, its output. Charges add
    /// up while the operator runs, and what they added to the sample's reservation is
    /// given back when it returns (the sample then holds what it has become). When the
    /// budget has no room the call waits for it, as the source does, for at most the
    /// run's budget wait; a sample whose bytes and charges together are more than the
    /// whole budget is an error (an operator error: the run's error policy applies), as is
    /// a wait that times out (the budget is too small for what the pipeline holds: never
    /// skipped). Without a budget (an operator called outside a run) it does nothing.
    pub fn reserve(&mut self, bytes: u64) -> Result<(), Error> {
        self.charger().charge(bytes)
    }

    /// A [`Charger`] for this sample, to call from a kernel once it knows what it will
    /// allocate (a decoder that has read the header).
    pub fn charger(&mut self) -> Charger<'_> {
        Charger(self.memory.as_mut())
    }

    /// The sample's generator and its [`Charger`] at once (for a kernel that draws and
    /// allocates).
    pub fn rng_and_charger(&mut self) -> (&mut Rng, Charger<'_>) {
        let w = self.words;
        let rng = self.rng.get_or_insert_with(|| Rng::from_words(&w));
        (rng, Charger(self.memory.as_mut()))
    }

    /// This context, for the last operator before a batch stage that stacks in `slots`:
    /// the sample is number `seq` of its epoch.
    pub fn with_batch_slots(mut self, slots: Arc<BatchSlots>, seq: u64) -> OpContext {
        self.slot = Some((slots, seq));
        self
    }

    /// Memory for the sample's main tensor of `len` bytes in the batch it will be stacked
    /// in, when the executor predicts one (see [`BatchSlots`]): an operator that makes a
    /// large tensor may write it there and save the batch stage a copy. At most one per
    /// sample; `None` when there is none. Writing elsewhere is always correct.
    pub fn output_slot(&mut self, len: usize) -> Option<Lease> {
        self.take_output_slot()(len)
    }

    /// [`output_slot`](Self::output_slot), to call later (while the generator is
    /// borrowed).
    pub fn take_output_slot(&mut self) -> impl FnMut(usize) -> Option<Lease> + use<> {
        let mut slot = self.slot.take();
        let epoch = self.words[1];
        move |len| {
            let (slots, seq) = slot.take()?;
            slots.lease(epoch, seq, len)
        }
    }

    /// The sample's generator (created on first use).
    pub fn rng(&mut self) -> &mut Rng {
        let w = self.words;
        self.rng.get_or_insert_with(|| Rng::from_words(&w))
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.words[1]
    }

    /// The context operator `op` has on the same sample (a fused kernel that stands for
    /// several operators draws from each one's generator).
    pub fn for_op(&self, op: usize) -> OpContext {
        let mut words = self.words;
        words[4] = op as u64;
        OpContext {
            words,
            rng: None,
            slot: None,
            memory: None,
        }
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

/// The built-in operators a spec can name, with their arguments.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Builtin {
    /// Renames field `from` to `to`.
    Rename {
        /// Old name.
        from: String,
        /// New name.
        to: String,
    },
    /// Keeps only `fields`.
    Select {
        /// Fields to keep.
        fields: Vec<String>,
    },
    /// Removes `fields`.
    Drop {
        /// Fields to remove.
        fields: Vec<String>,
    },
    /// Bytes to text (an error on invalid UTF-8).
    DecodeUtf8 {
        /// The field.
        field: String,
    },
    /// Text or bytes holding a decimal integer to an integer (`.cls` files).
    ParseInt {
        /// The field.
        field: String,
    },
    /// Raw little-endian bytes to a tensor (zero-copy), of `dtype` and `shape` (default:
    /// 1-D of whatever length the bytes give).
    ToTensor {
        /// The field.
        field: String,
        /// Element type (`uint8`, `float32`, ...).
        dtype: String,
        /// Shape; `None` for 1-D.
        #[serde(default)]
        shape: Option<Vec<usize>>,
    },
    /// Adds field `to` holding the byte length of `field`.
    Len {
        /// The field measured.
        field: String,
        /// The new field.
        to: String,
    },
    /// Keeps samples whose `field` has at least `min` (and at most `max`) bytes.
    FilterLen {
        /// The field measured.
        field: String,
        /// Smallest kept length.
        #[serde(default)]
        min: Option<usize>,
        /// Largest kept length.
        #[serde(default)]
        max: Option<usize>,
    },
    /// Adds field `to` with a random integer in `0..below` (a random operator, mostly for
    /// testing reproducibility).
    RandomInt {
        /// The new field.
        to: String,
        /// Exclusive bound.
        below: u64,
    },
    /// Decodes the JPEG, PNG or WebP bytes in `field` into a `uint8` `[H, W, C]` tensor.
    /// Followed by a `random_resized_crop` of the same field, the two run fused: only the
    /// crop's region is decoded, at the smallest DCT scale that covers the output.
    DecodeImage {
        /// The field.
        field: String,
        /// `rgb` (default; alpha dropped, gray replicated), `gray`, or `rgba` (alpha kept
        /// when the file has it).
        #[serde(default)]
        mode: Option<String>,
        /// Rotate/flip by the EXIF orientation tag (default off, as torchvision).
        #[serde(default)]
        exif_orientation: bool,
        /// Largest image accepted, in pixels (default 89,478,485, as PIL): checked from
        /// the header, before decoding.
        #[serde(default)]
        max_pixels: Option<u64>,
        /// Keep a JPEG whose data ends early, missing rows gray (default: an error).
        #[serde(default)]
        allow_truncated: bool,
    },
    /// torchvision's RandomResizedCrop: a random box (area fraction `scale`, aspect
    /// `ratio`) resized to `size`.
    RandomResizedCrop {
        /// The field (a decoded image).
        field: String,
        /// Output size: `n` or `[height, width]`.
        size: crate::image_ops::Size,
        /// Area fraction range (default `[0.08, 1.0]`).
        #[serde(default)]
        scale: Option<[f64; 2]>,
        /// Aspect ratio range (default `[3/4, 4/3]`).
        #[serde(default)]
        ratio: Option<[f64; 2]>,
        /// `nearest`, `bilinear` (default), `bicubic`, `lanczos`.
        #[serde(default)]
        interpolation: Option<String>,
        /// Anti-aliased downscale (default true).
        #[serde(default)]
        antialias: Option<bool>,
    },
    /// Resizes to `size` exactly.
    Resize {
        /// The field.
        field: String,
        /// `n` or `[height, width]`.
        size: crate::image_ops::Size,
        /// `nearest`, `bilinear` (default), `bicubic`, `lanczos`.
        #[serde(default)]
        interpolation: Option<String>,
        /// Anti-aliased downscale (default true).
        #[serde(default)]
        antialias: Option<bool>,
    },
    /// Cuts the centre `size` (padding with zeros when the image is smaller, as torchvision).
    CenterCrop {
        /// The field.
        field: String,
        /// `n` or `[height, width]`.
        size: crate::image_ops::Size,
    },
    /// A random `size` window, after optional padding.
    RandomCrop {
        /// The field.
        field: String,
        /// `n` or `[height, width]`.
        size: crate::image_ops::Size,
        /// Padding first: 1, 2 or 4 values, as torchvision.
        #[serde(default)]
        padding: Option<Vec<usize>>,
        /// Pad an image smaller than `size` up to it.
        #[serde(default)]
        pad_if_needed: bool,
        /// Fill value of constant padding.
        #[serde(default)]
        fill: u8,
        /// `constant` (default), `edge`, `reflect`, `symmetric`.
        #[serde(default)]
        padding_mode: Option<String>,
    },
    /// Pads the image: 1, 2 or 4 values, as torchvision.
    Pad {
        /// The field.
        field: String,
        /// The padding.
        padding: Vec<usize>,
        /// Fill value of constant padding.
        #[serde(default)]
        fill: u8,
        /// `constant` (default), `edge`, `reflect`, `symmetric`.
        #[serde(default)]
        padding_mode: Option<String>,
    },
    /// Mirrors the image with probability `p` (left-right, or top-bottom with `vertical`).
    RandomFlip {
        /// The field.
        field: String,
        /// Top-bottom instead of left-right.
        #[serde(default)]
        vertical: bool,
        /// Probability (default 0.5).
        #[serde(default = "crate::image_ops::half")]
        p: f64,
    },
    /// torchvision's ColorJitter (factors drawn in `[max(0, 1 - x), 1 + x]`, hue in
    /// `[-hue, hue]`, the four in random order), applied with probability `p`.
    ColorJitter {
        /// The field.
        field: String,
        /// Brightness.
        #[serde(default)]
        brightness: f32,
        /// Contrast.
        #[serde(default)]
        contrast: f32,
        /// Saturation.
        #[serde(default)]
        saturation: f32,
        /// Hue (at most 0.5).
        #[serde(default)]
        hue: f32,
        /// Probability of applying it (default 1).
        #[serde(default = "crate::image_ops::one")]
        p: f64,
    },
    /// Converts to gray (ITU-R 601-2 luma), with 1 or 3 (default) output channels.
    Grayscale {
        /// The field.
        field: String,
        /// Output channels.
        #[serde(default = "crate::image_ops::three")]
        channels: usize,
    },
    /// Converts to gray with probability `p`, keeping the number of channels.
    RandomGrayscale {
        /// The field.
        field: String,
        /// Probability.
        p: f64,
    },
    /// Gaussian blur with a sigma drawn uniformly in `sigma`, with probability `p`.
    GaussianBlur {
        /// The field.
        field: String,
        /// Odd kernel size.
        kernel_size: usize,
        /// Sigma range (default `[0.1, 2.0]`).
        #[serde(default)]
        sigma: Option<[f32; 2]>,
        /// Probability (default 1).
        #[serde(default = "crate::image_ops::one")]
        p: f64,
    },
    /// A `uint8` image to a float tensor: scaled to `[0, 1]` (unless `scale = false`),
    /// normalized (`normalize = "imagenet"`, or `mean` and `std`), in `chw` (default) or
    /// `hwc` layout, as `float32` (default) or `float16`. torchvision's ToTensor +
    /// Normalize in one pass.
    ImageToTensor {
        /// The field.
        field: String,
        /// `imagenet` for ImageNet's mean and std.
        #[serde(default)]
        normalize: Option<String>,
        /// Per-channel mean (after scaling).
        #[serde(default)]
        mean: Option<Vec<f32>>,
        /// Per-channel standard deviation (after scaling).
        #[serde(default)]
        std: Option<Vec<f32>>,
        /// `float32` (default) or `float16`.
        #[serde(default)]
        dtype: Option<String>,
        /// `chw` (default) or `hwc`.
        #[serde(default)]
        layout: Option<String>,
        /// Divide by 255 first (default true).
        #[serde(default = "crate::image_ops::yes")]
        scale: bool,
    },
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
        #[serde(default = "crate::image_ops::yes")]
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
    /// Replaces nulls (and NaN) in `field` with `value`.
    FillNull {
        /// The field.
        field: String,
        /// A number, an integer or a string.
        value: crate::column_ops::FillValue,
    },
    /// `ln(1 + x)` as float32; a negative value is an error, or 0 with `negative = "clamp"`.
    Log1p {
        /// The field.
        field: String,
        /// `error` (default) or `clamp`.
        #[serde(default)]
        negative: Option<String>,
    },
    /// Clips to `[min, max]`, as float32.
    Clip {
        /// The field.
        field: String,
        /// Lower bound.
        #[serde(default)]
        min: Option<f64>,
        /// Upper bound.
        #[serde(default)]
        max: Option<f64>,
    },
    /// `(x - mean) / std` with precomputed statistics, as float32.
    Standardize {
        /// The field.
        field: String,
        /// Mean.
        mean: f64,
        /// Standard deviation (positive).
        std: f64,
    },
    /// Bucket index (int64) among sorted `boundaries`, as `torch.bucketize(right=False)`.
    Bucketize {
        /// The field.
        field: String,
        /// Sorted boundaries.
        boundaries: Vec<f64>,
    },
    /// Hashes strings or integers into `buckets` buckets (int64): `xxh64(text, seed) %
    /// buckets`, integers hashed as their decimal text.
    HashBucket {
        /// The field.
        field: String,
        /// Number of buckets.
        buckets: u64,
        /// Hash seed (default 0).
        #[serde(default)]
        seed: u64,
    },
    /// Index (int64) of each value in a vocabulary; `oov_index` (default: its size) for
    /// values not in it.
    VocabLookup {
        /// The field.
        field: String,
        /// The vocabulary, in index order.
        #[serde(default)]
        vocab: Option<Vec<String>>,
        /// Or a file of one token per line.
        #[serde(default)]
        vocab_file: Option<String>,
        /// Index of unknown values.
        #[serde(default)]
        oov_index: Option<i64>,
    },
    /// Decodes WAV, FLAC, MP3 or Ogg Vorbis bytes in `field` into an `f32` `[channels,
    /// frames]` tensor in `[-1, 1)`, and puts the rate (Hz) in `<field>_sample_rate`.
    DecodeAudio {
        /// The field (encoded audio bytes).
        field: String,
        /// Average the channels into one.
        #[serde(default)]
        mono: bool,
        /// Start this many seconds in.
        #[serde(default)]
        offset_s: Option<f64>,
        /// Decode at most this many seconds.
        #[serde(default)]
        duration_s: Option<f64>,
        /// Refuse streams with more samples (channels x frames) than this (default 2^27).
        #[serde(default)]
        max_samples: Option<u64>,
        /// Corrupt packets replaced by silence before the record is an error (default 0:
        /// any corrupt packet is an error). When above 0, the count of repaired packets is
        /// put in `<field>_bad_packets`.
        #[serde(default)]
        max_bad_packets: u32,
        /// Accept a stream that ends before its header says (default false: an error).
        #[serde(default)]
        allow_truncated: bool,
        /// A format hint (`mp3`, `wav`, `flac`, `ogg`); the content decides in the end.
        #[serde(default)]
        format: Option<String>,
    },
    /// Resamples the clip in `field` to `rate` Hz (torchaudio's windowed sinc).
    Resample {
        /// The field (a decoded clip).
        field: String,
        /// Target rate, Hz.
        rate: u32,
        /// Zero crossings of the sinc per side (default 6).
        #[serde(default)]
        lowpass_filter_width: Option<u32>,
        /// Cutoff as a fraction of the lower Nyquist rate (default 0.99).
        #[serde(default)]
        rolloff: Option<f64>,
    },
    /// `|STFT|^power` of the clip in `field`: `f32` `[C, n_fft/2 + 1, frames]`.
    Spectrogram {
        /// The field (a decoded clip).
        field: String,
        /// FFT size (default 400).
        #[serde(default)]
        n_fft: Option<usize>,
        /// Window length (default `n_fft`).
        #[serde(default)]
        win_length: Option<usize>,
        /// Hop (default `win_length / 2`).
        #[serde(default)]
        hop_length: Option<usize>,
        /// Reflect-pad by half a window at both ends (default true).
        #[serde(default)]
        center: Option<bool>,
        /// Exponent of the magnitude (default 2).
        #[serde(default)]
        power: Option<f32>,
    },
    /// The complex STFT of the clip in `field`: `f32` `[C, n_fft/2 + 1, frames, 2]`
    /// (real, imaginary), the input of `time_stretch`.
    Stft {
        /// The field (a decoded clip).
        field: String,
        /// FFT size (default 400).
        #[serde(default)]
        n_fft: Option<usize>,
        /// Window length (default `n_fft`).
        #[serde(default)]
        win_length: Option<usize>,
        /// Hop (default `win_length / 2`).
        #[serde(default)]
        hop_length: Option<usize>,
        /// Reflect-pad by half a window at both ends (default true).
        #[serde(default)]
        center: Option<bool>,
    },
    /// `|X|^power` of a complex STFT (`[.., 2]` last axis) in `field`.
    ComplexPower {
        /// The field (a complex STFT).
        field: String,
        /// Exponent (default 2).
        #[serde(default)]
        power: Option<f32>,
    },
    /// Mel spectrogram of the clip in `field`: `f32` `[C, n_mels, frames]`.
    MelSpectrogram {
        /// The field (a decoded clip).
        field: String,
        /// FFT size (default 400).
        #[serde(default)]
        n_fft: Option<usize>,
        /// Window length (default `n_fft`).
        #[serde(default)]
        win_length: Option<usize>,
        /// Hop (default `win_length / 2`).
        #[serde(default)]
        hop_length: Option<usize>,
        /// Exponent of the magnitude (default 2).
        #[serde(default)]
        power: Option<f32>,
        /// Mel bands (default 128).
        #[serde(default)]
        n_mels: Option<usize>,
        /// Lowest frequency (default 0).
        #[serde(default)]
        f_min: Option<f64>,
        /// Highest frequency (default half the sample rate).
        #[serde(default)]
        f_max: Option<f64>,
        /// `htk` (default) or `slaney`.
        #[serde(default)]
        mel_scale: Option<String>,
        /// `slaney` area normalisation (default none).
        #[serde(default)]
        norm: Option<String>,
    },
    /// Mel projection of the spectrogram in `field` (rate from `<field>_sample_rate`).
    MelScale {
        /// The field (a `[C, F, T]` spectrogram).
        field: String,
        /// Mel bands (default 128).
        #[serde(default)]
        n_mels: Option<usize>,
        /// Lowest frequency (default 0).
        #[serde(default)]
        f_min: Option<f64>,
        /// Highest frequency (default half the sample rate).
        #[serde(default)]
        f_max: Option<f64>,
        /// `htk` (default) or `slaney`.
        #[serde(default)]
        mel_scale: Option<String>,
        /// `slaney` area normalisation (default none).
        #[serde(default)]
        norm: Option<String>,
    },
    /// Decibels of the (power or magnitude) spectrogram in `field`.
    AmplitudeToDb {
        /// The field.
        field: String,
        /// `power` (default) or `magnitude`.
        #[serde(default)]
        stype: Option<String>,
        /// Floor at the maximum minus this many dB (default none).
        #[serde(default)]
        top_db: Option<f32>,
    },
    /// Phase-vocoder time stretch of the complex STFT in `field` by `rate`: one number, or
    /// `[low, high]` for a rate drawn uniformly per sample.
    TimeStretch {
        /// The field (a complex STFT from `stft`).
        field: String,
        /// The rate (> 1 speeds up), or a range.
        rate: crate::audio_ops::Rate,
        /// The STFT's hop (default `n_fft / 2`, from the bins).
        #[serde(default)]
        hop_length: Option<usize>,
    },
    /// SpecAugment time mask on the spectrogram in `field`.
    TimeMasking {
        /// The field.
        field: String,
        /// Widths are drawn in `[0, mask_param)`.
        mask_param: usize,
        /// Largest fraction of the axis masked (default 1).
        #[serde(default = "crate::image_ops::one")]
        p: f64,
        /// A separate mask per channel (default false).
        #[serde(default)]
        iid_channels: bool,
        /// Fill value (default 0).
        #[serde(default)]
        mask_value: f32,
    },
    /// SpecAugment frequency mask on the spectrogram in `field`.
    FrequencyMasking {
        /// The field.
        field: String,
        /// Widths are drawn in `[0, mask_param)`.
        mask_param: usize,
        /// Largest fraction of the axis masked (default 1).
        #[serde(default = "crate::image_ops::one")]
        p: f64,
        /// A separate mask per channel (default false).
        #[serde(default)]
        iid_channels: bool,
        /// Fill value (default 0).
        #[serde(default)]
        mask_value: f32,
    },
}

impl Builtin {
    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            Builtin::Rename { from, to } => format!("rename({from}->{to})"),
            Builtin::Select { .. } => "select".into(),
            Builtin::Drop { .. } => "drop".into(),
            Builtin::DecodeUtf8 { field } => format!("decode_utf8({field})"),
            Builtin::ParseInt { field } => format!("parse_int({field})"),
            Builtin::ToTensor { field, .. } => format!("to_tensor({field})"),
            Builtin::Len { field, .. } => format!("len({field})"),
            Builtin::FilterLen { field, .. } => format!("filter_len({field})"),
            Builtin::RandomInt { to, .. } => format!("random_int({to})"),
            Builtin::DecodeImage { field, .. } => format!("decode_image({field})"),
            Builtin::RandomResizedCrop { field, .. } => format!("random_resized_crop({field})"),
            Builtin::Resize { field, .. } => format!("resize({field})"),
            Builtin::CenterCrop { field, .. } => format!("center_crop({field})"),
            Builtin::RandomCrop { field, .. } => format!("random_crop({field})"),
            Builtin::Pad { field, .. } => format!("pad({field})"),
            Builtin::RandomFlip { field, .. } => format!("random_flip({field})"),
            Builtin::ColorJitter { field, .. } => format!("color_jitter({field})"),
            Builtin::Grayscale { field, .. } => format!("grayscale({field})"),
            Builtin::RandomGrayscale { field, .. } => format!("random_grayscale({field})"),
            Builtin::GaussianBlur { field, .. } => format!("gaussian_blur({field})"),
            Builtin::ImageToTensor { field, .. } => format!("image_to_tensor({field})"),
            Builtin::Tokenize { field, .. } => format!("tokenize({field})"),
            Builtin::FillNull { field, .. } => format!("fill_null({field})"),
            Builtin::Log1p { field, .. } => format!("log1p({field})"),
            Builtin::Clip { field, .. } => format!("clip({field})"),
            Builtin::Standardize { field, .. } => format!("standardize({field})"),
            Builtin::Bucketize { field, .. } => format!("bucketize({field})"),
            Builtin::HashBucket { field, .. } => format!("hash_bucket({field})"),
            Builtin::VocabLookup { field, .. } => format!("vocab_lookup({field})"),
            Builtin::DecodeAudio { field, .. } => format!("decode_audio({field})"),
            Builtin::Resample { field, .. } => format!("resample({field})"),
            Builtin::Spectrogram { field, .. } => format!("spectrogram({field})"),
            Builtin::Stft { field, .. } => format!("stft({field})"),
            Builtin::ComplexPower { field, .. } => format!("complex_power({field})"),
            Builtin::MelSpectrogram { field, .. } => format!("mel_spectrogram({field})"),
            Builtin::MelScale { field, .. } => format!("mel_scale({field})"),
            Builtin::AmplitudeToDb { field, .. } => format!("amplitude_to_db({field})"),
            Builtin::TimeStretch { field, .. } => format!("time_stretch({field})"),
            Builtin::TimeMasking { field, .. } => format!("time_masking({field})"),
            Builtin::FrequencyMasking { field, .. } => format!("frequency_masking({field})"),
        }
    }

    /// Checks arguments that can be checked before running.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            Builtin::ToTensor { dtype, .. } if DType::parse(dtype).is_none() => Err(
                Error::invalid(format!("to_tensor: unknown dtype {dtype:?}")),
            ),
            Builtin::RandomInt { below: 0, .. } => {
                Err(Error::invalid("random_int: `below` must be at least 1"))
            }
            b if crate::image_ops::is_image_op(b) => crate::image_ops::validate(b),
            b if crate::column_ops::is_column_op(b) => crate::column_ops::validate(b),
            b if crate::audio_ops::is_audio_op(b) => crate::audio_ops::validate(b),
            _ => Ok(()),
        }
    }
}

fn take_field(s: &mut Sample, field: &str) -> Result<Value, Error> {
    s.require(field)?;
    Ok(s.remove(field).expect("present"))
}

impl SampleOp for Builtin {
    fn meta(&self) -> OpMeta {
        let m = OpMeta::new(self.name());
        match self {
            Builtin::RandomInt { .. } => m.random().with_cost_ns(20.0),
            Builtin::DecodeImage { .. } => m.with_cost_ns(3_000_000.0).with_size_ratio(8.0),
            Builtin::RandomResizedCrop { .. }
            | Builtin::RandomCrop { .. }
            | Builtin::RandomFlip { .. }
            | Builtin::ColorJitter { .. }
            | Builtin::RandomGrayscale { .. }
            | Builtin::GaussianBlur { .. } => m.random().with_cost_ns(500_000.0),
            b if crate::image_ops::is_image_op(b) => m.with_cost_ns(200_000.0),
            Builtin::TimeStretch { rate, .. } if rate.is_random() => {
                m.random().with_cost_ns(5_000_000.0)
            }
            Builtin::TimeMasking { .. } | Builtin::FrequencyMasking { .. } => {
                m.random().with_cost_ns(200_000.0)
            }
            b if crate::audio_ops::is_audio_op(b) => m.with_cost_ns(2_000_000.0),
            Builtin::Tokenize { .. } => m.with_cost_ns(300_000.0),
            Builtin::DecodeUtf8 { .. } => m.with_cost_ns(100.0).with_size_ratio(1.0),
            Builtin::FilterLen { .. } => m.filter().with_cost_ns(10.0).with_size_ratio(1.0),
            _ => m.with_cost_ns(20.0).with_size_ratio(1.0),
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
        crate::column_ops::is_column_op(self)
            .then(|| crate::column_ops::apply_batch(self, batch).map(Some))
    }

    fn apply(&self, mut s: Sample, ctx: &mut OpContext) -> Result<Option<Sample>, Error> {
        if crate::column_ops::is_column_op(self) {
            return crate::column_ops::apply(self, s).map(Some);
        }
        if crate::image_ops::is_image_op(self) {
            return crate::image_ops::apply(self, s, ctx)
                .expect("an image operator")
                .map(Some);
        }
        if crate::audio_ops::is_audio_op(self) {
            return crate::audio_ops::apply(self, s, ctx).map(Some);
        }
        match self {
            Builtin::Rename { from, to } => {
                s.require(from)?;
                s.rename(from, to.as_str());
            }
            Builtin::Select { fields } => {
                for f in fields {
                    s.require(f)?;
                }
                s.retain(|n| fields.iter().any(|f| f == n));
            }
            Builtin::Drop { fields } => s.retain(|n| !fields.iter().any(|f| f == n)),
            Builtin::DecodeUtf8 { field } => {
                let v = take_field(&mut s, field)?;
                let text = match v {
                    Value::Bytes(b) => match std::str::from_utf8(&b) {
                        Ok(t) => Value::Str(t.into()),
                        Err(e) => {
                            return Err(Error::operator(format!(
                                "field {field:?} is not UTF-8: {e}"
                            )))
                        }
                    },
                    Value::Str(t) => Value::Str(t),
                    other => {
                        return Err(Error::operator(format!(
                            "field {field:?} is {}, not bytes",
                            other.kind()
                        )))
                    }
                };
                s.insert(field.as_str(), text);
            }
            Builtin::ParseInt { field } => {
                let v = take_field(&mut s, field)?;
                let parsed = match &v {
                    Value::Int(i) => Some(*i),
                    other => other
                        .as_bytes()
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .and_then(|t| t.trim().parse::<i64>().ok()),
                };
                let i = parsed
                    .ok_or_else(|| Error::operator(format!("field {field:?} is not an integer")))?;
                s.insert(field.as_str(), i);
            }
            Builtin::ToTensor {
                field,
                dtype,
                shape,
            } => {
                let dt = DType::parse(dtype)
                    .ok_or_else(|| Error::invalid(format!("unknown dtype {dtype:?}")))?;
                let v = take_field(&mut s, field)?;
                let b: Bytes = match v {
                    Value::Bytes(b) => b,
                    other => {
                        return Err(Error::operator(format!(
                            "field {field:?} is {}, not bytes",
                            other.kind()
                        )))
                    }
                };
                let shape = shape.clone().unwrap_or_else(|| vec![b.len() / dt.size()]);
                s.insert(
                    field.as_str(),
                    Tensor::new(dt, shape, b)
                        .map_err(|e| Error::operator(format!("field {field:?}: {}", e.message)))?,
                );
            }
            Builtin::Len { field, to } => {
                let n = s.require(field)?.size_bytes();
                s.insert(to.as_str(), n as i64);
            }
            Builtin::FilterLen { field, min, max } => {
                let n = s.require(field)?.size_bytes();
                if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
                    return Ok(None);
                }
            }
            Builtin::RandomInt { to, below } => {
                let v = ctx.rng().below(*below) as i64;
                s.insert(to.as_str(), v);
            }
            b => unreachable!("{} is applied above", b.name()),
        }
        Ok(Some(s))
    }
}

#[cfg(test)]
mod charge_tests {
    use super::*;

    #[test]
    fn an_operator_s_charges_top_up_its_sample_s_reservation_and_fail_past_the_limit() {
        let b = MemoryBudget::new(100);
        let wait = Duration::from_millis(20);
        // The sample holds 30 and is 20 bytes: charges up to 10 come out of its hold.
        let hold = b.try_reserve(30).unwrap();
        let mut cx = OpContext::new(0, 0, 0, 0, 0).with_budget(&b, Some(hold), 20, wait);
        cx.reserve(10).unwrap();
        assert_eq!(b.used(), 30);
        // More is taken from the budget, before the operator allocates it.
        cx.charger().charge(40).unwrap();
        assert_eq!(b.used(), 70);
        let (hold, peak) = cx.take_hold();
        assert_eq!(
            (hold.as_ref().map(Reservation::bytes), peak),
            (Some(70), Some(70))
        );
        drop(hold);
        // A need larger than the whole budget is an operator error saying so; nothing taken.
        let mut cx = OpContext::new(0, 0, 0, 0, 0).with_budget(&b, None, 0, wait);
        let e = cx.reserve(101).unwrap_err();
        assert_eq!(e.kind, stoker_core::ErrorKind::Operator);
        assert!(
            e.message
                .contains("more than the whole memory budget (100 bytes)"),
            "{e}"
        );
        assert_eq!(b.used(), 0);
        // A budget held elsewhere: the wait times out, an error that is never skipped.
        let other = b.try_reserve(90).unwrap();
        let mut cx = OpContext::new(0, 0, 0, 0, 0).with_budget(&b, None, 0, wait);
        let e = cx.reserve(50).unwrap_err();
        assert_eq!(e.kind, stoker_core::ErrorKind::Invalid);
        assert!(e.message.contains("stayed full"), "{e}");
        drop(other);
        // Without a budget (outside a run) it charges nothing.
        assert!(OpContext::new(0, 0, 0, 0, 0).reserve(u64::MAX).is_ok());
    }
}
