#!/bin/bash
# Host work per step of a method that never drafts against ar (issue 41's bar: draft-verify
# :auto with a skip set whose drafts are never right within 10% of ar's host us/seq-step at
# batch 1 and 64). Five rounds, ar and the method alternating in each, default threads; batch 1
# over 64 prompts (~4,000 steps), batch 64 over 256. Setup as in host-rounds.sh (/tmp/tiny,
# /tmp/tiny-store, /tmp/tiny/skip-all.json). Prints the medians with min-max.
set -e
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
for i in $(seq "$ROUNDS"); do
  for bp in 1:64 64:256; do
    python recipes/host_profile.py --model /tmp/tiny --store /tmp/tiny-store \
      --input recipes/prompts/specbench128.jsonl --skip-set /tmp/tiny/skip-all.json \
      --methods ar,draft-verify:auto --batch-sizes "${bp%%:*}" --prompts "${bp##*:}" \
      --max-tokens 64 2>/dev/null | grep '^| [ad]'
  done
done | python -c '
import sys, statistics as S
rows = {}
for line in sys.stdin:
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    rows.setdefault((int(c[1]), c[0]), []).append(float(c[6]))
print("| batch | method | host us/seq-step, median (min-max) | vs ar |")
print("|---|---|---|---|")
for (b, m), v in sorted(rows.items()):
    ar = S.median(rows[(b, "ar")])
    print(f"| {b} | {m} | {S.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) | "
          f"{S.median(v) / ar:.2f}x |")'
