#!/bin/bash
# The graph path's host work (issue 52). From the repo root, with the tiny model at /tmp/tiny
#   python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
# Each file was made at the commit named beside it: check that commit out in a worktree at
# $WT (with this commit's recipes/host_profile.py and this folder's scripts copied in where
# older) and run the line there with PYTHONPATH=$WT.
set -e
D=bench-results/2026-11-30-graph-staging
# stage_host.py: before.txt at aa04539's graphs.py, after.txt at 944af8b, after2.txt at 129f1be
PYTHONPATH=$PWD python $D/stage_host.py 8,32,64 > $D/after2.txt
HP="python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
  --store /tmp/tiny-store --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 --schedule cuda \
  --repeats 3 --skip-set /tmp/tiny/skip.json --graphs"
# host-profile-graphs.txt at f8cc686
$HP --methods ar,self-draft:grid:fixed,self-draft:light:fixed,draft-verify,kangaroo > $D/host-profile-graphs.txt
# host-profile-graphs-ab2.txt: aa04539 (worktree /tmp/wt-old) against f8cc686, alternating
# (host-profile-graphs-ab.txt: the same against 944af8b)
for i in 1 2 3; do
  (cd /tmp/wt-old && PYTHONPATH=/tmp/wt-old $HP --methods ar,self-draft:grid:fixed,self-draft:light:fixed | tail -3 | sed 's/^/before /')
  $HP --methods ar,self-draft:grid:fixed,self-draft:light:fixed | tail -3 | sed 's/^/after  /'
done > $D/host-profile-graphs-ab2.txt
# the tests' clock: cells-before.txt at 3674c17, cells-after.txt at b3b676d
PYTHONPATH=$PWD python bench-results/2026-11-30-tree-gain/cells.py 3 self-draft,draft-verify,kangaroo \
  32:waiting,32:drain,64:waiting,64:drain,8:waiting,8:drain,1:waiting,1:drain > $D/cells-after.txt
# arnoise-before.txt at 129f1be, arnoise-after.txt at b3b676d
PYTHONPATH=$PWD python $D/arnoise.py 64 waiting 5 > $D/arnoise-after.txt
# rounds-b8-waiting-before.txt at 129f1be, rounds-b8-waiting-after.txt at b3b676d
PYTHONPATH=$PWD python $D/rounds.py 8 waiting 6 self-draft > $D/rounds-b8-waiting-after.txt
# ragged-before.txt at ca551c5, ragged-after.txt after it
PYTHONPATH=$PWD python $D/stage_ragged.py 8,64 > $D/ragged-after.txt
# cells-final.txt at a7624ad
PYTHONPATH=$PWD python bench-results/2026-11-30-tree-gain/cells.py 3 self-draft,draft-verify,kangaroo \
  32:waiting,32:drain,64:waiting,64:drain,8:waiting,8:drain,1:waiting,1:drain > $D/cells-final.txt
