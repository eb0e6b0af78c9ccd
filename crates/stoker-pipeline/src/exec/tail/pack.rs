//! The pack stage in the tail: [`PackStage`] (the `pack` module: documents into fixed-size
//! blocks, with its own replayable checkpoint) as a [`TailStage`]. Blocks count in the
//! budget; the documents they were made of leave it.

use stoker_core::Error;

use super::{block, Cut, Flow, StageCx, TailStage};
use crate::exec::chain::locate;
use crate::exec::marks::StageMark;
use crate::pack::PackStage;

impl TailStage for PackStage {
    fn push(
        &mut self,
        item: Flow,
        cx: &StageCx<'_>,
        outs: &mut Vec<Flow>,
    ) -> Result<Option<Cut>, Error> {
        let Flow::Elem(el, _) = item else {
            return Err(Error::invalid(format!(
                "{} takes samples but receives batches (put it before batch)",
                self.spec.name()
            )));
        };
        match PackStage::push(self, el.pos, &el.sample) {
            Ok(blocks) => {
                // The documents' bytes leave the budget with them; blocks count.
                drop(el);
                outs.extend(blocks.into_iter().map(|(p, s)| block(cx.budget, p, s)));
                Ok(None)
            }
            Err(e) => Err(locate(cx.ds, e.with_stage(self.spec.name()), el.pos)),
        }
    }

    fn flush(&mut self, cx: &StageCx<'_>) -> Result<Option<Flow>, Error> {
        if !self.has_pending() {
            return Ok(None);
        }
        match self.finish() {
            Ok(b) => Ok(b.map(|(pos, sample)| block(cx.budget, pos, sample))),
            Err(e) => Err(e.with_stage(self.spec.name())),
        }
    }

    fn mark(&self) -> Result<StageMark, String> {
        self.checkpoint()
            .map(StageMark::Fixed)
            .map_err(|e| e.message)
    }

    fn sent(&mut self, item: &Flow) {
        if let Flow::Elem(el, _) = item {
            self.note_sent(el.pos.record);
        }
    }

    fn pushed(&mut self) {
        self.prune();
    }
}
