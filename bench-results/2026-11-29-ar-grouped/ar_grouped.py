"""How much of speculation's gain at batch is grouped admission, which `ar` is denied? On the
host-charged clock of tests/test_host_clock.py (demo shape's H200 tables, host x HOST), requests
waiting (4x the batch, the real-text traces' lengths): `ar` admitting every freed slot at once (as it
ran before this folder's change, and runs under --speculate fixed), `ar` with the admission
policy a controller's run gets (runtime/step/admission.py: `ar` under auto, the default, since
this folder's change), and the trace's chains (real text's acceptance) under auto. Least time
of ROUNDS rounds each, against `ar` at once.

    python bench-results/2026-11-29-ar-grouped/ar_grouped.py [ROUNDS] [BATCHES] [known|cap]

known: each answer's budget is its real length, so admission's known-end rule sees every end
(what tests/sim.py gave every run before this folder); cap: every budget is the longest
answer's (one --max-tokens, as a job has) and the shorter answers end "by EOS", unseen
(sim_run's ends_known=False, what tests/test_host_clock.py runs now).
"""
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import (HOST, SimClock, TraceChains, h200_fused_table, prefill_table,  # noqa: E402
                 script_model, sim_controller, sim_run, timed_model, trace_lengths, traces)


class Patch:   # (monkeypatch's setattr, never undone: one process, one probe)
    def setattr(self, obj, name, value, raising=True):
        setattr(obj, name, value)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "8,32,64").split(",")]
    known = (sys.argv[3] if len(sys.argv) > 3 else "cap") == "known"
    m, _ = script_model()
    print("| batch | ar+grouped x ar | trace x ar | trace x ar+grouped | prefill forwards "
          "ar / ar+grouped / trace | steps ar / ar+grouped / trace |")
    print("|---|---|---|---|---|---|")
    for b in batches:
        texts = traces()
        n = 4 * b
        prompts = T._prompts(n, seed=b)
        lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, texts)]
        clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
        timed_model(m, clock, Patch())
        best, st, ref = {}, {}, None
        for _ in range(rounds):
            for name in ("ar", "ar+grouped", "trace"):
                clock.reset()
                if name in ("ar", "ar+grouped"):
                    out, s = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens,
                                     grouped=name == "ar+grouped", ends_known=known)
                    ref = ref or out
                else:
                    dr = TraceChains(ref, texts)
                    out, s = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens,
                                     controller=sim_controller(dr, clock.table),
                                     ends_known=known)
                assert out == ref, name
                t = clock()
                if t < best.get(name, float("inf")):
                    best[name], st[name] = t, s
        ar, g, tr = best["ar"], best["ar+grouped"], best["trace"]
        names = ("ar", "ar+grouped", "trace")
        print(f"| {b} | {ar / g:.3f} | {ar / tr:.3f} | {g / tr:.3f} | "
              + " / ".join(str(st[k].prefill_forwards) for k in names) + " | "
              + " / ".join(str(st[k].steps) for k in names) + " |", flush=True)


if __name__ == "__main__":
    main()
