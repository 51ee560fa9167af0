#!/usr/bin/env bash
# One machine, one input, three ways to run the same generate job, paired rounds:
#   one:      1 process x 2 threads
#   ray:      --ray local, 2 actors x 1 thread
#   torchrun: torchrun --nproc-per-node 2, 2 ranks x 1 thread
# Usage (repo root, venv active): bash bench-results/2026-11-27-ray-vs-torchrun/run.sh [ROUNDS]
# PROMPTS (64) and TOKENS (32) size the job: PROMPTS=128 TOKENS=64 OUT=.../runs-long for the
# longer one.
# Writes OUT/<way>-<round>.json (the run's metrics and the command's wall) and prints a table.
set -euo pipefail
ROUNDS=${1:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/runs}
mkdir -p "$OUT"
IN=$OUT/in.jsonl
head -n "${PROMPTS:-64}" recipes/prompts/specbench128.jsonl > "$IN"
COMMON=(--max-tokens "${TOKENS:-32}" --batch-size 8 --device cpu -q)
run() {   # WAY ROUND CMD...
  local way=$1 r=$2; shift 2
  local t0 t1 run
  t0=$(date +%s.%N)
  "$@" > "$OUT/$way-$r.log" 2>&1
  t1=$(date +%s.%N)
  run=$(grep -o 'run: *[^ ]*' "$OUT/$way-$r.log" | tail -1 | awk '{print $2}')
  python - "$run" "$(echo "$t1 - $t0" | bc)" > "$OUT/$way-$r.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1] + "/metrics.json"))
print(json.dumps({"command_wall_s": float(sys.argv[2]), "tokens_per_s": m["tokens_per_s"],
                  "new_tokens": m["new_tokens"], "wall_time_s": m.get("wall_time_s"),
                  "requests": m["requests"], "ray": m.get("ray"),
                  "world_size": m.get("world_size", 1)}))
PY
}
for r in $(seq 1 "$ROUNDS"); do
  run one "$r" specctl generate "$IN" --out "$OUT/one-$r.jsonl" --threads 2 "${COMMON[@]}"
  run ray "$r" specctl generate "$IN" --out "$OUT/ray-$r.jsonl" --threads 1 --ray local \
    --actors 2 "${COMMON[@]}"
  run torchrun "$r" torchrun --nproc-per-node 2 -m specctl generate "$IN" \
    --out "$OUT/torchrun-$r.jsonl" --threads 1 "${COMMON[@]}"
done
python - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
texts = {}
print("| way | tokens/s (metrics) median (min-max) | command wall s median (min-max) | answers = one's |")
print("|---|---|---|---|")
for way in ("one", "ray", "torchrun"):
    runs = [json.load(open(f"{out}/{way}-{r}.json")) for r in range(1, rounds + 1)]
    tps = [x["tokens_per_s"] for x in runs]
    wall = [x["command_wall_s"] for x in runs]
    texts[way] = [[json.loads(l)["text"] for l in open(f"{out}/{way}-{r}.jsonl")]
                  for r in range(1, rounds + 1)]
    same = all(t == texts["one"][0] for t in texts[way])
    print(f"| {way} | {statistics.median(tps):.1f} ({min(tps):.1f}-{max(tps):.1f}) | "
          f"{statistics.median(wall):.1f} ({min(wall):.1f}-{max(wall):.1f}) | {same} |")
PY
