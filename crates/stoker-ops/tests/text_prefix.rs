//! [`Tokenize`]'s prefix path: with truncation, a long text is encoded only as far as the
//! kept tokens need, and the ids are exactly the whole text's.
//!
//! Every check compares the prefix path with the same `Tokenize` turned to whole texts
//! (`whole_text`, the code `text_parity.rs` holds to Python's ids), over random texts,
//! the fixture tokenizers and variants of their files: other normalizers, pre-tokenizers,
//! a Unigram model, added tokens that strip spaces or are matched after normalization.

use std::path::PathBuf;

use serde_json::{json, Value as Json};
use stoker_core::Value;
use stoker_ops::text::{Tokenize, TokenizeParams};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    NormalizedString, Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer,
};

fn fixture(name: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/text/{name}-tokenizer.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// xorshift64*: a fixed seed gives the same texts on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn str(&mut self, xs: &[&'static str]) -> &'static str {
        xs[self.below(xs.len())]
    }
}

/// Words, and things that are hard on a cut: combining marks (also right after a space),
/// compatibility characters that decompose to a space and a mark, final sigma, `İ` (two
/// characters lowercased), CJK, emoji with joiners, zero-width and control characters,
/// special-token text, contractions (GPT-2's regex matches `'s` on its own).
const WORDS: &[&str] = &[
    "the",
    "a",
    "of",
    "Stoker",
    "stoker",
    "STOKER",
    "hello",
    "world",
    "tokenizer",
    "don't",
    "it's",
    "we're",
    "I'll",
    "they've",
    "'s",
    "'",
    "café",
    "naïve",
    "Ünïcödé",
    "straße",
    "ΣΊΣΥΦΟΣ",
    "ὈΔΥΣΣΕΎΣ",
    "Москва",
    "İstanbul",
    "ﬁnance",
    "e\u{301}",
    "a\u{308}\u{301}",
    "\u{301}",
    "\u{b4}",
    "\u{a8}x",
    "\u{1fbd}",
    "中文字符",
    "日本語のテキスト",
    "한국어",
    "👍🏽",
    "👨\u{200d}👩\u{200d}👧",
    "🤖",
    "x²",
    "½",
    "Ⅻ",
    "ｆｕｌｌ",
    "<|endoftext|>",
    "<mask>",
    "[MASK]",
    "[SEP]",
    "[CLS]",
    "<s>",
    "</s>",
    "3.14159",
    "2024",
    "1,000,000",
    "0x1F",
    "foo_bar",
    "--",
    "...",
    "!!!",
    "?",
    "\"quoted\"",
    "(paren)",
    "#tag",
    "@user",
    "http://example.com/a?b=c",
    "\u{200b}",
    "\u{feff}",
    "\u{1}",
    "\u{fffd}",
    "\u{85}",
    "\u{2028}",
    "\u{180e}",
    "\u{300}\u{316}",
    "ǅ",
    "ß",
    "ﬀ",
    "Å",
    "Ω",
    "K",
];

/// Separators: mostly one space, else runs and other whitespace, or nothing.
const SEPARATORS: &[&str] = &[
    "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "", "\u{a0}", "\u{3000}", " \t ", ". ", ", ",
    " \u{301}", "\u{a0} ", " \u{a0}", "\n ",
];

fn long_word(rng: &mut Rng) -> String {
    let unit = *rng.pick(&[
        "abc",
        "1234567890",
        "中文",
        "é",
        "-",
        "e\u{301}",
        "👍",
        "x_",
    ]);
    unit.repeat(5 + rng.below(150))
}

fn text(rng: &mut Rng) -> String {
    let pieces = *rng.pick(&[0, 1, 3, 10, 40, 150, 600]);
    let pieces = rng.below(pieces + 1);
    let mut s = String::new();
    if rng.below(8) == 0 {
        s.push_str(rng.str(SEPARATORS));
    }
    for _ in 0..pieces {
        if rng.below(40) == 0 {
            s.push_str(&long_word(rng));
        } else {
            s.push_str(rng.str(WORDS));
        }
        if rng.below(3) == 0 {
            s.push_str(rng.str(SEPARATORS));
        } else {
            s.push(' ');
        }
    }
    s
}

fn with(mut j: Json, key: &str, value: Json) -> Json {
    j[key] = value;
    j
}

fn add_tokens(mut j: Json, tokens: &[Json]) -> Json {
    j["added_tokens"]
        .as_array_mut()
        .unwrap()
        .extend(tokens.iter().cloned());
    j
}

fn added(id: u32, content: &str, lstrip: bool, rstrip: bool, single: bool, norm: bool) -> Json {
    json!({"id": id, "content": content, "single_word": single, "lstrip": lstrip,
           "rstrip": rstrip, "normalized": norm, "special": !norm})
}

/// A small Unigram model over the test alphabet: every character, `▁`, and the words with
/// and without `▁`.
fn unigram() -> Json {
    let mut vocab = vec![
        json!(["<unk>", 0.0]),
        json!(["<s>", 0.0]),
        json!(["</s>", 0.0]),
    ];
    let mut seen: std::collections::BTreeSet<String> =
        ["<unk>", "<s>", "</s>"].map(String::from).into();
    for w in WORDS.iter().chain(SEPARATORS) {
        for c in w
            .chars()
            .chain("▁abcdefghijklmnopqrstuvwxyz0123456789".chars())
        {
            if seen.insert(c.to_string()) {
                vocab.push(json!([c.to_string(), -8.0]));
            }
        }
        for piece in [w.to_lowercase(), format!("▁{}", w.to_lowercase())] {
            if !w.is_empty() && seen.insert(piece.clone()) {
                vocab.push(json!([piece, -4.0 - piece.chars().count() as f64 * 0.1]));
            }
        }
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(1, "<s>", false, false, false, false),
                         added(2, "</s>", false, false, false, false)],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                          "split": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "</s>", "type_id": 1}}],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": null,
        "model": {"type": "Unigram", "unk_id": 0, "vocab": vocab, "byte_fallback": false},
    })
}

/// Tokenizer files the prefix path takes (`true`) or refuses (`false`), by name.
fn configurations() -> Vec<(&'static str, Json, bool)> {
    let gpt2 = fixture("gpt2");
    let bert = fixture("minilm");
    let ws = |t: &str| json!({"type": t});
    let seq_n = |ns: Vec<Json>| json!({"type": "Sequence", "normalizers": ns});
    let seq_p = |ps: Vec<Json>| json!({"type": "Sequence", "pretokenizers": ps});
    let byte_level = |prefix: bool, regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true,
               "use_regex": regex})
    };
    let metaspace = |scheme: &str, split: bool| {
        json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
               "split": split})
    };
    // RoBERTa's layout over GPT-2's vocabulary: a space before the text, `<s> .. </s>`
    // (here both `<|endoftext|>`), a `<mask>` that eats the spaces before it, and a
    // normalized single-word token matched in the lowercased text.
    let roberta = add_tokens(
        with(
            with(
                with(gpt2.clone(), "pre_tokenizer", byte_level(true, true)),
                "normalizer",
                seq_n(vec![ws("NFC"), ws("Lowercase")]),
            ),
            "post_processor",
            json!({"type": "RobertaProcessing", "sep": ["<|endoftext|>", 50256],
                   "cls": ["<|endoftext|>", 50256], "trim_offsets": true,
                   "add_prefix_space": true}),
        ),
        &[
            added(50257, "<mask>", true, false, false, false),
            added(50258, "Stoker", false, true, true, true),
        ],
    );
    let bert_tokens = add_tokens(
        bert.clone(),
        &[
            added(30522, "<mask>", true, true, false, false),
            added(30523, "stoker", false, false, true, true),
        ],
    );
    let bert_bad_token = add_tokens(
        bert.clone(),
        &[added(30522, "中文", false, false, false, true)],
    );
    let gpt2_bad_token = add_tokens(
        gpt2.clone(),
        &[added(50257, "hello world", false, false, false, false)],
    );
    let mut dropout = gpt2.clone();
    dropout["model"]["dropout"] = json!(0.1);
    let gpt4_split = json!({"type": "Split", "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
        "behavior": "Isolated", "invert": false});
    let mut spaces = gpt2.clone();
    spaces["model"]["vocab"]["ĠĠ"] = json!(50257);
    spaces["model"]["merges"]
        .as_array_mut()
        .unwrap()
        .push(json!(["Ġ", "Ġ"]));
    let un = unigram();
    vec![
        ("gpt2", gpt2.clone(), true),
        ("minilm", bert.clone(), true),
        ("roberta-like", roberta, true),
        // Runs of spaces as tokens, where GPT-2's `\s+(?!\S)` shows.
        ("gpt2+2 spaces", spaces.clone(), true),
        // NFKC turns some characters into a space and a mark ("´" to " \u{301}").
        (
            "gpt2+2 spaces nfkc+lowercase",
            with(
                spaces.clone(),
                "normalizer",
                seq_n(vec![ws("NFKC"), ws("Lowercase")]),
            ),
            true,
        ),
        ("minilm+added", bert_tokens, true),
        (
            "minilm nfkc+lower whitespace",
            with(
                with(bert.clone(), "pre_tokenizer", ws("Whitespace")),
                "normalizer",
                seq_n(vec![ws("NFKC"), ws("Lowercase")]),
            ),
            true,
        ),
        (
            "minilm nfd+strip-accents+lower whitespace-split",
            with(
                with(bert.clone(), "pre_tokenizer", ws("WhitespaceSplit")),
                "normalizer",
                seq_n(vec![ws("NFD"), ws("StripAccents"), ws("Lowercase")]),
            ),
            true,
        ),
        (
            "minilm bert+digits",
            with(
                bert.clone(),
                "pre_tokenizer",
                seq_p(vec![
                    ws("BertPreTokenizer"),
                    json!({"type": "Digits", "individual_digits": true}),
                ]),
            ),
            true,
        ),
        (
            "gpt2 whitespace-split+bytelevel",
            with(
                with(
                    gpt2.clone(),
                    "pre_tokenizer",
                    seq_p(vec![ws("WhitespaceSplit"), byte_level(true, false)]),
                ),
                "normalizer",
                seq_n(vec![ws("NFKD"), ws("StripAccents")]),
            ),
            true,
        ),
        ("unigram metaspace", un.clone(), true),
        (
            "unigram whitespace-split+metaspace first",
            with(
                with(
                    un.clone(),
                    "pre_tokenizer",
                    seq_p(vec![ws("WhitespaceSplit"), metaspace("first", true)]),
                ),
                "normalizer",
                json!({"type": "BertNormalizer", "clean_text": true,
                       "handle_chinese_chars": true, "strip_accents": null,
                       "lowercase": true}),
            ),
            true,
        ),
        // Refused.
        (
            "gpt2 bytelevel without regex",
            with(gpt2.clone(), "pre_tokenizer", byte_level(false, false)),
            false,
        ),
        (
            "gpt2 bert-normalizer",
            with(
                gpt2.clone(),
                "normalizer",
                json!({"type": "BertNormalizer", "clean_text": true,
                       "handle_chinese_chars": false, "strip_accents": false,
                       "lowercase": false}),
            ),
            false,
        ),
        (
            "gpt2+2 spaces bert-normalizer",
            with(
                spaces.clone(),
                "normalizer",
                json!({"type": "BertNormalizer", "clean_text": true,
                       "handle_chinese_chars": false, "strip_accents": false,
                       "lowercase": false}),
            ),
            false,
        ),
        (
            "gpt2 split regex",
            with(
                gpt2.clone(),
                "pre_tokenizer",
                seq_p(vec![gpt4_split, byte_level(false, false)]),
            ),
            false,
        ),
        (
            "minilm replace",
            with(
                bert.clone(),
                "normalizer",
                seq_n(vec![
                    json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}),
                    ws("Lowercase"),
                ]),
            ),
            false,
        ),
        (
            "minilm strip",
            with(
                bert.clone(),
                "normalizer",
                json!({"type": "Strip", "strip_left": true, "strip_right": true}),
            ),
            false,
        ),
        (
            "minilm digits first",
            with(
                bert.clone(),
                "pre_tokenizer",
                seq_p(vec![
                    json!({"type": "Digits", "individual_digits": false}),
                    ws("BertPreTokenizer"),
                ]),
            ),
            false,
        ),
        (
            "minilm no pre-tokenizer",
            with(bert.clone(), "pre_tokenizer", Json::Null),
            false,
        ),
        (
            "unigram metaspace without split",
            with(un, "pre_tokenizer", metaspace("always", false)),
            false,
        ),
        ("gpt2 spaced added token", gpt2_bad_token, false),
        ("minilm normalized token with spaces", bert_bad_token, false),
        ("gpt2 dropout", dropout, false),
    ]
}

fn tokenize(json: &Json, p: TokenizeParams) -> Tokenize {
    Tokenize::from_json(json.to_string().as_bytes(), p).unwrap()
}

/// The parameters the property test runs: limits at, just above and well above the
/// template's size, with and without the template, BOS/EOS, `pad_to` as the limit.
fn params() -> Vec<TokenizeParams> {
    let mut ps = vec![];
    for m in [2, 3, 6, 17, 64, 254] {
        ps.push(TokenizeParams::new().max_length(Some(m)));
    }
    for m in [0, 1, 5, 40] {
        ps.push(
            TokenizeParams::new()
                .add_special_tokens(false)
                .max_length(Some(m)),
        );
    }
    ps.push(
        TokenizeParams::new()
            .bos_id(Some(1))
            .eos_id(Some(2))
            .max_length(Some(12)),
    );
    ps.push(TokenizeParams::new().pad_to(Some(30)));
    ps
}

#[test]
fn prefix_ids_are_the_whole_texts_ids() {
    let mut rng = Rng(0x005e_ed0f_7e57);
    let (mut texts, mut cut, mut retried) = (0, 0, 0);
    // The refused ones encode whole texts either way (`refused_configurations_...`).
    for (name, json, _) in configurations().into_iter().filter(|c| c.2) {
        for p in params() {
            let prefix = tokenize(&json, p.clone());
            assert!(prefix.encodes_prefix(), "{name}");
            let whole = prefix.clone().whole_text();
            assert!(!whole.encodes_prefix());
            // The default first prefix, and tiny ones that cut (and double) everywhere.
            let estimates = [
                prefix.clone(),
                prefix.clone().prefix_estimate(1, 1),
                prefix.clone().prefix_estimate(0, 1),
                prefix.prefix_estimate(2, 9),
            ];
            for _ in 0..40 {
                let s = text(&mut rng);
                let v = Value::from(s.as_str());
                let want = whole.encode_ids(&v).unwrap();
                for t in &estimates {
                    let (got, spent) = t.encode_ids_counted(&v).unwrap();
                    assert_eq!(got, want, "{name} {p:?} on {s:?}");
                    cut += usize::from(spent < s.len());
                    retried += usize::from(spent > s.len());
                    texts += 1;
                }
            }
        }
    }
    // The prefix path must have cut a good share of the texts, and tried prefixes too
    // short for others (then encoded them whole).
    println!("{texts} texts: {cut} cut, {retried} whole after prefixes");
    assert!(cut > texts / 3, "{cut} of {texts} texts were cut");
    assert!(
        retried > texts / 20,
        "{retried} of {texts} texts were retried whole"
    );
}

/// The lemma under the prefix path: at every cut it may make, the tokens of the text
/// before the cut lead the whole text's (no truncation, no template).
#[test]
fn at_every_cut_the_prefix_tokens_lead_the_whole() {
    let mut rng = Rng(0xc07);
    let mut cuts = 0;
    for (name, json, _) in configurations().into_iter().filter(|c| c.2) {
        let t = tokenize(&json, TokenizeParams::new().add_special_tokens(false));
        for _ in 0..120 {
            let mut s = text(&mut rng);
            s.truncate(s.floor_char_boundary(600));
            let whole = t.encode_ids(&Value::from(s.as_str())).unwrap();
            for c in Tokenize::prefix_cuts(&s) {
                let head = t.encode_ids(&Value::from(&s[..c])).unwrap();
                assert!(
                    whole.starts_with(&head),
                    "{name}: {:?} | {:?}: {head:?} against {whole:?}",
                    &s[..c],
                    &s[c..]
                );
                cuts += 1;
            }
        }
    }
    assert!(cuts > 10_000, "{cuts} cuts");
}

#[test]
fn a_long_document_encodes_a_prefix() {
    let doc = "The quick brown fox jumps over the lazy dog, again and again. ".repeat(330);
    assert!(doc.len() > 20_000);
    for name in ["gpt2", "minilm"] {
        let t = tokenize(&fixture(name), TokenizeParams::new().max_length(Some(64)));
        assert!(t.encodes_prefix(), "{name}");
        let (ids, spent) = t.encode_ids_counted(&Value::from(doc.as_str())).unwrap();
        assert_eq!(ids.len(), 64);
        assert!(spent < 1_000, "{name} encoded {spent} bytes");
        let whole = t.clone().whole_text();
        let (all, spent) = whole
            .encode_ids_counted(&Value::from(doc.as_str()))
            .unwrap();
        assert_eq!(spent, doc.len());
        assert_eq!(ids, all, "{name}");
    }
    // Without truncation there is nothing to save.
    let t = tokenize(&fixture("gpt2"), TokenizeParams::new());
    assert!(!t.encodes_prefix());
}

#[test]
fn refused_configurations_encode_the_whole_text() {
    let doc = "hello world ".repeat(500);
    for (name, json, takes) in configurations() {
        if takes {
            continue;
        }
        let t = tokenize(&json, TokenizeParams::new().max_length(Some(8)));
        assert!(!t.encodes_prefix(), "{name}");
        let (_, spent) = t.encode_ids_counted(&Value::from(doc.as_str())).unwrap();
        assert_eq!(spent, doc.len(), "{name}");
    }
    // Some refusals are only conservative (the configuration does not establish the cut;
    // GPT-2's vocabulary may happen to), but for these a cut the rule allows changes the
    // tokens before it.
    let witnesses = [
        // A control character removed before a run of spaces: GPT-2's regex then sees
        // "word " alone but "word   next" whole (" " against "  ", " next"), which differ
        // once two spaces are a token (GPT-2's own vocabulary has none).
        ("gpt2+2 spaces bert-normalizer", "word \u{1}", "  next"),
        // The space is no longer whitespace: one word across the cut.
        ("minilm replace", "hello", " world"),
        ("minilm no pre-tokenizer", "hello", " world"),
        // The added token is cut in two.
        ("gpt2 spaced added token", "say hello", " world"),
    ];
    let all = configurations();
    for (name, head, tail) in witnesses {
        let json = &all.iter().find(|c| c.0 == name).unwrap().1;
        let t = tokenize(json, TokenizeParams::new().add_special_tokens(false));
        let ids = |s: &str| t.encode_ids(&Value::from(s)).unwrap();
        let (h, w) = (ids(head), ids(&format!("{head}{tail}")));
        assert!(!w.starts_with(&h), "{name}: {h:?} leads {w:?}");
        assert!(Tokenize::prefix_cuts(&format!("{head}{tail}")).contains(&head.len()));
    }
}

#[test]
fn the_cut_goes_before_a_space_that_follows_a_non_space() {
    // One kept token and the smallest first prefix: the cut is the first allowed one.
    let t = tokenize(
        &fixture("gpt2"),
        TokenizeParams::new()
            .add_special_tokens(false)
            .max_length(Some(1)),
    )
    .prefix_estimate(0, 1);
    let spent = |s: &str| t.encode_ids_counted(&Value::from(s)).unwrap().1;
    // Before the space after "hello", though GPT-2 splits "  world" as " ", " world".
    assert_eq!(spent("hello  world again"), 5);
    // Not inside the leading run of spaces: after "hello".
    assert_eq!(spent("  hello world"), 7);
    // Not after a tab, a newline or a no-break space: whitespace too.
    assert_eq!(spent("a\t b c"), 4);
    assert_eq!(spent("a\n b c"), 4);
    assert_eq!(spent("a\u{a0} b c"), 5);
    // No space at all: the whole text.
    assert_eq!(spent("hello\tworld\nagain"), 17);
    // Two kept tokens: " a" gives one, so the prefix doubles to the cut at or after byte
    // 4, " a b": 2 + 4 bytes in all.
    let t = tokenize(
        &fixture("gpt2"),
        TokenizeParams::new()
            .add_special_tokens(false)
            .max_length(Some(2)),
    )
    .prefix_estimate(0, 1);
    let (ids, spent) = t.encode_ids_counted(&Value::from(" a b c d")).unwrap();
    assert_eq!(spent, 6);
    assert_eq!(
        ids,
        t.clone()
            .whole_text()
            .encode_ids(&Value::from(" a b c d"))
            .unwrap()
    );
}

/// The essay's claims about single characters, checked for every character: no character
/// that is not whitespace ends in whitespace after the normalizers said to keep a cut's
/// non-space end, and `N(c + b) = N(c) + N(b)` for a `b` starting with a space.
#[test]
fn normalizers_keep_a_cut_before_a_space_for_every_character() {
    let norm = |n: &str| -> tokenizers::NormalizerWrapper {
        serde_json::from_value(json!({"type": n})).unwrap()
    };
    let kept = ["NFC", "NFD", "NFKC", "NFKD", "Lowercase"].map(norm);
    let removing = [
        norm("StripAccents"),
        serde_json::from_value(json!({"type": "BertNormalizer", "clean_text": true,
            "handle_chinese_chars": true, "strip_accents": true, "lowercase": true}))
        .unwrap(),
    ];
    let apply = |n: &tokenizers::NormalizerWrapper, s: &str| {
        let mut x = NormalizedString::from(s);
        n.normalize(&mut x).unwrap();
        x.get().to_string()
    };
    let tails = [" x", " \u{301}y", "  \u{308}"];
    let chars = (0..0x3_2000u32)
        .chain(0xe_0000..0xe_0200)
        .filter_map(char::from_u32)
        .filter(|c| !c.is_whitespace());
    for c in chars {
        let a = format!("x{c}");
        for n in kept.iter().chain(&removing) {
            let na = apply(n, &a);
            if kept.iter().any(|k| std::ptr::eq(k, n)) {
                assert!(
                    na.chars().next_back().is_some_and(|l| !l.is_whitespace()),
                    "{n:?} on {a:?} gives {na:?}"
                );
            }
            for b in tails {
                assert_eq!(
                    apply(n, &format!("{a}{b}")),
                    format!("{na}{}", apply(n, b)),
                    "{n:?} on {a:?} + {b:?}"
                );
            }
        }
    }
}

/// GPT-2's pre-tokenizer regex on `x c` and `x c  y` for every character `c` that is not
/// whitespace: the first's pre-tokens lead the second's (its `\s` is not wider than Rust's
/// `char::is_whitespace`).
#[test]
fn gpt2_pre_tokens_of_a_prefix_lead_the_whole_for_every_character() {
    let pre = ByteLevel::new(false, false, true);
    let split = |s: &str| -> Vec<String> {
        let mut p = PreTokenizedString::from(s);
        pre.pre_tokenize(&mut p).unwrap();
        p.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    };
    let chars = (0..0x3_2000u32)
        .chain(0xe_0000..0xe_0200)
        .filter_map(char::from_u32)
        .filter(|c| !c.is_whitespace());
    for c in chars {
        for a in [format!("x{c}"), format!("x {c}"), format!("{c}")] {
            let head = split(&a);
            for b in ["  y", " y", " \n z", " \u{301}"] {
                let all = split(&format!("{a}{b}"));
                assert_eq!(all[..head.len()], head[..], "{a:?} + {b:?}");
            }
        }
    }
}

/// Timing: 1,000 documents of about 20 KB of words from the repository's docs, GPT-2,
/// `max_length` 254, prefix path against whole texts in the same run. Run with
/// `cargo test -p stoker-ops --release --test text_prefix -- --ignored --nocapture`.
#[test]
#[ignore]
fn timing_prefix_against_whole() {
    let docs_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut words = vec![];
    for entry in std::fs::read_dir(&docs_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let s = std::fs::read_to_string(&path).unwrap();
            words.extend(s.split_whitespace().map(str::to_string));
        }
    }
    assert!(words.len() > 1000, "{} words", words.len());
    let mut rng = Rng(42);
    let docs: Vec<String> = (0..1000)
        .map(|_| {
            let mut d = String::new();
            while d.len() < 20_000 {
                d.push_str(rng.pick(&words).as_str());
                d.push_str(if rng.below(12) == 0 { "\n" } else { " " });
            }
            d
        })
        .collect();
    let mb = docs.iter().map(String::len).sum::<usize>() as f64 / 1e6;
    let prefix = tokenize(
        &fixture("gpt2"),
        TokenizeParams::new().max_length(Some(254)),
    );
    assert!(prefix.encodes_prefix());
    let whole = prefix.clone().whole_text();
    let run = |t: &Tokenize| {
        let start = std::time::Instant::now();
        let mut spent = 0;
        let mut ids = vec![];
        for d in &docs {
            let (i, s) = t.encode_ids_counted(&Value::from(d.as_str())).unwrap();
            spent += s;
            ids.push(i);
        }
        (start.elapsed().as_secs_f64(), spent, ids)
    };
    let (mut tp, mut tw) = (vec![], vec![]);
    for _ in 0..5 {
        let (p, spent_p, ids_p) = run(&prefix);
        let (w, spent_w, ids_w) = run(&whole);
        assert_eq!(ids_p, ids_w);
        println!(
            "prefix {p:.3} s ({:.2} MB encoded), whole {w:.3} s ({:.2} MB encoded)",
            spent_p as f64 / 1e6,
            spent_w as f64 / 1e6
        );
        tp.push(p);
        tw.push(w);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, w) = (median(&mut tp), median(&mut tw));
    println!(
        "{} docs, {mb:.1} MB, max_length 254, gpt2: prefix median {p:.3} s, whole median \
         {w:.3} s, speedup {:.1}x",
        docs.len(),
        w / p
    );
}
