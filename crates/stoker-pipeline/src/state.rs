//! Where a run is, as data: the checkpoint types a user holds ([`PipelineState`], one
//! [`StageState`] per tail stage, the items they hold as [`ItemPos`]) and the run's own form
//! of an item's positions ([`Key`]), with the translation between the two ([`CutTable`] writes
//! keys out, [`decode_cuts`] and [`Key::decode`] read them back).
//!
//! A state is positions, never data: a shuffle buffer is the positions of the samples in it,
//! a batch its samples' positions, a sample `unbatch` cut from a batch that batch and its
//! place in it. Resuming reads those samples again and makes the items again (the executor's
//! `restore`). The format is versioned ([`STATE_VERSION`]); a state from another pipeline, or
//! an older format, is refused with a reason ([`foreign_state`]).

use std::collections::HashMap;
use std::sync::Arc;
use stoker_core::Error;

/// Where a sample came from: the shard's index in the dataset's (sorted) shard list and
/// the record's index in the shard.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Pos {
    /// Shard index.
    pub shard: u32,
    /// Record index within the shard.
    pub record: u64,
}

/// Where the source is in an epoch (serialisable, small).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceCursor {
    /// Next index into the epoch's order (objects, or shards not yet opened).
    pub next: u64,
    /// Open shards: (index into the epoch's order, records consumed).
    pub slots: Vec<(u64, u64)>,
    /// Whose turn it is among the slots.
    pub rr: u32,
    /// Samples taken from the slots so far (the rank split's round counter).
    pub stream_index: u64,
    /// Emissions so far (the next sequence number).
    pub emitted: u64,
}

/// An item a tail stage holds, as positions: enough to make it again on resume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ItemPos {
    /// A sample from the source: its position.
    Sample(Pos),
    /// A sample `unbatch` cut from a batch: the batch (an index into
    /// [`PipelineState::cuts`]) and the sample's place in it. Such a sample depends on the
    /// whole batch (a padding collate, operators on batches), so the batch is made again.
    Cut {
        /// Index into [`PipelineState::cuts`].
        cut: u32,
        /// Place in that batch.
        index: u32,
    },
    /// A batch: its samples, in order.
    Batch(Vec<ItemPos>),
}

/// A tail stage's state in a checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StageState {
    /// Keeps nothing.
    Stateless,
    /// A shuffle buffer: picks made this epoch, and the buffered items (samples, or
    /// batches for a shuffle after a batch) in buffer order.
    Shuffle {
        /// Picks made.
        emitted: u64,
        /// The items in the buffer.
        buffer: Vec<ItemPos>,
    },
    /// A batch being filled.
    Batch {
        /// Its samples so far.
        partial: Vec<ItemPos>,
    },
    /// An unbatch stage, cutting a batch into samples.
    Unbatch {
        /// The batch it is cutting (an index into [`PipelineState::cuts`]), if it has
        /// handed on some of its samples but not all.
        cut: Option<u32>,
        /// Samples of it handed on.
        sent: u32,
    },
    /// A take or skip counter.
    Count {
        /// Items counted this epoch.
        seen: u64,
    },
    /// A pack stage: the documents to replay (see the `pack` module).
    Pack {
        /// Blocks it handed on this epoch (the replay makes block `blocks` first).
        blocks: u64,
        /// Positions of the documents to push again, in order.
        docs: Vec<Pos>,
        /// Tokens (separators included) of the first document that were in earlier blocks.
        skip: u64,
        /// The first document's index in the epoch's stream.
        next_doc: u64,
    },
}

/// Where a run is: enough to continue it exactly, in a restored run of the same pipeline.
/// Small (positions, not data) and serialisable (serde; JSON via `to_json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipelineState {
    /// Format version of this state.
    pub version: u32,
    /// The pipeline's seed (a state only fits a pipeline with the same seed).
    pub seed: u64,
    /// The epoch being read.
    pub epoch: u64,
    /// The source's cursor in that epoch.
    pub cursor: SourceCursor,
    /// One per tail stage.
    pub stages: Vec<StageState>,
    /// Items yielded in this epoch.
    pub yielded_in_epoch: u64,
    /// Items yielded in all.
    pub yielded: u64,
    /// Samples yielded in all.
    pub samples_yielded: u64,
    /// The batches `unbatch` cut samples from that the stages still hold samples of (or
    /// are cutting): each one's samples, in order. A batch may name earlier ones (after a
    /// second unbatch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<Vec<ItemPos>>,
    /// The rank split was contiguous (the source's cursor indexes this rank's pieces).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contiguous: bool,
}

impl PipelineState {
    /// As JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("state serialises")
    }
    /// From JSON.
    pub fn from_json(s: &str) -> Result<PipelineState, Error> {
        serde_json::from_str(s).map_err(|e| Error::invalid(format!("not a pipeline state: {e}")))
    }

    /// The state at the start of a run from the beginning (epoch `first_epoch`), with these
    /// tail stages' initial states.
    pub(crate) fn initial(
        seed: u64,
        first_epoch: u64,
        stages: Vec<StageState>,
        contiguous: bool,
    ) -> PipelineState {
        PipelineState {
            version: STATE_VERSION,
            seed,
            epoch: first_epoch,
            cursor: SourceCursor::default(),
            stages,
            yielded_in_epoch: 0,
            yielded: 0,
            samples_yielded: 0,
            cuts: vec![],
            contiguous,
        }
    }

    /// An error unless this state can start a pipeline whose first epoch is `first_epoch`.
    pub(crate) fn check_epoch(&self, first_epoch: u64) -> Result<(), Error> {
        if self.epoch < first_epoch {
            return Err(Error::invalid(format!(
                "this state is at epoch {}, before the pipeline's first epoch {first_epoch}: \
                 resume it with the first_epoch of the run it came from",
                self.epoch
            )));
        }
        Ok(())
    }

    /// An error unless this state was taken from a run of a pipeline with this seed, this
    /// many tail stages and this rank split.
    pub(crate) fn check_fits(
        &self,
        seed: u64,
        stages: usize,
        contiguous: bool,
    ) -> Result<(), Error> {
        if self.seed != seed || self.version != STATE_VERSION || self.stages.len() != stages {
            return Err(Error::invalid(
                "this state was not taken from a run of this pipeline (seed, version or \
                 stages differ)",
            ));
        }
        if self.contiguous != contiguous {
            return Err(Error::invalid(
                "this state was taken with the other rank split (contiguous against \
                 interleaved): resume with the split it was taken with",
            ));
        }
        Ok(())
    }
}

pub(crate) const STATE_VERSION: u32 = 2;

/// What an item in the tail is made of, as positions (the run's form of [`ItemPos`]).
/// Batches share their list of members: a sample cut from a batch points at it, so the
/// samples of one batch name it once, and a checkpoint writes it once.
#[derive(Debug, Clone)]
pub(crate) enum Key {
    /// A sample from the source.
    Pos(Pos),
    /// The sample at this place of a batch that `unbatch` cut.
    Cut(Arc<[Key]>, u32),
    /// A batch of these samples.
    Batch(Arc<[Key]>),
}

/// A sample's place in the batch `unbatch` cut it from (None: it was never in one).
pub(crate) type CutFrom = Option<(Arc<[Key]>, u32)>;

impl Key {
    /// The key of the sample at `pos`, cut from a batch when `cut` says so.
    pub(crate) fn of_sample(pos: Pos, cut: &CutFrom) -> Key {
        match cut {
            Some((m, k)) => Key::Cut(m.clone(), *k),
            None => Key::Pos(pos),
        }
    }

    /// The source position (of a batch: of its first sample).
    pub(crate) fn pos(&self) -> Pos {
        match self {
            Key::Pos(p) => *p,
            Key::Cut(m, k) => m[*k as usize].pos(),
            Key::Batch(m) => m.first().map_or(
                Pos {
                    shard: 0,
                    record: 0,
                },
                Key::pos,
            ),
        }
    }

    /// The source positions it is made of (a cut sample: those of its whole batch).
    pub(crate) fn leaves(&self, out: &mut Vec<Pos>) {
        match self {
            Key::Pos(p) => out.push(*p),
            Key::Cut(m, _) | Key::Batch(m) => m.iter().for_each(|k| k.leaves(out)),
        }
    }

    pub(crate) fn decode(i: &ItemPos, cuts: &[Arc<[Key]>]) -> Result<Key, Error> {
        Ok(match i {
            ItemPos::Sample(p) => Key::Pos(*p),
            ItemPos::Cut { cut, index } => match cuts.get(*cut as usize) {
                Some(m) if (*index as usize) < m.len() => Key::Cut(m.clone(), *index),
                _ => return Err(foreign_state("a cut sample names no batch")),
            },
            ItemPos::Batch(v) => Key::Batch(
                v.iter()
                    .map(|i| Key::decode(i, cuts))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

pub(crate) fn foreign_state(what: &str) -> Error {
    Error::invalid(format!(
        "this state was not taken from a run of this pipeline ({what})"
    ))
}

/// The batches of a checkpoint's cut samples, each written once ([`PipelineState::cuts`]).
#[derive(Default)]
pub(crate) struct CutTable {
    pub(crate) cuts: Vec<Vec<ItemPos>>,
    /// By the address of the batch's member list.
    pub(crate) ids: HashMap<usize, u32>,
}

impl CutTable {
    pub(crate) fn cut_id(&mut self, m: &Arc<[Key]>) -> u32 {
        let addr = Arc::as_ptr(m) as *const Key as usize;
        if let Some(id) = self.ids.get(&addr) {
            return *id;
        }
        // Members first: a batch names only earlier ones.
        let members = m.iter().map(|k| self.item(k)).collect();
        self.cuts.push(members);
        let id = (self.cuts.len() - 1) as u32;
        self.ids.insert(addr, id);
        id
    }

    pub(crate) fn item(&mut self, k: &Key) -> ItemPos {
        match k {
            Key::Pos(p) => ItemPos::Sample(*p),
            Key::Cut(m, index) => ItemPos::Cut {
                cut: self.cut_id(m),
                index: *index,
            },
            Key::Batch(m) => ItemPos::Batch(m.iter().map(|k| self.item(k)).collect()),
        }
    }
}

/// The batches a state's cut samples come from, as the run holds them.
pub(crate) fn decode_cuts(cuts: &[Vec<ItemPos>]) -> Result<Vec<Arc<[Key]>>, Error> {
    let mut out: Vec<Arc<[Key]>> = Vec::with_capacity(cuts.len());
    for c in cuts {
        let m = c
            .iter()
            .map(|i| Key::decode(i, &out))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(m.into());
    }
    Ok(out)
}
