#!/usr/bin/env bash
# The GPU benchmark (issue 7): run on the lent GPU machine after staging the demo model as
# ../shared/GPU.md says (tools/stage-device.sh, two calls), from the repository root:
#   bash recipes/gpu_bench.sh GGUF PROMPTS.jsonl [SKIPSET.json] [OUTDIR]
# Optional artifacts built on a CPU beforehand and carried along (the device has no internet):
#   ADAPTER=DIR (a train-adapter output), CORPUS=DIR (a build-cache output)
# ATTENTION=flex benches the FlexAttention backend (default sdpa).
# STEPS=tests,bench,profile (the default: all) picks steps, so a session whose calls are capped
# (10 min on the lent GPU) can split them; keep ar in METHODS of every bench call: speedups are
# ratios within one bench run. E.g. one call per batch size (BATCH_SIZES=1, then 8, then 32),
# STEPS=bench; MAX_TOKENS, REPEATS, WARMUP (default 128, 3, 2) trim a call (transformers' eager
# peers at batch 1 run ~25-50 tokens/s: they take most of a batch-1 call); LIMIT=N benches the
# first N prompts. The prompts and skip set of the published tables are in recipes/gpu/ (see
# recipes/gpu/README.md for the exact calls).
# It converts the GGUF into a fresh store (specctl models pull --from), runs the GPU tests, then
# `specctl bench` for ar, every method whose artifact is there, the Self-Draft ablations and the
# HF peers (eager, prompt lookup, static-cache compiled) at batch 1, 8 and 32 (bf16), the host
# profile, and writes the table (bench.md), the run's results.json and (PLOTS=1) its plots into OUTDIR.
set -euo pipefail
gguf=$1; prompts=$2; skip=${3:-}; out=${4:-gpu-bench}
mkdir -p "$out"
export SPECCTL_HOME=${SPECCTL_HOME:-/tmp/specctl-gpu-store} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
$py -m specctl models pull --from "$gguf"
steps=",${STEPS:-tests,bench,profile},"
if [[ $steps == *,tests,* ]]; then
  $py -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider > "$out/gpu-tests.txt" 2>&1 || true
  tail -5 "$out/gpu-tests.txt"
fi
if [[ $steps == *,bench,* ]]; then
  methods=ar
  extra=()
  if [ -n "$skip" ]; then methods=$methods,draft-verify; extra+=(--skip-set "$skip"); fi
  if [ -n "${ADAPTER:-}" ]; then methods=$methods,kangaroo; extra+=(--adapter "$ADAPTER"); fi
  if [ -n "${CORPUS:-}" ]; then extra+=(--corpus-cache "$CORPUS"); else extra+=(--corpus-cache none); fi
  methods=$methods,self-draft,self-draft:no-corpus,self-draft:no-context,self-draft:light,hf,hf-static,hf-prompt-lookup
  methods=${METHODS:-$methods}
  $py -m specctl bench "$prompts" --methods "$methods" --batch-sizes "${BATCH_SIZES:-1,8,32}" \
      ${LIMIT:+--limit "$LIMIT"} --max-tokens "${MAX_TOKENS:-128}" --repeats "${REPEATS:-3}" --warmup "${WARMUP:-2}" -q "${extra[@]}" \
      --attention "${ATTENTION:-sdpa}" \
      2>&1 | tee "$out/bench.log"
  if [ -n "${PLOTS:-}" ]; then $py -m specctl report --md "$out/bench.md" --plots "$out" \
      || $py -m specctl report --md "$out/bench.md" --no-plots
  else $py -m specctl report --md "$out/bench.md" --no-plots; fi
  cp "$(ls -td "$SPECCTL_HOME"/benches/*/ | head -1)results.json" "$out/results.json"
fi
[[ $steps == *,profile,* ]] && $py recipes/host_profile.py --input "$prompts" --methods ar,self-draft --batch-sizes 1,8,32 --prompts 16 \
    --max-tokens 64 --device cuda 2>&1 | tee "$out/host-profile.md" || true
