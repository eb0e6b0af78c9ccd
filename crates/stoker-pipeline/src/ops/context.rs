//! What an operator may use besides its sample: the [`OpContext`] (the sample's
//! generator, its batch slot, and its reservation in the run's memory budget) and the
//! [`Charger`] through which an operator or its kernel charges what it allocates before
//! allocating it. `ops.rs` explains the memory rules these carry out.

use std::sync::Arc;
use std::time::Duration;

use stoker_core::{BatchSlots, Error, Lease, MemoryBudget, Reservation};

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

#[cfg(test)]
mod tests {
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
