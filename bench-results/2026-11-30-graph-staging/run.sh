#!/bin/bash
# The graph path's host work (issue 52), before (aa04539: staging a padded step a sequence at a
# time) and after (944af8b: whole arrays). From the repo root, with the tiny model at /tmp/tiny
# (python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store)
# and a worktree of aa04539 at /tmp/wt-old carrying this commit's recipes/host_profile.py.
set -e
D=bench-results/2026-11-30-graph-staging
PYTHONPATH=$PWD python $D/stage_host.py 8,32,64 > $D/after.txt
HP="python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
  --store /tmp/tiny-store --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 --schedule cuda \
  --repeats 3 --skip-set /tmp/tiny/skip.json --graphs"
$HP --methods ar,self-draft:grid:fixed,self-draft:light:fixed,draft-verify,kangaroo > $D/host-profile-graphs.txt
for i in 1 2 3; do   # alternating, before and after
  (cd /tmp/wt-old && PYTHONPATH=/tmp/wt-old $HP --methods ar,self-draft:grid:fixed,self-draft:light:fixed | tail -3 | sed 's/^/before /')
  $HP --methods ar,self-draft:grid:fixed,self-draft:light:fixed | tail -3 | sed 's/^/after  /'
done > $D/host-profile-graphs-ab.txt
