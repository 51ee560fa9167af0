# Host a step at b64 before ($BASE: a worktree at 775e504) and after this folder's change, 3
# rounds alternated, tiny model (recipes/tiny_model.py /tmp/tiny --input
# recipes/prompts/specbench128.jsonl --store /tmp/tiny-store), from the repo root:
#   git worktree add /tmp/base 775e504; BASE=/tmp/base bash bench-results/2026-12-03-staging-kept/ab.sh
BASE=${BASE:-/tmp/base}
run() {
  (cd "$1" && PYTHONPATH=$PWD python recipes/host_profile.py --model /tmp/tiny \
    --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store --batch-sizes ${B:-64} \
    --threads 1 --max-tokens 48 --prompts 128 --repeats 3 --schedule cuda --graphs \
    --skip-set /tmp/tiny/skip.json \
    --methods ar,self-draft:grid:fixed,self-draft:grid-job:fixed 2>&1 | grep "^| [as]" | sed "s/^/$2 /")
}
for r in 1 2 3; do run "$BASE" before; run "$PWD" after; done
