"""`specctl bench` and `specctl report`: every method on the same prompts, in one process.

    res = run_bench(BenchConfig("mt_bench.jsonl", methods=("ar", "draft-verify", "hf")), store)
    md = markdown(res)                      # the tables, for a README
    write_plots(res, out_dir)               # speedup vs batch size, tokens/s per category

What is measured, per (method, batch size):
- specctl methods (`ar`, `draft-verify`, and every later method
  `runtime.jobs.methods.make_drafter` knows) run through the one `Runner`, greedy, EOS
  stopping as in `generate`. Every run, warm-up or
  timed, builds its drafter and controller afresh, as one `generate` run does, so adaptive
  state (acceptance estimates, draft-verify's gamma, learnt step costs) starts at its prior
  every time; what carries over is the loaded model, its captured CUDA graphs and KV cache
  (one cache shape for every method) and the step-cost table, measured at its first use (the
  first warm-up of the first `auto` method). transformers' peers keep no state between runs
  beyond the loaded model and hf-static's compiled shapes. Every table says so (`CARRIED`).
- `hf`: transformers' own `generate` on the same checkpoint, device and dtype: static batches of
  `batch_size` prompts in input order, left padding, do_sample=False, the same EOS ids.
  `hf-prompt-lookup`: the same with `prompt_lookup_num_tokens=10` (batch 1 only in transformers).
  `hf-static` (CUDA only): the same with `cache_implementation="static"`, transformers' fast
  path that compiles the forward; its warm-up runs the timed prompts in full (it compiles per
  shape).
- Warm-up: `warmup` untimed runs over the first `batch_size` prompts (16 new tokens at most);
  for hf-static the first is the whole timed workload, so its compiled shapes exist before the
  clock starts. specctl's runners capture every CUDA graph shape as they are built, which is
  before the clock starts too (each row's `captures` counts any captured inside it).
- Timing: `repeats` runs over all prompts, round-robin over the methods of a batch size; tokens/s = generated tokens / wall seconds of the whole
  run (prefill included; the KV cache allocation is not), the GPU synchronized before and after.
  Reported: the median, min, max and IQR of the repeats. Speedup over `ar`: the median over
  rounds of each round's ratio (round k of a method ran next to round k of `ar`, so a slow
  spell of a shared machine lands on both), with the rounds' range in the table.
- Honesty marks per row (bench/conditions.py): the batch it really ran at (no more than the
  prompts), drain-bound (fewer than 4 x batch prompts: a warning before the runs, `†` in the
  table) and the CUDA graph shapes captured inside its timed repeats (`captures`, `!` where any:
  their capture time is in its tokens/s).
- Acceptance numbers (mean accepted tokens, CTAR(1..6), share of steps with zero accepted,
  padding ratio a padded batch would have had) come from the first repeat, with the same
  definitions as `generate`'s metrics.json (`runtime.jobs.metrics.metrics`); they are
  deterministic, and
  later repeats must reproduce the first one's tokens exactly (`repeats_identical`).
- Outputs are compared token for token with `ar` of the same batch size and with `ar` at batch 1
  (run untimed once if batch 1 is not benchmarked). Every specctl method must match; `hf` rows
  are informational (padding and bf16 may change a greedy choice). Where a row differs (from
  `ar`, or between its repeats), `divergence_gaps` measures how close to a tie the model was at
  each sequence's first differing token: in bf16 a near-tie (a logit gap within
  NEAR_TIE_STEPS rounding steps) is flipped by any change of summation order; a large gap
  would be a bug. The table's `= ar` column says which.
- Peak memory: CUDA: torch.cuda.max_memory_allocated over the timed repeats (reset before each;
  it includes every resident model: the HF peer's weights too once loaded), and run_memory_mb,
  the peak minus what was allocated before the run (KV cache and activations).
  CPU: the process's RSS high-water mark (process-wide and never decreasing, so later rows include
  earlier ones).
- Per category (when prompts carry `category`): the run's wall time is attributed to requests in
  proportion to their time in a slot (exact at batch 1), giving tokens/s and speedup per category.

A bench run is stored as `benches/<id>/` with manifest.json, results.json (see
`bench.config.RESULTS_SCHEMA`) and table.md.

Modules: config (BenchConfig, the results schema), peers (the timed methods: specctl's and
transformers'), analysis (spreads, output comparison, divergence gaps), conditions (effective
batch, drain-bound, graph captures), run (the timing loop), report (stored runs, tables, plots).
"""

from specctl.bench.analysis import compare, divergence_gaps, mismatch_error, spread
from specctl.bench.config import PEERS, RESULTS_SCHEMA, BenchConfig, parse_list
from specctl.bench.report import (CARRIED, CATEGORY_COLUMNS, TABLE_COLUMNS, category_rows,
                                  load_benches, markdown, notes, table_rows, title, write_plots)
from specctl.bench.run import run_bench

__all__ = ["BenchConfig", "CARRIED", "CATEGORY_COLUMNS", "PEERS", "RESULTS_SCHEMA",
           "TABLE_COLUMNS", "category_rows", "compare", "divergence_gaps", "load_benches",
           "markdown", "mismatch_error", "notes", "parse_list", "run_bench", "spread",
           "table_rows", "title", "write_plots"]
