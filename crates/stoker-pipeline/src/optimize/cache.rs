//! Cache placement: whether the workers keep each sample as the deterministic operators
//! at the head of their chain leave it (a decoded image), so that later epochs start from
//! it instead of reading and decoding again.
//!
//! The point is fixed by the operators' declarations: after the longest run of
//! deterministic maps that keep every sample at the head of the workers' chain (for the
//! ImageNet pipeline: after `decode_image`, before `random_resized_crop`, the first random
//! operator). Everything before it gives the same sample every epoch; everything after it
//! still runs every epoch, drawing from the same generators, so a cached run yields exactly
//! what an uncached one does with the head unfused (a fused decode and crop decodes at a DCT
//! scale: the same boxes, pixels a little apart).
//!
//! Whether to cache is a comparison of costs over the run's epochs, per sample:
//! `E x whole` without the cache (the chain as it runs, fused where it can be) against
//! `head + tail + (E - 1) x tail` with it (the head fills the cache in the first epoch, and
//! cannot fuse with what follows it: a decode that fills the cache decodes the whole image,
//! not only the crop's region). Costs are the run's measurements where it has them, else the
//! operators' declared costs; a head with no cost known is not cached. It must also fit: the
//! epoch's samples at the cache point, estimated from the bytes the run reads per epoch times
//! the head's size ratios (measured or declared), within half the memory budget, which
//! bounds the cache as it fills (a sample that does not fit is not stored, and is made again
//! each epoch). When an operator of the head declares no size ratio (an audio decoder: how
//! much PCM an MP3 gives depends on the file), the size is measured instead: the cache fills
//! while its first [`WATCH_SAMPLES`] samples say how many bytes a source byte becomes, and it
//! is dropped (its bytes given back, nothing more stored) if the epoch would then not fit;
//! until that verdict the source still reads every object, so dropping loses nothing. That
//! is a plan changed by a measurement during the run, with the same samples either way.
//! A run of one epoch caches only for later runs: when it reads through the
//! process's shared store (each epoch of a PyTorch loop is such a run) and the operators
//! before the cache point are spec operators (known by their parameters, so a later run can
//! tell they are the same); the cost is then compared as for a run without end, and the
//! cache is kept in the process for the runs that follow (`exec/opcache.rs`).

use std::sync::Arc;

use super::{Facts, Physical};
use crate::ops::SampleOp;

/// Where the workers' chain keeps its samples, and how many bytes it may keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CachePlan {
    /// The number of the workers' operators before the cache point.
    pub(crate) after: usize,
    /// The most the cache holds.
    pub(crate) limit: u64,
    /// It is kept for later runs of the same pipeline in the process (see
    /// [`Facts::later_runs`]).
    pub(crate) shared: bool,
    /// The bytes the source reads in an epoch, when the size of the samples at the cache
    /// point is not known before the run (an operator of the head declares no size ratio):
    /// the cache then measures the ratio on its first [`WATCH_SAMPLES`] samples and drops
    /// itself if the epoch would not fit in `limit` (`exec/opcache.rs`).
    pub(crate) watch: Option<u64>,
}

/// Samples the cache measures before it decides whether the epoch fits, when the size is
/// measured as it fills ([`CachePlan::watch`]).
pub(crate) const WATCH_SAMPLES: u64 = 32;

/// Epochs assumed for a run without an end, in the comparison of costs.
const ENDLESS: f64 = 1000.0;

/// The cache is placed when the run's cost with it is at most this fraction of the cost
/// without it.
const MIN_GAIN: f64 = 0.9;

/// Decides the cache (see the module documentation) for the producer of `ph`, whose
/// operators will be fused when `fuse`; the reason, either way, goes to `ph.explain` when
/// there is a candidate.
pub(crate) fn place_cache(mut ph: Physical, facts: &Facts, fuse: bool) -> Physical {
    let head = ph
        .producer
        .iter()
        .take_while(|(_, op)| {
            let m = op.meta();
            m.deterministic && !m.filters
        })
        .count();
    if head == 0 || ph.producer.is_empty() {
        return ph;
    }
    let names = super::producer_name(&ph.producer[..head]);
    let at = format!("a cache after {names}");
    // Later runs can use what this one caches when the operators that make its samples are
    // known by their parameters (a Python function is known only by its name).
    let shared = facts.later_runs
        && ph.producer[..head]
            .iter()
            .all(|(_, op)| op.as_builtin().is_some());
    // A run of one epoch reads nothing twice (and says nothing about it), unless later
    // runs read the same samples.
    if facts.epochs == Some(1) && !shared {
        return ph;
    }
    let Some(room) = facts.cache_room else {
        ph.explain.push(format!(
            "{at}: decided by a run, from the bytes it lists and its memory budget"
        ));
        return ph;
    };
    // The epoch's bytes at the cache point: estimated from the size ratios, or, when an
    // operator of the head declares none, measured as the cache fills (`watch`).
    let ratio: Option<f64> = ph.producer[..head]
        .iter()
        .map(|(i, op)| {
            facts
                .measured_ratio
                .get(i)
                .copied()
                .or(op.meta().size_ratio)
        })
        .product();
    let (bytes, watch) = match (facts.input_bytes, ratio) {
        (Some(b), Some(r)) => (Some(b as f64 * r), None),
        (Some(b), None) => (None, Some(b)),
        (None, _) => {
            ph.explain.push(format!(
                "no {at}: the size of the epoch's samples there is not known (the listing \
                 gives no sizes)"
            ));
            return ph;
        }
    };
    if let Some(bytes) = bytes.filter(|&b| b > room as f64) {
        ph.explain.push(format!(
            "no {at}: the epoch's samples there, {} (estimated), would not fit in half the \
             memory budget, {}",
            crate::ops::size(bytes as u64),
            crate::ops::size(room)
        ));
        return ph;
    }
    let cost = |ops: &[(usize, Arc<dyn SampleOp>)]| -> Option<f64> {
        let fused;
        let ops = if fuse {
            fused = super::fusion::fused(ops.to_vec());
            &fused[..]
        } else {
            ops
        };
        ops.iter()
            .map(|(i, op)| facts.measured_ns.get(i).copied().or(op.meta().cost_ns))
            .sum()
    };
    let (Some(whole), Some(first), Some(rest)) = (
        cost(&ph.producer),
        cost(&ph.producer[..head]),
        cost(&ph.producer[head..]),
    ) else {
        ph.explain.push(format!(
            "no {at}: an operator's cost is not known (neither measured nor declared)"
        ));
        return ph;
    };
    // Kept for later runs, the cache pays over the epochs they read too (how many is not
    // known: as for a run without end).
    let epochs = match facts.epochs {
        Some(e) if !shared => e as f64,
        _ => ENDLESS,
    };
    let without = epochs * whole;
    let with = first + epochs * rest;
    let ms = |ns: f64| format!("{:.2} ms", ns / 1e6);
    let over = match facts.epochs {
        _ if shared => "the epochs of this run and of later runs over the same data (each \
                        epoch of a PyTorch loop is a run)"
            .to_string(),
        Some(e) => format!("{e} epochs"),
        None => "each epoch after the first".to_string(),
    };
    // Only for a clear gain (reading a cached sample costs a little too).
    if with > without * MIN_GAIN {
        ph.explain.push(format!(
            "no {at}: over {over} it would cost more than it saves ({} a sample to fill it \
             and {} after it, against {} a sample each epoch without it)",
            ms(first + rest),
            ms(rest),
            ms(whole)
        ));
        return ph;
    }
    let fits = match bytes {
        Some(b) => format!(
            "the epoch's samples there ({} estimated) fit in half the memory budget ({})",
            crate::ops::size(b as u64),
            crate::ops::size(room)
        ),
        None => format!(
            "the size of the epoch's samples there is measured as it fills (an operator \
             declares no size ratio): it is dropped, before any epoch reads from it, if the \
             first {} samples say the epoch would not fit in half the memory budget ({})",
            WATCH_SAMPLES,
            crate::ops::size(room)
        ),
    };
    ph.explain.push(format!(
        "{at}: {fits}; epochs after the first{} start from them: {} a sample instead of {} \
         ({} to fill it in the first); the same samples come out as from the chain unfused",
        if shared {
            ", in this run and in later runs of the same pipeline through the shared store,"
        } else {
            ""
        },
        ms(rest),
        ms(whole),
        ms(first + rest)
    ));
    ph.cache = Some(CachePlan {
        after: head,
        limit: room,
        shared,
        watch,
    });
    ph
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::FnOp;
    use crate::optimize::placement::place;
    use crate::plan::Op;
    use stoker_core::OpMeta;

    fn op(name: &str, meta: impl Fn(OpMeta) -> OpMeta) -> Op {
        Op::Map(Arc::new(FnOp::new(meta(OpMeta::new(name)), |s, _| {
            Ok(Some(s))
        })))
    }

    /// A decode (deterministic, 3 ms, x5) then a random crop (0.4 ms, x0.25).
    fn decode_then_crop() -> Vec<Op> {
        vec![
            op("decode", |m| m.with_cost_ns(3e6).with_size_ratio(5.0)),
            op("crop", |m| {
                m.random().with_cost_ns(4e5).with_size_ratio(0.25)
            }),
        ]
    }

    fn facts(epochs: Option<u64>, input: u64, room: u64) -> Facts {
        Facts {
            epochs,
            input_bytes: Some(input),
            cache_room: Some(room),
            ..Facts::default()
        }
    }

    #[test]
    fn a_multi_epoch_run_caches_after_the_deterministic_head_when_it_fits_and_pays() {
        let ph = place_cache(
            place(&decode_then_crop()),
            &facts(Some(3), 100 << 20, 1 << 30),
            true,
        );
        assert_eq!(
            ph.cache,
            Some(CachePlan {
                after: 1,
                limit: 1 << 30,
                shared: false,
                watch: None,
            })
        );
        let why = ph.explain.join("\n");
        assert!(why.starts_with("a cache after map[decode]: "), "{why}");
        assert!(why.contains("(500.0 MiB estimated)"), "{why}");
        assert!(why.contains("0.40 ms a sample instead of 3.40 ms"), "{why}");
        // Without an end, too.
        let ph = place_cache(
            place(&decode_then_crop()),
            &facts(None, 100 << 20, 1 << 30),
            true,
        );
        assert!(ph.cache.is_some());
    }

    #[test]
    fn no_cache_for_one_epoch_a_random_head_a_budget_too_small_or_no_gain() {
        let one = place_cache(
            place(&decode_then_crop()),
            &facts(Some(1), 1, 1 << 30),
            true,
        );
        assert_eq!(one.cache, None);
        assert!(one.explain.is_empty(), "{:?}", one.explain);
        let random_first = vec![decode_then_crop()[1].clone(), decode_then_crop()[0].clone()];
        let ph = place_cache(place(&random_first), &facts(Some(3), 1, 1 << 30), true);
        assert_eq!(ph.cache, None);
        assert!(ph.explain.is_empty(), "{:?}", ph.explain);
        let small = place_cache(
            place(&decode_then_crop()),
            &facts(Some(3), 100 << 20, 1 << 28),
            true,
        );
        assert_eq!(small.cache, None);
        assert!(
            small.explain[0].contains(
                "500.0 MiB (estimated), would not fit in half the memory \
                                       budget, 256.0 MiB"
            ),
            "{:?}",
            small.explain
        );
        // A head that costs little next to what follows: two epochs do not pay for it.
        let cheap = vec![
            op("parse", |m| m.with_cost_ns(1e3).with_size_ratio(1.0)),
            op("augment", |m| m.random().with_cost_ns(1e6)),
        ];
        let ph = place_cache(place(&cheap), &facts(Some(2), 1 << 20, 1 << 30), true);
        assert_eq!(ph.cache, None);
        assert!(
            ph.explain[0].contains("would cost more than it saves"),
            "{:?}",
            ph.explain
        );
    }

    #[test]
    fn a_head_without_a_size_ratio_is_cached_and_measured_as_it_fills() {
        // A decoder whose output size depends on the file (declares no ratio).
        let ops = vec![
            op("decode_audio", |m| m.with_cost_ns(3e6)),
            op("mask", |m| m.random().with_cost_ns(2e5)),
        ];
        let ph = place_cache(place(&ops), &facts(Some(2), 100 << 20, 1 << 30), false);
        assert_eq!(
            ph.cache,
            Some(CachePlan {
                after: 1,
                limit: 1 << 30,
                shared: false,
                watch: Some(100 << 20),
            })
        );
        let why = ph.explain.join("\n");
        assert!(why.contains("is measured as it fills"), "{why}");
        assert!(why.contains("first 32 samples"), "{why}");
        // Without the listing's sizes there is nothing to project from.
        let mut f = facts(Some(2), 0, 1 << 30);
        f.input_bytes = None;
        let ph = place_cache(place(&ops), &f, false);
        assert_eq!(ph.cache, None);
        assert!(
            ph.explain[0].contains("the listing gives no sizes"),
            "{:?}",
            ph.explain
        );
        // A measured ratio, where a run has one, is an estimate like a declared one.
        let mut f = facts(Some(2), 100 << 20, 1 << 30);
        f.measured_ratio.insert(0, 4.0);
        let ph = place_cache(place(&ops), &f, false);
        assert_eq!(ph.cache.map(|c| c.watch), Some(None));
        f.measured_ratio.insert(0, 40.0);
        assert_eq!(place_cache(place(&ops), &f, false).cache, None);
    }

    #[test]
    fn a_run_of_one_epoch_caches_for_later_runs_of_spec_operators_only() {
        // One epoch through the shared store: later runs (the next epochs of a PyTorch
        // loop) read the same samples.
        let mut f = facts(Some(1), 100 << 20, 1 << 30);
        f.later_runs = true;
        // A closure is known only by its name: nothing says a later run's is the same.
        let ph = place_cache(place(&decode_then_crop()), &f, true);
        assert_eq!(ph.cache, None);
        assert!(ph.explain.is_empty(), "{:?}", ph.explain);
        let spec: Vec<Op> = [
            r#"{"op": "decode_image", "field": "jpg"}"#,
            r#"{"op": "random_resized_crop", "field": "jpg", "size": 224}"#,
        ]
        .iter()
        .map(|j| {
            Op::Map(Arc::new(
                serde_json::from_str::<crate::ops::Builtin>(j).unwrap(),
            ))
        })
        .collect();
        let ph = place_cache(place(&spec), &f, true);
        assert_eq!(
            ph.cache,
            Some(CachePlan {
                after: 1,
                limit: 1 << 30,
                shared: true,
                watch: None,
            })
        );
        let why = ph.explain.join("\n");
        assert!(
            why.contains("and in later runs of the same pipeline"),
            "{why}"
        );
        // Without later runs, a run of one epoch does not cache them either.
        f.later_runs = false;
        assert_eq!(place_cache(place(&spec), &f, true).cache, None);
    }

    #[test]
    fn measured_costs_and_sizes_win_over_declared_ones() {
        let mut f = facts(Some(3), 100 << 20, 1 << 30);
        // Measured: the decode makes samples 20x (2 GB: too big).
        f.measured_ratio.insert(0, 20.0);
        let ph = place_cache(place(&decode_then_crop()), &f, true);
        assert_eq!(ph.cache, None);
        assert!(ph.explain[0].contains("would not fit"), "{:?}", ph.explain);
        // Measured: the decode costs next to nothing.
        let mut f = facts(Some(2), 100 << 20, 1 << 30);
        f.measured_ns.insert(0, 1e3);
        let ph = place_cache(place(&decode_then_crop()), &f, true);
        assert_eq!(ph.cache, None);
        assert!(
            ph.explain[0].contains("would cost more"),
            "{:?}",
            ph.explain
        );
    }
}
