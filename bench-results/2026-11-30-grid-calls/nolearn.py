"""Is the grid's host in --device-core mode slow because its own learning (under the forward)
leaves the host's caches cold? MODE=keep: as it is; none: no learning (grid_learned does
nothing: no acceptance past the first drafts, so more steps); pollute: no learning but a 600 KB
sweep in its place. From the repo root: MODE=none PYTHONPATH=$PWD python .../nolearn.py"""
import os

import numpy as np

from harness import profile_argv

profile_argv("self-draft:grid:fixed", "--device-core", "1")
from specctl.speculative import self_draft as SD
mode = os.environ.get("MODE")
if mode == "none":
    SD.SelfDraftDrafter.grid_learned = lambda self, seqs, acc: None
elif mode == "pollute":   # no learning, but a same-sized sweep of 600 KB under the forward
    buf = np.ones(600_000 // 8)
    SD.SelfDraftDrafter.grid_learned = lambda self, seqs, acc: (lambda: buf.sum())
import host_profile
host_profile.main()
