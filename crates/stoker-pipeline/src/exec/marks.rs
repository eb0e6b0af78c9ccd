//! Marks: where the consumer is, as of each item it receives, so that `Run::state` can give
//! the state after the last item taken rather than after what the pipeline has read ahead.
//!
//! Each item carries a [`Mark`] (the epoch, the last source `seq` the tail had taken, each
//! stage's part). The shuffle buffers are too large to copy into every mark: they keep an
//! undo log instead ([`ShuffleMirror`]), and a mark names a position in each log. An item
//! that goes through a parallel stage in the tail takes along the part of its mark the
//! stages before that stage make ([`Upstream`]); the stages after it complete it.

use super::Run;
use crate::optimize::TailOp;
use crate::state::{CutTable, PipelineState, STATE_VERSION};
use crate::state::{Key, StageState};
use std::collections::VecDeque;
use std::sync::Arc;
use stoker_core::Error;

/// The shuffle buffers' contents (as keys) and an undo log of each one's moves, shared with
/// the consumer side. Indexed by tail stage.
///
/// Each buffer has its own log and its own count of moves, so a mark names a position in
/// every log: with a parallel map stage between two shuffle buffers, the upstream buffer
/// moves on while items the downstream one has not yet seen are on the workers, and a
/// checkpoint rewinds each buffer to where it was when the consumer's item passed it.
#[derive(Debug, Default)]
pub(super) struct ShuffleMirror {
    pub(super) bufs: Vec<Vec<Key>>,
    pub(super) emitted: Vec<u64>,
    pub(super) logs: Vec<VecDeque<ShufMove>>,
    /// Moves pruned from the front of each log.
    pub(super) base: Vec<u64>,
    /// Each log's moves before this count may be pruned (the consumer is past them).
    pub(super) keep_from: Vec<u64>,
}

#[derive(Debug, Clone)]
pub(super) enum ShufMove {
    Push,
    Replace { slot: usize, out: Key },
    Remove { slot: usize, out: Key },
    EpochStart { emitted: u64 },
}

impl ShuffleMirror {
    pub(super) fn new(stages: usize) -> ShuffleMirror {
        ShuffleMirror {
            bufs: vec![Vec::new(); stages],
            emitted: vec![0; stages],
            logs: vec![VecDeque::new(); stages],
            base: vec![0; stages],
            keep_from: vec![0; stages],
        }
    }
    /// Moves made so far by stage `stage`.
    pub(super) fn ops_of(&self, stage: usize) -> u64 {
        self.base[stage] + self.logs[stage].len() as u64
    }
    pub(super) fn record(&mut self, stage: usize, m: ShufMove) {
        let log = &mut self.logs[stage];
        while self.base[stage] < self.keep_from[stage] && !log.is_empty() {
            log.pop_front();
            self.base[stage] += 1;
        }
        log.push_back(m);
    }
    /// Every buffer and pick count as they were after `ops[i]` moves of stage `i`.
    #[allow(clippy::type_complexity)]
    pub(super) fn rewound(&self, ops: &[u64]) -> Result<(Vec<Vec<Key>>, Vec<u64>), Error> {
        let mut bufs = self.bufs.clone();
        let mut emitted = self.emitted.clone();
        for (i, log) in self.logs.iter().enumerate() {
            let ops = ops.get(i).copied().unwrap_or(0);
            if ops < self.base[i] {
                return Err(Error::invalid(
                    "checkpoint too old: the undo log was pruned",
                ));
            }
            let (buf, emitted) = (&mut bufs[i], &mut emitted[i]);
            for m in log.iter().skip((ops - self.base[i]) as usize).rev() {
                match m {
                    ShufMove::Push => {
                        buf.pop();
                    }
                    ShufMove::Replace { slot, out } => {
                        buf[*slot] = out.clone();
                        *emitted -= 1;
                    }
                    ShufMove::Remove { slot, out } => {
                        if *slot == buf.len() {
                            buf.push(out.clone());
                        } else {
                            let moved = buf[*slot].clone();
                            buf.push(moved);
                            buf[*slot] = out.clone();
                        }
                        *emitted -= 1;
                    }
                    ShufMove::EpochStart { emitted: e } => *emitted = *e,
                }
            }
        }
        Ok((bufs, emitted))
    }
}

/// A stage's part of a mark: its checkpoint, or what makes it when asked for.
#[derive(Debug, Clone)]
pub(super) enum StageMark {
    Fixed(StageState),
    /// Filled in from the shuffle mirror, rewound.
    Shuffle,
    Batch(Vec<Key>),
    Unbatch(Option<Arc<[Key]>>, u32),
}

/// Where the consumer is, as of one item.
#[derive(Debug, Clone)]
pub(super) struct Mark {
    /// Why this position cannot be a checkpoint (a stage lost what it needs for it).
    pub(super) broken: Option<String>,
    pub(super) epoch: u64,
    pub(super) last_seq: Option<u64>,
    /// Each shuffle stage's moves (see [`ShuffleMirror`]).
    pub(super) shuffle_ops: Vec<u64>,
    pub(super) stages: Vec<StageMark>,
    pub(super) yielded_in_epoch: u64,
}

/// The part of a mark that tail stages `0..upto` make: taken when an item enters a
/// parallel map stage (the stages before it have moved on by the time its result comes
/// back), carried with the item to the workers and back, and completed by the stages after
/// it. An item at the end of the tail gets the whole mark this way, exactly as if every
/// stage had run on one thread.
#[derive(Debug, Clone, Default)]
pub(super) struct Upstream {
    pub(super) upto: usize,
    pub(super) broken: Option<String>,
    pub(super) last_seq: Option<u64>,
    /// Per tail stage; entries from `upto` on are not yet meaningful.
    pub(super) shuffle_ops: Vec<u64>,
    /// Stages `0..upto`.
    pub(super) stages: Vec<StageMark>,
}

impl Run {
    /// The position after the last item this run yielded.
    pub fn state(&self) -> Result<PipelineState, Error> {
        if let Err(why) = &self.resumable {
            return Err(Error::invalid(why.clone()));
        }
        let Some(m) = &self.last else {
            return Ok(self.start.clone());
        };
        if let Some(why) = &m.broken {
            return Err(Error::invalid(why.clone()));
        }
        let cursor = match m.last_seq {
            Some(seq) => self
                .shared
                .history
                .lock()
                .iter()
                .find(|(e, s, _)| *e == m.epoch && *s == seq)
                .map(|(_, _, c)| c.clone())
                .ok_or_else(|| Error::invalid("the source's cursor history lost this position"))?,
            None => self
                .shared
                .epoch_start
                .lock()
                .get(&m.epoch)
                .cloned()
                .unwrap_or_default(),
        };
        let shuffled = if m.stages.iter().any(|s| matches!(s, StageMark::Shuffle)) {
            Some(self.shared.shuffle.lock().rewound(&m.shuffle_ops)?)
        } else {
            None
        };
        let mut table = CutTable::default();
        let mut stages = Vec::with_capacity(m.stages.len());
        for (i, sm) in m.stages.iter().enumerate() {
            stages.push(match sm {
                StageMark::Fixed(s) => s.clone(),
                StageMark::Shuffle => {
                    let (bufs, emitted) = shuffled.as_ref().expect("rewound");
                    StageState::Shuffle {
                        emitted: emitted[i],
                        buffer: bufs[i].iter().map(|k| table.item(k)).collect(),
                    }
                }
                StageMark::Batch(keys) => StageState::Batch {
                    partial: keys.iter().map(|k| table.item(k)).collect(),
                },
                StageMark::Unbatch(Some(batch), sent) if (*sent as usize) < batch.len() => {
                    StageState::Unbatch {
                        cut: Some(table.cut_id(batch)),
                        sent: *sent,
                    }
                }
                StageMark::Unbatch(..) => StageState::Unbatch { cut: None, sent: 0 },
            });
        }
        Ok(PipelineState {
            version: STATE_VERSION,
            seed: self.seed,
            epoch: m.epoch,
            cursor,
            stages,
            yielded_in_epoch: m.yielded_in_epoch,
            yielded: self.yielded,
            samples_yielded: self.samples,
            cuts: table.cuts,
            contiguous: self.start.contiguous,
        })
    }
}

/// What tail stage `t` holds at the start of a run.
pub(super) fn initial_stage(t: &TailOp) -> StageState {
    match t {
        TailOp::Shuffle(_) => StageState::Shuffle {
            emitted: 0,
            buffer: vec![],
        },
        TailOp::Batch(..) => StageState::Batch { partial: vec![] },
        TailOp::Unbatch => StageState::Unbatch { cut: None, sent: 0 },
        TailOp::Take(_) | TailOp::Skip(_) => StageState::Count { seen: 0 },
        TailOp::Pack(_) => StageState::Pack {
            blocks: 0,
            docs: vec![],
            skip: 0,
            next_doc: 0,
        },
        TailOp::Map(..) => StageState::Stateless,
    }
}

/// Whether `Run::state` works for a run of a plan with these tail stages (`Err`: why not).
pub(super) fn resumable(tail: &[TailOp], deterministic: bool) -> Result<(), String> {
    let packs = tail.iter().filter(|t| matches!(t, TailOp::Pack(_))).count();
    if !deterministic {
        Err("state() needs a deterministic run".to_string())
    } else if packs > 0 && tail.iter().any(|t| matches!(t, TailOp::Unbatch)) {
        Err("state() does not support unbatch together with pack yet".to_string())
    } else if packs > 1 {
        Err("state() supports at most one pack stage".to_string())
    } else if tail
        .iter()
        .skip_while(|t| !matches!(t, TailOp::Pack(_)))
        .any(|t| matches!(t, TailOp::Shuffle(_)))
    {
        Err("state() does not support a shuffle after pack yet".to_string())
    } else {
        Ok(())
    }
}
