//! The shuffle buffer: holds `size` items; once full, each new item takes the place of one
//! picked at random (a pure function of seed, epoch and the number of picks so far), which
//! goes on. At the end of an epoch it hands on the rest in random order. Its contents are
//! mirrored as keys, with an undo log, in the run's [`ShuffleMirror`](super::super::marks)
//! so that a checkpoint can name them as of any item the consumer took.

use stoker_core::Error;

use super::{Flow, StageCx, TailStage, SHUFFLE_PICK};
use crate::exec::marks::{ShufMove, StageMark};
use crate::rng::Rng;

pub(in crate::exec) struct ShuffleStage {
    size: usize,
    buf: Vec<Flow>,
    emitted: u64,
}

impl ShuffleStage {
    /// A buffer of `size` holding `buf` (restored; empty at a run's start), `emitted` picks
    /// made this epoch.
    pub(in crate::exec) fn restore(size: usize, buf: Vec<Flow>, emitted: u64) -> ShuffleStage {
        ShuffleStage { size, buf, emitted }
    }

    /// The next pick's slot in a buffer of `len` items.
    fn pick(&self, cx: &StageCx<'_>, len: usize) -> usize {
        Rng::from_words(&[cx.seed, cx.epoch, SHUFFLE_PICK, self.emitted]).below(len as u64) as usize
    }
}

impl TailStage for ShuffleStage {
    // Samples, or batches after a batch stage: the picks are the same either way.
    fn push(
        &mut self,
        item: Flow,
        cx: &StageCx<'_>,
        outs: &mut Vec<Flow>,
    ) -> Result<Option<super::Cut>, Error> {
        let i = cx.index;
        let mut m = cx.shared.shuffle.lock();
        if self.buf.len() < self.size {
            m.bufs[i].push(item.key());
            m.record(i, ShufMove::Push);
            self.buf.push(item);
        } else {
            let k = self.pick(cx, self.buf.len());
            self.emitted += 1;
            let out = std::mem::replace(&mut self.buf[k], item);
            let out_key = std::mem::replace(&mut m.bufs[i][k], self.buf[k].key());
            m.record(
                i,
                ShufMove::Replace {
                    slot: k,
                    out: out_key,
                },
            );
            m.emitted[i] = self.emitted;
            outs.push(out);
        }
        Ok(None)
    }

    fn flush(&mut self, cx: &StageCx<'_>) -> Result<Option<Flow>, Error> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let i = cx.index;
        let k = self.pick(cx, self.buf.len());
        self.emitted += 1;
        let out = self.buf.swap_remove(k);
        let mut m = cx.shared.shuffle.lock();
        let out_key = m.bufs[i].swap_remove(k);
        m.emitted[i] = self.emitted;
        m.record(
            i,
            ShufMove::Remove {
                slot: k,
                out: out_key,
            },
        );
        Ok(Some(out))
    }

    fn mark(&self) -> Result<StageMark, String> {
        // Filled in from the mirror, rewound, when a state is asked for.
        Ok(StageMark::Shuffle)
    }
}
