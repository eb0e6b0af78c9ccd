//! The unbatch stage: cuts each batch into its samples, which go on one at a time
//! (`TailRun::cut_out`), noting the batch it is cutting and how many of its samples it has
//! handed on, so that a checkpoint taken in the middle names the rest. Samples pass.

use std::sync::Arc;

use stoker_core::Error;

use super::{Cut, Flow, StageCx, TailStage};
use crate::exec::marks::StageMark;
use crate::state::Key;

pub(in crate::exec) struct UnbatchStage {
    /// The batch being cut, and how many of its samples were handed on.
    pub(in crate::exec) cutting: Option<Arc<[Key]>>,
    pub(in crate::exec) sent: u32,
}

impl UnbatchStage {
    /// Cutting nothing, or (restored) the batch of `cutting` with `sent` samples handed on.
    pub(in crate::exec) fn restore(cutting: Option<Arc<[Key]>>, sent: u32) -> UnbatchStage {
        UnbatchStage { cutting, sent }
    }
}

impl TailStage for UnbatchStage {
    fn push(
        &mut self,
        item: Flow,
        _cx: &StageCx<'_>,
        outs: &mut Vec<Flow>,
    ) -> Result<Option<Cut>, Error> {
        match item {
            // The batch's bytes leave the budget with it.
            Flow::Batch(b, members, _hold) => Ok(Some((members, b.unbatch()?))),
            sample => {
                outs.push(sample);
                Ok(None)
            }
        }
    }

    fn flush(&mut self, _cx: &StageCx<'_>) -> Result<Option<Flow>, Error> {
        Ok(None)
    }

    fn mark(&self) -> Result<StageMark, String> {
        Ok(StageMark::Unbatch(self.cutting.clone(), self.sent))
    }
}
