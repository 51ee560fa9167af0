"""A numpy call warm (the same call in a loop) and after a 32 MB array sum that pushes the
host's data out of cache, as a CPU forward does between two plans: median us. From the repo
root: PYTHONPATH=$PWD python bench-results/2026-11-30-grid-calls/flush.py"""
import time

import numpy as np

from specctl.speculative.context_table import ContextTable

rng = np.random.default_rng(0)
t = ContextTable(49152, 10, 4)
t.push_texts([rng.integers(0, 49152, 300).tolist() for _ in range(64)])
keys = rng.integers(0, 49152, 64)
big = np.ones(4_000_000)


def tm(f, n, flush):
    ts = []
    for _ in range(n):
        if flush:
            big.sum()
        a = time.perf_counter()
        f()
        ts.append(time.perf_counter() - a)
    return sorted(ts)[n // 2] * 1e6


for name, f in (("np.minimum over 64 ints", lambda: np.minimum(keys, 4)),
                ("ContextTable.candidates, 64 keys x 4 x 4", lambda: t.candidates(keys, 4, 4))):
    print(f"{name:42s} warm {tm(f, 1000, False):6.1f} us   flushed {tm(f, 200, True):6.1f} us")
