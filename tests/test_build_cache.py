"""build-cache: corpus reading (OANC tree and zip, BOM, latin-1, unsafe zip members, JSONL, gz/bz2),
exact counts against brute force (top-N, min_count, document boundaries, partitions), the
runtime lookup (longest key first, count order, dedup), the artifact round trip and its checks,
tokenizer fingerprints, resolve_corpus_cache, and the CLI end to end."""

from __future__ import annotations

import bz2
import gzip
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import fails
from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.prep.cache.command import BuildCacheConfig, run_build_cache
from specctl.prep.cache.corpus import CorpusReader
from specctl.prep.cache.files import decode
from specctl.prep.cache.zips import unsafe_member_name
from specctl.prep.cache.ngrams import CountConfig, count_token_docs, write_artifact
from specctl.models.fingerprint import tokenizer_fingerprint
from specctl.runtime.jobs.artifacts import resolve_corpus_cache
from specctl.speculative import corpus_cache as cs
from specctl.speculative.corpus_cache import CorpusCache, brute_force_table, hash_key, hash_keys
from specctl.store import Store
from tiny import make_tokenizer

runner = CliRunner(env={"COLUMNS": "200"})

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "To be or not to be, that is the question.",
    "Paris is the capital of France.",
    "All that glitters is not gold.",
]


def _text(seed: int, n: int = 40) -> str:
    rng = np.random.default_rng(seed)
    return "\n".join(SENTENCES[i] for i in rng.integers(0, len(SENTENCES), n)) + "\n"


# (relative path, bytes) of a small tree shaped like the OANC
def oanc_files() -> dict[str, bytes]:
    d = "OANC-GrAF/data"
    return {
        f"{d}/spoken/face-to-face/charlotte/sw001.txt": _text(1).encode(),
        f"{d}/spoken/face-to-face/charlotte/sw001.xml": b"<graph/>",
        f"{d}/spoken/face-to-face/charlotte/sw001.anc": b"<header/>",
        f"{d}/spoken/telephone/switchboard/20/sw2001.txt": _text(2).encode(),
        f"{d}/spoken/telephone/switchboard/20/sw2001-s.xml": b"<s/>",
        f"{d}/written_1/journal/verbatim/VOL15_1.txt": b"\xef\xbb\xbf" + _text(3).encode(),
        f"{d}/written_1/journal/verbatim/VOL15_1-hdr.xml": b"<hdr/>",
        f"{d}/written_2/non-fiction/OUP/Castro/ch1.txt": ("Caf\xe9 au lait. " * 3 + "\n"
                                                          + _text(4)).encode("latin-1"),
        f"{d}/written_2/non-fiction/OUP/Castro/ch1.anc": b"<anc/>",
        "OANC-GrAF/resources/README.txt": b"not corpus text\n",
    }


@pytest.fixture(scope="module")
def oanc_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("oanc")
    for rel, data in oanc_files().items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root / "OANC-GrAF"


@pytest.fixture(scope="module")
def oanc_zip(tmp_path_factory) -> Path:
    z = tmp_path_factory.mktemp("oancz") / "OANC_GrAF.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        for rel, data in oanc_files().items():
            f.writestr(rel, data)
    return z


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    make_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tok_dir))


def read_all(paths, **kw):
    r = CorpusReader(paths, **kw)
    return list(r), r.stats


def table_dict(cache: CorpusCache) -> dict:
    out = {}
    for k, t in cache.tables.items():
        for i in range(t.keys.shape[0]):
            a, b = int(t.offsets[i]), int(t.offsets[i + 1])
            out[tuple(t.keys[i].tolist())] = [(tuple(c), int(n)) for c, n in
                                              zip(t.conts[a:b].tolist(), t.counts[a:b].tolist())]
    return out


def tables_dict(t) -> dict:
    out = {}
    for k in t.keys:
        for i in range(t.keys[k].shape[0]):
            a, b = int(t.offsets[k][i]), int(t.offsets[k][i + 1])
            out[tuple(t.keys[k][i].tolist())] = [
                (tuple(c), int(n)) for c, n in zip(t.conts[k][a:b].tolist(), t.counts[k][a:b].tolist())]
    return out


def ref_lookup(bf: dict, context: list[int], kmax: int, limit: int) -> list[list[int]]:
    out, seen = [], set()
    for k in range(min(kmax, len(context)), 0, -1):
        for cont, _ in bf.get(tuple(context[-k:]), []):
            if cont not in seen:
                seen.add(cont)
                out.append(list(cont))
                if len(out) == limit:
                    return out
    return out


def write_cache(out: Path, docs, cfg: CountConfig, fingerprint: str = "x") -> Path:
    """An n-gram cache artifact of token documents in folder `out` (made here), counted with
    cfg; the path of its safetensors file."""
    out.mkdir()
    return write_artifact(out, count_token_docs(docs, cfg, out.parent / f"{out.name}-work"),
                          {"max_key_len": cfg.max_key_len, "gram_len": cfg.gram_len,
                           "top": cfg.top, "min_count": cfg.min_count,
                           "tokenizer_fingerprint": fingerprint, "tokenizer": "t"})


# ---------------------------------------------------------------------------------------------
# reading


def test_oanc_tree_reads_txt_only(oanc_tree):
    docs, st = read_all([oanc_tree])
    names = [Path(n).name for n, _ in docs]
    assert names == ["sw001.txt", "sw2001.txt", "VOL15_1.txt", "ch1.txt"]   # sorted walk
    assert st.files == 4 and st.documents == 4
    assert st.annotation_files == 5 and st.outside_data == 1 and st.other_files == 0
    texts = dict(zip(names, (t for _, t in docs)))
    assert not texts["VOL15_1.txt"].startswith("\ufeff")                   # BOM stripped
    assert texts["VOL15_1.txt"].startswith(SENTENCES[0][:3]) or texts["VOL15_1.txt"][0] != "\ufeff"
    assert texts["ch1.txt"].startswith("Caf\ufffd au lait.")               # latin-1 é replaced
    assert st.bad_bytes == 3 and st.files_with_bad_bytes == 1
    assert any("undecodable" in p for p in st.problems)
    assert st.words == sum(len(t.split()) for _, t in docs)
    # the data folder itself, or the folder above the tree, read the same documents
    assert [t for _, t in read_all([oanc_tree / "data"])[0]] == [t for _, t in docs]
    assert [t for _, t in read_all([oanc_tree.parent])[0]] == [t for _, t in docs]


def test_oanc_zip_in_place_same_documents(oanc_tree, oanc_zip, tmp_path):
    tree_docs, st1 = read_all([oanc_tree])
    zip_docs, st2 = read_all([oanc_zip])
    assert [t for _, t in zip_docs] == [t for _, t in tree_docs]
    for f in ("files", "documents", "words", "annotation_files", "outside_data", "bad_bytes",
              "files_with_bad_bytes"):
        assert getattr(st1, f) == getattr(st2, f), f
    assert zip_docs[0][0].startswith(f"{oanc_zip}:OANC-GrAF/data/")
    assert list(tmp_path.iterdir()) == []                                 # nothing unpacked


def test_unsafe_zip_members_refused(tmp_path):
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("good/ok.txt", "fine text here\n")
        for bad in ("../evil.txt", "/etc/abs.txt", "C:/win.txt", "a/..\\b.txt", "x/../../y.txt"):
            f.writestr(zipfile.ZipInfo(bad), "evil text\n")
    docs, st = read_all([z])
    assert [t for _, t in docs] == ["fine text here\n"]
    assert st.refused_members == 5
    assert any("refused" in p and "evil.txt" in p for p in st.problems)
    assert unsafe_member_name("../x") and unsafe_member_name("/x") and unsafe_member_name("D:x")
    assert unsafe_member_name("a/b/c.txt") is None and unsafe_member_name("a..b.txt") is None
    assert not (tmp_path.parent / "evil.txt").exists()


def test_zip_member_size_cap(tmp_path):
    z = tmp_path / "bomb.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("big.txt", "a " * (1 << 19))          # 1 MiB, compresses to ~1 KB
        f.writestr("small.txt", "small text\n")
    assert z.stat().st_size < 20_000
    docs, st = read_all([z], max_member_bytes=64 << 10)
    assert [t for _, t in docs] == ["small text\n"]
    assert st.oversize_members == 1 and any("cap" in p for p in st.problems)


def test_jsonl_text_and_bad_lines(tmp_path):
    p = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": "first document"}), "{not json", json.dumps(["a list"]),
             json.dumps({"body": "no text"}), "", json.dumps({"text": "second \u00e9"})]
    p.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    docs, st = read_all([p])
    assert [t for _, t in docs] == ["first document", "second \u00e9"]
    assert docs[1][0] == f"{p}:6"
    assert st.jsonl_lines == 5 and st.bad_jsonl_lines == 3
    assert [x.split(": ", 1)[0] for x in st.problems] == [f"{p}:2", f"{p}:3", f"{p}:4"]


def test_compressed_and_plain_files_and_split(tmp_path):
    text = "".join(f"line {i} of the text\n" for i in range(200))
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "b.txt.bz2").write_bytes(bz2.compress(text.encode()))
    (tmp_path / "c.cor").write_bytes(text.encode())
    docs, st = read_all([tmp_path / "a.txt.gz", tmp_path / "b.txt.bz2", tmp_path / "c.cor"])
    assert [t for _, t in docs] == [text] * 3 and st.files == 3
    # a long text is cut at line ends into documents of about doc_chars
    docs, _ = read_all([tmp_path / "c.cor"], doc_chars=500)
    assert "".join(t for _, t in docs) == text and len(docs) > 5
    assert all(t.endswith("\n") and len(t) <= 500 for _, t in docs)
    # folders read .txt(.gz/.bz2) only
    docs, st = read_all([tmp_path])
    assert len(docs) == 2 and st.other_files == 1


def test_decode_counts_bad_bytes():
    assert decode(b"\xef\xbb\xbfok") == ("ok", 0)
    assert decode(b"a\xff\xfeb") == ("a\ufffd\ufffdb", 2)
    assert decode("\ufffd".encode()) == ("\ufffd", 0)     # a real U+FFFD is not a bad byte


def test_reader_errors(tmp_path):
    with pytest.raises(SpecctlError, match="no such file"):
        CorpusReader([tmp_path / "missing"])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.xml").write_text("<x/>")
    with pytest.raises(SpecctlError, match=r"no \.txt files found"):
        list(CorpusReader([tmp_path / "d"]))
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(SpecctlError, match="not a zip file"):
        list(CorpusReader([tmp_path / "bad.zip"]))


# ---------------------------------------------------------------------------------------------
# counting and lookup


def test_hash_scalar_equals_vectorized():
    rng = np.random.default_rng(0)
    for k in (1, 2, 4):
        keys = rng.integers(0, 200_000, size=(50, k))
        assert hash_keys(keys).tolist() == [hash_key(r) for r in keys.tolist()]
    assert len({hash_key([i]) for i in range(10_000)}) == 10_000


@pytest.mark.parametrize("vocab,rows_per_part,kmax,g,top,minc", [
    (4, 10**6, 4, 4, 20, 6), (6, 17, 3, 2, 3, 2), (70_000, 40, 2, 3, 5, 1), (3, 5, 4, 1, 2, 3)])
def test_counts_equal_brute_force(tmp_path, vocab, rows_per_part, kmax, g, top, minc):
    rng = np.random.default_rng(vocab)
    docs = [rng.integers(0, vocab, size=int(rng.integers(0, 120))).tolist() for _ in range(60)]
    if vocab > 1000:   # a repeated document so something passes min_count
        docs += [docs[0]] * 3
    cfg = CountConfig(max_key_len=kmax, gram_len=g, top=top, min_count=minc,
                      rows_per_part=rows_per_part)
    tables = count_token_docs(docs, cfg, tmp_path)
    bf = brute_force_table(docs, kmax, g, top, minc)
    assert bf and tables_dict(tables) == bf
    for k in range(1, kmax + 1):   # keys sorted by hash, hashes right
        h = tables.hashes[k]
        assert np.all(h[1:] >= h[:-1]) and np.array_equal(hash_keys(tables.keys[k]), h)


def test_ngrams_do_not_cross_documents(tmp_path):
    cfg = CountConfig(max_key_len=2, gram_len=2, top=5, min_count=2)
    t = tables_dict(count_token_docs([[1, 2], [3, 4]] * 5, cfg, tmp_path))
    assert t == {}
    t = tables_dict(count_token_docs([[1, 2, 3, 4]] * 5, cfg, tmp_path / "b"))
    assert t == {(1,): [((2, 3), 5)], (2,): [((3, 4), 5)], (1, 2): [((3, 4), 5)]}


def test_lookup_order_dedup_limit(tmp_path):
    # key (5,) -> [2 2 2] x7, [1 1 1] x6, [3 3 3] x6; key (9, 5) -> [1 1 1] x6, [3 3 3] x6;
    # key (8, 9, 5) -> [3 3 3] x6
    docs = [[8, 9, 5, 3, 3, 3]] * 6 + [[9, 5, 1, 1, 1]] * 6 + [[5, 2, 2, 2]] * 7
    out = tmp_path / "a"
    write_cache(out, docs, CountConfig(max_key_len=3, gram_len=3, top=20, min_count=6))
    c = CorpusCache.load(out)
    assert c.entries([5]) == [([2, 2, 2], 7), ([1, 1, 1], 6), ([3, 3, 3], 6)]  # ties: tokens
    # longest key first: (8,9,5) gives [3 3 3], then (9,5) [1 1 1], then (5) [2 2 2]
    assert c.lookup([7, 8, 9, 5]) == [[3, 3, 3], [1, 1, 1], [2, 2, 2]]
    assert c.lookup([7, 8, 9, 5], limit=2) == [[3, 3, 3], [1, 1, 1]]
    assert c.lookup([0, 9, 5]) == [[1, 1, 1], [3, 3, 3], [2, 2, 2]]   # dedup across k
    assert c.lookup([5]) == [[2, 2, 2], [1, 1, 1], [3, 3, 3]]
    assert c.lookup([4]) == [] and c.lookup([]) == [] and c.lookup([5], limit=0) == []
    assert c.lookup(np.array([8, 9, 5])) == [[3, 3, 3], [1, 1, 1], [2, 2, 2]]


def test_lookup_equals_reference_on_random_tables(tmp_path):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 5, size=int(rng.integers(5, 80))).tolist() for _ in range(80)]
    cfg = CountConfig(max_key_len=4, gram_len=3, top=4, min_count=3, rows_per_part=300)
    c = CorpusCache.load(write_cache(tmp_path / "a", docs, cfg))   # the bare file works too
    bf = brute_force_table(docs, 4, 3, 4, 3)
    assert table_dict(c) == bf
    for _ in range(200):
        ctx = rng.integers(0, 6, size=int(rng.integers(1, 7))).tolist()
        lim = int(rng.integers(1, 12))
        assert c.lookup(ctx, lim) == ref_lookup(bf, ctx, 4, lim), ctx


def test_lookup_filter_and_memo(tmp_path, monkeypatch):
    # large token ids (the filter's products wrap in numpy and are exact in Python): every
    # stored key of every length is found through the filter, most absent keys are turned away
    # before any search, and what a lookup returns is the caller's own
    rng = np.random.default_rng(5)
    big = 2**31 - 97
    phrases = big - rng.integers(0, 40, size=(12, 8))   # repeated phrases: keys of every length
    docs = [np.concatenate(phrases[rng.integers(0, 12, size=5)]).tolist() for _ in range(30)]
    out = tmp_path / "a"
    write_cache(out, docs, CountConfig(max_key_len=4, gram_len=2, top=3, min_count=2,
                                       rows_per_part=200))
    c = CorpusCache.load(out)
    bf = brute_force_table(docs, 4, 2, 3, 2)
    assert {len(k) for k in bf} == {1, 2, 3, 4}
    for key, conts in bf.items():
        assert c.lookup([0] * 4 + list(key), 1) == [list(conts[0][0])], key
        assert c.entries(list(key)) == [(list(x), n) for x, n in conts]
    searched = []
    row = cs._row
    monkeypatch.setattr(cs, "_row", lambda t, key: searched.append(key) or row(t, key))
    absent = [(big - rng.integers(0, 40, size=4)).tolist() for _ in range(300)]
    absent = [a for a in absent if tuple(a[-2:]) not in bf]
    assert len(absent) > 200
    for ctx in absent:
        assert c.lookup(ctx, 5) == ref_lookup(bf, ctx, 4, 5)
    long_searches = [k for k in searched if len(k) >= 2]
    assert len(long_searches) < 0.3 * 3 * len(absent)
    monkeypatch.undo()
    got = c.lookup([big], 3)
    got[0].append(-1)
    assert c.lookup([big], 3) == ref_lookup(bf, [big], 4, 3)


def test_artifact_checks(tmp_path):
    out = tmp_path / "a"
    path = write_cache(out, [[1, 2, 3, 4, 5]] * 3,
                       CountConfig(max_key_len=2, gram_len=2, top=5, min_count=2), "f")
    data = path.read_bytes()
    assert json.loads((out / "config.json").read_text())["tokenizer_fingerprint"] == "f"
    for i, bad in enumerate([data[:100], b"\xff" * 8 + data[8:], data[:8] + b"[" + data[9:],
                             b""]):
        p = tmp_path / f"bad{i}.safetensors"
        p.write_bytes(bad)
        with pytest.raises(SpecctlError):
            CorpusCache.load(p)
    # a tampered hash table (valid file) is caught by the checks
    from safetensors.numpy import load_file, save_file
    t = load_file(str(path))
    t["k1.key_hash"] = t["k1.key_hash"][::-1].copy()
    meta = {"config": json.dumps({"max_key_len": 2, "gram_len": 2,
                                  "tokenizer_fingerprint": "f"})}
    save_file(t, str(tmp_path / "tampered.safetensors"), metadata=meta)
    with pytest.raises(SpecctlError, match="k=1"):
        CorpusCache.load(tmp_path / "tampered.safetensors")
    with pytest.raises(SpecctlError, match="not an n-gram cache"):
        CorpusCache.load(tmp_path)


# ---------------------------------------------------------------------------------------------
# fingerprints and resolving


def test_tokenizer_fingerprint(tok_dir, tmp_path):
    same = tmp_path / "same"
    shutil.copytree(tok_dir, same)
    cfg = json.loads((same / "tokenizer.json").read_text())
    cfg["truncation"] = {"max_length": 7, "strategy": "LongestFirst", "stride": 0,
                         "direction": "Right"}
    (same / "tokenizer.json").write_text(json.dumps(cfg, indent=1))
    other = tmp_path / "other"
    make_tokenizer(other, vocab_size=300)
    fp = tokenizer_fingerprint(tok_dir)
    assert len(fp) == 64 and fp == tokenizer_fingerprint(same) != tokenizer_fingerprint(other)
    with pytest.raises(SpecctlError, match="no tokenizer files"):
        tokenizer_fingerprint(tmp_path)


def _variant(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer.json").read_text())
    edit(cfg)
    (dst / "tokenizer.json").write_text(json.dumps(cfg, indent=1))
    return dst


def test_fingerprint_is_what_the_tokenizer_does_not_how_it_is_written(tok_dir, tmp_path):
    # what transformers 5.17 and 5.23 write differently for the same GGUF tokenizer (seen on
    # the GPU machine: a cache built here was refused there): a no-op normalizer, another
    # decoder, explicit defaults in the BPE model, merges as "a b" strings or [a, b] pairs
    def rewrite(cfg):
        cfg["normalizer"] = {"type": "Sequence", "normalizers": []}
        cfg["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                                           {"type": "Fuse"}]}
        cfg["pre_tokenizer"]["trim_offsets"] = not cfg["pre_tokenizer"].get("trim_offsets")
        m = cfg["model"]
        m.update(end_of_word_suffix=None if m.get("end_of_word_suffix") else "",
                 continuing_subword_prefix=None if m.get("continuing_subword_prefix") else "")
        m["merges"] = [" ".join(x) if isinstance(x, list) else x.split(" ") for x in m["merges"]]
    fp = tokenizer_fingerprint(tok_dir)
    assert tokenizer_fingerprint(_variant(tok_dir, tmp_path / "rewritten", rewrite)) == fp

    def swap_merges(cfg):   # the same vocabulary, merges applied in another order
        m = cfg["model"]["merges"]
        m[0], m[-1] = m[-1], m[0]
    def rename(cfg):        # one vocabulary entry with another id
        v = cfg["model"]["vocab"]
        a, b = sorted(v, key=v.get)[-2:]
        v[a], v[b] = v[b], v[a]
    for name, edit in (("merges", swap_merges), ("vocab", rename)):
        assert tokenizer_fingerprint(_variant(tok_dir, tmp_path / name, edit)) != fp, name
    def dropout(cfg):       # BPE dropout: random merges, but the same tokenizer
        cfg["model"]["dropout"] = 0.5
    drop = _variant(tok_dir, tmp_path / "dropout", dropout)
    assert {tokenizer_fingerprint(drop) for _ in range(3)} == {fp}

    def added(cfg):         # an added token's settings change how text is split
        cfg["added_tokens"][0]["lstrip"] = not cfg["added_tokens"][0].get("lstrip")
    assert tokenizer_fingerprint(_variant(tok_dir, tmp_path / "added", added)) != fp
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text('{"model": {"type": "BPE"')
    with pytest.raises(SpecctlError, match="not a valid tokenizer.json"):
        tokenizer_fingerprint(tmp_path / "broken")


def test_caches_with_the_earlier_fingerprint_still_resolve(built, tok_dir, tmp_path):
    from specctl.models.fingerprint import _legacy_fingerprint
    store, res = built
    old = tmp_path / "old-cache"
    shutil.copytree(res["path"], old)
    cfg = json.loads((old / "config.json").read_text())
    cfg["tokenizer_fingerprint"] = _legacy_fingerprint(tok_dir)
    (old / "config.json").write_text(json.dumps(cfg))
    assert cfg["tokenizer_fingerprint"] != tokenizer_fingerprint(tok_dir)
    assert resolve_corpus_cache(store, tok_dir, str(old), lambda m: None) == old
    other = tmp_path / "other"
    make_tokenizer(other, vocab_size=300)
    with pytest.raises(SpecctlError, match="another tokenizer"):
        resolve_corpus_cache(store, other, str(old), lambda m: None)
    # a model without tokenizer.json (vocab.json + merges.txt) has no earlier fingerprint: a
    # cache that names none is refused, not matched by the missing value
    files = tmp_path / "files-tokenizer"
    files.mkdir()
    model = json.loads((tok_dir / "tokenizer.json").read_text())["model"]
    (files / "vocab.json").write_text(json.dumps(model["vocab"]))
    (files / "merges.txt").write_text("#version: 0.2\n" + "".join(
        (m if isinstance(m, str) else " ".join(m)) + "\n" for m in model["merges"]))
    del cfg["tokenizer_fingerprint"]
    (old / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecctlError, match="tokenizer_fingerprint: missing"):
        resolve_corpus_cache(store, files, str(old), lambda m: None)


@pytest.fixture(scope="module")
def built(tmp_path_factory, oanc_tree, tok_dir):
    store = Store(tmp_path_factory.mktemp("store"))
    res = run_build_cache(BuildCacheConfig((str(oanc_tree),), str(tok_dir),
                                           CountConfig(min_count=3, workers=2)), store)
    return store, res


def test_build_matches_brute_force_over_tokenized_documents(built, oanc_tree, tok, tok_dir):
    store, res = built
    docs, st = read_all([oanc_tree])
    ids = [tok(t, add_special_tokens=False)["input_ids"] for _, t in docs]
    bf = brute_force_table(ids, 4, 4, 20, 3)
    cache = CorpusCache.load(res["path"])
    assert bf and table_dict(cache) == bf
    m = res["manifest"]
    assert res["id"] == f"{tok_dir.name.lower()}-oanc-k4g4"
    assert m["kind"] == "ngram-caches" and m["files"] == 4 and m["words"] == st.words
    assert m["tokens"] == sum(map(len, ids)) and m["bad_bytes"] == 3
    assert m["total_keys"] == len(bf) and m["total_ngrams"] == sum(map(len, bf.values()))
    assert m["corpus"]["annotation_files"] == 5 and m["tokens_per_s"] > 0
    assert m["tokenizer_fingerprint"] == cache.tokenizer_fingerprint
    assert cache.gram_len == 4 and cache.max_key_len == 4
    # a phrase of the corpus finds its continuation
    ctx = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    want = tok(" jumps over the lazy dog", add_special_tokens=False)["input_ids"][:4]
    assert cache.lookup(ctx, 3)[0] == want


def test_zip_build_identical_to_tree(built, oanc_zip, tok_dir):
    store, res = built
    res2 = run_build_cache(BuildCacheConfig((str(oanc_zip),), str(tok_dir),
                                            CountConfig(min_count=3), name="from-zip"), store)
    assert res2["id"] == "from-zip"
    a = (res["path"] / "ngram.safetensors").read_bytes()
    b = (res2["path"] / "ngram.safetensors").read_bytes()
    assert a == b


def test_resolve_corpus_cache(built, tok_dir, tmp_path):
    store, res = built
    logs = []
    assert resolve_corpus_cache(store, tok_dir, None, logs.append) in (
        res["path"], store.path("ngram-caches", "from-zip"))
    assert resolve_corpus_cache(store, tok_dir, res["id"], logs.append) == res["path"]
    assert resolve_corpus_cache(store, tok_dir, str(res["path"]), logs.append) == res["path"]
    assert any("corpus cache" in l for l in logs)
    other = tmp_path / "other"
    make_tokenizer(other, vocab_size=300)
    assert resolve_corpus_cache(store, other, None, logs.append) is None
    for choice in (res["id"], str(res["path"]), str(res["path"] / "ngram.safetensors")):
        with pytest.raises(SpecctlError, match="another tokenizer"):
            resolve_corpus_cache(store, other, choice, logs.append)
    assert resolve_corpus_cache(Store(tmp_path / "empty"), tok_dir, None, logs.append) is None
    with pytest.raises(SpecctlError, match="no artifact"):
        resolve_corpus_cache(store, tok_dir, "nonexistent-id", logs.append)


def test_a_store_without_caches_resolves_none_without_fingerprinting(tok_dir, tmp_path,
                                                                      monkeypatch):
    """Most stores hold no corpus cache: a run's start then works out no tokenizer
    fingerprint (~0.5 s for the demo model's), and still refuses a named cache's mismatch."""
    import specctl.runtime.jobs.artifacts as artifacts

    def nope(d):
        raise AssertionError("fingerprinted")
    monkeypatch.setattr(artifacts, "tokenizer_fingerprint", nope)
    monkeypatch.setattr(artifacts, "_legacy_fingerprint", nope)
    assert resolve_corpus_cache(Store(tmp_path / "empty"), tok_dir, None, print) is None


def test_newest_matching_cache_wins(tok_dir, tmp_path, oanc_tree):
    store = Store(tmp_path / "s")
    for name, created in (("older", "2020-01-01T00:00:00Z"), ("newer", "2030-01-01T00:00:00Z")):
        res = run_build_cache(BuildCacheConfig((str(oanc_tree),), str(tok_dir),
                                               CountConfig(min_count=3), name=name), store)
        mf = res["path"] / "manifest.json"
        m = json.loads(mf.read_text())
        m["created"] = created
        mf.write_text(json.dumps(m))
    assert resolve_corpus_cache(store, tok_dir, None, lambda m: None).name == "newer"


# ---------------------------------------------------------------------------------------------
# CLI


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_cli_end_to_end(tmp_path, oanc_zip, tok_dir):
    store = tmp_path / "store"
    r = invoke("build-cache", oanc_zip, "--model", tok_dir, "--store", store, "--min-count", 3,
               "--top", 5, "--max-key-len", 3, "--gram-len", 2, "--workers", 1)
    assert r.exit_code == 0, r.output
    assert "saved" in r.output and "keys" in r.output and "tokens/s" in r.output
    (path,) = [p for p in (store / "ngram-caches").iterdir() if not p.name.startswith(".")]
    assert path.name.endswith("-oanc-k3g2")
    cache = CorpusCache.load(path)
    assert (cache.max_key_len, cache.gram_len, cache.config["top"]) == (3, 2, 5)
    assert all(len(v) <= 5 for v in table_dict(cache).values())
    r = invoke("store", "ls", "--store", store, "--kind", "ngram-caches")
    assert r.exit_code == 0 and path.name in r.output
    assert not list((store / "work").iterdir())           # temp files cleaned up
    # the same id again: refused (an existing cache is not silently replaced), unless --force
    again = ("build-cache", oanc_zip, "--model", tok_dir, "--store", store, "--min-count", 3,
             "--top", 5, "--max-key-len", 3, "--gram-len", 2, "--workers", 1)
    fails(invoke(*again), path.name, "--force")
    r = invoke(*again, "--force")
    assert r.exit_code == 0 and "replacing" in r.output, r.output
    # one made by another command while this one counted (the check at the start saw none):
    # kept, and this one refused, not silently written over it
    import specctl.prep.cache.command as command
    theirs = (path / "manifest.json").read_bytes()
    shutil.move(path, tmp_path / "theirs")
    write = command.write_artifact

    def racing(*a, **kw):
        shutil.copytree(tmp_path / "theirs", path)
        return write(*a, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(command, "write_artifact", racing)
        fails(invoke(*again), "made by another command while this one ran", "--force")
    assert (path / "manifest.json").read_bytes() == theirs
    assert [p.name for p in (store / "ngram-caches").iterdir()] == [path.name]


def test_cli_errors(tmp_path, tok_dir, oanc_tree):
    store = tmp_path / "store"
    e = fails(invoke("build-cache", "--model", tok_dir, "--store", store), "no corpus given")
    fails(invoke("build-cache", oanc_tree, "--model", tok_dir, "--store", store, "--workers", 0),
          "--workers must be at least 1")
    assert "https://anc.org/data/oanc/" in e
    fails(invoke("build-cache", tmp_path / "nope.zip", "--model", tok_dir, "--store", store),
          "nope.zip", "no such file")
    (tmp_path / "empty").mkdir()
    fails(invoke("build-cache", tmp_path / "empty", "--model", tok_dir, "--store", store),
          "no .txt files found")
    (tmp_path / "blank.txt").write_text("  \n\n")
    fails(invoke("build-cache", tmp_path / "blank.txt", "--model", tok_dir, "--store", store),
          "no text")
    (tmp_path / "tiny.txt").write_text("just a few words\n")
    fails(invoke("build-cache", tmp_path / "tiny.txt", "--model", tok_dir, "--store", store),
          "--min-count")
    fails(invoke("build-cache", oanc_tree, "--model", tok_dir, "--store", store, "--top", 0),
          "--top")
    fails(invoke("build-cache", oanc_tree, "--model", tok_dir, "--store", store, "--name", "a/b"),
          "--name")
    fails(invoke("build-cache", oanc_tree, "--model", tok_dir, "--store", store, "--name", " "),
          "--name: empty")
    fails(invoke("build-cache", oanc_tree, "--model", tmp_path / "no-model", "--store", store),
          "no-model")
    assert not (store / "ngram-caches").exists() or not any(
        p for p in (store / "ngram-caches").iterdir() if not p.name.startswith("."))


def test_cli_default_corpus_location(tmp_path, oanc_zip, tok_dir):
    store = tmp_path / "store"
    (store / "data").mkdir(parents=True)
    shutil.copy(oanc_zip, store / "data" / "OANC_GrAF.zip")
    r = invoke("build-cache", "--model", tok_dir, "--store", store, "--min-count", 3, "-q")
    assert r.exit_code == 0, r.output
    assert "default location" in r.output
    assert (store / "ngram-caches" / f"{tok_dir.name.lower()}-oanc-k4g4" / "ngram.safetensors").is_file()


def test_help_shows_examples():
    r = invoke("build-cache", "--help")
    assert r.exit_code == 0 and "specctl build-cache" in r.output and "anc.org" in r.output


# ---------------------------------------------------------------------------------------------
# real text (slow): gensim's lee_background.cor with the demo model's tokenizer


def _gensim_lee(dest: Path) -> Path:
    member = "gensim/test/test_data/lee_background.cor"
    out = dest / "lee_background.cor"
    if out.is_file():
        return out
    dl = dest / "dl"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                           "--disable-pip-version-check", "gensim==4.4.0", "-d", str(dl)],
                          capture_output=True, text=True)
    wheels = sorted(dl.glob("gensim-4.4.0-*.whl")) if proc.returncode == 0 else []
    if not wheels:
        pytest.skip("gensim==4.4.0 wheel unavailable")
    with zipfile.ZipFile(wheels[0]) as z:
        out.write_bytes(z.read(member))
    return out


@pytest.mark.slow
def test_real_text_build(tmp_path, demo_model_dir):
    from helpers import cache_root
    lee = _gensim_lee(cache_root() / "data" / "gensim")
    store = Store(tmp_path / "store")
    res = run_build_cache(BuildCacheConfig((str(lee),), str(demo_model_dir), CountConfig(min_count=2)),
                          store)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    ids = tok(lee.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    bf = brute_force_table([ids], 4, 4, 20, 2)
    cache = CorpusCache.load(res["path"])
    assert table_dict(cache) == bf and res["manifest"]["words"] == 59_890
    ctx = tok(" in New South", add_special_tokens=False)["input_ids"]
    assert tok.decode(cache.lookup(ctx)[0]).startswith(" Wales")


def test_demo_corpus_from_a_wheel_without_network(tmp_path):
    """`build-cache demo`: the gensim wheel's English texts (lee news in utf-8 and latin-1, the
    Wikipedia dump as prose) land in the store as .txt; a second call reuses them."""
    import bz2
    import zipfile
    from specctl.prep.cache.demo import DATA, fetch_demo_corpus, wiki_prose
    from specctl.store import Store
    wiki = ("<mediawiki><page><text xml:space=\"preserve\">{{Infobox|x=1}}"
            "'''Anarchism''' is a [[political philosophy|philosophy]] that rejects rulers and "
            "hierarchy.&lt;ref&gt;A source.&lt;/ref&gt; It is old.\n"
            "== History ==\n[[Category:Politics]]</text></page></mediawiki>")
    whl = tmp_path / "gensim-4.4.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(DATA + "lee_background.cor", "The prime minister said on Tuesday.\n")
        z.writestr(DATA + "lee.cor", "Caf\xe9 owners said.\n".encode("latin-1"))
        z.writestr(DATA + "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
                   bz2.compress(wiki.encode()))
    store = Store(tmp_path / "s")
    d = fetch_demo_corpus(store, log=lambda *_: None, wheel=whl)
    assert (d / "lee.txt").read_text(encoding="utf-8") == "Café owners said.\n"
    prose = (d / "enwiki.txt").read_text(encoding="utf-8")
    assert prose == "Anarchism is a philosophy that rejects rulers and hierarchy. It is old.\n"
    assert wiki_prose(wiki) == prose
    assert fetch_demo_corpus(store, log=lambda *_: None, wheel=tmp_path / "absent.whl") == d


def test_generate_refuses_a_cache_with_ids_past_the_vocabulary(tmp_path, tiny_llama):
    """A cache whose token ids the model cannot embed is one line naming the file, not an
    IndexError from inside a step."""
    from specctl.models.fingerprint import tokenizer_fingerprint as fp
    vocab = json.loads((Path(tiny_llama) / "config.json").read_text())["vocab_size"]
    docs = [[5, 6, vocab + 7, 8]] * 6
    out = tmp_path / "cache"
    write_cache(out, docs, CountConfig(max_key_len=2, gram_len=2, top=20, min_count=6),
                fp(tiny_llama))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    r = runner.invoke(app, ["generate", str(prompts), "--model", str(tiny_llama), "--method",
                            "self-draft", "--corpus-cache", str(out), "--store",
                            str(tmp_path / "s"), "--max-tokens", "4", "-q"])
    fails(r, "past this model's vocabulary", str(out))


def test_links_out_of_a_corpus_folder_are_not_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("private words that must not end up in a cache")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The quick brown fox jumps over the lazy dog.")
    (corpus / "inside.txt").symlink_to(corpus / "a.txt")
    (corpus / "leak.txt").symlink_to(secret)
    docs, st = read_all([corpus])
    # (the link inside is followed, to a.txt: read once, as a file given twice is)
    assert [Path(n).name for n, _ in docs] == ["a.txt"]
    assert st.links_outside == 1 and "links to files outside" in st.summary()


def test_a_killed_build_leaves_no_work_behind(tmp_path, tok_dir, oanc_tree):
    """A work folder left by a killed build-cache (no process holds its lock) is listed by
    `store ls` and removed by the next build-cache; one in use is not touched."""
    import fcntl
    store = tmp_path / "store"
    work = store / "work"
    (work / "build-cache-dead1").mkdir(parents=True)
    (work / "build-cache-dead1" / "stream.i32").write_bytes(b"\0" * 4096)
    live = work / "build-cache-live1"
    live.mkdir()
    with open(live / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = invoke("store", "ls", "--store", store)
        assert "build-cache-dead1" in r.output and "killed" in r.output
        assert "build-cache-live1" not in r.output
        r = invoke("store", "ls", "--store", store, "--kind", "work")   # (the rows' own kind)
        assert r.exit_code == 0 and "build-cache-dead1" in r.output, r.output
        assert "build-cache-dead1" not in invoke("store", "ls", "--store", store,
                                                 "--kind", "runs").output
        r = invoke("build-cache", oanc_tree, "--model", tok_dir, "--store", store,
                   "--min-count", 2, "--workers", 1)
        assert r.exit_code == 0, r.output
        assert sorted(p.name for p in work.iterdir()) == ["build-cache-live1"]


def test_an_input_given_twice_is_read_once(tmp_path, tok_dir, oanc_tree):
    """`a a ./a`, or a file a folder also given reads, counted once (counted three times,
    each n-gram passed --min-count at a third of its occurrences); a file the folder's walk
    skips (JSONL) is read as given."""
    one = next(p for p in sorted(oanc_tree.rglob("*.txt")))
    lines = tmp_path / "more.jsonl"
    lines.write_text("".join(json.dumps({"text": f"line {i} of more text"}) + "\n"
                             for i in range(50)))
    opts = ("--model", tok_dir, "--min-count", 2, "--top", 5, "--max-key-len", 3,
            "--gram-len", 2, "--workers", 1, "--name")
    totals = []
    for name, given in (("once", [oanc_tree, lines]),
                        ("again", [oanc_tree, one, oanc_tree, lines, oanc_tree / ".", lines])):
        r = invoke("build-cache", *given, *opts, name, "--store", tmp_path / "s")
        assert r.exit_code == 0, r.output
        m = json.loads((tmp_path / "s" / "ngram-caches" / name / "manifest.json").read_text())
        totals.append((m["files"], m["tokens"], m["total_ngrams"]))
    said = " ".join(r.output.split())
    n = totals[0][0] - 1   # (the folder's files it reads, twice more; then one, and lines)
    assert f"{2 * n + 2} files given more than once (or inside a folder given too), read " \
           f"once: {one}, " in said, said
    assert totals[0] == totals[1] and totals[0][0] >= 2, totals
