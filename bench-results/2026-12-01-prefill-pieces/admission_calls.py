"""Each prefill call of ar's run on the host-charged clock, eager then in pieces: its prompts,
tokens, and what the admission learnt (forwards, ms, its fit F). Prompts as long as ShareGPT's,
CUDA's prefill chunk.

    PYTHONPATH=$PWD python bench-results/2026-12-01-prefill-pieces/admission_calls.py BATCH PROMPTS
"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model, sim_run
from specctl.runtime.step import admission as A
m, patch = script_model()
b, n = int(sys.argv[1]), int(sys.argv[2])
known, prompts, lens, clock = T.workload(m, b, n, patch, real_lengths=True)
origp = A.Admission.prefilled
def prefilled(self, forwards, tokens, ms, prompts=1):
    origp(self, forwards, tokens, ms, prompts)
    print(f"  t={clock()*1e3:7.1f} prompts {prompts:2d} tokens {tokens:5d} fwd {forwards} ms {ms:6.2f} F {self.fixed_ms()}")
A.Admission.prefilled = prefilled
for pieces in (False, True):
    clock.reset()
    print("pieces", pieces)
    out, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False, pieces=pieces, prefill_chunk=4096)
    print(f"job {clock()*1e3:.1f} prefill_s {st.prefill_s*1e3:.1f}")
