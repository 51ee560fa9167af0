"""Self-Draft's propose, per-sequence and batched (commit 6ab1442's batch_trie path), timed on
alternate calls in one run (the same states and machine load for both), with host_profile's
arguments after `--`. Run from a checkout of 6ab1442:

    PYTHONPATH=. python bench-results/2026-11-29-sd-batch/interleave.py --model /tmp/tiny \
        --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store \
        --skip-set /tmp/tiny/skip.json --batch-sizes 64 --threads 1 --max-tokens 48 \
        --prompts 128 --methods self-draft:light:fixed --repeats 3
"""
import collections
import importlib.util
import sys
import time

import specctl.speculative.self_draft as sd

sys.argv = ["host_profile"] + sys.argv[1:]
T = collections.defaultdict(list)
calls = [0]
propose = sd.SelfDraftDrafter.propose


def timed(self, seqs, kv, limits):
    calls[0] += 1
    way = "batched" if calls[0] % 2 else "per-sequence"
    sd.BATCH_MIN = 8 if way == "batched" else 1 << 30
    t = time.perf_counter()
    out = propose(self, seqs, kv, limits)
    T[way, "b>=32" if len(seqs) >= 32 else "b<32"].append(time.perf_counter() - t)
    return out


sd.SelfDraftDrafter.propose = timed
spec = importlib.util.spec_from_file_location("hp", "recipes/host_profile.py")
hp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hp)
hp.main()
for k in sorted(T):
    v = sorted(T[k])
    print(*k, f"calls {len(v)} median {v[len(v) // 2] * 1e3:.3f} ms")
