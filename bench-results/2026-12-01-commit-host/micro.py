"""Old against new, warm and cold (after 32 MB of cache traffic), on b64-shaped inputs:
KVCache.advance and Answers.emit at 26f3925 against this tree's, and the reverted
Planner._columns (7dceab7, copied below) against the lists it replaced. Run from the repo
root: python bench-results/2026-12-01-commit-host/micro.py"""
import random, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np
old = Path(tempfile.mkdtemp())
for mod, path in (("kv_old", "specctl/engine/kv.py"),
                  ("answers_old", "specctl/runtime/step/answers.py")):
    (old / f"{mod}.py").write_text(subprocess.run(["git", "show", f"26f3925:{path}"],
                                                  capture_output=True, text=True,
                                                  check=True).stdout)
sys.path.insert(0, str(old))
from specctl.engine.kv import KVCache
import kv_old, answers_old
from specctl.runtime.step.answers import Answers
from specctl.runtime.step.sequence import Request, Sequence
from specctl.runtime.step.stats import RunStats
from specctl.runtime.step.step import Planner

junk = np.ones(8 << 20, np.float32)
def bench(f, setup, n=400):
    warm, cold = [], []
    for i in range(n):
        a = setup()
        if i % 2:
            junk.__imul__(1.0000001)
        t0 = time.perf_counter(); f(*a); dt = time.perf_counter() - t0
        (cold if i % 2 else warm).append(dt * 1e6)
    return statistics.median(warm), statistics.median(cold)

B = 64
rng = random.Random(0)
def kvs(cls):
    kv = cls(1, B, 512, 1, 2)
    kv.lens[:] = [rng.randrange(100, 300) for _ in range(B)]
    return kv
for name, cls in (("old", kv_old.KVCache), ("new", KVCache)):
    for counts in (None, "acc"):
        kv = kvs(cls)
        slots = list(range(B))
        def setup():
            kv.lens[:] = [200] * B
            return (slots, None if counts is None else [rng.randrange(1, 4) for _ in range(B)])
        print("advance", counts, name, "warm %.1f cold %.1f us" % bench(kv.advance, setup))

def seqs_for(cls_answers):
    kv = KVCache(1, B, 512, 1, 2)
    st = RunStats()
    ans = cls_answers({2}, (), lambda ids: "", kv, 512, st)
    out = []
    for i in range(B):
        s = Sequence(Request(i, [[]], max_tokens=64), [1], i)
        s.out_ids = [5] * 10
        out.append(s)
    return ans, out
for name, mod in (("old", answers_old), ("new", None)):
    ans, ss = seqs_for(mod.Answers if mod else Answers)
    toks = [[rng.randrange(3, 99) for _ in range(rng.choice([1, 1, 2, 3]))] for _ in range(B)]
    def emit_all(ans=ans, ss=ss):
        e = ans.emit
        for s, t in zip(ss, toks):
            e(s, t)
    def setup(ss=ss):
        for s in ss:
            del s.out_ids[10:]
            s.finish_reason = None
        return ()
    print("emit x64", name, "warm %.1f cold %.1f us" % bench(emit_all, setup))

# _columns against the old lists + _room
kv = KVCache(1, B, 512, 1, 2)
kv.lens[:] = [rng.randrange(100, 300) for _ in range(B)]
pl = Planner.__new__(Planner); pl.kv, pl.max_len = kv, 512
ss = []
for i in range(B):
    s = Sequence(Request(i, [[]], max_tokens=64), [1], i); s.out_ids = [5] * 10; s.pending = 7; ss.append(s)
def old_way(seqs=ss):
    lens = kv.lens
    room = pl._room(seqs)
    seq = np.array(([s.slot for s in seqs], [lens[s.slot] for s in seqs], [s.pending for s in seqs], room), dtype=np.int64)
    return seq
def _columns(seqs):   # (7dceab7's Planner._columns, reverted)
    lens = kv.lens
    cols = np.array([(s.slot, lens[s.slot], s.pending, s.req.max_tokens - len(s.out_ids))
                     for s in seqs], dtype=np.int64).T
    np.minimum(cols[3] - 1, pl.max_len - 2 - cols[1], out=cols[3])
    np.maximum(cols[3], 0, out=cols[3])
    return cols
def new_way(seqs=ss):
    cols = _columns(seqs)
    slots, lens = cols[0].tolist(), cols[1].tolist()
    return cols
assert (old_way() == new_way()).all()
for name, f in (("old lists+_room+array", old_way), ("new _columns+tolist", new_way)):
    print(name, "warm %.1f cold %.1f us" % bench(f, lambda: ()))

# an ar step's verdicts: a Verdict a row and the probe tuple by index (26f3925's verify)
# against RowVerdicts (e038657)
from specctl.speculative.verify import RowVerdicts, Verdict
target = [rng.randrange(99) for _ in range(B)]
cu, real, probed = list(range(B + 1)), [1] * B, [0] * B
def old_verdicts():
    probe_out = tuple(target[cu[b] + real[b]:cu[b] + real[b] + probed[b]] if probed[b] else None
                      for b in range(B))
    return tuple([Verdict([], t) for t in target]), probe_out
def new_verdicts():
    return RowVerdicts(target), (None,) * B
for name, f in (("old verdicts", old_verdicts), ("new RowVerdicts", new_verdicts)):
    print(name, "warm %.1f cold %.1f us" % bench(f, lambda: ()))

# the step loop's passes over the running sequences a step (Runner._loop): a lambda key and
# the `finished` property a sequence (26f3925) against attrgetter and finish_reason
from operator import attrgetter
running = [Sequence(Request(i, [[]], max_tokens=64), [1], i) for i in range(B)]
def old_loop():
    running.sort(key=lambda s: s.slot)
    live = [s for s in running if not s.finished]
    n = sum(s.finished for s in live)
    return live, n, [s for s in running if s.finished]
SLOT = attrgetter("slot")
def new_loop():
    running.sort(key=SLOT)
    live = [s for s in running if s.finish_reason is None]
    done = [s for s in running if s.finish_reason is not None]
    return live, len(done) - len(running) + len(live), done
for name, f in (("old loop passes", old_loop), ("new loop passes", new_loop)):
    print(name, "warm %.1f cold %.1f us" % bench(f, lambda: ()))

# a paged cache's reservation before each step (Runner._reserve), every sequence's rows there
# already (most steps): sorted by a lambda and a scan of `running` a sequence (26f3925)
# against attrgetter and the scan only where a reservation fails
kvp = KVCache(1, B, 2048, 1, 2, num_blocks=B * 40)
paged = []
for i in range(B):
    s = Sequence(Request(i, [[]], max_tokens=256), [1], i, admitted=B - i)
    kvp.reserve(i, 400)
    kvp.lens[i] = 380
    paged.append(s)
ADMITTED = attrgetter("admitted")
def old_reserve():
    for s in sorted(paged, key=lambda s: s.admitted):
        while s in paged and not kvp.reserve(s.slot, kvp.lens[s.slot] + 16):
            raise RuntimeError
def new_reserve():
    lens, reserve, cut = kvp.lens, kvp.reserve, False
    for s in sorted(paged, key=ADMITTED):
        if cut and s not in paged:
            continue
        if reserve(s.slot, lens[s.slot] + 16):
            continue
        raise RuntimeError
for name, f in (("old paged reserve", old_reserve), ("new paged reserve", new_reserve)):
    print(name, "warm %.1f cold %.1f us" % bench(f, lambda: ()))
