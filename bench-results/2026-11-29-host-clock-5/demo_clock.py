"""The host-charged clock of tests/test_host_clock.py at real size: the demo model
(SmolLM2-135M-Instruct, fp32 on this CPU) and its real drafter, Self-Draft as a user runs it
by default (context cache; no corpus cache is in this store, no job cache), on real prompts,
every forward priced by the committed H200 table of the demo shape (sim.h200_fused_table),
every prefill by its prefill table, and everything else the run does by this process's own
CPU time times sim.HOST. The tests' tiny model has a vocabulary of 30-odd tokens and prompts
of 3-12: its drafting costs the host a fraction of what the demo model's does. So this is
the clock's prediction of what `bench-batch` measures on the GPU (2026-11-26: Self-Draft
0.88x / 0.71x / 0.61x ar at b8 / 32 / 64, 256 ShareGPT prompts x 64 tokens).

    python bench-results/2026-11-29-host-clock-5/demo_clock.py BATCH [PROMPTS] [THREADS] [ROUNDS] [METHOD]

(METHOD a bench variant too, as self-draft:grid: since ../2026-11-29-grid-device.)

PROMPTS (default 4 x BATCH) ShareGPT first turns, each cut to its first 96 tokens (prefill of
whole turns on 2 cores would take longer than the run), answers of the lengths the demo
model's real answers had (sim.trace_lengths, at most 64; with all of them 64 long, `ar`'s
sequences all end at once and it admits in whole batches, which no real job does). Prints ar's and Self-Draft's simulated ms, the ratio, steps,
drafting steps and the learnt host price of a drafting sequence; asserts the outputs equal.

A caveat: the host's work is timed on the CPU that has just run the forward (225 ms of CPU
for the demo model at b64), so it runs with cold caches: a forward's own wrapper is charged
~0.7 ms at b64 (0.24 ms of CPU beside 225 inside), and `ar`'s host time moved by ~10%
between runs of the same work. Both methods pay it; the ratio of one round moves with it,
so rounds are repeated and the median is the figure.
"""
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from sim import (HOST, NoUndo, SimClock, h200_fused_table, prefill_table,  # noqa: E402
                 sim_controller, sim_run, timed_model, trace_lengths, traces)
from specctl.engine.loader import load_model  # noqa: E402
from specctl.io.sharegpt import first_human_turns  # noqa: E402
from specctl.models.checkpoint import resolve_model  # noqa: E402
from specctl.runtime.jobs.config import GenerateConfig, split_variant  # noqa: E402
from specctl.runtime.jobs.methods import make_drafter  # noqa: E402
from specctl.runtime.jobs.tokenization import Tokenization  # noqa: E402
from specctl.runtime.step.sequence import Request  # noqa: E402
from specctl.store import Store  # noqa: E402

b = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4 * b
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
store = Store(None)
model_dir = resolve_model(None, store)
model = load_model(model_dir, "cpu", "fp32")
tk = Tokenization(model_dir, chat=True)
texts = first_human_turns(n, store)
prompts = [tk.render(Request(i, [[{"role": "user", "content": t}]], 64))[:96]
           for i, t in enumerate(texts)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(model, clock, NoUndo())
w0 = time.time()
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
lens = [min(x, 64) for x in trace_lengths(n, traces())]   # (the real answers' lengths)
METHOD = sys.argv[5] if len(sys.argv) > 5 else "self-draft"   # (draft-verify: the skip set
SKIP = str(ROOT / "recipes/gpu/skip-attn-16-20-24-28.json")     # the CPU bench uses)
name, opts = split_variant(METHOD)   # (a bench variant too: self-draft:grid)
cfg = GenerateConfig(input="x", method=name, batch_size=b, max_tokens=64,
                     skip_set=SKIP if name == "draft-verify" else None, **opts)
base = make_drafter(cfg, model, model_dir, store, lambda *_: None)
ratios = []
for r in range(rounds):   # (ar, then Self-Draft afresh: a round's ratio is one pair's)
    clock.reset()
    ref, ar = sim_run(model, prompts, None, clock, batch_size=b, max_tokens=lens)
    t_ar = clock()
    dr = base.fresh()
    ctl = sim_controller(dr, clock.table)
    clock.reset()
    got, st = sim_run(model, prompts, dr, clock, batch_size=b, max_tokens=lens, controller=ctl)
    t_sd = clock()
    assert got == ref, f"{METHOD}'s output differs from ar's"
    ratios.append(t_ar / t_sd)
    drafting = sum(v for k, v in st.budget_hist.items() if k) if st.budget_hist else 0
    fit = ctl.cost.host_fit()
    print(f"batch {b}, {n} prompts x {sum(lens) / n:.0f} tokens, host x{HOST}, round {r + 1}: "
          f"ar {t_ar * 1e3:.1f} ms ({ar.steps} steps), {METHOD} {t_sd * 1e3:.1f} ms "
          f"({st.steps} steps, {drafting} sequence-steps with a budget, {st.searches} "
          f"searches, guard trips {st.guard_trips}): {t_ar / t_sd:.3f}x ar; host price of "
          f"drafting: {fit[0]:.3f} ms a step + {fit[1] * 1e3:.1f} us a drafting sequence; "
          f"wall {time.time() - w0:.0f} s", flush=True)
    for name, x in (("ar", ar), (METHOD, st)):
        print(f"  {name}: prefill {x.prefill_s * 1e3:.1f} ms ({x.prefill_forwards} forwards), "
              f"steps {x.step_s * 1e3:.1f} ms; lean steps {x.lean_steps} "
              f"({x.lean_step_ms:.1f} ms), drafting {x.controlled_steps - x.lean_steps} "
              f"({x.measured_step_ms - x.lean_step_ms:.1f} ms, predicted "
              f"{x.predicted_step_ms:.1f}), tokens {x.verified_tokens} (predicted "
              f"{x.predicted_tokens:.0f}), accepted {x.accept_hist}, held {x.guard_held}",
              flush=True)
ratios.sort()
print(f"batch {b}: {METHOD} x ar over {rounds} rounds: median "
      f"{ratios[len(ratios) // 2]:.3f}, all {', '.join(f'{x:.3f}' for x in ratios)}")
