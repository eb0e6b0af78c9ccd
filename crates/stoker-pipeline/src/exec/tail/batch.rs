//! The batch stage: collects samples until it has `size`, then collates them (their large
//! tensors stacked as they arrive, into the batch's slots when the producer wrote them
//! there); at the end of an epoch it hands on the partial batch unless `drop_last`.

use stoker_core::{CollatePolicy, Error, Stacker};

use super::{collate_elems, Flow, StageCx, TailStage};
use crate::exec::marks::StageMark;
use crate::source::Element;
use crate::state::{CutFrom, Key};

pub(in crate::exec) struct BatchStage {
    size: usize,
    drop_last: bool,
    collate: CollatePolicy,
    partial: Vec<(Element, CutFrom)>,
    /// The partial batch's large tensors, stacked as they arrive.
    stacker: Stacker,
}

impl BatchStage {
    /// A batch stage with `partial` already in it (restored; empty at a run's start), each
    /// already pushed to `stacker`.
    pub(in crate::exec) fn restore(
        (size, drop_last, collate): (usize, bool, CollatePolicy),
        partial: Vec<(Element, CutFrom)>,
        stacker: Stacker,
    ) -> BatchStage {
        BatchStage {
            size,
            drop_last,
            collate,
            partial,
            stacker,
        }
    }

    fn take(&mut self) -> Result<Flow, Error> {
        let members = std::mem::take(&mut self.partial);
        let st = self.stacker.take();
        collate_elems(members, Some(st), &self.collate)
    }
}

impl TailStage for BatchStage {
    fn push(
        &mut self,
        item: Flow,
        _cx: &StageCx<'_>,
        outs: &mut Vec<Flow>,
    ) -> Result<Option<super::Cut>, Error> {
        let Flow::Elem(mut el, cut) = item else {
            return Err(Error::invalid("batch of batches"));
        };
        self.stacker.push(&mut el.sample, self.size, &self.collate);
        self.partial.push((el, cut));
        if self.partial.len() == self.size {
            outs.push(self.take()?);
        }
        Ok(None)
    }

    fn flush(&mut self, _cx: &StageCx<'_>) -> Result<Option<Flow>, Error> {
        if self.partial.is_empty() {
            return Ok(None);
        }
        if self.drop_last {
            self.partial.clear();
            self.stacker.take();
            return Ok(None);
        }
        self.take().map(Some)
    }

    fn mark(&self) -> Result<StageMark, String> {
        Ok(StageMark::Batch(
            self.partial
                .iter()
                .map(|(e, c)| Key::of_sample(e.pos, c))
                .collect(),
        ))
    }
}
