//! Tokenizer throughput on one thread: texts/s and tokens/s over a generated corpus.
//!
//! ```sh
//! cargo run --release -p stoker-ops --example text_tokenize -- \
//!     [--tokenizer PATH] [--texts 20000] [--rounds 3] [--max-length N --pad-to N] \
//!     [--dump corpus.jsonl]
//! ```
//!
//! The corpus is a deterministic mix of English-like paragraphs (40-160 words) with numbers,
//! punctuation and some accented, CJK and emoji text. `--dump` writes it as JSON lines (one
//! string per line) so `text_tokenize.py` (beside this file) can time Python `tokenizers` on the same
//! texts. Timings are wall clock over whole rounds; the best round is reported.

use std::time::Instant;

use stoker_core::rng::Rng;
use stoker_core::Value;
use stoker_ops::text::{Tokenize, TokenizeParams};

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "data",
    "pipeline",
    "storage",
    "accelerator",
    "training",
    "object",
    "stream",
    "throughput",
    "latency",
    "tokenizer",
    "sequence",
    "gradient",
    "distributed",
    "checkpoint",
    "shuffle",
    "Stoker",
    "GPU",
    "Parquet",
    "S3",
    "epoch",
    "batch",
    "model",
    "language",
    "preprocessing",
    "resumable",
    "deterministic",
    "concurrency",
    "bandwidth",
    "kernel",
    "vocabulary",
];
const EXTRAS: &[&str] = &[
    "caf\u{e9}",
    "na\u{ef}ve",
    "\u{fc}ber",
    "\u{6570}\u{636e}",
    "\u{30c7}\u{30fc}\u{30bf}",
    "\u{1f680}",
    "\u{1f600}",
    "2024",
    "3.14",
    "1,000",
    "(see",
    "above)",
    "\"quoted\"",
    "e.g.",
    "don't",
    "it's",
    "--",
    "#42",
    "https://example.com/x",
];

fn corpus(n: usize) -> Vec<String> {
    let mut rng = Rng::from_words(&[0x5eed, 7]);
    (0..n)
        .map(|_| {
            let words = 40 + rng.below(121) as usize;
            let mut p = String::new();
            for w in 0..words {
                if w > 0 {
                    p.push(' ');
                }
                let word = if rng.below(12) == 0 {
                    EXTRAS[rng.below(EXTRAS.len() as u64) as usize]
                } else {
                    WORDS[rng.below(WORDS.len() as u64) as usize]
                };
                p.push_str(word);
                if rng.below(10) == 0 {
                    p.push(if rng.below(2) == 0 { ',' } else { '.' });
                }
            }
            p
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut tokenizer = format!(
        "{}/tests/fixtures/text/gpt2-tokenizer.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let (mut n, mut rounds, mut dump) = (20_000usize, 3usize, None);
    let mut params = TokenizeParams::new();
    while let Some(a) = args.next() {
        let mut val = || args.next().expect("a value after the flag");
        match a.as_str() {
            "--tokenizer" => tokenizer = val(),
            "--texts" => n = val().parse().expect("a number"),
            "--rounds" => rounds = val().parse().expect("a number"),
            "--max-length" => params = params.max_length(Some(val().parse().expect("a number"))),
            "--pad-to" => params = params.pad_to(Some(val().parse().expect("a number"))),
            "--dump" => dump = Some(val()),
            other => panic!("unknown flag {other}"),
        }
    }
    let texts = corpus(n);
    if let Some(path) = dump {
        let mut out = String::new();
        for t in &texts {
            out.push_str(&json_string(t));
            out.push('\n');
        }
        std::fs::write(&path, out).expect("write the corpus");
        eprintln!("wrote {n} texts to {path}");
    }
    if rounds == 0 {
        return;
    }
    let values: Vec<Value> = texts.iter().map(|t| Value::from(t.as_str())).collect();
    let bytes: usize = texts.iter().map(String::len).sum();
    let tok = Tokenize::from_file(&tokenizer, params).expect("load the tokenizer");
    println!("tokenizer {tokenizer}");
    println!("{n} texts, {:.1} MB, 1 thread", bytes as f64 / 1e6);
    let mut best = f64::INFINITY;
    let mut tokens = 0usize;
    for r in 0..rounds {
        let start = Instant::now();
        tokens = 0;
        for v in &values {
            tokens += tok.encode(v).expect("encode").lengths[0];
        }
        let s = start.elapsed().as_secs_f64();
        best = best.min(s);
        println!(
            "round {r}: {:.3} s, {:.0} texts/s, {:.2} M tokens/s",
            s,
            n as f64 / s,
            tokens as f64 / s / 1e6
        );
    }
    println!(
        "best: {:.0} texts/s, {:.2} M tokens/s, {:.1} MB/s ({tokens} tokens)",
        n as f64 / best,
        tokens as f64 / best / 1e6,
        bytes as f64 / best / 1e6
    );
}

/// A JSON string literal (the corpus has no control characters but quotes and non-ASCII).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
