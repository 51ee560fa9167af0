#!/bin/bash
# What a GPU's host launches a step (recipes/host_profile.py --launches), the grid's drafting
# step verifying with its kernel (under Triton's interpreter here) and, for the second file,
# on its tensor operations (triton imported first, without the interpreter: host_profile then
# leaves GridStep as a CPU runs it). The tiny model at /tmp/tiny (recipes/tiny_model.py).
set -euo pipefail
out=$(dirname "$0")
args=(--model /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
      --batch-sizes 1,64 --threads 1 --max-tokens 48 --prompts 128
      --methods ar,self-draft:grid:fixed,self-draft,draft-verify,kangaroo --schedule cuda
      --repeats 1 --skip-set /tmp/tiny/skip.json --graphs --launches)
python recipes/host_profile.py "${args[@]}" > "$out/launches-kernel.txt"
TRITON_INTERPRET=0 python -c "import sys, runpy, triton; sys.argv = ['host_profile.py'] + sys.argv[1:]; runpy.run_path('recipes/host_profile.py', run_name='__main__')" "${args[@]}" > "$out/launches-tensor-ops.txt"
