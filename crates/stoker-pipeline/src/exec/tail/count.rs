//! `take(n)` and `skip(n)`: a counter per epoch; take passes the first `n` items and drops
//! the rest, skip drops the first `n` and passes the rest (dropped items are counted in the
//! stage's statistics).

use stoker_core::Error;

use super::{Flow, StageCx, TailStage};
use crate::exec::marks::StageMark;
use crate::state::StageState;

pub(in crate::exec) struct CountStage {
    limit: u64,
    seen: u64,
    /// Take (else skip).
    take: bool,
}

impl CountStage {
    /// `take(limit)` (else `skip(limit)`) that has counted `seen` items this epoch.
    pub(in crate::exec) fn restore(limit: u64, seen: u64, take: bool) -> CountStage {
        CountStage { limit, seen, take }
    }
}

impl TailStage for CountStage {
    fn push(
        &mut self,
        item: Flow,
        cx: &StageCx<'_>,
        outs: &mut Vec<Flow>,
    ) -> Result<Option<super::Cut>, Error> {
        let counted = self.seen < self.limit;
        if counted {
            self.seen += 1;
        }
        if counted == self.take {
            outs.push(item);
        } else {
            cx.counters.add(&cx.counters.dropped, 1);
        }
        Ok(None)
    }

    fn flush(&mut self, _cx: &StageCx<'_>) -> Result<Option<Flow>, Error> {
        Ok(None)
    }

    fn mark(&self) -> Result<StageMark, String> {
        Ok(StageMark::Fixed(StageState::Count { seen: self.seen }))
    }
}
