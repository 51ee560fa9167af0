"""The host-charged clock of tests/test_host_clock.py at real size: the demo model
(SmolLM2-135M-Instruct, fp32 on this CPU) and its real drafter, Self-Draft as a user runs it
by default (context cache; no corpus cache is in this store, no job cache), on real prompts,
every forward priced by the committed H200 table of the demo shape (sim.h200_fused_table),
every prefill by its prefill table, and everything else the run does by this process's own
CPU time times sim.HOST. The tests' tiny model has a vocabulary of 30-odd tokens and prompts
of 3-12: its drafting costs the host a fraction of what the demo model's does. So this is
the clock's prediction of what `bench-batch` measures on the GPU (2026-11-26: Self-Draft
0.88x / 0.71x / 0.61x ar at b8 / 32 / 64, 256 ShareGPT prompts x 64 tokens).

    python bench-results/2026-11-29-host-clock-5/demo_clock.py BATCH [PROMPTS] [THREADS]

PROMPTS (default 4 x BATCH) ShareGPT first turns, each cut to its first 96 tokens (prefill of
whole turns on 2 cores would take longer than the run), answers of the lengths the demo
model's real answers had (sim.trace_lengths, at most 64; with all of them 64 long, `ar`'s
sequences all end at once and it admits in whole batches, which no real job does). Prints ar's and Self-Draft's simulated ms, the ratio, steps,
drafting steps and the learnt host price of a drafting sequence; asserts the outputs equal.
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
from specctl.runtime.jobs.config import GenerateConfig  # noqa: E402
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
clock.reset()
lens = [min(x, 64) for x in trace_lengths(n, traces())]   # (the real answers' lengths)
ref, ar = sim_run(model, prompts, None, clock, batch_size=b, max_tokens=lens)
t_ar = clock()
cfg = GenerateConfig(input="x", method="self-draft", batch_size=b, max_tokens=64)
dr = make_drafter(cfg, model, model_dir, store, lambda *_: None)
ctl = sim_controller(dr, clock.table)
clock.reset()
got, st = sim_run(model, prompts, dr, clock, batch_size=b, max_tokens=lens, controller=ctl)
t_sd = clock()
assert got == ref, "Self-Draft's output differs from ar's"
drafting = sum(v for k, v in st.budget_hist.items() if k) if st.budget_hist else 0
fit = ctl.cost.host_fit()
print(f"batch {b}, {n} prompts x {sum(lens) / n:.0f} tokens, host x{HOST}: ar {t_ar * 1e3:.1f} ms ({ar.steps} "
      f"steps), self-draft {t_sd * 1e3:.1f} ms ({st.steps} steps, {st.controlled_steps} "
      f"drafting, {drafting} sequence-steps with a budget, {st.searches} searches, guard trips "
      f"{st.guard_trips}): {t_ar / t_sd:.3f}x ar; host price of drafting: {fit[0]:.3f} ms a "
      f"step + {fit[1] * 1e3:.1f} us a drafting sequence (lean {ctl.cost.lean_host * 1e3:.1f} "
      f"us a sequence); wall {time.time() - w0:.0f} s", flush=True)
for name, r in (("ar", ar), ("self-draft", st)):
    print(f"  {name}: prefill {r.prefill_s * 1e3:.1f} ms ({r.prefill_forwards} forwards), steps "
          f"{r.step_s * 1e3:.1f} ms; lean steps {r.lean_steps} ({r.lean_step_ms:.1f} ms), "
          f"drafting {r.controlled_steps - r.lean_steps} ({r.measured_step_ms - r.lean_step_ms:.1f}"
          f" ms, predicted {r.predicted_step_ms:.1f}), accepted {r.accept_hist}, held "
          f"{r.guard_held}, searches {r.search_ms:.1f} ms")
