//! Parity of [`Tokenize`] with the Python `tokenizers` package.
//!
//! `tests/fixtures/text/parity.json` holds texts and the ids and attention masks Python
//! produced for them, per tokenizer (BERT WordPiece of all-MiniLM-L6-v2, GPT-2 byte-level
//! BPE) and configuration; `gen_fixtures.py` beside it made them. Every id must match.

use std::path::PathBuf;

use bytes::Bytes;
use serde_json::Value as Json;
use stoker_core::{DType, Value};
use stoker_ops::text::{Tokenize, TokenizeParams};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text")
}

fn load() -> Json {
    let raw = std::fs::read_to_string(fixtures().join("parity.json")).unwrap();
    serde_json::from_str(&raw).unwrap()
}

fn params_of(cfg: &Json) -> TokenizeParams {
    let u = |k: &str| cfg.get(k).and_then(Json::as_u64);
    let mut p = TokenizeParams::new()
        .add_special_tokens(cfg["add_special_tokens"].as_bool().unwrap())
        .max_length(u("max_length").map(|x| x as usize))
        .pad_to(u("pad_to").map(|x| x as usize))
        .bos_id(u("bos_id").map(|x| x as u32))
        .eos_id(u("eos_id").map(|x| x as u32));
    if let Some(pad) = u("pad_id") {
        p = p.pad_id(pad as u32);
    }
    p
}

fn ints(j: &Json) -> Vec<i64> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

#[test]
fn ids_and_masks_match_python_tokenizers() {
    let fx = load();
    let texts: Vec<&str> = fx["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(texts.len() > 200, "fixture lost its texts");
    let mut checked = 0;
    for case in fx["cases"].as_array().unwrap() {
        let name = case["tokenizer"].as_str().unwrap();
        let cfg = &case["config"];
        let tok = Tokenize::from_file(
            fixtures().join(format!("{name}-tokenizer.json")),
            params_of(cfg),
        )
        .unwrap();
        for (i, text) in texts.iter().enumerate() {
            let want_ids = ints(&case["ids"][i]);
            let want_mask = ints(&case["attention_mask"][i]);
            let got = tok.encode(&Value::from(*text)).unwrap();
            assert_eq!(
                got.input_ids.to_vec::<i64>().unwrap(),
                want_ids,
                "{name} {} text {i} {text:?}",
                cfg["name"]
            );
            assert_eq!(got.attention_mask.to_vec::<i64>().unwrap(), want_mask);
            assert_eq!(got.input_ids.shape(), &[want_ids.len()]);
            checked += 1;
        }
    }
    assert_eq!(checked, texts.len() * 9);
}

#[test]
fn a_column_stacks_to_the_same_rows() {
    let fx = load();
    let texts: Vec<Value> = fx["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| Value::from(t.as_str().unwrap()))
        .collect();
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["tokenizer"] == "minilm" && c["config"]["name"] == "trunc_pad_16")
        .unwrap();
    let tok = Tokenize::from_file(
        fixtures().join("minilm-tokenizer.json"),
        params_of(&case["config"]).dtype(DType::I32),
    )
    .unwrap();
    let out = tok.encode_column(&Value::List(texts.clone())).unwrap();
    assert_eq!(out.input_ids.shape(), &[texts.len(), 16]);
    assert_eq!(out.input_ids.dtype(), DType::I32);
    let want: Vec<i32> = (0..texts.len())
        .flat_map(|i| ints(&case["ids"][i]))
        .map(|x| x as i32)
        .collect();
    assert_eq!(out.input_ids.to_vec::<i32>().unwrap(), want);
    // The long text (index of the first text longer than 1000 bytes) was truncated.
    let long = texts
        .iter()
        .position(|t| t.as_str().unwrap().len() > 1000)
        .unwrap();
    assert_eq!(out.lengths[long], 16);
}

#[test]
fn bytes_encode_like_str() {
    let tok = Tokenize::from_file(
        fixtures().join("gpt2-tokenizer.json"),
        TokenizeParams::new(),
    )
    .unwrap();
    let text = "caf\u{e9} \u{1f600} data";
    let a = tok.encode(&Value::from(text)).unwrap();
    let b = tok
        .encode(&Value::Bytes(Bytes::from(text.as_bytes().to_vec())))
        .unwrap();
    assert_eq!(a, b);
}
