#!/bin/bash
# The job cache's measurements (issue 55) on the demo model, CPU fp32, run one after another
# (2 shared cores: never two at once). OUT: where the outputs go (default /tmp/jc).
set -e
cd "$(dirname "$0")/../.."
PY=${PY:-python}
OUT=${OUT:-/tmp/jc}
mkdir -p "$OUT"
$PY recipes/job_workload.py --docs 24 > "$OUT/job24.jsonl"
$PY recipes/job_workload.py --docs 12 > "$OUT/job12.jsonl"
for b in 1 8; do
  for jc in job-cache no-job-cache; do
    $PY -m specctl generate "$OUT/job24.jsonl" --method self-draft --$jc -b $b --max-tokens 64 \
      --device cpu --dtype fp32 -o "$OUT/gen-b$b-$jc.jsonl" > "$OUT/gen-b$b-$jc.log" 2>&1
    $PY bench-results/2026-11-28-job-cache/summarize.py "$OUT/gen-b$b-$jc.jsonl" \
      "$OUT/gen-b$b-$jc.summary.json"
  done
done
$PY -m specctl bench "$OUT/job12.jsonl" --methods ar,self-draft:no-job,self-draft:job \
  --batch-sizes 1 --max-tokens 48 --repeats 2 --warmup 1 --device cpu --dtype fp32 \
  > "$OUT/bench-job.log" 2>&1
$PY -m specctl bench recipes/prompts/specbench128.jsonl --limit 12 \
  --methods ar,self-draft:no-job,self-draft:job --batch-sizes 1 --max-tokens 48 --repeats 2 \
  --warmup 1 --device cpu --dtype fp32 > "$OUT/bench-heldout.log" 2>&1
# the job cache's reach where no budget cuts it: --speculate fixed (every candidate verified
# every step; --branches 0 keeps the CPU's step small), batch 1
for jc in job-cache no-job-cache; do
  $PY -m specctl generate "$OUT/job12.jsonl" --method self-draft --$jc -b 1 --max-tokens 48 \
    --speculate fixed --branches 0 --device cpu --dtype fp32 -o "$OUT/fixed-b1-$jc.jsonl" \
    > "$OUT/fixed-b1-$jc.log" 2>&1
  $PY bench-results/2026-11-28-job-cache/summarize.py "$OUT/fixed-b1-$jc.jsonl" \
    "$OUT/fixed-b1-$jc.summary.json"
done
