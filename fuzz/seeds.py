#!/usr/bin/env python3
"""Writes the seed corpora, fuzz/corpus/<target>/seed-*, from the repository's own test
fixtures (made by webdataset, TensorFlow, pyarrow, PIL, ffmpeg/sox, see each fixtures
directory's make_*.py) plus a few small hand-written inputs. Nothing here is committed: the
fixtures are, and this script is run by run.sh before fuzzing. Seeds are cut to SEED_MAX
bytes (a truncated file is a fine seed, and small seeds keep the fuzzer fast)."""

import glob
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# STOKER_FUZZ_CORPUS: where to write them (run.sh's CI mode writes a fresh directory).
OUT = os.environ.get(
    "STOKER_FUZZ_CORPUS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
)
SEED_MAX = 16 * 1024
FORMATS = os.path.join(ROOT, "crates/stoker-formats/tests/fixtures")
IMAGES = os.path.join(ROOT, "crates/stoker-ops/tests/fixtures/image/files")
AUDIO = os.path.join(ROOT, "crates/stoker-ops/tests/fixtures/audio/files")
COLUMNAR = os.path.join(ROOT, "crates/stoker-pipeline/tests/fixtures/columnar")


def put(target, name, data, limit=SEED_MAX):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data[:limit])


def files(pattern):
    for p in sorted(glob.glob(pattern)):
        with open(p, "rb") as f:
            yield os.path.basename(p), f.read()


def tfrecords(data):
    """The payloads of a TFRecord file's records."""
    at = 0
    while at + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        yield data[at + 12 : at + 12 + n]
        at += 12 + n + 4


def main():
    for name, data in files(os.path.join(FORMATS, "*.tar")):
        put("tar", name, data)
    for name, data in files(os.path.join(FORMATS, "*.tfrecord")):
        put("tfrecord", name, data)
        for i, rec in enumerate(tfrecords(data)):
            put("tf_example", f"{name}-{i}", rec)
    for name, data in files(os.path.join(FORMATS, "*.parquet")):
        # Parquet's footer is at the end: whole files only (the largest are 18 KB).
        put("parquet", name, data, limit=None)
    for name, data in files(os.path.join(COLUMNAR, "*/*.parquet")):
        put("parquet", "columnar-" + name, data, limit=None)
    for name, data in files(os.path.join(IMAGES, "*")):
        if name == "big.jpg":
            continue
        put("image_header", name, data, limit=2048)
        # The first byte picks the options (mode, EXIF, truncation, fused crop).
        put("image_decode", name, b"\x00" + data)
        put("image_decode", name + "-fused-exif", b"\x14" + data)
    for name, data in files(os.path.join(AUDIO, "*")):
        put("audio", name, b"\x00" + data, limit=8192)
    put("jsonl", "mixed.jsonl",
        '{"id": 1, "text": "caf\\u00e9", "tags": ["a", "b"], "x": 1.5}\n'
        '\n'
        '{"id": 2, "nested": {"k": [1, 2, {"z": null}]}, "ok": true}\r\n'
        '{"id": 3, "big": 18446744073709551616, "neg": -1e308}\n'
        'not json\n'
        '[1, 2]\n'
        '{"id": 4, "last": "no newline"}')
    csv_text = ('id,text,value\n1,"multi\nline, 1",1.25\r\n2,"say ""hi""",\n'
                '3,caf\u00e9,-3\n4,,-inf\n5\n6,"unterminated\n7,x,y\n')
    put("csv", "header", b"\x00" + csv_text.encode())
    put("csv", "tabs-noheader", b"\x0d" + "1\tx\t2.0\n3\t\"y\"\t\n".encode())
    put("csv", "bom", b"\x00\xef\xbb\xbfk,,k\n1,2,3\n")
    for i, u in enumerate([
        "s3://bucket/prefix/train-*.tar", "gs://b/k", "az://container/path/x",
        "azure://acct/c/k", "file:///tmp/data/", "/abs/path/x.tar", "relative/dir/",
        "https://host:9000/bucket/key?x=1", "http://127.0.0.1:9000/b/",
        "s3://bucket", "s3://", "s3://b/%2Fweird%20key", "gcs://b/", "abfss://c@a.dfs.core.windows.net/p",
    ]):
        put("url", str(i), u)
    for i, g in enumerate([
        "*.tar\0train/shard-000.tar", "**/*.jpg\0a/b/c.jpg", "train-{000..009}.tar\0train-001.tar",
        "[a-c]?/**/x\0b1/y/x", "{a,b}/*.{jpg,png}\0a/1.png", "[!x]*\0yz", "\\*\0*",
        "**\0", "a/**/b/**/c\0a/x/b/y/c",
    ]):
        put("glob", str(i), g)
    specs = [
        # The README's.
        '''source = "s3://bucket/train/"
glob = "*.tar"
format = "tar"
shuffle_shards = true
interleave = 4
[[ops]]
op = "shuffle"
buffer = 1000
[[ops]]
op = "decode_image"
field = "jpg"
[[ops]]
op = "random_resized_crop"
field = "jpg"
size = 224
[[ops]]
op = "random_flip"
field = "jpg"
[[ops]]
op = "image_to_tensor"
field = "jpg"
normalize = "imagenet"
[[ops]]
op = "batch"
size = 64
''',
        '''source = "s3://bucket/train/"
keys = ["a.tar", "b/c.tar"]
format = "csv"
seed = 1
epochs = 2
first_epoch = 1
[format_options]
delimiter = ";"
has_header = false
infer_types = true
[rank]
rank = 1
world = 8
policy = "pad"
split = "contiguous"
[[ops]]
op = "rename"
map = { c0 = "x" }
[[ops]]
op = "take"
n = 10
[[ops]]
op = "unbatch"
[[ops]]
op = "cache"
size = "20GiB"
[options]
threads = 8
errors = "skip"
memory_limit = "2GiB"
columnar = true
[store]
endpoint = "http://127.0.0.1:9000"
allow_http = true
''',
        '''source = "file:///data/audio/"
format = "files"
[[ops]]
op = "decode_audio"
field = "wav"
[[ops]]
op = "resample"
field = "audio"
rate = 16000
[[ops]]
op = "mel_spectrogram"
field = "audio"
[[ops]]
op = "time_masking"
field = "audio"
max = 10
[[ops]]
op = "batch"
size = 8
collate = "pad"
''',
        '''source = "s3://b/t/"
format = "parquet"
[format_options]
columns = ["image", "label"]
[[ops]]
op = "standardize"
field = "label"
[[ops]]
op = "pack"
field = "ids"
block_size = 2048
separator = 50256
''',
    ]
    for i, s in enumerate(specs):
        put("spec", str(i), s)
    states = [
        '{"version":2,"seed":7,"epoch":0,"cursor":{"next":6,"slots":[],"rr":0,'
        '"stream_index":6,"emitted":6},"stages":[{"kind":"shuffle","emitted":2,'
        '"buffer":[{"shard":3,"record":0},{"shard":5,"record":0}]},{"kind":"batch",'
        '"partial":[{"shard":1,"record":0}]},{"kind":"unbatch","cut":0,"sent":1}],'
        '"yielded_in_epoch":1,"yielded":1,"samples_yielded":1,'
        '"cuts":[[{"shard":0,"record":0},{"shard":2,"record":0},{"shard":4,"record":0}]]}',
        '{"version":2,"seed":7,"epoch":1,"cursor":{"next":0,"slots":[[0,3]],"rr":0,'
        '"stream_index":0,"emitted":0},"stages":[{"kind":"stateless"},{"kind":"count",'
        '"seen":4},{"kind":"pack","blocks":1,"docs":[{"shard":0,"record":1}],"skip":3,'
        '"next_doc":2}],"yielded_in_epoch":0,"yielded":20,"samples_yielded":20,'
        '"contiguous":true}',
    ]
    for i, s in enumerate(states):
        put("state", str(i), s)
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(OUT, "*/seed-*")))
    print(f"seeds: {len(glob.glob(os.path.join(OUT, '*/seed-*')))} files, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
