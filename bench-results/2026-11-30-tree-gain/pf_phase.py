"""The prefill phase's host work at chunk 4096 on the demo clock: per prefill call, the clock's
ms and the under_prefill (search) share, ar against a method. pf_phase.py BATCH PROMPTS METHOD"""
import runpy, sys, time
sys.argv = ["chunk_clock.py"] + sys.argv[1:]
from specctl.runtime.step import runner as R
log = []
o_pf, o_under = R.Runner._prefill, R.Runner.under_prefill
def _prefill(self, fresh, under=None):
    t0 = self.clock(); c0 = time.thread_time()
    box = {"under": 0.0}
    def u():
        t = self.clock()
        under()
        box["under"] += self.clock() - t
    r = o_pf(self, fresh, under=u if under else None)
    log.append((self.drafter.name, self.prefill_chunk, len(fresh), (self.clock() - t0) * 1e3, box["under"] * 1e3))
    return r
R.Runner._prefill = _prefill
try:
    runpy.run_path(str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-30-prefill-chunk/chunk_clock.py"), run_name="__main__")
finally:
    import collections
    agg = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
    for name, ch, n, ms, und in log:
        a = agg[(name, ch)]; a[0] += 1; a[1] += n; a[2] += ms; a[3] += und
    for k, (c, n, ms, und) in agg.items():
        print(k, f"calls {c} prompts {n} clock ms {ms:.1f} under_prefill ms {und:.1f}")
