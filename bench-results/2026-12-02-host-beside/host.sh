# Host a step at b64 before (e721041, a worktree at $BASE) and after this folder's changes,
# alternated, 3 rounds, tiny model (recipes/tiny_model.py /tmp/tiny --input
# recipes/prompts/specbench128.jsonl --store /tmp/tiny-store):
#   git worktree add /tmp/base e721041; BASE=/tmp/base bash bench-results/2026-12-02-host-beside/host.sh
# (BASE: any commit to set beside the working tree; ../2026-12-03-staging-kept/ab.sh runs it)
BASE=${BASE:-/tmp/base}
run() {
  (cd "$1" && PYTHONPATH=$PWD python recipes/host_profile.py --model /tmp/tiny \
    --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store --batch-sizes ${B:-64} \
    --threads 1 --max-tokens 48 --prompts 128 --repeats 3 --schedule cuda --graphs \
    --skip-set /tmp/tiny/skip.json \
    --methods ar,self-draft:grid:fixed,self-draft:grid-job:fixed 2>&1 | grep "^| [as]" | sed "s/^/$2 /")
}
for r in 1 2 3; do run "$BASE" before; run "$PWD" after; done
