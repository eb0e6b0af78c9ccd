//! Batch slots: a batch's buffer handed out sample by sample before the samples are made.
//!
//! The batch stage stacks each sample's large tensor into one buffer per batch
//! ([`crate::Stacker`]): for an ImageNet batch that is a 600 KB copy per image, made on the
//! pipeline's one sequential thread (about 4% of the CPU of decode, crop, flip and
//! normalise). [`BatchSlots`] removes it: the operator that makes a sample's tensor asks for
//! the place the batch will stack it ([`BatchSlots::lease`], through the operator's context),
//! writes it there, and the stacker finds it already in place.
//!
//! The executor predicts a sample's place from its sequence number in the epoch: sample
//! `s` goes to slot `s % size` of batch `s / size`. A prediction that proves wrong (a
//! sample was dropped before the batch, a run resumed mid-batch) costs only the copy the
//! stacker makes anyway, and the next batches are predicted from the observed offset
//! (samples already written under the old one are copied). Buffers are made for the
//! batches about [`AHEAD_SAMPLES`] samples ahead; a sample finished further ahead (the
//! consumer is the bottleneck, so the copy costs nothing that shows) is made and stacked as
//! without slots. Batches that keep starting outside their slots (the operator writes
//! another field than the one stacked) make the stage give slots up.
//!
//! Nothing here depends on the prediction being right: each slot is leased at most once,
//! the stacker writes a slot only after claiming it from a state that no lease holds, it
//! takes a tensor as in place only when the tensor's bytes are the slot's own, and a batch
//! gets a buffer only when no lease into it remains (otherwise its bytes are copied out).

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::recycle::GLOBAL;

/// A slot no lease has taken.
const FREE: u8 = 0;
/// A lease holds the slot (its operator may be writing it).
const LEASED: u8 = 1;
/// The slot's lease is gone (its tensor was stacked, copied or dropped).
const RELEASED: u8 = 2;
/// The stacker claimed the slot to copy a sample there.
const CLAIMED: u8 = 3;

/// Samples ahead of the batch being stacked that may be written in slots: buffers are kept
/// for the batches they span, and at least [`AHEAD_BATCHES`]. Samples finished further
/// ahead (the consumer is the bottleneck) are stacked by copy, as without slots; the
/// buffers cost only the memory those samples would have held anyway.
const AHEAD_SAMPLES: usize = 256;
const AHEAD_BATCHES: usize = 2;

/// Batches in a row that start with none of their tensors in a slot before slots are
/// given up (the field the operator writes is not the one stacked, say): leases would
/// only cost buffers.
const MISSES: u32 = 4;

/// A batch's key: (epoch, batch index in the epoch under the prediction).
type Key = (u64, u64);

/// The buffers of the batches to come, for one pipeline run's batch stage.
#[derive(Debug)]
pub struct BatchSlots {
    size: usize,
    /// Buffers kept at most (see [`AHEAD_SAMPLES`]).
    ahead: usize,
    reg: Mutex<Registry>,
    placed: AtomicU64,
    copied: AtomicU64,
}

#[derive(Debug, Default)]
struct Registry {
    bufs: BTreeMap<Key, Arc<SlotBuf>>,
    /// Batches at or before this one were started: no new buffer for them.
    floor: Option<Key>,
    /// The prediction's offset in an epoch: (epoch, samples to subtract).
    shift: (u64, u64),
    /// Batches in a row started without a slot.
    misses: u32,
    /// No more leases (see [`MISSES`]).
    off: bool,
}

/// One batch's buffer: `size` slots of `slot_len` bytes after `pad` bytes of alignment.
#[derive(Debug)]
pub struct SlotBuf {
    /// The allocation (`len() == pad`, capacity for every slot); written only through
    /// `base`, never through a reference, while slots are leased.
    buf: Vec<u8>,
    base: *mut u8,
    pad: usize,
    slot_len: usize,
    state: Box<[AtomicU8]>,
}

// SAFETY: `base` points into `buf`, which lives as long as the `SlotBuf`. Each slot's bytes
// are written by one party at a time, as the slot states say: the one lease of a slot, or
// the stacker after claiming it from a state no lease holds; a slot's bytes are read only
// after its writer is done (a lease's bytes once it is frozen, a claimed slot's once the
// stacker has copied into it).
unsafe impl Send for SlotBuf {}
unsafe impl Sync for SlotBuf {}

impl SlotBuf {
    fn new(size: usize, slot_len: usize) -> SlotBuf {
        let (mut buf, pad) = GLOBAL.take_aligned(size * slot_len);
        // SAFETY: `take_aligned` leaves room for `size * slot_len` bytes after `pad`.
        let base = unsafe { buf.as_mut_ptr().add(pad) };
        SlotBuf {
            buf,
            base,
            pad,
            slot_len,
            state: (0..size).map(|_| AtomicU8::new(FREE)).collect(),
        }
    }

    fn slot_ptr(&self, j: usize) -> *mut u8 {
        debug_assert!(j < self.state.len());
        // SAFETY: slot `j` lies within the allocation.
        unsafe { self.base.add(j * self.slot_len) }
    }

    /// The slot whose bytes `data` is, exactly.
    fn slot_of(&self, data: &[u8]) -> Option<usize> {
        let off = (data.as_ptr() as usize).checked_sub(self.base as usize)?;
        let j = off / self.slot_len;
        (off % self.slot_len == 0 && j < self.state.len() && data.len() == self.slot_len)
            .then_some(j)
    }

    /// Claims slot `j` for the stacker's copy; false when a lease holds it.
    fn claim(&self, j: usize) -> bool {
        [FREE, RELEASED].into_iter().any(|from| {
            self.state[j]
                .compare_exchange(from, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// The first `taken` slots, written, as one buffer (and its padding).
    fn into_vec(mut self, taken: usize) -> (Vec<u8>, usize) {
        let mut buf = std::mem::take(&mut self.buf);
        // SAFETY: the stacker wrote, or found written, each of the first `taken` slots,
        // and no lease into the buffer is left (the caller owns it alone).
        unsafe { buf.set_len(self.pad + taken * self.slot_len) };
        (buf, self.pad)
    }
}

impl Drop for SlotBuf {
    fn drop(&mut self) {
        GLOBAL.put(std::mem::take(&mut self.buf));
    }
}

/// One slot of a batch's buffer, for the operator making that sample's tensor.
#[derive(Debug)]
pub struct Lease {
    buf: Arc<SlotBuf>,
    slot: usize,
}

impl Lease {
    /// The slot's length in bytes (what was asked for).
    pub fn len(&self) -> usize {
        self.buf.slot_len
    }

    /// The slot's first byte (where a tensor written through this lease will be).
    pub fn as_ptr(&self) -> *const u8 {
        self.buf.slot_ptr(self.slot)
    }

    /// Never true (a lease is never asked for an empty tensor).
    pub fn is_empty(&self) -> bool {
        self.buf.slot_len == 0
    }

    /// The slot's memory, to write whole.
    pub fn out(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: the slot is this lease's alone (its state went from FREE to LEASED
        // once, here), and `&mut self` makes this the only view of it.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.slot_ptr(self.slot).cast::<MaybeUninit<u8>>(),
                self.buf.slot_len,
            )
        }
    }

    /// The slot's bytes, as written through [`out`](Self::out).
    ///
    /// # Safety
    /// Every byte of the slot must have been written.
    pub unsafe fn into_bytes(self) -> Bytes {
        Bytes::from_owner(Written(self))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.buf.state[self.slot].store(RELEASED, Ordering::Release);
    }
}

/// A lease whose slot was written whole.
struct Written(Lease);

impl AsRef<[u8]> for Written {
    fn as_ref(&self) -> &[u8] {
        let l = &self.0;
        // SAFETY: written whole (`Lease::into_bytes`), and no longer written: the lease
        // has no `out` after this.
        unsafe { std::slice::from_raw_parts(l.buf.slot_ptr(l.slot), l.buf.slot_len) }
    }
}

/// A batch the stacker is filling in a [`SlotBuf`].
#[derive(Debug)]
pub(crate) struct InSlots {
    slots: Arc<BatchSlots>,
    key: Key,
    buf: Arc<SlotBuf>,
    taken: usize,
}

impl InSlots {
    /// Adds the next sample's tensor bytes, `data`: found in place, or copied into the
    /// next slot. `Err` gives back the buffer's bytes so far, as an ordinary buffer with
    /// room for `size` samples (a lease holds the next slot), with `data` not yet added.
    pub(crate) fn push(&mut self, data: &[u8]) -> Result<(), (Vec<u8>, usize)> {
        let slots = &self.slots;
        let j = self.taken;
        let b = &self.buf;
        if b.slot_of(data) == Some(j) {
            slots.placed.fetch_add(1, Ordering::Relaxed);
        } else if b.claim(j) {
            // SAFETY: slot `j` is claimed (no lease writes it) and `data` is another
            // slot's or another buffer's bytes, so the ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), b.slot_ptr(j), b.slot_len);
            }
            slots.copied.fetch_add(1, Ordering::Relaxed);
        } else {
            return Err(self.copy_out(slots.size));
        }
        self.taken += 1;
        Ok(())
    }

    /// The samples so far as an ordinary buffer (from [`crate::recycle::GLOBAL`]) with room
    /// for `size`.
    fn copy_out(&self, size: usize) -> (Vec<u8>, usize) {
        let n = self.taken * self.buf.slot_len;
        let (mut v, pad) = GLOBAL.take_aligned(size * self.buf.slot_len);
        // SAFETY: the first `taken` slots are written and no longer written to.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(self.buf.base, n) });
        (v, pad)
    }

    /// The batch's bytes: the buffer itself when nothing else holds it, else a copy.
    pub(crate) fn finish(self) -> (Vec<u8>, usize) {
        let taken = self.taken;
        {
            // No more leases into it.
            let mut reg = self.slots.reg.lock();
            if reg
                .bufs
                .get(&self.key)
                .is_some_and(|b| Arc::ptr_eq(b, &self.buf))
            {
                reg.bufs.remove(&self.key);
            }
        }
        match Arc::try_unwrap(self.buf) {
            Ok(b) => b.into_vec(taken),
            Err(buf) => {
                let me = InSlots {
                    slots: self.slots,
                    key: self.key,
                    buf,
                    taken,
                };
                me.copy_out(taken)
            }
        }
    }
}

impl BatchSlots {
    /// Slots for a batch stage of `size` samples per batch.
    pub fn new(size: usize) -> BatchSlots {
        let size = size.max(1);
        BatchSlots {
            size,
            ahead: AHEAD_SAMPLES.div_ceil(size).max(AHEAD_BATCHES),
            reg: Mutex::new(Registry::default()),
            placed: AtomicU64::new(0),
            copied: AtomicU64::new(0),
        }
    }

    /// Samples found in place by the stacker so far.
    pub fn placed(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// Samples the stacker copied into a slot (a prediction that was wrong).
    pub fn copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// The slot for sample `seq` of `epoch`, a tensor of `len` bytes: `None` when there is
    /// none to give (its batch has started, is too far ahead, or the slot was leased).
    pub fn lease(&self, epoch: u64, seq: u64, len: usize) -> Option<Lease> {
        if len == 0 {
            return None;
        }
        let size = self.size as u64;
        let mut reg = self.reg.lock();
        if reg.off {
            return None;
        }
        let shift = if reg.shift.0 == epoch { reg.shift.1 } else { 0 };
        let rel = seq + size - shift;
        let (key, slot) = ((epoch, rel / size), (rel % size) as usize);
        // A batch being stacked takes leases into its buffer, but gets none made, and
        // batches before it are done.
        let started = reg.floor.is_some_and(|f| key <= f);
        if reg.floor.is_some_and(|f| key < f) {
            return None;
        }
        let buf = match reg.bufs.get(&key) {
            Some(b) if b.slot_len == len => b.clone(),
            Some(_) => return None,
            None if started || reg.bufs.len() >= self.ahead => return None,
            None => {
                let b = Arc::new(SlotBuf::new(self.size, len));
                reg.bufs.insert(key, b.clone());
                b
            }
        };
        drop(reg);
        buf.state[slot]
            .compare_exchange(FREE, LEASED, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        Some(Lease { buf, slot })
    }

    /// A batch started with none of its tensors in a slot (after [`start`](Self::start)
    /// found none of them). After a few in a row, slots are given up: their buffers are
    /// freed and no more leases are given.
    pub(crate) fn missed(&self) {
        let mut reg = self.reg.lock();
        reg.misses += 1;
        if reg.misses >= MISSES && !reg.off {
            reg.off = true;
            reg.bufs.clear();
        }
    }

    /// Whether slots were given up (see [`missed`](Self::missed)).
    pub fn given_up(&self) -> bool {
        self.reg.lock().off
    }

    /// A batch starts with a tensor of bytes `data`: its buffer when `data` is the first
    /// slot of one (the prediction held). Either way the batches up to this one get no
    /// new buffer, and a tensor found in another slot moves the prediction by as much.
    pub(crate) fn start(self: &Arc<Self>, data: &[u8]) -> Option<InSlots> {
        let mut reg = self.reg.lock();
        let (key, j) = reg
            .bufs
            .iter()
            .find_map(|(k, b)| b.slot_of(data).map(|j| (*k, j)))?;
        reg.floor = Some(key);
        reg.misses = 0;
        if j != 0 {
            let shift = if reg.shift.0 == key.0 { reg.shift.1 } else { 0 };
            reg.shift = (key.0, (shift + j as u64) % self.size as u64);
            // Every buffer made under the old offset is out of step.
            reg.bufs.clear();
            return None;
        }
        // The samples still in flight for this batch take leases into its buffer until it
        // is finished; those before it are done.
        reg.bufs.retain(|k, _| *k >= key);
        let buf = reg.bufs.get(&key)?.clone();
        drop(reg);
        // The slot's lease is the tensor being stacked: it is in place.
        self.placed.fetch_add(1, Ordering::Relaxed);
        Some(InSlots {
            slots: self.clone(),
            key,
            buf,
            taken: 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(mut l: Lease, byte: u8) -> Bytes {
        for b in l.out() {
            b.write(byte);
        }
        // SAFETY: written whole just above.
        unsafe { l.into_bytes() }
    }

    #[test]
    fn predicted_samples_are_stacked_in_place_and_the_batch_is_the_buffer() {
        let s = Arc::new(BatchSlots::new(3));
        let a = write(s.lease(0, 0, 4).unwrap(), 1);
        let b = write(s.lease(0, 1, 4).unwrap(), 2);
        // Slot taken once.
        assert!(s.lease(0, 1, 4).is_none());
        let mut st = s.start(&a).unwrap();
        let base = a.as_ptr();
        drop(a);
        // A sample of the batch being stacked, made after it started.
        let c = write(s.lease(0, 2, 4).unwrap(), 3);
        st.push(&b).unwrap();
        drop(b);
        st.push(&c).unwrap();
        drop(c);
        let (v, pad) = st.finish();
        assert_eq!(&v[pad..], &[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
        assert_eq!(v[pad..].as_ptr(), base, "the batch is the slots' buffer");
        assert_eq!((s.placed(), s.copied()), (3, 0));
        // Its batch is done: no more leases for it, nor for one before it.
        assert!(s.lease(0, 2, 4).is_none());
        assert!(s.lease(0, 0, 4).is_none());
    }

    #[test]
    fn a_dropped_sample_costs_a_copy_and_the_next_batch_is_predicted_again() {
        let s = Arc::new(BatchSlots::new(2));
        // Sample 0 is dropped (its lease goes unused); 1, 2 make the first batch.
        drop(s.lease(0, 0, 2).unwrap());
        let one = write(s.lease(0, 1, 2).unwrap(), 1);
        let two = write(s.lease(0, 2, 2).unwrap(), 2);
        // 1 is in slot 1: no buffer for this batch, and the offset moves by one.
        assert!(s.start(&one).is_none());
        drop((one, two));
        // Sample 3 now starts a batch: predicted at slot 0.
        let three = write(s.lease(0, 3, 2).unwrap(), 3);
        let four = write(s.lease(0, 4, 2).unwrap(), 4);
        let mut st = s.start(&three).unwrap();
        drop(three);
        st.push(&four).unwrap();
        drop(four);
        let (v, pad) = st.finish();
        assert_eq!(&v[pad..], &[3, 3, 4, 4]);
    }

    #[test]
    fn a_sample_out_of_place_is_copied_and_a_held_slot_is_never_written() {
        let s = Arc::new(BatchSlots::new(3));
        let a = write(s.lease(0, 0, 2).unwrap(), 1);
        // Slot 1's lease is held (its operator still running), slot 2's tensor is made.
        let held = s.lease(0, 1, 2).unwrap();
        let c = write(s.lease(0, 2, 2).unwrap(), 3);
        let mut st = s.start(&a).unwrap();
        drop(a);
        // A sample that is not in the slots goes to slot 1: held, so out of the slots.
        let (mut v, pad) = st.push(&[9, 9]).unwrap_err();
        assert_eq!(&v[pad..], &[1, 1]);
        v.extend_from_slice(&[9, 9]);
        v.extend_from_slice(&c);
        assert_eq!(&v[pad..], &[1, 1, 9, 9, 3, 3]);
        drop(held);
        // Another batch: slot 1 free, so the foreign sample is copied in, and the
        // buffer is still held by slot 2's tensor when it finishes: a copy comes out.
        let d = write(s.lease(0, 3, 2).unwrap(), 4);
        let f = write(s.lease(0, 5, 2).unwrap(), 6);
        let mut st = s.start(&d).unwrap();
        st.push(&[7, 7]).unwrap();
        st.push(&f).unwrap();
        assert_eq!(s.copied(), 1);
        let (v, pad) = st.finish();
        assert_eq!(&v[pad..], &[4, 4, 7, 7, 6, 6]);
        assert_ne!(v[pad..].as_ptr(), d.as_ptr(), "held elsewhere: copied out");
        assert_eq!(
            &d[..],
            &[4, 4],
            "the tensor that still holds the buffer is intact"
        );
    }

    #[test]
    fn slots_are_given_up_when_batches_keep_missing_them() {
        let s = Arc::new(BatchSlots::new(1));
        let held = (s.lease(0, 0, 4).unwrap(), s.lease(0, 1, 4).unwrap());
        for _ in 0..MISSES {
            assert!(!s.given_up());
            assert!(s.start(&[0, 0, 0, 0]).is_none());
            s.missed();
        }
        assert!(s.given_up());
        assert!(s.lease(0, 9, 4).is_none());
        assert!(s.reg.lock().bufs.is_empty(), "their buffers are let go");
        drop(held);
        // One found in between resets the count.
        let s = Arc::new(BatchSlots::new(1));
        for seq in 0..3 * MISSES as u64 {
            let a = write(s.lease(0, seq, 4).unwrap(), 1);
            if seq % 2 == 0 {
                assert!(s.start(&a).is_some());
            } else {
                s.missed();
            }
        }
        assert!(!s.given_up());
    }

    #[test]
    fn only_a_few_batches_ahead_get_buffers() {
        let s = BatchSlots::new(AHEAD_SAMPLES / 2);
        let n = AHEAD_SAMPLES as u64;
        let a = s.lease(0, 0, 8);
        let b = s.lease(0, n - 1, 8);
        assert!(a.is_some() && b.is_some());
        assert!(s.lease(0, n, 8).is_none());
        let s = BatchSlots::new(AHEAD_SAMPLES);
        assert!(s.lease(0, 0, 8).is_some());
        assert!(s.lease(0, 2 * n - 1, 8).is_some());
        assert!(s.lease(0, 2 * n, 8).is_none());
        // A length other than the batch's: no slot.
        let s = BatchSlots::new(2);
        let _x = s.lease(0, 0, 8).unwrap();
        assert!(s.lease(0, 1, 4).is_none());
    }
}
