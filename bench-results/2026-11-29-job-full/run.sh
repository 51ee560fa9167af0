#!/bin/bash
# The job cache's reach in tokens a step on the full repetitive job (384 prompts), where no
# budget cuts its candidates (--speculate fixed; --branches 0 keeps the CPU's step small) and
# under auto (the default), batch 8 and 1, with and without the job cache; each output compared
# with ar's. Demo model, CPU fp32, one run after another; a run whose summary is here is not
# run again. OUT: where outputs go (default /tmp/jc2).
set -e
cd "$(dirname "$0")/../.."
PY=${PY:-python}
OUT=${OUT:-/tmp/jc2}
D=bench-results/2026-11-29-job-full
J=recipes/prompts/job-repetitive.jsonl
mkdir -p "$OUT"
[ -s "$OUT/ar.jsonl" ] || $PY -m specctl generate $J --method ar -b 16 --max-tokens 64 \
  --device cpu --dtype fp32 -o "$OUT/ar.jsonl" > "$OUT/ar.log" 2>&1
for mode in fixed auto; do
  for b in 8 1; do
    for jc in job-cache no-job-cache; do
      R=$mode-b$b-$jc
      [ -s "$D/$R.summary.json" ] && continue
      X=(); [ $mode = fixed ] && X=(--speculate fixed --branches 0)
      $PY -m specctl generate $J --method self-draft --$jc -b $b --max-tokens 64 "${X[@]}" \
        --device cpu --dtype fp32 -o "$OUT/$R.jsonl" > "$OUT/$R.log" 2>&1
      $PY bench-results/2026-11-28-job-cache/summarize.py "$OUT/$R.jsonl" "$D/$R.summary.json"
      $PY - "$OUT/ar.jsonl" "$OUT/$R.jsonl" <<'PYEOF'
import json, sys
a, b = ({(r := json.loads(l))["id"]: r["token_ids"] for l in open(f)} for f in sys.argv[1:])
bad = [k for k in a if a[k] != b.get(k)]
print(f"{sys.argv[2]}: {len(a) - len(bad)} of {len(a)} outputs equal ar's", bad[:5])
PYEOF
    done
  done
done
