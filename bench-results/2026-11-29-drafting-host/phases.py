# CPU time by phase of Self-Draft's drafting steps only, per drafting sequence, in a host-charged run
# (tests/test_host_clock.py, BATCH, requests waiting; each phase timed by a wrapper, ~0.5 us a call of its own).
#   python bench-results/2026-11-29-drafting-host/phases.py BATCH
import sys, time
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
import specctl.runtime.step.runner as RM
from specctl.runtime.step.step import Planner
from specctl.runtime.step.accounting import Accounting
from specctl.speculative.self_draft import SelfDraftDrafter
from specctl.runtime.control.controller import Controller
from specctl.engine import batch as EB
import specctl.speculative.self_draft as SDM
import specctl.engine.kv as KVM
import specctl.runtime.step.answers as ANS
import specctl.runtime.step.step as STM
m, patch = script_model()
b = int(sys.argv[1])
phase = {}
def tw(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        c = time.thread_time()
        try: return f(*a, **k)
        finally: phase[label] = phase.get(label, 0) + time.thread_time() - c
    setattr(obj, name, w)
for o, n, l in [(Planner, "plan", "plan"), (Planner, "execute", "execute"), (RM, "read", "read"), (RM, "verify", "verify"),
                (RM, "commit", "commit"), (Planner, "prefetch", "prefetch"), (Accounting, "step", "acct"),
                (SelfDraftDrafter, "observe", "sd.observe"), (SelfDraftDrafter, "propose", "sd.propose"),
                (SelfDraftDrafter, "catch_up", "sd.catch_up"), (Planner, "_planned", "layout"),
                (Controller, "decide", "decide"), (Controller, "observe", "ctl.observe"), (RM.Runner, "catch_up", "runner.catch_up"),
                (EB.ForwardBatch, "__init__", "FB.init"), (EB, "tree_layout", "tree_layout"), (SDM, "build_trie", "build_trie"),
                (SelfDraftDrafter, "candidates", "candidates"), (KVM.KVCache, "commit_many", "commit_many"), (ANS.Answers, "emit", "emit"),
                (STM, "seq_input", "seq_input"), (RM, "verify_greedy", "verify_greedy") if hasattr(RM, "verify_greedy") else (STM, "verify_greedy", "verify_greedy")]:
    tw(o, n, l)
tot, nd, ns = {}, [0], [0]
inner = RM.Runner.step
def step(self, seqs, drain=False):
    phase.clear(); c = time.thread_time()
    rows0 = self.stats.step_tokens
    w = inner(self, seqs, drain)
    phase["ALL"] = time.thread_time() - c
    if self.drafter.name == "self-draft" and self.stats.step_tokens - rows0 > len(seqs):
        nd[0] += 1; ns[0] += len(seqs)
        for k, v in phase.items(): tot[k] = tot.get(k, 0) + v
    return w
RM.Runner.step = step
T.HOST = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
ratios, stats, ar = T.host_charged_ratios(m, b, 4 * b, patch, methods=["self-draft"], rounds=1)
print(ratios, "drafting steps", nd[0], "seq-steps", ns[0])
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"  {k:16s} {v*1e3/nd[0]:8.3f} ms/step {v*1e6/ns[0]:8.2f} us/seq")
