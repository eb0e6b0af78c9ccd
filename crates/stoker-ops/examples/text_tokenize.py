#!/usr/bin/env python3
"""Times Python `tokenizers` on one thread, for comparison with `text_tokenize.rs`.

    cargo run --release -p stoker-ops --example text_tokenize -- --dump /tmp/corpus.jsonl
    python3 crates/stoker-ops/examples/text_tokenize.py /tmp/corpus.jsonl \
        [--tokenizer crates/stoker-ops/tests/fixtures/text/gpt2-tokenizer.json]

Same corpus, same tokenizer file, no truncation or padding (the file's own are switched
off), special tokens added: what the Rust example measures. One thread: rayon's pool is
limited to one thread and `TOKENIZERS_PARALLELISM=false` keeps `encode_batch` sequential.
Reports the best of `--rounds` rounds for `encode` (one call per text) and `encode_batch`
(batches of `--batch` texts).
"""

import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--tokenizer",
                    default=os.path.join(HERE, "../tests/fixtures/text/gpt2-tokenizer.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1000)
    a = ap.parse_args()
    with open(a.corpus, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    tok = Tokenizer.from_file(a.tokenizer)
    tok.no_truncation()
    tok.no_padding()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"tokenizer {a.tokenizer}\n{len(texts)} texts, {mb:.1f} MB, 1 thread")

    def single():
        return sum(len(tok.encode(t).ids) for t in texts)

    def batch():
        n = 0
        for i in range(0, len(texts), a.batch):
            n += sum(len(e.ids) for e in tok.encode_batch(texts[i:i + a.batch]))
        return n

    def fast():
        n = 0
        for i in range(0, len(texts), a.batch):
            n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + a.batch]))
        return n

    for name, fn in [("encode", single), ("encode_batch", batch), ("encode_batch_fast", fast)]:
        best, tokens = float("inf"), 0
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            tokens = fn()
            best = min(best, time.perf_counter() - t0)
        print(f"{name}: {len(texts) / best:.0f} texts/s, {tokens / best / 1e6:.2f} M tokens/s, "
              f"{mb / best:.1f} MB/s ({tokens} tokens)")


if __name__ == "__main__":
    main()
