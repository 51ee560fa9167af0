"""--resume continues a run only when everything its answers depend on is unchanged, by content
(runtime/jobs/depends.py, models/contents.py): weights replaced under the same path past the first
MiB (which the artifact key, model_fingerprint, does not read), a corpus cache rewritten under
the same id, a run recorded without contents. The digest cache: a start costs a stat, a changed
file (a rewrite with its mtime set back included) is hashed again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli import app
from tiny import make_tiny_model

runner = CliRunner(env={"COLUMNS": "200"})
MAX_TOKENS = 5
PROMPTS = [{"prompt": "The quick brown fox"}, {"prompt": "To be or not to be"},
           {"prompt": "What is the capital of France?"}]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l]


def generate(inp, out, store, model, *extra):
    r = runner.invoke(app, [str(a) for a in (
        "generate", inp, "--model", model, "--store", store, "--out", out, "--max-tokens",
        MAX_TOKENS, "--device", "cpu", "--dtype", "fp32", "-q", *extra)])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "Traceback" not in r.output
    return " ".join(r.output.split())


def runs(store: Path) -> list[Path]:
    d = store / "runs"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


def texts(path: Path) -> list[str]:
    return [l["text"] for l in read_jsonl(path)]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny models of the same shapes (other seeds), weights over 1 MiB (3.5 MB)."""
    root = tmp_path_factory.mktemp("models")
    return (make_tiny_model(root / "a", hidden=128, seed=0),
            make_tiny_model(root / "b", hidden=128, seed=1))


def test_resume_refuses_weights_changed_past_the_first_mib(tmp_path, models, count_generated):
    """The probe's defect: weights behind a folder replaced by same-shaped ones that differ past
    the first MiB; --resume said '2 of 3 already done' and mixed two models' answers."""
    from specctl.models.fingerprint import model_fingerprint
    a, b = models
    model = tmp_path / "model"
    shutil.copytree(a, model)
    inp = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    store = tmp_path / "store"
    generate(inp, tmp_path / "first.jsonl", store, model, "--limit", 2)
    (old_run,) = runs(store)

    # the weights past the first MiB become model b's (same file layout: same shapes)
    w, wb = model / "model.safetensors", (b / "model.safetensors").read_bytes()
    data = bytearray(w.read_bytes())
    assert len(data) == len(wb) > 3 << 20
    key_before = model_fingerprint(model)
    data[2 << 20:] = wb[2 << 20:]
    w.write_bytes(bytes(data))
    assert model_fingerprint(model) == key_before   # the artifact key cannot see it

    count_generated.clear()
    said = generate(inp, tmp_path / "second.jsonl", store, model, "--resume")
    assert f"not resuming {old_run.name}" in said and "weights model.safetensors changed" in said
    assert "resuming" not in said.replace("not resuming", "")
    assert sorted(count_generated) == [0, 1, 2]                  # all three, with the new weights
    assert len(runs(store)) == 2
    # the answers are those of the changed model alone (a fresh run in another store)
    generate(inp, tmp_path / "fresh.jsonl", tmp_path / "store2", model)
    assert texts(tmp_path / "second.jsonl") == texts(tmp_path / "fresh.jsonl")

    # and the new run resumes: nothing changed since
    count_generated.clear()
    said = generate(inp, tmp_path / "third.jsonl", store, model, "--resume")
    assert "already complete" in said and count_generated == []


def test_unchanged_model_resumes_and_a_run_without_contents_does_not(tmp_path, models,
                                                                       count_generated):
    a, _ = models
    inp = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    store = tmp_path / "store"
    generate(inp, tmp_path / "o1.jsonl", store, a, "--limit", 1)
    (run,) = runs(store)
    manifest = json.loads((run / "manifest.json").read_text())
    deps = manifest["depends"]
    assert {"model config", "tokenizer", "weights model.safetensors", "options",
            "device"} <= set(deps)
    count_generated.clear()
    said = generate(inp, tmp_path / "o2.jsonl", store, a, "--resume", "--limit", 2)
    assert f"resuming {run.name}: 1 of 2" in said and count_generated == [1]

    # a run begun by an older specctl recorded no contents: nothing can be checked
    del manifest["depends"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    count_generated.clear()
    said = generate(inp, tmp_path / "o3.jsonl", store, a, "--resume")
    assert f"not resuming {run.name}" in said and "older specctl" in said
    assert sorted(count_generated) == [0, 1, 2]


def _corpus_cache(tmp_path: Path, model: Path, docs) -> Path:
    """A corpus cache of docs (token lists) for the model's tokenizer at tmp_path/cache, made
    anew over whatever was there (a rewrite under the same name)."""
    from specctl.models.fingerprint import tokenizer_fingerprint
    from specctl.prep.cache.ngrams import CountConfig, count_token_docs, write_artifact
    out = tmp_path / "cache"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    cfg = CountConfig(max_key_len=2, gram_len=2, top=20, min_count=2)
    write_artifact(out, count_token_docs(docs, cfg, tmp_path / "w"),
                   {"max_key_len": 2, "gram_len": 2, "top": 20, "min_count": 2,
                    "tokenizer_fingerprint": tokenizer_fingerprint(model), "tokenizer": "t"})
    return out


def test_resume_refuses_a_corpus_cache_rewritten_under_the_same_name(tmp_path, tiny_llama,
                                                                       count_generated):
    """A self-draft run names its corpus cache by id only: the cache's content is recorded."""
    cache = _corpus_cache(tmp_path, tiny_llama, [[5, 6, 7, 8, 9]] * 3)
    inp = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    store = tmp_path / "store"
    opts = ("--method", "self-draft", "--corpus-cache", cache)
    generate(inp, tmp_path / "o1.jsonl", store, tiny_llama, *opts, "--limit", 1)
    (run,) = runs(store)
    _corpus_cache(tmp_path, tiny_llama, [[10, 11, 12, 13]] * 4)
    count_generated.clear()
    said = generate(inp, tmp_path / "o2.jsonl", store, tiny_llama, *opts, "--resume")
    assert f"not resuming {run.name}" in said and "corpus cache changed" in said
    assert sorted(count_generated) == [0, 1, 2]


def test_auto_resumes_no_run_whose_corpus_cache_changed(tmp_path, tiny_llama,
                                                         count_generated):
    """--method auto --resume takes the job's run with the most answers among those that
    depend on what they did: a complete self-draft run whose corpus cache was rewritten under
    its name is not one (it was taken, refused as changed, and every answer made again); the
    ar run with 1 of 3 is, and makes the 2 it lacks."""
    cache = _corpus_cache(tmp_path, tiny_llama, [[5, 6, 7, 8, 9]] * 3)
    inp = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    store = tmp_path / "store"
    generate(inp, tmp_path / "o1.jsonl", store, tiny_llama, "--method", "self-draft",
             "--corpus-cache", cache)
    generate(inp, tmp_path / "o2.jsonl", store, tiny_llama, "--limit", 1)
    _corpus_cache(tmp_path, tiny_llama, [[10, 11, 12, 13]] * 4)
    count_generated.clear()
    said = generate(inp, tmp_path / "o3.jsonl", store, tiny_llama, "--method", "auto",
                    "--corpus-cache", cache, "--resume")
    assert "resuming the ar run" in said and sorted(count_generated) == [1, 2], said


def test_digest_cache(tmp_path, monkeypatch):
    """A digest is reused while the file's stat is unchanged, and computed again after any
    change: in the middle of the file, or with the mtime set back (the ctime moves)."""
    import specctl.models.contents as contents
    from specctl.store import Store

    f = tmp_path / "w.bin"
    data = bytearray(os.urandom(3 << 20))
    f.write_bytes(bytes(data))
    hashed = []
    real = contents.hashlib.new

    def new(name):
        hashed.append(name)
        return real(name)
    monkeypatch.setattr(contents.hashlib, "new", new)
    store = Store(tmp_path / "store")
    d1 = contents.DigestCache(store).digest(f)
    cache = contents.DigestCache(store)
    cache.save()                      # (nothing learnt: nothing written)
    assert not (store.root / contents.CACHE).exists()
    c = contents.DigestCache(store)
    assert c.digest(f) == d1 and len(hashed) == 2
    c.save()
    hashed.clear()
    assert contents.DigestCache(store).digest(f) == d1 and hashed == []   # a stat, no read

    st = f.stat()
    data[len(data) // 2] ^= 0xFF      # one byte in the middle
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))   # the mtime set back
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
    d2 = contents.DigestCache(store).digest(f)
    assert d2 != d1 and hashed == [contents.HASH]


def test_a_store_model_is_named_by_its_checked_crc32(tmp_path, tiny_llama):
    """A store model's weights are checked against its manifest's crc32 at every load: those
    are its content, and nothing is hashed for it."""
    from specctl.models.contents import model_contents
    from specctl.store import file_crc32
    d = tmp_path / "m"
    shutil.copytree(tiny_llama, d)
    crc = file_crc32(d / "model.safetensors")
    (d / "manifest.json").write_text(json.dumps({"weights_crc32": {"model.safetensors": crc}}))
    assert model_contents(d)["weights model.safetensors"] == f"crc32:{crc}"
    (d / "manifest.json").unlink()
    assert model_contents(d)["weights model.safetensors"].startswith("sha256:")
