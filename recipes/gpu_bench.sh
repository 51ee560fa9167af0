#!/usr/bin/env bash
# The GPU benchmark (issue 7): run on the lent GPU machine after staging the demo model as
# ../shared/GPU.md says (tools/stage-device.sh, two calls), from the repository root:
#   bash recipes/gpu_bench.sh GGUF PROMPTS.jsonl [SKIPSET.json] [OUTDIR]
# It converts the GGUF into a fresh store (specctl models pull --from), runs the GPU tests, then
# `specctl bench` for ar, draft-verify (when a skip set is given) and the HF peers at batch 1, 8
# and 32 (bf16), and writes the table (bench.md) and results into OUTDIR.
set -euo pipefail
gguf=$1; prompts=$2; skip=${3:-}; out=${4:-gpu-bench}
mkdir -p "$out"
export SPECCTL_HOME=${SPECCTL_HOME:-/tmp/specctl-gpu-store} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
$py -m specctl models pull --from "$gguf"
$py -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider > "$out/gpu-tests.txt" 2>&1 || true
tail -5 "$out/gpu-tests.txt"
methods=ar,hf,hf-prompt-lookup
extra=()
if [ -n "$skip" ]; then methods=ar,draft-verify,hf,hf-prompt-lookup; extra=(--skip-set "$skip"); fi
methods=${METHODS:-$methods}
$py -m specctl bench "$prompts" --methods "$methods" --batch-sizes 1,8,32 \
    --max-tokens "${MAX_TOKENS:-128}" --repeats "${REPEATS:-3}" --warmup 2 -q "${extra[@]}"
$py -m specctl report --md "$out/bench.md" --plots "$out"
