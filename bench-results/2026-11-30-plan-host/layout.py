"""tree_layout's two ways (Python bit rows, numpy arrays), median us warm (the same call in a loop)
and after a 32 MB sum (a CPU forward's cache traffic between two plans), by batch and nodes a
tree. From the repo root: PYTHONPATH=$PWD python bench-results/2026-11-30-plan-host/layout.py"""
import random, time
import numpy as np
from specctl.engine import batch as FB
big = np.ones(4_000_000)
def tm(f, n, flush):
    ts = []
    for _ in range(n):
        if flush: big.sum()
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return sorted(ts)[n // 2] * 1e6
rng = random.Random(0)
def tree(k):   # a trie-like tree of k nodes: each node's parent an earlier node or the root
    return [rng.randrange(-1, j) if rng.random() < 0.4 else j - 1 for j in range(k)]
for B, k in ((1, 15), (4, 15), (8, 8), (8, 15), (8, 30), (16, 15), (32, 8), (32, 15), (64, 8), (64, 15)):
    ps = [tree(k) for _ in range(B)]
    n = k + 1


    FB_ROWS = FB.ROWS_NODES
    FB.ROWS_NODES = 0
    a_w, a_f = tm(lambda: FB.tree_layout(ps, n), 300, False), tm(lambda: FB.tree_layout(ps, n), 100, True)
    FB.ROWS_NODES = 10**9
    r_w, r_f = tm(lambda: FB.tree_layout(ps, n), 300, False), tm(lambda: FB.tree_layout(ps, n), 100, True)
    FB.ROWS_NODES = FB_ROWS
    print(f"B {B:3d} x {k:3d} nodes = {B*k:5d}: arrays warm {a_w:7.1f} flushed {a_f:7.1f} | rows warm {r_w:7.1f} flushed {r_f:7.1f} us")
