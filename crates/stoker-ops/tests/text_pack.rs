//! [`Packer`] properties: every token lands in exactly one block, in order; boundaries and
//! positions follow the documents; a checkpointed state resumes exactly.

use proptest::prelude::*;
use stoker_ops::text::{Block, Packer, PackerParams, PackerState, Remainder};

/// Runs `docs` through a packer, then finishes.
fn pack(params: &PackerParams, docs: &[Vec<u32>]) -> Vec<Block> {
    let mut p = Packer::new(params.clone()).unwrap();
    let mut out: Vec<Block> = docs.iter().flat_map(|d| p.push(d)).collect();
    out.extend(p.finish().unwrap());
    out
}

/// The reference: each token with its document, separators included.
fn stream(docs: &[Vec<u32>], sep: Option<u32>) -> Vec<(u32, u64)> {
    docs.iter()
        .enumerate()
        .flat_map(|(d, ids)| ids.iter().copied().chain(sep).map(move |t| (t, d as u64)))
        .collect()
}

fn params() -> impl Strategy<Value = PackerParams> {
    (
        1usize..12,
        prop::option::of(0u32..3),
        prop_oneof![Just(Remainder::Drop), (0u32..3).prop_map(Remainder::Pad)],
    )
        .prop_map(|(b, s, r)| PackerParams::new(b).separator(s).remainder(r))
}

fn docs() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(100u32..200, 0..30), 0..20)
}

proptest! {
    #[test]
    fn every_token_once_in_order_with_its_document(p in params(), docs in docs()) {
        let blocks = pack(&p, &docs);
        let want = stream(&docs, p.separator);
        let mut got = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            prop_assert_eq!(b.input_ids.len(), p.block_size);
            let last = i + 1 == blocks.len();
            // Only the last block may be partial, and only when padding.
            if !last || p.remainder == Remainder::Drop {
                prop_assert_eq!(b.real_len(), p.block_size);
            }
            if let Remainder::Pad(id) = p.remainder {
                prop_assert!(b.input_ids[b.real_len()..].iter().all(|&t| t == id));
            }
            prop_assert_eq!(b.cu_seqlens[0], 0);
            prop_assert!(b.cu_seqlens.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(b.doc_index.len() + 1, b.cu_seqlens.len());
            for (s, w) in b.cu_seqlens.windows(2).enumerate() {
                for t in w[0]..w[1] {
                    got.push((b.input_ids[t as usize], b.doc_index[s]));
                }
            }
        }
        let kept = if p.remainder == Remainder::Drop {
            want.len() / p.block_size * p.block_size
        } else {
            want.len()
        };
        prop_assert_eq!(&got[..], &want[..kept]);
    }

    #[test]
    fn positions_restart_at_every_segment(p in params(), docs in docs()) {
        for b in pack(&p, &docs) {
            let pos = b.position_ids();
            let seg = b.segment_ids();
            for t in 0..b.input_ids.len() {
                if t >= b.real_len() {
                    prop_assert_eq!((pos[t], seg[t]), (0, -1));
                } else if t == 0 || seg[t] != seg[t - 1] {
                    prop_assert_eq!(pos[t], 0);
                    prop_assert_eq!(b.cu_seqlens[seg[t] as usize], t as u32);
                } else {
                    prop_assert_eq!(pos[t], pos[t - 1] + 1);
                }
            }
            // Consecutive segments of a block belong to consecutive documents (no
            // document is split inside a block).
            prop_assert!(b.doc_index.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn a_checkpoint_resumes_exactly(p in params(), docs in docs(), cut in 0usize..20) {
        let whole = pack(&p, &docs);
        let cut = cut.min(docs.len());
        let mut first = Packer::new(p.clone()).unwrap();
        let mut out: Vec<Block> = docs[..cut].iter().flat_map(|d| first.push(d)).collect();
        // Through JSON, as a pipeline checkpoint would carry it.
        let saved = serde_json::to_string(first.state()).unwrap();
        let state: PackerState = serde_json::from_str(&saved).unwrap();
        prop_assert_eq!(first.pending(), &state.pending[..]);
        let mut second = Packer::from_state(p.clone(), state).unwrap();
        out.extend(docs[cut..].iter().flat_map(|d| second.push(d)));
        out.extend(second.finish().unwrap());
        prop_assert_eq!(out, whole);
    }
}
