#!/usr/bin/env bash
# Pack what one GPU session needs into two carries of under 64 MiB each (the device tool's limit),
# so the whole bench needs two calls of staging instead of three or more:
#   .gpuA/  the first 64 MB of the demo model + the wheels the device lacks
#   .gpuB/  the rest of the model + art.tgz (corpus cache, Kangaroo adapter, prompts, skip set)
# usage (project root, after ../shared/tools/stage-device.sh made .stage1/.stage2/.whl):
#   CORPUS=DIR ADAPTER=DIR bash recipes/gpu/stage.sh
# then the calls (device tool, one right after the other: the machine is given back 30 s idle):
#   1. carry [".gpuA"]: mkdir -p /tmp/m && cp .gpuA/part00 /tmp/m/ && python3 -m pip install -q
#      --no-index --no-deps --no-compile --target /tmp/site .gpuA/whl/*.whl && export
#      PYTHONPATH=/tmp/site:$PWD && python3 -m pytest -q -m gpu tests/test_gpu.py
#   2. carry [".gpuB"]: cat /tmp/m/part00 .gpuB/part01 > /tmp/m/model.gguf && tar xzf
#      .gpuB/art.tgz -C /tmp && export PYTHONPATH=/tmp/site:$PWD && CORPUS=/tmp/art/corpus
#      ADAPTER=/tmp/art/adapter STEPS=bench ... bash recipes/gpu_bench.sh /tmp/m/model.gguf
#      /tmp/art/sharegpt32.jsonl /tmp/art/skip.json /tmp/out   (recipes/gpu/README.md)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)   # (a worktree's .git is a file)
mkdir -p "$(dirname "$exclude")" && touch "$exclude"
for d in .gpuA .gpuB; do grep -qx "/$d/" "$exclude" || echo "/$d/" >> "$exclude"; done
[ -s .stage1/part00 ] && [ -s .stage2/part01 ] || { echo "run ../shared/tools/stage-device.sh first" >&2; exit 1; }
rm -rf .gpuA .gpuB && mkdir -p .gpuA/whl .gpuB/art
cat .stage1/part00 .stage2/part01 > .gpuB/model.tmp
head -c 64000000 .gpuB/model.tmp > .gpuA/part00
tail -c +64000001 .gpuB/model.tmp > .gpuB/part01 && rm .gpuB/model.tmp
cp .whl/*.whl .gpuA/whl/
[ -n "${CORPUS:-}" ] && cp -r "$CORPUS" .gpuB/art/corpus
[ -n "${ADAPTER:-}" ] && cp -r "$ADAPTER" .gpuB/art/adapter
cp recipes/gpu/sharegpt32.jsonl .gpuB/art/ && cp recipes/gpu/skip-attn-16-20-24-28.json .gpuB/art/skip.json
(cd .gpuB && tar czf art.tgz art && rm -rf art)
du -sb .gpuA .gpuB
# each call carries its folder plus the tracked files: together under 64 MiB
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
for d in .gpuA .gpuB; do
  n=$(( $(du -sb "$d" | cut -f1) + tree ))
  if (( n > 64 * 1024 * 1024 )); then
    echo "$d and the tracked files come to $n bytes, over the 64 MiB a call carries" >&2; exit 1
  fi
done
