"""Can anything change a greedy fp32 token at batch 64 (issue 52 item 5)? The tiny model and
the demo-model-shaped workload of tests/test_host_clock.py: ar at batch 1 is the reference;
ar at 64, and each method under auto at 64 on the host-charged clock (its decisions follow
the machine's timing: admission groups, draft budgets, graph-grid shapes), are compared with
it, and every first difference is priced by its logit gap (one batch-1 fp32 forward over the
prompt and the common prefix) in fp32 rounding steps of the top logit.

    python bench-results/2026-11-28-fp32-b64/probe.py [n_prompts] [rounds] [tokens]   (repo root)

tokens: every answer that long (default: the traces' lengths, at most 64).
"""
import sys

sys.path.insert(0, "tests")
from helpers import method_drafters, run_ids  # noqa: E402
from sim import (HOST, SimClock, TraceChains, h200_fused_table, prefill_table,  # noqa: E402
                 script_model, sim_controller, sim_run, timed_model, trace_lengths,
                 traces)
from test_host_clock import _prompts  # noqa: E402
from specctl.bench.analysis import tie_gap  # noqa: E402


def gap(model, prompt, ref, got):
    j = next((j for j, (p, q) in enumerate(zip(got, ref)) if p != q), None)
    if j is None:
        return None
    return j, tie_gap(model, list(prompt) + ref[:j], ref[j], got[j])


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    m, patch = script_model()
    known = traces()
    prompts = _prompts(n, seed=64)
    lens = [min(x, 64) for x in trace_lengths(n, known)] if len(sys.argv) < 4 else \
        [int(sys.argv[3])] * n
    ref = [run_ids(m, [p], batch_size=1, max_tokens=k)[0][0] for p, k in zip(prompts, lens)]
    clock = SimClock(h200_fused_table(), 64, host=HOST, prefill=prefill_table())
    max_len = max(len(p) for p in prompts) + max(lens) + 16
    timed_model(m, clock, patch)
    out, _ = sim_run(m, prompts, None, clock, batch_size=64, max_tokens=lens, max_len=max_len)
    runs = {"ar b64": [out]}
    drafters = {"trace": TraceChains(ref, known), **method_drafters(m, prompts, ref)}
    for name, dr in drafters.items():
        if dr is None:
            continue
        runs[name] = []
        for _ in range(rounds):
            d = dr.fresh()
            clock.reset()
            got, _ = sim_run(m, prompts, d, clock, batch_size=64, max_tokens=lens,
                             controller=sim_controller(d, clock.table), max_len=max_len)
            runs[name].append(got)
    print(f"{n} prompts, answers of {min(lens)}-{max(lens)} tokens; reference: ar at batch 1\n")
    print("| run | outputs different | first differences: #prompt (token, logit gap, what "
          "another batch shape moves the logits, near-tie) |")
    print("|---|---|---|")
    for name, outs in runs.items():
        for r, got in enumerate(outs):
            diffs = [(i, gap(m, prompts[i], ref[i], g)) for i, g in enumerate(got) if g != ref[i]]
            shown = "; ".join(f"#{i}: ({j}, {d['gap']:.2e}, {d['shape']:.1e}, {d['near_tie']})"
                              for i, (j, d) in diffs[:6])
            print(f"| {name} round {r} | {len(diffs)} of {n} | {shown or '-'} |")


main()
