"""A tiny random model and its artifacts, for measuring the runtime's own host work.

    python recipes/tiny_model.py OUT --input FILE --store STORE [--layers 2] [--hidden 64]
                                 [--vocab 2048]

Its forward costs almost nothing, so what a step costs with it is the runtime's work: the
setup of the issue "A host-lean step" (recipes/host_profile.py --model OUT ...). Writes:
- OUT: a random Llama (`--layers`, `--hidden`) with a byte-level BPE of about `--vocab` tokens
  trained on the input's prompts (the tests' tiny model, larger);
- OUT/skip.json: a one-block skip set (the last layer's attention) for draft-verify;
- into STORE: a Self-Draft corpus cache of the input's prompts (as `specctl build-cache` makes
  one) and a Kangaroo adapter initialized from the model's layer 1 (as `train-adapter` stores
  one; untrained, so its drafts are the model's own early exit).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny import make_tiny_model  # noqa: E402

from specctl.engine.loader import load_model  # noqa: E402
from specctl.io.prompts import read_prompts  # noqa: E402
from specctl.models.fingerprint import model_fingerprint  # noqa: E402
from specctl.prep.cache.command import BuildCacheConfig, CountConfig, run_build_cache  # noqa
from specctl.prep.adapter.train import save_adapter  # noqa: E402
from specctl.speculative.kangaroo import Adapter  # noqa: E402
from specctl.store import Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--input", required=True, help="JSONL prompts (what the profile runs)")
    ap.add_argument("--store", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=2048)
    a = ap.parse_args()
    texts = [t["content"] for r in read_prompts(a.input) for turn in r.turns for t in turn]
    out = make_tiny_model(Path(a.out), layers=a.layers, hidden=a.hidden, vocab_size=a.vocab,
                          texts=texts)
    (out / "skip.json").write_text(json.dumps(
        {"num_layers": a.layers, "attn": [a.layers - 1], "mlp": []}))
    store = Store(a.store)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "prompts.txt"
        corpus.write_text("\n".join(texts))
        run_build_cache(BuildCacheConfig((str(corpus),), str(out), CountConfig(min_count=1),
                                         force=True), store)
    model = load_model(out, "cpu", "fp32")
    save_adapter(store, model, Adapter.init_from_model(model, 1), model_fingerprint(out),
                 {"heldout_top1": 0.0})
    print(out)


if __name__ == "__main__":
    main()
