//! The `pack` stage: blocks equal a plain reference packing of the same documents, in the
//! order the pipeline gives them; bookkeeping (positions, segments, `cu_seqlens`, document
//! indices and origins) is right; results do not depend on the thread count; a run stopped
//! anywhere resumes exactly; remainder policies, epochs, batching and bad input.

mod common;

use common::*;
use proptest::prelude::*;
use stoker_core::{Collate, CollatePolicy, Error, OpMeta, Sample, Tensor, Value};
use stoker_pipeline::spec::OpSpec;
use stoker_pipeline::{
    Builtin, ErrorPolicy, FieldOp, FnOp, Item, Pack, PackRemainder, Pipeline, PipelineState,
    RunOptions,
};

/// What one packed block should be, computed without the packer.
#[derive(Debug, Clone, PartialEq)]
struct Want {
    ids: Vec<i64>,
    positions: Vec<i64>,
    segments: Vec<i64>,
    mask: Vec<i64>,
    cu: Vec<i32>,
    docs: Vec<i64>,
}

/// The reference: every document's ids then the separator, one stream, cut every `len`
/// tokens; the last partial block padded with `pad` (or dropped when `pad` is `None`).
/// Positions restart where the document changes and at every block start.
fn reference(docs: &[Vec<i64>], len: usize, sep: Option<i64>, pad: Option<i64>) -> Vec<Want> {
    // (token, document) for the whole stream.
    let mut stream = Vec::new();
    for (d, ids) in docs.iter().enumerate() {
        for &t in ids.iter().chain(sep.iter()) {
            stream.push((t, d as i64));
        }
    }
    let mut out = Vec::new();
    for chunk in stream.chunks(len) {
        if chunk.len() < len && pad.is_none() {
            break;
        }
        let mut w = Want {
            ids: vec![],
            positions: vec![],
            segments: vec![],
            mask: vec![],
            cu: vec![],
            docs: vec![],
        };
        for (i, &(t, d)) in chunk.iter().enumerate() {
            if i == 0 || chunk[i - 1].1 != d {
                w.cu.push(i as i32);
                w.docs.push(d);
            }
            let start = *w.cu.last().unwrap() as i64;
            w.ids.push(t);
            w.positions.push(i as i64 - start);
            w.segments.push(w.docs.len() as i64 - 1);
            w.mask.push(1);
        }
        w.cu.push(chunk.len() as i32);
        while w.ids.len() < len {
            w.ids.push(pad.unwrap());
            w.positions.push(0);
            w.segments.push(-1);
            w.mask.push(0);
        }
        out.push(w);
    }
    out
}

fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Tensor(t) => t
            .to_vec::<i64>()
            .or_else(|| {
                t.to_vec::<i32>()
                    .map(|v| v.into_iter().map(i64::from).collect())
            })
            .unwrap(),
        v => panic!("not a tensor: {v:?}"),
    }
}

/// A block sample as a [`Want`].
fn got(s: &Sample) -> Want {
    let t = |f: &str| ints(s.get(f).unwrap_or_else(|| panic!("no {f}")));
    Want {
        ids: t("input_ids"),
        positions: t("position_ids"),
        segments: t("segment_ids"),
        mask: t("attention_mask"),
        cu: t("cu_seqlens").into_iter().map(|x| x as i32).collect(),
        docs: t("doc_index"),
    }
}

fn samples(p: &Pipeline) -> Vec<Sample> {
    p.run()
        .unwrap()
        .map(|i| i.unwrap().into_sample().unwrap())
        .collect()
}

/// Documents in memory: `input_ids` tensors of seeded random lengths (empty ones too) and
/// ids.
fn docs(n: usize, max_len: usize, seed: u64) -> Vec<Vec<i64>> {
    let mut rng = stoker_pipeline::rng::Rng::from_words(&[seed, 99]);
    (0..n)
        .map(|_| {
            let len = rng.below(max_len as u64 + 1) as usize;
            (0..len).map(|_| 1 + rng.below(50_000) as i64).collect()
        })
        .collect()
}

fn doc_samples(docs: &[Vec<i64>]) -> Vec<Sample> {
    docs.iter()
        .enumerate()
        .map(|(i, ids)| {
            let mut s = Sample::new();
            s.insert("__key__", format!("d{i}"));
            s.insert("text", format!("document {i}"));
            s.insert(
                "input_ids",
                Tensor::from_slice(vec![ids.len()], ids).unwrap(),
            );
            s
        })
        .collect()
}

fn opts(threads: usize) -> RunOptions {
    RunOptions::default()
        .with_threads(threads)
        .with_autotune(false)
        .with_window(16)
}

#[test]
fn blocks_equal_the_reference_packing() {
    for (seed, len, sep, remainder) in [
        (1, 8, Some(0), PackRemainder::Pad),
        (2, 8, None, PackRemainder::Pad),
        (3, 5, Some(7), PackRemainder::Drop),
        (4, 1, None, PackRemainder::Drop),
        (5, 64, Some(50_256), PackRemainder::Pad),
        (6, 3, Some(1), PackRemainder::Pad),
    ] {
        let d = docs(60, 20, seed);
        let pack = Pack::new(len).separator(sep).remainder(remainder).pad_id(9);
        let blocks = samples(
            &Pipeline::from_samples(doc_samples(&d))
                .pack(pack)
                .options(opts(2)),
        );
        let pad = (remainder == PackRemainder::Pad).then_some(9);
        let want = reference(&d, len, sep.map(i64::from), pad);
        assert!(want.len() > 2, "{seed}");
        let got: Vec<Want> = blocks.iter().map(got).collect();
        assert_eq!(got, want, "seed {seed} len {len} sep {sep:?}");
        // Origins: a memory source's sample i is shard i, record 0.
        for b in &blocks {
            let origin = ints(b.get("doc_origin").unwrap());
            let index = ints(b.get("doc_index").unwrap());
            let pairs: Vec<i64> = index.iter().flat_map(|&d| [d, 0]).collect();
            assert_eq!(origin, pairs);
            assert_eq!(b.get("text"), None, "input fields are not carried over");
        }
    }
}

#[test]
fn a_hand_checked_layout() {
    // The layout in the kernel's docs: a b c | d e f g h with separator 0, blocks of 8.
    let d = vec![vec![1, 2, 3], vec![4, 5, 6, 7, 8]];
    let blocks = samples(
        &Pipeline::from_samples(doc_samples(&d))
            .pack(Pack::new(8).separator(Some(0)).keys(true))
            .options(opts(1)),
    );
    assert_eq!(blocks.len(), 2);
    let b = got(&blocks[0]);
    assert_eq!(b.ids, vec![1, 2, 3, 0, 4, 5, 6, 7]);
    assert_eq!(b.positions, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    assert_eq!(b.segments, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(b.cu, vec![0, 4, 8]);
    assert_eq!(b.docs, vec![0, 1]);
    let b = got(&blocks[1]);
    assert_eq!(b.ids, vec![8, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(b.positions, vec![0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(b.segments, vec![0, 0, -1, -1, -1, -1, -1, -1]);
    assert_eq!(b.mask, vec![1, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(b.cu, vec![0, 2]);
    assert_eq!(b.docs, vec![1]);
    assert_eq!(
        blocks[0].get("doc_keys"),
        Some(&Value::List(vec!["d0".into(), "d1".into()]))
    );
    assert_eq!(
        blocks[1].get("doc_keys"),
        Some(&Value::List(vec!["d1".into()]))
    );
    let shape = |f: &str| match blocks[0].get(f) {
        Some(Value::Tensor(t)) => (t.shape().to_vec(), t.dtype().name()),
        v => panic!("{f}: {v:?}"),
    };
    assert_eq!(shape("input_ids"), (vec![8], "int64"));
    assert_eq!(shape("cu_seqlens"), (vec![3], "int32"));
    assert_eq!(shape("doc_origin"), (vec![2, 2], "int64"));
}

/// Documents from the line shards on the test server: each line's bytes are its ids.
fn tokenized(p: Pipeline) -> Pipeline {
    p.map(FnOp::new(
        OpMeta::new("bytes_as_ids"),
        |mut s: Sample, _| {
            let ids: Vec<i64> = match s.get("txt") {
                Some(Value::Bytes(b)) => b.iter().map(|&x| i64::from(x)).collect(),
                v => return Err(Error::operator(format!("txt is {v:?}"))),
            };
            s.insert("input_ids", Tensor::from_slice(vec![ids.len()], &ids)?);
            Ok(Some(s))
        },
    ))
}

fn ids_of_docs(p: &Pipeline) -> Vec<Vec<i64>> {
    samples(p)
        .iter()
        .map(|s| ints(s.get("input_ids").unwrap()))
        .collect()
}

#[test]
fn shuffled_sharded_documents_pack_in_the_order_the_pipeline_gives_them() {
    let base = || {
        tokenized(shards().interleave(3).shuffle_shards(true))
            .shuffle(17)
            .seed(5)
    };
    // The documents in the order the pipeline yields them without the pack stage.
    let d = ids_of_docs(&base().options(opts(2)));
    assert_eq!(d.len(), 203);
    let want = reference(&d, 16, Some(10), Some(0));
    for threads in [1, 2, 4] {
        let blocks = samples(
            &base()
                .pack(Pack::new(16).separator(Some(10)))
                .options(opts(threads)),
        );
        let got: Vec<Want> = blocks.iter().map(got).collect();
        assert_eq!(got, want, "{threads} threads");
    }
}

#[test]
fn pack_then_batch_stacks_blocks() {
    let d = docs(40, 12, 7);
    let p = Pipeline::from_samples(doc_samples(&d))
        .pack(Pack::new(6).separator(Some(0)).dtype("int32"))
        .batch(4, false)
        .options(opts(2));
    let batches: Vec<_> = p
        .run()
        .unwrap()
        .map(|i| i.unwrap().into_batch().unwrap())
        .collect();
    let want = reference(&d, 6, Some(0), Some(0));
    assert_eq!(
        batches.iter().map(|b| b.len()).sum::<usize>(),
        want.len(),
        "every block once"
    );
    for (k, b) in batches.iter().enumerate() {
        let Some(Value::Tensor(ids)) = b.get("input_ids") else {
            panic!("{b:?}")
        };
        assert_eq!(ids.shape(), &[b.len(), 6]);
        assert_eq!(ids.dtype().name(), "int32");
        let rows: Vec<i32> = ids.to_vec().unwrap();
        let want_rows: Vec<i32> = want[k * 4..k * 4 + b.len()]
            .iter()
            .flat_map(|w| w.ids.iter().map(|&x| x as i32))
            .collect();
        assert_eq!(rows, want_rows);
    }
    // Blocks have different numbers of segments: `cu_seqlens`, `doc_index` and
    // `doc_origin` stack only under `pad` (with -1 here).
    let p = Pipeline::from_samples(doc_samples(&d))
        .pack(Pack::new(6).separator(Some(0)))
        .batch_with(
            4,
            false,
            CollatePolicy {
                default: Collate::Pad(-1.0),
                fields: vec![],
            },
        )
        .options(opts(2));
    let mut blocks = 0;
    for b in p.run().unwrap() {
        let b = b.unwrap().into_batch().unwrap();
        let Some(Value::Tensor(cu)) = b.get("cu_seqlens") else {
            panic!("{b:?}")
        };
        let width = cu.shape()[1];
        let rows: Vec<i32> = cu.to_vec().unwrap();
        for (r, row) in rows.chunks(width).enumerate() {
            let real: Vec<i32> = row.iter().copied().filter(|&x| x >= 0).collect();
            assert_eq!(real, want[blocks + r].cu);
        }
        let Some(Value::Tensor(origin)) = b.get("doc_origin") else {
            panic!("{b:?}")
        };
        assert_eq!(origin.shape(), &[b.len(), width - 1, 2]);
        blocks += b.len();
    }
    assert_eq!(blocks, want.len());
}

#[test]
fn remainder_policies_and_epochs() {
    // 10 documents of 3 ids + separator: 40 tokens, blocks of 6: 6 full, 4 left over.
    let d: Vec<Vec<i64>> = (0..10)
        .map(|i| vec![i * 10 + 1, i * 10 + 2, i * 10 + 3])
        .collect();
    let run = |r: PackRemainder| {
        samples(
            &Pipeline::from_samples(doc_samples(&d))
                .pack(Pack::new(6).separator(Some(0)).remainder(r).pad_id(5))
                .epochs(Some(2))
                .options(opts(2)),
        )
    };
    let padded = run(PackRemainder::Pad);
    let dropped = run(PackRemainder::Drop);
    assert_eq!(padded.len(), 2 * 7);
    assert_eq!(dropped.len(), 2 * 6);
    // A block never spans the epoch boundary: each epoch is packed on its own, the same
    // way (no shuffling here), with document indices from 0.
    assert_eq!(padded[..7], padded[7..]);
    assert_eq!(dropped[..6], dropped[6..]);
    assert_eq!(padded[..6], dropped[..6]);
    let last = got(&padded[6]);
    assert_eq!(last.ids, vec![91, 92, 93, 0, 5, 5]);
    assert_eq!(last.mask, vec![1, 1, 1, 1, 0, 0]);
    assert_eq!(last.segments, vec![0, 0, 0, 0, -1, -1]);
    assert_eq!(last.positions, vec![0, 1, 2, 3, 0, 0]);
    assert_eq!(last.cu, vec![0, 4]);
    assert_eq!(last.docs, vec![9]);
    assert_eq!(got(&padded[7]).docs, vec![0, 1]);
    // Stopping at the epoch boundary and resuming there loses nothing.
    let p = Pipeline::from_samples(doc_samples(&d))
        .pack(Pack::new(6).separator(Some(0)).pad_id(5))
        .epochs(Some(2))
        .options(opts(2));
    let mut r = p.run().unwrap();
    let head: Vec<_> = r.by_ref().take(7).map(Result::unwrap).collect();
    assert_eq!(head.len(), 7);
    let rest: Vec<Sample> = p
        .resume(&r.state().unwrap())
        .unwrap()
        .map(|i| i.unwrap().into_sample().unwrap())
        .collect();
    assert_eq!(rest, padded[7..]);
}

#[test]
fn long_documents_are_split_across_blocks() {
    let d = vec![vec![1; 3], (100..125).collect::<Vec<i64>>(), vec![2; 2]];
    let blocks = samples(
        &Pipeline::from_samples(doc_samples(&d))
            .pack(Pack::new(8).separator(Some(0)))
            .options(opts(1)),
    );
    let got: Vec<Want> = blocks.iter().map(got).collect();
    assert_eq!(got, reference(&d, 8, Some(0), Some(0)));
    // The 26-token document (with its separator) covers blocks 0 to 3; positions restart
    // at each block start.
    assert_eq!(got[1].docs, vec![1]);
    assert_eq!(got[1].positions, (0..8).collect::<Vec<i64>>());
    assert_eq!(got[3].docs, vec![1, 2]);
}

#[test]
fn bad_documents_are_named() {
    let to_str = FnOp::new(OpMeta::new("break_s2"), |mut s: Sample, _| {
        if s.key() == Some("shards/s2.txt:4") {
            s.insert("input_ids", "not ids");
        }
        Ok(Some(s))
    });
    let p = tokenized(shards())
        .map(to_str)
        .pack(Pack::new(8))
        .options(opts(2));
    let e = p
        .run()
        .unwrap()
        .find_map(Result::err)
        .expect("an error")
        .to_string();
    assert!(e.contains("pack(input_ids, 8)"), "{e}");
    assert!(e.contains("s2.txt record 4"), "{e}");
    assert!(e.contains("are a str"), "{e}");

    // A missing field, named with the fields there are.
    let drop_ids = FnOp::new(OpMeta::new("drop_ids"), |mut s: Sample, _| {
        if s.key() == Some("shards/s0.txt:7") {
            s.remove("input_ids");
        }
        Ok(Some(s))
    });
    let p = tokenized(shards())
        .map(drop_ids)
        .pack(Pack::new(8))
        .options(opts(2));
    let e = p.run().unwrap().find_map(Result::err).unwrap().to_string();
    assert!(e.contains("pack(input_ids, 8)"), "{e}");
    assert!(e.contains("s0.txt record 7"), "{e}");
    assert!(e.contains("no field \"input_ids\""), "{e}");

    // Floats and negative ids.
    for (v, want) in [
        (
            Value::Tensor(Tensor::from_slice(vec![2], &[1.0f32, 2.0]).unwrap()),
            "float32",
        ),
        (Value::List(vec![Value::Int(3), Value::Int(-2)]), "(-2)"),
    ] {
        let mut s = Sample::new();
        s.insert("input_ids", v);
        let e = Pipeline::from_samples(vec![s])
            .pack(Pack::new(4))
            .run()
            .unwrap()
            .find_map(Result::err)
            .unwrap()
            .to_string();
        assert!(e.contains("pack(input_ids, 4)") && e.contains(want), "{e}");
    }

    // Skipped under `errors = skip`: the block goes on with the next document.
    let mut d = doc_samples(&[vec![1, 2], vec![3], vec![4, 5]]);
    d[1].insert("input_ids", "bad");
    let p = Pipeline::from_samples(d)
        .pack(Pack::new(2).remainder(PackRemainder::Drop))
        .options(opts(1).with_errors(ErrorPolicy::Skip));
    let mut run = p.run().unwrap();
    let blocks: Vec<Want> = run
        .by_ref()
        .map(|i| got(&i.unwrap().into_sample().unwrap()))
        .collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].ids, vec![1, 2]);
    assert_eq!(blocks[1].ids, vec![4, 5]);
    assert_eq!(run.stats().skipped, 1);
}

#[test]
fn pack_after_batch_is_refused() {
    let p = Pipeline::from_samples(doc_samples(&docs(8, 4, 1)))
        .batch(2, false)
        .pack(Pack::new(4));
    let e = p.run().unwrap().find_map(Result::err).unwrap().to_string();
    assert!(e.contains("pack(input_ids, 4) takes samples"), "{e}");
}

#[test]
fn the_spec_names_pack() {
    let op: OpSpec = serde_json::from_value(serde_json::json!({
        "op": "pack", "field": "ids", "block_size": 4, "separator": 2,
        "remainder": "drop", "pad_id": 1, "dtype": "int32", "keys": true
    }))
    .unwrap();
    let OpSpec::Pack(p) = &op else {
        panic!("{op:?}")
    };
    assert_eq!(
        *p,
        Pack::new(4)
            .field("ids")
            .separator(Some(2))
            .remainder(PackRemainder::Drop)
            .pad_id(1)
            .dtype("int32")
            .keys(true)
    );
    let p = op.apply(Pipeline::from_samples(vec![])).unwrap();
    assert!(p.explain().contains("pack(ids, 4)"), "{}", p.explain());
    // Defaults.
    let op: OpSpec =
        serde_json::from_value(serde_json::json!({"op": "pack", "block_size": 8})).unwrap();
    assert!(matches!(&op, OpSpec::Pack(p) if *p == Pack::new(8)));
    // Mistakes.
    for (bad, want) in [
        (
            serde_json::json!({"op": "pack", "block_size": 0}),
            "block_size",
        ),
        (
            serde_json::json!({"op": "pack", "block_size": 4, "dtype": "float32"}),
            "dtype",
        ),
    ] {
        let op: OpSpec = serde_json::from_value(bad).unwrap();
        let e = op
            .apply(Pipeline::from_samples(vec![]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    for bad in [
        serde_json::json!({"op": "pack", "block_size": 4, "remainder": "keep"}),
        serde_json::json!({"op": "pack", "block_size": 4, "length": 4}),
        serde_json::json!({"op": "pack"}),
    ] {
        assert!(
            serde_json::from_value::<OpSpec>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    // In a TOML spec, after tokenize's output.
    let spec: stoker_pipeline::PipelineSpec = toml::from_str(
        r#"
        source = "file:///tmp/x/"
        format = "jsonl"
        [[ops]]
        op = "pack"
        block_size = 2048
        separator = 50256
        [[ops]]
        op = "batch"
        size = 8
        "#,
    )
    .unwrap();
    assert!(matches!(&spec.ops[0], OpSpec::Pack(p) if p.block_size == 2048));
}

#[test]
fn resume_with_a_shuffle_after_pack_is_refused() {
    let p = Pipeline::from_samples(doc_samples(&docs(20, 5, 1)))
        .pack(Pack::new(4))
        .shuffle(3);
    let mut r = p.run().unwrap();
    r.next();
    let e = r.state().unwrap_err().to_string();
    assert!(e.contains("shuffle after pack"), "{e}");
}

#[test]
fn resume_with_unbatch_and_pack_is_refused() {
    let p = Pipeline::from_samples(doc_samples(&docs(20, 5, 1)))
        .pack(Pack::new(4))
        .batch(2, false)
        .unbatch();
    let mut r = p.run().unwrap();
    r.next().unwrap().unwrap();
    let e = r.state().unwrap_err().to_string();
    assert!(e.contains("unbatch together with pack"), "{e}");
}

#[test]
fn the_state_holds_positions_not_tokens() {
    // Blocks of 2048 from documents of about 500 tokens, batches of 8: a checkpoint in the
    // middle of a batch names a few dozen documents, not 16,000 ids.
    let d = docs(400, 1000, 3);
    let p = Pipeline::from_samples(doc_samples(&d))
        .pack(Pack::new(2048).separator(Some(0)))
        .batch(8, false)
        .options(opts(2));
    let mut r = p.run().unwrap();
    r.next().unwrap().unwrap();
    let json = r.state().unwrap().to_json();
    assert!(json.len() < 4000, "{} bytes: {json}", json.len());
}

// Exact resume.

#[derive(Debug, Clone)]
struct Shape {
    store: bool,
    buffer: Option<usize>,
    len: usize,
    sep: bool,
    drop: bool,
    between: Option<(bool, u64)>,
    batch: Option<(usize, bool)>,
    take: Option<u64>,
    random_after: bool,
    epochs: u64,
    seed: u64,
    threads: usize,
}

fn build(s: &Shape) -> Pipeline {
    let mut p = if s.store {
        tokenized(shards().interleave(2).shuffle_shards(true))
    } else {
        Pipeline::from_samples(doc_samples(&docs(60, 16, s.seed)))
    };
    if let Some(b) = s.buffer {
        p = p.shuffle(b);
    }
    let pack = Pack::new(s.len)
        .separator(s.sep.then_some(0))
        .remainder(if s.drop {
            PackRemainder::Drop
        } else {
            PackRemainder::Pad
        });
    p = p.pack(pack);
    if s.random_after {
        p = p.map(Builtin::Fields(FieldOp::RandomInt {
            to: "r".into(),
            below: 1000,
        }));
    }
    match s.between {
        Some((true, n)) => p = p.take(n),
        Some((false, n)) => p = p.skip(n),
        None => {}
    }
    if let Some((n, drop_last)) = s.batch {
        p = p.batch(n, drop_last);
    }
    if let Some(n) = s.take {
        p = p.take(n);
    }
    p.epochs(Some(s.epochs))
        .seed(s.seed)
        .options(opts(s.threads))
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        (
            any::<bool>(),
            proptest::option::of(1usize..20),
            1usize..12,
            any::<bool>(),
            any::<bool>(),
        ),
        (
            proptest::option::of((any::<bool>(), 0u64..30)),
            proptest::option::of((1usize..6, any::<bool>())),
            proptest::option::of(1u64..40),
            any::<bool>(),
        ),
        (1u64..3, any::<u64>(), 1usize..4),
    )
        .prop_map(
            |(
                (store, buffer, len, sep, drop),
                (between, batch, take, random_after),
                (epochs, seed, threads),
            )| Shape {
                store,
                buffer,
                len,
                sep,
                drop,
                between,
                batch,
                take,
                random_after,
                epochs,
                seed,
                threads,
            },
        )
}

fn collect(run: impl Iterator<Item = Result<Item, Error>>) -> Vec<Item> {
    run.map(Result::unwrap).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn resuming_anywhere_yields_exactly_the_rest(
        s in shape(),
        stop in 0.0f64..1.0,
        stop2 in 0.0f64..1.0,
    ) {
        let p = build(&s);
        let full = collect(p.run().unwrap());
        // The same with another thread count.
        let other = build(&Shape { threads: 5 - s.threads, ..s.clone() });
        prop_assert_eq!(&collect(other.run().unwrap()), &full);
        let k = ((full.len() as f64) * stop) as usize;
        let mut run = p.run().unwrap();
        let head: Vec<Item> = run.by_ref().take(k).map(Result::unwrap).collect();
        prop_assert_eq!(&head[..], &full[..k]);
        let state = PipelineState::from_json(&run.state().unwrap().to_json()).unwrap();
        drop(run);
        let mut resumed = p.resume(&state).unwrap();
        let k2 = (((full.len() - k) as f64) * stop2) as usize;
        let mid: Vec<Item> = resumed.by_ref().take(k2).map(Result::unwrap).collect();
        prop_assert_eq!(&mid[..], &full[k..k + k2]);
        let state2 = PipelineState::from_json(&resumed.state().unwrap().to_json()).unwrap();
        drop(resumed);
        let tail = collect(p.resume(&state2).unwrap());
        prop_assert_eq!(&tail[..], &full[k + k2..]);
    }
}

#[test]
fn resuming_at_every_item_yields_exactly_the_rest() {
    // Every stop point of a few shapes, including a checkpoint in the middle of a long
    // document and in the middle of a batch of blocks.
    for (len, batch, between) in [(4, None, None), (5, Some(3), None), (3, Some(2), Some(2))] {
        let s = Shape {
            store: false,
            buffer: Some(5),
            len,
            sep: true,
            drop: false,
            between: between.map(|n| (true, n + 20)),
            batch: batch.map(|n| (n, false)),
            take: None,
            random_after: true,
            epochs: 2,
            seed: 11,
            threads: 2,
        };
        let p = build(&s);
        let full = collect(p.run().unwrap());
        assert!(full.len() > 20);
        for k in 0..=full.len() {
            let mut run = p.run().unwrap();
            run.by_ref().take(k).for_each(|i| drop(i.unwrap()));
            let st = run.state().unwrap();
            drop(run);
            let rest: Vec<Item> = match p.resume(&st).unwrap().collect::<Result<_, _>>() {
                Ok(r) => r,
                Err(e) => panic!("len {len} batch {batch:?} stop {k}: {e} {}", st.to_json()),
            };
            assert_eq!(rest, full[k..], "len {len} batch {batch:?} stop {k}");
        }
    }
}

#[test]
fn tokenize_then_pack_from_a_toml_spec() {
    // Two JSONL shards of text, tokenized with GPT-2's tokenizer.json, packed into blocks of
    // 16 with its <|endoftext|> between documents, batched by 4: the batches' rows are the
    // reference packing of the ids the same spec gives without pack and batch. The run is
    // then stopped in the middle and resumed.
    let dir = tempfile::tempdir().unwrap();
    let words = [
        "data",
        "keeps",
        "the",
        "accelerator",
        "fed",
        "ünïcödé",
        "🚀",
        "tokens",
    ];
    let mut n = 0;
    for shard in 0..2 {
        let mut body = String::new();
        for line in 0..25 {
            let k = 1 + (shard * 31 + line * 7) % 13;
            let text: Vec<&str> = (0..k).map(|j| words[(line + j) % words.len()]).collect();
            body.push_str(&serde_json::json!({ "text": text.join(" ") }).to_string());
            body.push('\n');
            n += 1;
        }
        std::fs::write(dir.path().join(format!("part-{shard}.jsonl")), body).unwrap();
    }
    let tokenizer = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../stoker-ops/tests/fixtures/text/gpt2-tokenizer.json");
    let spec = |ops: &str| -> Pipeline {
        let text = format!(
            r#"
            source = "file://{}/"
            format = "jsonl"
            seed = 3
            shuffle_shards = true
            [[ops]]
            op = "tokenize"
            field = "text"
            tokenizer = "{}"
            {ops}
            [options]
            threads = 2
            "#,
            dir.path().display(),
            tokenizer.display()
        );
        let spec: stoker_pipeline::PipelineSpec = toml::from_str(&text).unwrap();
        spec.build(Default::default()).unwrap()
    };
    let d = ids_of_docs(&spec(""));
    assert_eq!(d.len(), n);
    let want = reference(&d, 16, Some(50_256), Some(0));
    let p = spec(
        r#"
        [[ops]]
        op = "pack"
        block_size = 16
        separator = 50256
        [[ops]]
        op = "batch"
        size = 4
        "#,
    );
    let full = collect(p.run().unwrap());
    let mut rows = Vec::new();
    for item in &full {
        let Item::Batch(b) = item else {
            panic!("{item:?}")
        };
        let Some(Value::Tensor(ids)) = b.get("input_ids") else {
            panic!("{b:?}")
        };
        assert_eq!(ids.shape()[1], 16);
        rows.extend(ids.to_vec::<i64>().unwrap());
    }
    let want_rows: Vec<i64> = want.iter().flat_map(|w| w.ids.clone()).collect();
    assert_eq!(rows, want_rows);
    let k = full.len() / 2;
    let mut run = p.run().unwrap();
    run.by_ref().take(k).for_each(|i| drop(i.unwrap()));
    let st = PipelineState::from_json(&run.state().unwrap().to_json()).unwrap();
    drop(run);
    assert_eq!(collect(p.resume(&st).unwrap()), full[k..]);
}

#[test]
fn a_state_with_a_batch_of_blocks_being_filled_is_refused() {
    let p = Pipeline::from_samples(doc_samples(&docs(20, 5, 1)))
        .pack(Pack::new(4))
        .batch(2, false);
    let mut r = p.run().unwrap();
    r.next().unwrap().unwrap();
    let mut st = r.state().unwrap();
    drop(r);
    st.stages[1] = stoker_pipeline::StageState::Batch {
        partial: vec![stoker_pipeline::ItemPos::Sample(stoker_pipeline::Pos {
            shard: u32::MAX,
            record: 2,
        })],
    };
    let e = p
        .resume(&st)
        .unwrap()
        .find_map(Result::err)
        .unwrap()
        .to_string();
    assert!(e.contains("batch of packed blocks"), "{e}");
}
