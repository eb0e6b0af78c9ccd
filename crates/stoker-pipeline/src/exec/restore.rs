//! Resume: a restored run makes the tail stages' buffered items again from the positions in
//! the state (reading the samples back, through the producer and the tail maps before each
//! stage, collating batches and cutting them again), then replays what the stages were
//! handing on when the checkpoint was taken, from the deepest stage up.

use super::chain::{batch_through, sample_through, How};
use super::marks::ShufMove;
use super::par::ParStage;
use super::tail::{
    collate_elems, BatchStage, CountStage, Flow, ShuffleStage, Stage, TailRun, UnbatchStage,
};
use super::worker::ProducerOp;
use crate::optimize::TailOp;
use crate::pack::PackStage;
use crate::source::{materialize, Element, Pos};
use crate::state::{decode_cuts, foreign_state, ItemPos, Key, PipelineState, StageState};
use std::collections::HashMap;
use std::sync::Arc;
use stoker_core::{Error, Sample, Stacker};

impl TailRun<'_> {
    /// The stages, restored from `restored` when given; with the samples the restored
    /// stages are made of, read again (by position), for [`TailRun::replay`].
    pub(super) fn init_stages(
        &self,
        restored: Option<&PipelineState>,
    ) -> Result<(Vec<Stage>, HashMap<Pos, Sample>), Error> {
        let ctx = self.ctx;
        let cuts = match restored {
            Some(s) => decode_cuts(&s.cuts)?,
            None => Vec::new(),
        };
        let decode = |v: &[ItemPos]| {
            v.iter()
                .map(|i| Key::decode(i, &cuts))
                .collect::<Result<Vec<_>, _>>()
        };
        let cut = |c: &Option<u32>| match c {
            Some(c) => cuts
                .get(*c as usize)
                .cloned()
                .map(Some)
                .ok_or_else(|| foreign_state("an unbatch names no batch")),
            None => Ok(None),
        };
        // The keys of every restored stage, and the samples they are made of, read at once.
        let mut keys: Vec<Vec<Key>> = Vec::with_capacity(ctx.ph_tail.len());
        let mut leaves = Vec::new();
        let mut after_pack = false;
        for (i, t) in ctx.ph_tail.iter().enumerate() {
            after_pack |= matches!(t, TailOp::Pack(_));
            let k = match (t, restored.map(|s| &s.stages[i])) {
                (TailOp::Shuffle(_), Some(StageState::Shuffle { buffer, .. })) => decode(buffer)?,
                (TailOp::Batch(..), Some(StageState::Batch { partial })) => decode(partial)?,
                (TailOp::Unbatch, Some(StageState::Unbatch { cut: c, .. })) => {
                    cut(c)?.map(Key::Batch).into_iter().collect()
                }
                _ => Vec::new(),
            };
            // A checkpoint is never taken while a batch after a pack holds blocks (see the
            // `pack` module).
            if after_pack && matches!(t, TailOp::Batch(..)) && !k.is_empty() {
                return Err(foreign_state("a batch of packed blocks being filled"));
            }
            k.iter().for_each(|k| k.leaves(&mut leaves));
            keys.push(k);
        }
        leaves.sort_unstable();
        leaves.dedup();
        let got: HashMap<Pos, Sample> = if leaves.is_empty() {
            HashMap::new()
        } else {
            leaves
                .iter()
                .copied()
                .zip(materialize(&ctx.ds, &leaves)?)
                .collect()
        };
        let mut stages = Vec::new();
        let mut mirror = ctx.shared.shuffle.lock();
        for (i, t) in ctx.ph_tail.iter().enumerate() {
            let st = restored.map(|s| &s.stages[i]);
            stages.push(match t {
                TailOp::Map(..) => match &ctx.par_ops[i] {
                    Some(run) => Stage::Par(Box::new(ParStage::new(run.clone()))),
                    None => Stage::Fused,
                },
                TailOp::Shuffle(n) => {
                    let emitted = match st {
                        Some(StageState::Shuffle { emitted, .. }) => *emitted,
                        _ => 0,
                    };
                    let buf = keys[i]
                        .iter()
                        .map(|k| self.remake(k, i, &got))
                        .collect::<Result<Vec<_>, _>>()?;
                    let prev = mirror.emitted[i];
                    mirror.record(i, ShufMove::EpochStart { emitted: prev });
                    mirror.bufs[i] = std::mem::take(&mut keys[i]);
                    mirror.emitted[i] = emitted;
                    Stage::Shuffle(ShuffleStage::restore(*n, buf, emitted))
                }
                TailOp::Batch(n, d, c) => {
                    let mut partial = Vec::with_capacity(keys[i].len());
                    let slots = ctx.shared.slots.clone().filter(|_| i == 0);
                    let mut stacker = Stacker::with_slots(slots);
                    for k in &keys[i] {
                        match self.remake(k, i, &got)? {
                            Flow::Elem(mut el, cut) => {
                                stacker.push(&mut el.sample, *n, c);
                                partial.push((el, cut));
                            }
                            Flow::Batch(..) => return Err(foreign_state("a batch of batches")),
                        }
                    }
                    Stage::Batch(BatchStage::restore((*n, *d, c.clone()), partial, stacker))
                }
                TailOp::Pack(p) => Stage::Pack(Box::new(match st {
                    Some(st) => PackStage::restore(p.clone(), st)?,
                    None => PackStage::new(p.clone())?,
                })),
                TailOp::Unbatch => Stage::Unbatch(match st {
                    Some(StageState::Unbatch { cut: c, sent }) => {
                        UnbatchStage::restore(cut(c)?, *sent)
                    }
                    _ => UnbatchStage::restore(None, 0),
                }),
                TailOp::Take(n) | TailOp::Skip(n) => {
                    let seen = match st {
                        Some(StageState::Count { seen }) => *seen,
                        _ => 0,
                    };
                    Stage::Count(CountStage::restore(*n, seen, matches!(t, TailOp::Take(_))))
                }
            });
        }
        Ok((stages, got))
    }

    /// Hands on, from the deepest stage up, what the restored stages were handing on when
    /// the checkpoint was taken (as the first run did after it): the rest of the batch an
    /// unbatch was cutting, and the blocks a pack stage's documents complete (see the
    /// `pack` module; they are pushed through it again).
    pub(super) fn replay(
        &mut self,
        restored: &PipelineState,
        got: &HashMap<Pos, Sample>,
    ) -> Result<(), Error> {
        for i in (0..self.stages.len()).rev() {
            match (&self.stages[i], &restored.stages[i]) {
                (Stage::Pack(_), StageState::Pack { docs, .. }) => {
                    for el in self.rematerialize(docs, i)? {
                        self.push(i, Flow::Elem(el, None));
                        if self.failed {
                            return Ok(());
                        }
                    }
                }
                (
                    Stage::Unbatch(UnbatchStage {
                        cutting: Some(m),
                        sent,
                    }),
                    _,
                ) => {
                    let (m, sent) = (m.clone(), *sent);
                    let Flow::Batch(b, ..) = self.remake_batch(&m, i, got)? else {
                        unreachable!("remake_batch makes a batch")
                    };
                    self.cut_out(i, m, b.unbatch()?, sent);
                    if self.failed {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Samples at `positions`, read again and passed through the producer and the tail
    /// maps before stage `upto`.
    pub(super) fn rematerialize(
        &self,
        positions: &[Pos],
        upto: usize,
    ) -> Result<Vec<Element>, Error> {
        let samples = materialize(&self.ctx.ds, positions)?;
        let mut out = Vec::with_capacity(samples.len());
        for (pos, sample) in positions.iter().zip(samples) {
            out.push(self.remake_sample(*pos, sample, upto)?);
        }
        Ok(out)
    }

    /// The source's sample at `pos` as it reaches tail stage `at`: through the producer
    /// operators (on the columnar path, the structural ones the source applies) and the
    /// tail maps before `at`.
    pub(super) fn remake_sample(
        &self,
        pos: Pos,
        sample: Sample,
        at: usize,
    ) -> Result<Element, Error> {
        let ctx = self.ctx;
        // In memory already (read again to rebuild what the state held): counted, even
        // past the limit, so that what follows waits for it.
        let hold = Some(ctx.budget.count_held(sample.size_bytes() as u64));
        let el = Element {
            seq: 0,
            pos,
            sample,
            hold,
        };
        let producer = match &ctx.cfg.columnar {
            Some(c) => &c.ops[..],
            None => &ctx.producer[..],
        };
        let how = How {
            budget: Some(ctx.shared.charging()),
            learn: true,
            ..How::plain(ctx.seed, self.epoch, &ctx.ds)
        };
        let el = sample_through(producer, el, how)?
            .ok_or_else(|| Error::invalid("a buffered sample is filtered out on resume"))?;
        self.tail_maps(el, 0, at)
    }

    /// `el` through the per-sample tail maps in stages `from..at`.
    pub(super) fn tail_maps(&self, el: Element, from: usize, at: usize) -> Result<Element, Error> {
        let ctx = self.ctx;
        let how = How::plain(ctx.seed, self.epoch, &ctx.ds);
        sample_through(&tail_maps(&ctx.ph_tail[from..at]), el, how)?
            .ok_or_else(|| Error::invalid("a buffered sample is filtered out on resume"))
    }

    /// The item `k` names as it reaches tail stage `at`, made again from the samples read
    /// back (`got`).
    pub(super) fn remake(
        &self,
        k: &Key,
        at: usize,
        got: &HashMap<Pos, Sample>,
    ) -> Result<Flow, Error> {
        match k {
            Key::Pos(p) => {
                let s = got
                    .get(p)
                    .cloned()
                    .ok_or_else(|| Error::invalid(format!("position {p:?} not found on resume")))?;
                Ok(Flow::Elem(self.remake_sample(*p, s, at)?, None))
            }
            Key::Batch(m) => self.remake_batch(m, at, got),
            Key::Cut(m, k) => {
                let u = self.ctx.ph_tail[..at]
                    .iter()
                    .rposition(|t| matches!(t, TailOp::Unbatch))
                    .ok_or_else(|| foreign_state("a cut sample with no unbatch before it"))?;
                let Flow::Batch(b, ..) = self.remake_batch(m, u, got)? else {
                    unreachable!("remake_batch makes a batch")
                };
                let sample = b
                    .unbatch()?
                    .into_iter()
                    .nth(*k as usize)
                    .ok_or_else(|| foreign_state("a cut sample past its batch's end"))?;
                let el = Element {
                    seq: 0,
                    pos: m[*k as usize].pos(),
                    sample,
                    hold: None,
                };
                let el = self.tail_maps(el, u + 1, at)?;
                Ok(Flow::Elem(el, Some((m.clone(), *k))))
            }
        }
    }

    /// The batch of `members` as it reaches tail stage `at`: its samples made again as
    /// they reached the last batch stage before `at`, collated, and passed through the
    /// operators on batches between.
    pub(super) fn remake_batch(
        &self,
        members: &Arc<[Key]>,
        at: usize,
        got: &HashMap<Pos, Sample>,
    ) -> Result<Flow, Error> {
        let ctx = self.ctx;
        let Some((b, TailOp::Batch(_, _, collate))) = ctx.ph_tail[..at]
            .iter()
            .enumerate()
            .rev()
            .find(|(_, t)| matches!(t, TailOp::Batch(..)))
        else {
            return Err(foreign_state("a batch with no batch stage before it"));
        };
        let mut elems = Vec::with_capacity(members.len());
        for k in members.iter() {
            match self.remake(k, b, got)? {
                Flow::Elem(el, cut) => elems.push((el, cut)),
                Flow::Batch(..) => return Err(foreign_state("a batch of batches")),
            }
        }
        let Flow::Batch(batch, _, hold) = collate_elems(elems, None, collate)? else {
            unreachable!("collate_elems makes a batch")
        };
        let first = members.first().map_or(
            Pos {
                shard: 0,
                record: 0,
            },
            Key::pos,
        );
        let how = How::plain(ctx.seed, self.epoch, &ctx.ds);
        let batch = batch_through(&tail_maps(&ctx.ph_tail[b + 1..at]), batch, first, how)?
            .ok_or_else(|| Error::invalid("a buffered batch is filtered out on resume"))?;
        Ok(Flow::Batch(batch, members.clone(), hold))
    }
}

/// The maps among these tail stages, in order.
fn tail_maps(stages: &[TailOp]) -> Vec<ProducerOp> {
    stages
        .iter()
        .filter_map(|t| match t {
            TailOp::Map(i, op) => Some((*i, op.clone())),
            _ => None,
        })
        .collect()
}
