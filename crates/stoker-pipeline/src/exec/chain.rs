//! Applying a chain of operators to one item: every place that runs operators (the
//! workers' producer, a parallel stage in the tail, a stage run inline, the remaking of
//! buffered items on resume) goes through here, with the same contexts, budget charging,
//! error locations and checks (a map that drops an item without declaring itself a filter
//! is an error; an operator on batches keeps the rows).

use super::opcache::OpCache;
use super::par::ParOps;
use super::runtime::Charging;
use super::tail::Flow;
use super::worker::ProducerOp;
use crate::ops::{checked, OpContext};
use crate::pack::BLOCK_SHARD;
use crate::source::{Dataset, Element, Pos};
use crate::state::Key;
use crate::stats::{OpProfile, StageCounters, PROFILE_EVERY};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use stoker_core::{Batch, BatchSlots, Error};

/// How one pass of an item through a chain of operators runs: the operators' coordinates
/// (seed, epoch), where their errors point, what they charge, count and learn.
#[derive(Clone, Copy)]
pub(super) struct How<'a> {
    pub(super) seed: u64,
    pub(super) epoch: u64,
    /// Names the objects and records in errors.
    pub(super) ds: &'a Dataset,
    /// The budget the operators charge their buffers to (`None`: they charge nothing, as
    /// when buffered items are made again on resume).
    pub(super) budget: Option<Charging<'a>>,
    /// Each operator's statistics, when each is a stage of its own (a parallel stage's).
    pub(super) counters: Option<&'a [Arc<StageCounters>]>,
    /// Each operator's profile (time and bytes of one sample in
    /// [`PROFILE_EVERY`](crate::stats::PROFILE_EVERY), every batch), when it is measured.
    pub(super) profile: Option<&'a [Arc<OpProfile>]>,
    /// The batch stage's slots, which the chain's last operator writes into.
    pub(super) slots: Option<&'a Arc<BatchSlots>>,
    /// The cache of samples at the chain's cache point (the workers' chain only).
    pub(super) cache: Option<&'a OpCache>,
    /// Learn what the operators make of a sample for the source's reservations (the
    /// producer's chain: the source's estimate is for it).
    pub(super) learn: bool,
}

impl<'a> How<'a> {
    /// A pass that charges, counts and learns nothing.
    pub(super) fn plain(seed: u64, epoch: u64, ds: &'a Dataset) -> How<'a> {
        How {
            seed,
            epoch,
            ds,
            budget: None,
            counters: None,
            profile: None,
            slots: None,
            cache: None,
            learn: false,
        }
    }
}

/// One sample through `ops` in order (`None`: a filter dropped it). Each operator gets its
/// context (its generator's coordinates, the budget with the sample's reservation, the batch
/// slots for the last one); an error names the operator, the object and the record; a map
/// that drops the sample without declaring itself a filter is an error. Afterwards the
/// sample's reservation is its size (and, with `learn`, the growth is learnt).
pub(super) fn sample_through(
    ops: &[ProducerOp],
    mut el: Element,
    how: How<'_>,
) -> Result<Option<Element>, Error> {
    let before = el.sample.size_bytes();
    // The most the sample needed at once (its bytes and what an operator charged).
    let mut peak = 0u64;
    let mut now = before;
    // One sample in PROFILE_EVERY is timed and weighed at each operator.
    let profile = how.profile.filter(|_| el.seq.is_multiple_of(PROFILE_EVERY));
    // A sample the cache holds starts at the cache point, as the operators before it left it.
    let mut start = 0;
    if let Some(c) = how.cache {
        if let Some(s) = c.get(el.pos) {
            el.sample = s;
            now = el.sample.size_bytes();
            start = c.after;
        }
    }
    for (k, (i, op)) in ops.iter().enumerate().skip(start) {
        if let Some(c) = how.cache.filter(|c| k == c.after && start == 0) {
            c.put(el.pos, &el.sample, before as u64);
        }
        let c = how.counters.map(|c| &*c[k]);
        let p0 = profile.map(|_| (Instant::now(), el.sample.size_bytes() as u64));
        let t0 = c.map(|c| {
            c.add(&c.items_in, 1);
            Instant::now()
        });
        let mut ctx = OpContext::new(how.seed, how.epoch, el.pos.shard, el.pos.record, *i);
        if let Some((budget, wait)) = how.budget {
            ctx = ctx.with_budget(budget, el.hold.take(), now as u64, wait);
        }
        if let Some(s) = how.slots.filter(|_| k + 1 == ops.len()) {
            ctx = ctx.with_batch_slots(s.clone(), el.seq);
        }
        let r = op.apply(el.sample, &mut ctx);
        if let (Some(p), Some((t, bytes_in)), Ok(Some(s))) = (profile, p0, &r) {
            let ns = t.elapsed().as_nanos() as u64;
            p[k].note(t, 1, ns, bytes_in, s.size_bytes() as u64);
        }
        if how.budget.is_some() {
            let (hold, need) = ctx.take_hold();
            el.hold = hold;
            peak = peak.max(need.unwrap_or(0));
        }
        if let (Some(c), Some(t0)) = (c, t0) {
            c.add(&c.busy_ns, t0.elapsed().as_nanos() as u64);
        }
        match checked(&**op, r, "sample").map_err(|e| locate(how.ds, e, el.pos))? {
            Some(s) => {
                el.sample = s;
                if k + 1 < ops.len() {
                    now = el.sample.size_bytes();
                }
                if let Some(c) = c {
                    c.add(&c.items_out, 1);
                }
            }
            None => {
                if let Some(c) = c {
                    c.add(&c.dropped, 1);
                }
                return Ok(None);
            }
        }
    }
    if how.budget.is_some() && !ops.is_empty() {
        charge_growth(&mut el, before, peak, how.learn.then_some(how.ds));
    }
    Ok(Some(el))
}

/// One batch (whose first sample is at `first`) through `ops`' `apply_batch` in order
/// (column-wise; `None`: a filter dropped it), with the same contexts, errors and checks as
/// [`sample_through`]; an operator on batches keeps the rows (positions name the batch's
/// samples one to one), and a per-sample operator is an error here.
pub(super) fn batch_through(
    ops: &[ProducerOp],
    mut b: Batch,
    first: Pos,
    how: How<'_>,
) -> Result<Option<Batch>, Error> {
    let rows = b.len();
    for (k, (i, op)) in ops.iter().enumerate() {
        let c = how.counters.map(|c| &*c[k]);
        let t0 = c.map(|c| {
            c.add(&c.items_in, 1);
            Instant::now()
        });
        let mut cx = OpContext::new(how.seed, how.epoch, first.shard, first.record, *i);
        let p0 = how.profile.map(|_| (Instant::now(), b.size_bytes() as u64));
        let r = op.apply_batch(b, &mut cx);
        if let (Some(p), Some((t, bytes_in)), Some(Ok(Some(out)))) = (how.profile, p0, &r) {
            let ns = t.elapsed().as_nanos() as u64;
            p[k].note(t, rows as u64, ns, bytes_in, out.size_bytes() as u64);
        }
        if let (Some(c), Some(t0)) = (c, t0) {
            c.add(&c.busy_ns, t0.elapsed().as_nanos() as u64);
        }
        let locate = |e: Error| locate_batch(how.ds, e, first, rows);
        let Some(r) = r else {
            let name = op.meta().name;
            return Err(Error::invalid(format!(
                "{name} is a per-sample operator but receives batches (put it before batch)"
            ))
            .with_stage(name));
        };
        match checked(&**op, r, "batch").map_err(locate)? {
            None => {
                if let Some(c) = c {
                    c.add(&c.dropped, 1);
                }
                return Ok(None);
            }
            Some(out) => {
                if out.len() != rows {
                    return Err(locate(
                        Error::operator(format!(
                            "returned a batch of {} rows for a batch of {rows}: an operator on \
                             batches keeps the rows (filter samples before the batch)",
                            out.len()
                        ))
                        .with_stage(op.meta().name),
                    ));
                }
                b = out;
                if let Some(c) = c {
                    c.add(&c.items_out, 1);
                }
            }
        }
    }
    Ok(Some(b))
}

/// One item through a parallel stage's operators: a sample through [`sample_through`], a
/// batch through [`batch_through`], counted per operator, charged but not learnt (the
/// source's estimate is for the operators before the tail).
pub(super) fn apply_par(
    flow: Flow,
    run: &ParOps,
    (seed, epoch): (u64, u64),
    ds: &Dataset,
    budget: Charging<'_>,
) -> Result<Option<Flow>, Error> {
    let how = How {
        budget: Some(budget),
        counters: Some(&run.counters),
        profile: Some(&run.profile),
        ..How::plain(seed, epoch, ds)
    };
    Ok(match flow {
        Flow::Elem(el, cut) => sample_through(&run.ops, el, how)?.map(|el| Flow::Elem(el, cut)),
        Flow::Batch(b, members, hold) => {
            let first = Key::Batch(members.clone()).pos();
            batch_through(&run.ops, b, first, how)?.map(|b| Flow::Batch(b, members, hold))
        }
    })
}

/// The budget holds what a sample is after its operators, `before` bytes when they began
/// (a decoded image is several times its file), and the growth is learnt for the next
/// reservations when `ds` is given (a moving average, so one odd sample moves it by an
/// eighth). What is learnt is the most the sample needed at once, `peak` when its
/// operators charged more than it ended with (a decoded frame that a crop made small):
/// the source then admits a sample with room for its operators' buffers, so a worker
/// seldom has to wait for them.
pub(super) fn charge_growth(el: &mut Element, before: usize, peak: u64, ds: Option<&Dataset>) {
    let after = el.sample.size_bytes();
    if let Some(ds) = ds.filter(|_| before > 0) {
        let one = crate::source::GROWTH_ONE as u128;
        let most = (after as u128).max(peak as u128);
        let g = ((most * one) / before as u128).min(1 << 40) as u64;
        let _ = ds
            .growth
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    g.max(1)
                } else {
                    ((old * 7 + g) / 8).max(1)
                })
            });
    }
    if let Some(h) = el.hold.as_mut() {
        h.resize_to(after as u64);
    }
}

/// `e`, from an operator on a batch of `rows` samples whose first is at `first`, with that
/// sample's object and record, saying so.
pub(super) fn locate_batch(ds: &Dataset, e: Error, first: Pos, rows: usize) -> Error {
    let mut e = locate(ds, e, first);
    e.message = format!(
        "on a batch of {rows} samples (the first at this record): {}",
        e.message
    );
    e
}

/// `e` with the object and record of the sample at `pos` (a pack's block: its number).
pub(super) fn locate(ds: &Dataset, e: Error, pos: Pos) -> Error {
    match ds.shards.get(pos.shard as usize) {
        Some(shard) => e.with_object(shard.url.clone()).with_record(pos.record),
        None if pos.shard == BLOCK_SHARD => e.with_object(format!("pack block {}", pos.record)),
        None => e,
    }
}
