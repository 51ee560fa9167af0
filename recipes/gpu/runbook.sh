#!/usr/bin/env bash
# The GPU runbook: everything a lent GPU owes (../shared/GPU.md, "What the GPU owes") in two
# device calls of under 10 minutes each, and the same steps rehearsed on the CPU
# (tests/test_gpu_runbook.py: the stage, check and collect in the default tier, the rehearsal
# in the slow one).
#
#   bash recipes/gpu/runbook.sh stage             CPU machine, repo root: packs .gpu1/ and .gpu2/,
#                                                 prints the two device calls
#   bash recipes/gpu/runbook.sh run OUT PART      on the device (what the calls run), PART 1 or 2
#   bash recipes/gpu/runbook.sh collect P1.tgz P2.tgz
#                                                 CPU: the calls' files into
#                                                 bench-results/<date>-gpu-<commit>/
#   bash recipes/gpu/runbook.sh rehearse OUT      CPU: stage + both parts with a tiny model
#   bash recipes/gpu/runbook.sh check [DIR...]    each carry plus the working tree under 64 MiB
#   bash recipes/gpu/runbook.sh plan              the steps: part, budget s, estimate min, file
#
# Why two parts: a call carries at most 64 MiB (the working tree included) and the demo model's
# GGUF is 98 MB, so call 1 carries the model's first part and runs what needs no checkpoint,
# and call 2, at once after it (the machine goes back 30 s after a call; /tmp survives while it
# is warm), carries the rest of the model with the wheels and inputs and runs what needs it.
#
# The steps, their budgets and estimates are recipes/gpu/runbook.py's PLAN (`plan` prints them
# with each call's sum and fails when one is over its cap). The device lends a session 15
# minutes in all, the machine's start (1.5-2 min) and its warm waits (~30 s after a call)
# included, on a bare machine each start, so the calls are capped at 2 and 9 minutes:
#   call 1, carry .gpu1 (model part 1): stage1 | step-table-7b (the Llama-2-7B shape, random
#     bf16 weights made on the device: a step's cost does not depend on the weights' values) |
#     gpu-tests (`pytest -m gpu`, its flex tests left out) | prefill-cost (an eager prefill
#     forward's ms by its tokens: the fixed cost admission groups save)
#   call 2, carry .gpu2 (model part 2, wheels, art.tgz): stage2 | bench-batch (>= 256 prompts) |
#     bench-b1 | fused-probe (the fused layer against the unfused) | exact (sized to fit) |
#     repeat | host-profile
# Not in the calls (they do not fit; `plan` says so): train-adapter on the GPU, kv_scale.py at
# 7B. Kangaroo's rows use the adapter `stage` carries.
# Steps run in order of value. A call starts no step once less than MIN_STEP_S is left of its
# cap, and each step runs under `timeout` at its budget or what is left, whichever is less, so
# one hung step cannot eat the call; a failing or killed step never stops the next. Each step's
# exit status and wall time go to OUT/steps.tsv (124: killed at its budget; skip: not started),
# its output to OUT/<step>.log, its commands to OUT/commands.sh, and OUT/README.md is rewritten
# after every step. With PACK=FILE the run packs OUT into FILE after every step: a call returns
# at most 8 files, so OUT travels back as one tarball, and a call killed at its limit still
# returns the steps done before.
#
# stage inputs (env): CORPUS=DIR (a build-cache output); ADAPTER=DIR (a CPU-trained
# train-adapter output), none (no Kangaroo rows), or unset: stage trains one on the CPU
# (ADAPTER_TRAIN, its train-adapter options; ADAPTER_TRAIN_S, its time limit, 300) from the
# ShareGPT records after the bench prompts, and reuses it on the next stage (ADAPTER_STORE);
# PROMPTS (256: the bench's batch prompts, the first human turns of the first ShareGPT
# records, as `specctl bench` takes them by default); for offline or test staging MODEL_FILE
# (a .gguf, or a .tar of an HF model folder), WHEELS_DIR (a folder, or none), SHAREGPT (a
# ShareGPT JSON file), SKIP_SET, SPLIT_AT (bytes or half), CARRY_DIR (where .gpu1/.gpu2 go:
# the repo root, elsewhere only for tests). Without MODEL_FILE / WHEELS_DIR it runs
# ../shared/tools/stage-device.sh (STAGE_DEVICE=FILE) for the model and the wheels.
set -uo pipefail

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/../.." && pwd)
export PY=${PYTHON:-${PY:-python3}}
export STAGE_TMP=${STAGE_TMP:-/tmp/specctl-gpu}   # the run's model part 1, wheels, art, store
export CARRY_DIR=${CARRY_DIR:-$ROOT}
export ART=$STAGE_TMP/art
export REHEARSE=${REHEARSE:-0}
export MIN_STEP_S=${MIN_STEP_S:-20}   # (CALL_S=SECONDS, if set, caps both calls instead)
export CARRY_LIMIT_MIB=${CARRY_LIMIT_MIB:-64} MARGIN_MIB=${MARGIN_MIB:-2}
# the bench's methods: ar and every method `auto` (what the GPU owes), and at batch 1 the
# strongest HF peer too (it runs at batch 1 only)
export METHODS=${METHODS:-ar,self-draft:auto,self-draft:light:auto,draft-verify:auto,kangaroo:auto}
export METHODS_B1=${METHODS_B1:-ar,hf-static,${METHODS#ar,}}
export RUNBOOK_PYTHONPATH0=${RUNBOOK_PYTHONPATH0-${PYTHONPATH:-}}   # the caller's, kept for steps
set_pythonpath() {   # the wheels installed on the device, then the checkout (not installed there)
  export PYTHONPATH=$STAGE_TMP/site:$ROOT${RUNBOOK_PYTHONPATH0:+:$RUNBOOK_PYTHONPATH0}
}
set_pythonpath
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160}
DEVICE_OUT=/tmp/gpu-out   # OUT in the printed calls
TOOLS=$ROOT/recipes/gpu/runbook.py   # the plan, and the parts of the runbook that compute
tools() { "$PY" "$TOOLS" "$@"; }
STEPS_PY=$ROOT/recipes/gpu/runbook_steps.py   # what the steps, collect and rehearse compute
steps() { "$PY" "$STEPS_PY" "$@"; }

die() { echo "runbook: $*" >&2; exit 1; }
CLEANUP=()
trap '(( ${#CLEANUP[@]} == 0 )) || rm -rf "${CLEANUP[@]}"' EXIT

# Run a command and append it to OUT/commands.sh, so README.md can list what each step ran.
x() {
  local a words=()
  for a; do   # quoted only where the shell needs it, so the list reads as typed
    if [[ $a =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then words+=("$a")
    elif [[ $a != *"'"* ]]; then words+=("'$a'")
    else words+=("$(printf %q "$a")"); fi
  done
  echo "${words[*]}" >> "$OUT/commands.sh"
  "$@"
}

json_get() {  # FILE KEY: a top-level field of a JSON file ('' when absent)
  "$PY" -c 'import json, sys
try:
    v = json.load(open(sys.argv[1])).get(sys.argv[2])
except (OSError, ValueError):
    v = None
print("" if v is None else v)' "$1" "$2"
}

# ---------------------------------------------------------------------------------------------
# sizes: what one call carries is its carry folders plus the working tree (tracked files,
# untracked files git does not ignore, and shared/)

tree_bytes() {
  (cd "$ROOT" && {
     git ls-files -z --cached --others --exclude-standard
     if [ -d shared ] && git check-ignore -q shared; then find shared -type f -print0; fi
   } | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
}

check_carries() {  # DIR...: each one plus the tree within CARRY_LIMIT_MIB, else say by how much
  local tree limit n d bad=0
  tree=$(tree_bytes); limit=$(( CARRY_LIMIT_MIB * 1024 * 1024 ))
  [ -n "$tree" ] || die "could not size the working tree (git ls-files)"
  for d in "$@"; do
    [ -d "$d" ] || { echo "runbook: $d: no such carry folder" >&2; bad=1; continue; }
    n=$(( $(du -sb "$d" | cut -f1) + tree ))
    if (( n > limit )); then
      echo "runbook: OVER THE LIMIT: $d with the working tree is $n bytes, $(( n - limit )) over" \
           "the $CARRY_LIMIT_MIB MiB a call carries (tree $tree bytes)" >&2
      bad=1
    else
      echo "$d: $n bytes with the working tree ($tree), $(( (limit - n) / 1024 )) KiB to spare"
    fi
  done
  return $bad
}

ignore_in_git() (   # NAME...: top-level folders of the checkout, in .git/info/exclude
  cd "$ROOT" || exit 0
  exclude=$(git rev-parse --git-path info/exclude 2>/dev/null) || exit 0   # (worktrees too)
  mkdir -p "$(dirname "$exclude")" && touch "$exclude"
  for d; do grep -qx "/$d/" "$exclude" || echo "/$d/" >> "$exclude"; done
)

# ---------------------------------------------------------------------------------------------
# stage (CPU machine)

# The Kangaroo adapter the benches use when ADAPTER is unset: trained here on the CPU for the
# staged model, since the GPU's own training (4-7 min) does not fit a call. With these options
# it takes under a minute on the idle 2-core machine and ~3 with two test runs beside it (128
# conversations took over 5 then); its held-out top-1 is low (~0.05-0.09), but the rows exist
# and show what `auto` makes of a weak adapter. Kept in ADAPTER_STORE under a key of the model,
# the options and the data, so the next stage reuses it. Prints stage.json's "adapter" (JSON),
# or null when training failed or ran past ADAPTER_TRAIN_S (then the benches skip Kangaroo).
ADAPTER_TRAIN_DEFAULT="--limit 64 --max-len 128 --epochs 2 --batch-tokens 1024 --lr 2e-3"
ADAPTER_TRAIN_DEFAULT+=" --exit-layer 2"
cpu_adapter() {   # MODEL WORK ART
  local model=$1 work=$2 art=$3 opts=${ADAPTER_TRAIN:-$ADAPTER_TRAIN_DEFAULT}
  local limit=${ADAPTER_TRAIN_S:-300} key store dir folder how t0=$SECONDS
  key=$( { sha256sum < "$model"; sha256sum < "$work/train.json"; echo "$opts"; } | sha256sum \
         | cut -c1-16)
  store=${ADAPTER_STORE:-${TMPDIR:-/tmp}/specctl-gpu-adapters}/$key
  dir=$(ls -d "$store"/adapters/*/ 2>/dev/null | head -1)
  if [ -n "$dir" ]; then
    how="reused: trained on the CPU by an earlier stage (train-adapter $opts)"
  else
    folder=$(tools train-model "$model" "$work/train-model") \
      || { echo "runbook: no model folder to train an adapter with: no Kangaroo rows" >&2
           echo null; return 0; }
    echo "training a Kangaroo adapter on the CPU (at most $limit s): train-adapter $opts" >&2
    # shellcheck disable=SC2086   # (opts: several options)
    if ! timeout -k 10 "$limit" "$PY" -m specctl train-adapter --model "$folder" \
         --data "$work/train.json" --store "$store" $opts >&2 < /dev/null; then
      echo "runbook: the CPU adapter was not trained (failed, or past ADAPTER_TRAIN_S=$limit):" \
           "the benches will have no Kangaroo rows; pass ADAPTER=DIR to carry one" >&2
      rm -rf "$store"; echo null; return 0
    fi
    dir=$(ls -d "$store"/adapters/*/ | head -1)
    how="trained on the CPU by stage in $(( SECONDS - t0 )) s (train-adapter $opts)"
  fi
  dir=${dir%/}
  cp -r "$dir" "$art/adapter" || die "could not copy $dir"
  echo "the CPU adapter: $dir ($how)" >&2
  printf '{"how": "%s", "dir": "%s"}\n' "$how" "$dir"
}

stage() {
  cd "$ROOT" || exit 1
  command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1 \
    || die "stage runs in the git checkout (it sizes the working tree that travels)"
  local work; work=$(mktemp -d "${TMPDIR:-/tmp}/runbook-stage.XXXXXX") && CLEANUP+=("$work")
  local model=${MODEL_FILE:-} wheels=${WHEELS_DIR:-} need=0
  # the demo model and the wheels the device lacks: stage-device.sh's download, reused
  if [ -z "$model" ] || [ -z "$wheels" ]; then
    [ -z "$model" ] && { [ ! -s .stage1/part00 ] || [ ! -s .stage2/part01 ]; } && need=1
    [ -z "$wheels" ] && ! ls .whl/*.whl >/dev/null 2>&1 && need=1
    if (( need )); then
      local sd=${STAGE_DEVICE:-$ROOT/../shared/tools/stage-device.sh}
      [ -f "$sd" ] || die "no $sd: set MODEL_FILE and WHEELS_DIR, or STAGE_DEVICE"
      ignore_in_git .stage1 .stage2 .whl .dl   # (it appends to .git/info/exclude, made here)
      bash "$sd" > /dev/null || die "$sd failed"   # (its own calls are not these)
    fi
    if [ -z "$model" ]; then
      model=$work/SmolLM2-135M-Instruct.Q4_1.gguf
      cat .stage1/part00 .stage2/part01 > "$model" || die "could not join .stage1 and .stage2"
    fi
    wheels=${wheels:-$ROOT/.whl}
  fi
  [ -s "$model" ] || die "model file $model is missing or empty"

  # art: what call 2 unpacks into $ART
  local art=$work/art
  mkdir -p "$art"
  cp recipes/gpu/sharegpt32.jsonl "$art/" || die "recipes/gpu/sharegpt32.jsonl is missing"
  cp "${SKIP_SET:-recipes/gpu/skip-attn-16-20-24-28.json}" "$art/skip.json" || die "no skip set"
  if [ -n "${CORPUS:-}" ]; then cp -r "$CORPUS" "$art/corpus" || die "CORPUS=$CORPUS?"; fi
  # the batch rows' prompts (the device has no internet; the ShareGPT file is 125 MB, so only
  # its first records are read), and the records after them for the CPU adapter
  tools sharegpt "${SHAREGPT:-}" "$art/sharegpt-prompts.jsonl" "$work/train.json" \
    --prompts "${PROMPTS:-256}" --train-records "${TRAIN_RECORDS:-400}" \
    || die "could not cut the ShareGPT file"
  local adapter=null
  case ${ADAPTER:-} in
    none) echo "ADAPTER=none: no adapter is carried, so the benches have no Kangaroo rows" ;;
    '') adapter=$(cpu_adapter "$model" "$work" "$art") || exit 1 ;;   # (said why)
    *) cp -r "$ADAPTER" "$art/adapter" || die "ADAPTER=$ADAPTER?"
       adapter=$(printf '{"how": "ADAPTER=", "dir": "%s"}' "$ADAPTER") ;;
  esac

  # what the host-charged clock predicts for bench-batch's rows, made here before the GPU runs
  # (call 2 puts it beside bench-batch.md; PREDICT=0 skips its few CPU minutes)
  if [ "${PREDICT:-1}" != 0 ]; then
    "$PY" recipes/gpu/predict.py --prompts "${PROMPTS:-256}" > "$art/prediction.md" \
      || die "recipes/gpu/predict.py failed (PREDICT=0 skips it)"
  fi
  # the carries: part 1 of the model as large as call 1 allows, the rest with the art
  local c1=$CARRY_DIR/.gpu1 c2=$CARRY_DIR/.gpu2
  # the carries must be ignored, or every call takes them along as untracked files
  [ "$CARRY_DIR" = "$ROOT" ] && ignore_in_git .gpu1 .gpu2
  rm -rf "$c1" "$c2" && mkdir -p "$c1" "$c2"
  local size tree cut
  size=$(stat -c %s "$model"); tree=$(tree_bytes)
  cut=$(( (CARRY_LIMIT_MIB - MARGIN_MIB) * 1024 * 1024 - tree - 65536 ))
  case ${SPLIT_AT:-} in
    half) cut=$(( size / 2 )) ;;
    '') ;;
    *) cut=$SPLIT_AT ;;
  esac
  (( cut > size )) && cut=$size
  (( cut > 0 )) || die "no room for the model in call 1: the working tree is $tree bytes"
  head -c "$cut" "$model" > "$c1/model.part1"
  tail -c +$(( cut + 1 )) "$model" > "$c2/model.part2"
  if [ "$wheels" != none ]; then
    mkdir -p "$c2/whl" && cp "$wheels"/*.whl "$c2/whl/" || die "no wheels in $wheels"
  fi
  tar czf "$c2/art.tgz" -C "$work" art || die "could not pack art.tgz"
  tools stage-json "$model" "$cut" "$tree" "$art" "$adapter" "$c1/stage.json" "$c2/stage.json" \
    || die "could not write stage.json"
  du -sb "$c1"/* "$c2"/*
  check_carries "$c1" "$c2" \
    || die "a carry is over the limit: carry less (CORPUS, PROMPTS) or shrink the tree"
  local r1=.gpu1 r2=.gpu2
  [ "$CARRY_DIR" = "$ROOT" ] || { r1=$c1; r2=$c2; }
  cat <<TXT

The two device calls (run tool), the second as soon as the first returns (each starts no step
past its cap, $(tools cap 1) s and $(tools cap 2) s; timeout_s leaves room for a kill and the pack):
  1. carry ["$r1"], timeout_s $(( $(tools cap 1) + 30 )), command:
     PACK=\$OUT/gpu-part1.tgz bash recipes/gpu/runbook.sh run $DEVICE_OUT 1
  2. carry ["$r2"], timeout_s $(( $(tools cap 2) + 30 )), command:
     PACK=\$OUT/gpu-part2.tgz bash recipes/gpu/runbook.sh run $DEVICE_OUT 2
then give_back. Here: bash recipes/gpu/runbook.sh collect FILES_AT_1/gpu-part1.tgz \\
  FILES_AT_2/gpu-part2.tgz (FILES_AT_n: each call's files_at), and commit the folder it names.
What each call runs, and what none does: bash recipes/gpu/runbook.sh plan
TXT
}

# ---------------------------------------------------------------------------------------------
# the steps (device, or the CPU when REHEARSE=1); each runs in a process of its own under
# `timeout`, in the repo root, its output in OUT/<step>.log

env_facts() {
  steps env-facts
}

step_stage1() {
  local src=$CARRY_DIR/.gpu1
  if [ ! -f "$src/model.part1" ]; then
    echo "no $src/model.part1: call 1 carries .gpu1 (runbook.sh stage)"; return 1
  fi
  mkdir -p "$STAGE_TMP" || return 1
  x cp "$src/model.part1" "$STAGE_TMP/model.part1" || return 1
  cp "$src/stage.json" "$OUT/stage.json"
  env_facts > "$OUT/env.json" && cat "$OUT/env.json"
}

step_gpu_tests() {   # (on a CPU every test skips itself: the rehearsal checks the call only)
  # the flex tests (~35 s of 81) are left out: flex is not the default attention, and call 1
  # has 2 minutes
  x "$PY" -m pytest -q -m gpu -k "not flex" tests/test_gpu.py -p no:cacheprovider
}

step_step_table_7b() {   # ar's step cost at Llama-2-7B's shapes (recipes/gpu/shapes.py "7b"),
                         # random bf16 weights made on the device: 1-64 rows a sequence at batch
                         # 1, 8 and 32, as StepTable JSON for simulating real-size steps on a CPU
  if (( REHEARSE )); then
    x "$PY" recipes/step_table.py --random mini --batches 1,2 --ns 1,2 --context 32 --repeats 2 \
      --out "$OUT/step-table-7b.json"
  else
    x "$PY" recipes/step_table.py --random 7b --batches 1,8,32 --ns 1,2,4,8,16,32,64 \
      --context 256 --repeats 10 --out "$OUT/step-table-7b.json"
  fi
}

step_prefill_cost() {   # an eager prefill forward's ms by its tokens (the demo shape, random
                        # bf16 weights): the fixed cost F that admitting requests in groups saves
  if (( REHEARSE )); then
    x "$PY" recipes/gpu/prefill_cost.py --shape mini --tokens 1,8,32 --prompts 1,2 --repeats 2 \
      --out "$OUT/prefill-cost.json"
  else
    x "$PY" recipes/gpu/prefill_cost.py --shape demo --tokens 1,8,32,128,512 --prompts 1,4,16 \
      --repeats 10 --out "$OUT/prefill-cost.json"
  fi
}

step_stage2() {
  local src=$CARRY_DIR/.gpu2 part1=$STAGE_TMP/model.part1
  if [ ! -f "$src/model.part2" ]; then
    echo "no $src/model.part2: call 2 carries .gpu2 (runbook.sh stage)"; return 1
  fi
  [ -f "$part1" ] || part1=$CARRY_DIR/.gpu1/model.part1
  if [ ! -f "$part1" ]; then
    echo "model part 1 is not here: the machine was given back between the calls (a fresh one"
    echo "started). Make call 1 again, then call 2 at once."
    return 1
  fi
  mkdir -p "$STAGE_TMP" "$OUT"
  [ -f "$OUT/stage.json" ] || cp "$src/stage.json" "$OUT/stage.json"
  [ -f "$OUT/env.json" ] || env_facts > "$OUT/env.json"
  local name sha model
  name=$(json_get "$src/stage.json" model_file); sha=$(json_get "$src/stage.json" model_sha256)
  model=$STAGE_TMP/$name
  cat "$part1" "$src/model.part2" > "$model" || return 1
  if [ "$(sha256sum "$model" | cut -d' ' -f1)" != "$sha" ]; then
    echo "$model: sha256 differs from the staged model's: parts 1 and 2 come from different stages"
    return 1
  fi
  if ls "$src"/whl/*.whl >/dev/null 2>&1; then
    x "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$STAGE_TMP/site" "$src"/whl/*.whl || return 1
  fi
  rm -rf "$ART" && x tar xzf "$src/art.tgz" -C "$STAGE_TMP" || return 1
  case $name in
    *.gguf) x "$PY" -m specctl models pull --from "$model" || return 1 ;;
    *.tar)  # an HF model folder (the rehearsal's tiny model) in the demo model's place
      rm -rf "$STAGE_TMP/model-src" && mkdir -p "$STAGE_TMP/model-src" &&
        x tar xf "$model" -C "$STAGE_TMP/model-src" || return 1
      x "$PY" "$STEPS_PY" install-model "$STAGE_TMP/model-src" || return 1
      ;;
    *) echo "unknown model file type: $name"; return 1 ;;
  esac
  printf '{"file": "%s", "sha256": "%s", "bytes": %s, "store": "%s"}\n' "$name" "$sha" \
    "$(stat -c %s "$model")" "$SPECCTL_HOME/models/smollm2-135m-instruct" > "$OUT/model.json"
  cat "$OUT/model.json"
}

# The adapter the benches give Kangaroo: the one `stage` carried (trained on the CPU; the GPU's
# own training does not fit a call).
adapter_args() {
  if [ -d "$ART/adapter" ]; then echo "--adapter"; echo "$ART/adapter"; fi
}

bench() {   # NAME INPUT ARGS...: one `specctl bench`; its table as OUT/NAME.md, its stored run
            # under OUT/store/ (`specctl report --store OUT/store --all` renders it)
  local name=$1 input=$2; shift 2
  local before rc corpus=none new
  [ -d "$ART/corpus" ] && corpus=$ART/corpus
  local -a adapter
  mapfile -t adapter < <(adapter_args)
  before=$(ls "$SPECCTL_HOME/benches" 2>/dev/null)
  x "$PY" -m specctl bench "$input" -q --skip-set "$ART/skip.json" --corpus-cache "$corpus" \
    "${adapter[@]}" "$@"
  rc=$?
  new=$(ls -t "$SPECCTL_HOME/benches" 2>/dev/null | head -1)
  if [ -n "$new" ] && ! grep -qx "$new" <<< "$before"; then
    mkdir -p "$OUT/store/benches" && cp -r "$SPECCTL_HOME/benches/$new" "$OUT/store/benches/"
    cp "$SPECCTL_HOME/benches/$new/table.md" "$OUT/$name.md"
  else
    echo "no bench run was stored"; (( rc )) || rc=1
  fi
  return $rc
}

step_bench_batch() {   # batch 8/32/64 over every staged prompt (256: a batch-64 row keeps 64
                       # in flight to the end of 4 rounds, where 32 prompts made it batch 32).
  # 64 tokens and 1 repeat (after the warm-up pass, which on CUDA runs the whole workload): at
  # 128 tokens and 2 repeats it would take ~8 min of call 2's 9
  if (( REHEARSE )); then
    bench bench-batch "$ART/sharegpt-prompts.jsonl" --methods "$METHODS" --batch-sizes 2 \
      --limit 4 --max-tokens 4 --repeats 1 --warmup 1
  else
    bench bench-batch "$ART/sharegpt-prompts.jsonl" --methods "$METHODS" --batch-sizes 8,32,64 \
      --max-tokens 64 --repeats 1 --warmup 1
  fi
  local rc=$?
  # (the staged prediction for the same rows: README's "measured against the prediction")
  [ -f "$ART/prediction.md" ] && cp "$ART/prediction.md" "$OUT/bench-batch-prediction.md"
  return $rc
}

step_bench_b1() {   # batch 1 on 8 prompts: at 32 it would take 4x as long for little more
  if (( REHEARSE )); then
    bench bench-b1 "$ART/sharegpt32.jsonl" --methods "$METHODS_B1" --batch-sizes 1 --limit 2 \
      --max-tokens 4 --repeats 1 --warmup 1
  else
    bench bench-b1 "$ART/sharegpt32.jsonl" --methods "$METHODS_B1" --batch-sizes 1 --limit 8 \
      --max-tokens 128 --repeats 2 --warmup 1
  fi
}

step_host_profile() {
  if (( REHEARSE )); then   # (--threads: its step wrapper gives the CPU thread tuner no work)
    x "$PY" recipes/host_profile.py --input "$ART/sharegpt32.jsonl" \
      --methods ar,self-draft,self-draft:light --batch-sizes 1,2 --prompts 2 --max-tokens 4 \
      --threads 2 --skip-set "$ART/skip.json" > "$OUT/host-profile.md"
  else
    x "$PY" recipes/host_profile.py --input "$ART/sharegpt32.jsonl" \
      --methods ar,self-draft,self-draft:light --batch-sizes 1,8,32 --prompts 16 \
      --max-tokens 64 --skip-set "$ART/skip.json" > "$OUT/host-profile.md"
  fi
  local rc=$?
  cat "$OUT/host-profile.md"
  return $rc
}

# cuDNN's SDPA kernel off for the whole process (recipes/gpu/determinism.py's suspect); the
# flag must be set before the graphs are captured, so in the process that runs generate
NO_CUDNN='import runpy, sys, torch; torch.backends.cuda.enable_cudnn_sdp(False); '
NO_CUDNN+='sys.argv[0] = "specctl"; runpy.run_module("specctl", run_name="__main__")'

step_repeat() {   # the same bf16 generate run twice: byte for byte? (the fused layer's kernels
                  # have one reduction order; cuDNN's attention, not repeatable, is off)
  local -a args=(generate "$ART/sharegpt32.jsonl" --method ar --dtype bf16 -q)
  if (( REHEARSE )); then args+=(--limit 2 --batch-size 2 --max-tokens 4)
  else args+=(--batch-size 8 --max-tokens 128); fi
  mkdir -p "$OUT/repeat"
  local i rc=0
  for i in 1 2; do
    x "$PY" -m specctl "${args[@]}" --out "$OUT/repeat/default-$i.jsonl" || rc=1
  done
  steps repeat-table "$OUT/repeat" > "$OUT/repeat.md" || rc=1
  cat "$OUT/repeat.md"
  return $rc
}

step_fused_probe() {   # the fused layer against the unfused one (issue 43): a captured step's
                       # ms, launches a step and a layer, Triton's compile, logits agreement
  if (( REHEARSE )); then
    x "$PY" recipes/gpu/fused_probe.py --shapes 1x1,2x2 --replays 2 --context 64 \
      --json "$OUT/fused-probe.json" > "$OUT/fused-probe.md"
  else
    x "$PY" recipes/gpu/fused_probe.py --shapes 1x1,8x1,32x1,8x8 --replays 100 \
      --json "$OUT/fused-probe.json" > "$OUT/fused-probe.md"
  fi
  local rc=$?
  cat "$OUT/fused-probe.md"
  return $rc
}

step_exact() {   # --exact (issue 29): each row's tokens against ar:exact at batch 1 in bf16,
                 # (captured, on the fused layer) and what it costs against plain bf16 ar
  # Sized to fit: 32 prompts x 64 tokens at b1/8/32 did not finish in 120 s (graphs off, a
  # step is launch-bound); 8 prompts x 32 tokens is an eighth of the batch-1 work, and with 8
  # prompts a batch of 32 would run the same batch of 8 again, so b1/8
  local m=ar,ar:exact,self-draft:auto:exact,draft-verify:auto:exact,kangaroo:auto:exact
  if (( REHEARSE )); then
    bench exact "$ART/sharegpt32.jsonl" --methods "$m" --batch-sizes 1,2 --limit 2 \
      --max-tokens 4 --repeats 1 --warmup 1 --dtype bf16
  else
    bench exact "$ART/sharegpt32.jsonl" --methods "$m" --batch-sizes 1,8 --limit 8 \
      --max-tokens 32 --repeats 1 --warmup 1 --dtype bf16
  fi
}

# ---------------------------------------------------------------------------------------------
# run: the steps of one part, each under its budget, none stopping the next

pack() {
  [ -n "${PACK:-}" ] || return 0
  tar czf "$STAGE_TMP/pack.tgz" -C "$OUT" . && cp "$STAGE_TMP/pack.tgz" "$PACK"
}

run_part() {
  local out=$1 part=$2
  [[ $part == 1 || $part == 2 ]] || die "PART is 1 or 2, not $part"
  mkdir -p "$out" "$STAGE_TMP" || die "cannot make $out"
  export OUT; OUT=$(cd "$out" && pwd)
  export SPECCTL_HOME=${RUN_STORE:-$STAGE_TMP/store}   # a store of its own, never the caller's
  cd "$ROOT" || exit 1
  [ -f "$OUT/steps.tsv" ] || printf 'part\tstep\trc\twall_s\tbudget_s\tnote\n' > "$OUT/steps.tsv"
  echo "# part $part, $(date -u +%FT%TZ): SPECCTL_HOME=$SPECCTL_HOME PYTHONPATH=$PYTHONPATH" \
    >> "$OUT/commands.sh"
  local name budget t left start rc note failed=0 call_start=$SECONDS cap steps
  cap=${CALL_S:-$(tools cap "$part")} && steps=$(tools steps "$part") \
    || die "no plan: $TOOLS failed"
  while read -r name budget; do
    (( REHEARSE )) && budget=${REHEARSE_STEP_S:-240}
    left=$(( cap - (SECONDS - call_start) ))
    t=$(( budget < left ? budget : left ))
    if (( t < MIN_STEP_S )); then
      printf '%s\t%s\tskip\t0\t%s\t%s\n' "$part" "$name" "$budget" \
        "not started: ${left} s left of this call" >> "$OUT/steps.tsv"
      echo "== $name: not started, ${left} s left of the call's $cap"
      continue
    fi
    echo "== $name (budget ${t} s)"
    echo "# step $name" >> "$OUT/commands.sh"
    start=$SECONDS
    timeout -k 10 "$t" bash "$SELF" _step "$name" > "$OUT/$name.log" 2>&1 < /dev/null
    rc=$?
    note=
    case $rc in
      0) ;;
      124|137) note="killed at its budget of ${t} s" ;;
      200) rc=skip; note=$(tail -1 "$OUT/$name.log") ;;
      *) note=$(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | tr '\t' ' ' | cut -c1-160) ;;
    esac
    [[ $rc == 0 || $rc == skip ]] || failed=1
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$part" "$name" "$rc" "$(( SECONDS - start ))" "$t" \
      "$note" >> "$OUT/steps.tsv"
    echo "   rc $rc, $(( SECONDS - start )) s${note:+: $note}"
    tools readme "$OUT"
    pack
  done <<< "$steps"
  tools readme "$OUT"
  pack
  echo; column -t -s $'\t' "$OUT/steps.tsv" 2>/dev/null || cat "$OUT/steps.tsv"
  return $failed
}

# ---------------------------------------------------------------------------------------------
# collect (CPU machine): the calls' tarballs into bench-results/<date>-gpu-<commit>/

collect() {
  (( $# )) || die "usage: runbook.sh collect PART1.tgz [PART2.tgz]"
  local work i=0 f dest name
  work=$(mktemp -d "${TMPDIR:-/tmp}/runbook-collect.XXXXXX") && CLEANUP+=("$work")
  mkdir -p "$work/all"
  for f in "$@"; do
    i=$(( i + 1 )); mkdir -p "$work/$i"
    tar xzf "$f" -C "$work/$i" || die "$f: not a tarball of a run"
    cp -r "$work/$i/." "$work/all/"
  done
  # (steps.tsv and commands.sh: each part's from the last tarball that has it)
  steps merge-parts "$work" "$i" || die "could not merge steps.tsv and commands.sh"
  name="$(json_get "$work/all/env.json" date)-gpu-$(json_get "$work/all/stage.json" commit)"
  dest=${COLLECT_DEST:-$ROOT/bench-results/$name}
  mkdir -p "$dest"
  # no step leaves an adapter now, but a GPU train-adapter run by hand into OUT may: weights
  # stay out of git (the tree travels with every call)
  if [ -d "$work/all/adapter" ]; then
    local keep=${ADAPTER_DEST:-$ROOT/.gpu-adapter/$name}
    [ -n "${ADAPTER_DEST:-}" ] || ignore_in_git .gpu-adapter
    mkdir -p "$(dirname "$keep")" && rm -rf "$keep" && mv "$work/all/adapter" "$keep"
    echo "the GPU-trained adapter: $keep (specctl ... --adapter $keep)"
  fi
  cp -r "$work/all/." "$dest/"
  tools readme "$dest"
  echo "results: $dest"
  echo "commit them: git add $dest && git commit -m 'GPU runbook results $name' -- $dest"
}

# ---------------------------------------------------------------------------------------------
# rehearse (CPU): stage from local files (a tiny random model in the demo model's place, a
# ShareGPT file made from the committed prompts, no wheels), both parts with tiny settings,
# then collect; fails if any step failed

rehearse() {
  local out=${1:?usage: runbook.sh rehearse OUT}
  mkdir -p "$out" || exit 1
  out=$(cd "$out" && pwd)
  export REHEARSE=1 CARRY_DIR=$out/carry STAGE_TMP=$out/tmp
  export ART=$STAGE_TMP/art CALL_S=${CALL_S_REHEARSE:-100000}
  set_pythonpath
  mkdir -p "$out/src" "$CARRY_DIR"
  local t0=$SECONDS
  steps rehearsal-inputs "$ROOT" "$out/src" || die "could not make the tiny model"
  unset ADAPTER   # (the stage trains the tiny model's adapter, as it would the demo model's)
  MODEL_FILE=$out/src/tiny-model.tar WHEELS_DIR=none SHAREGPT=$out/src/sharegpt.json \
    SKIP_SET=$out/src/skip.json SPLIT_AT=half PROMPTS=16 ADAPTER_STORE=$out/adapter-store \
    ADAPTER_TRAIN="--limit 8 --max-len 160 --epochs 1 --lr 2e-3 --exit-layer 1" \
    stage || die "stage failed"
  local rc=0
  PACK=$out/gpu-part1.tgz run_part "$out/results" 1 || rc=1
  PACK=$out/gpu-part2.tgz run_part "$out/results" 2 || rc=1
  COLLECT_DEST=$out/collected collect "$out/gpu-part1.tgz" "$out/gpu-part2.tgz" || rc=1
  echo "rehearsal: $(( SECONDS - t0 )) s, $([ $rc = 0 ] && echo every step passed || echo FAILED)"
  return $rc
}

# ---------------------------------------------------------------------------------------------

cmd=${1:-}
shift || true
case $cmd in
  stage) stage ;;
  run) (( $# >= 2 )) || die "usage: runbook.sh run OUT PART"; run_part "$1" "$2" ;;
  _step) "step_${1//-/_}" ;;   # one step, in the process `timeout` watches (run_part)
  collect) collect "$@" ;;
  rehearse|--rehearse) rehearse "${1:-${REHEARSE_OUT:-/tmp/gpu-rehearsal}}" ;;
  check)
    (( $# )) || set -- "$CARRY_DIR/.gpu1" "$CARRY_DIR/.gpu2"
    check_carries "$@" ;;
  plan) tools plan --staged "$CARRY_DIR/.gpu2/stage.json" ;;
  *) sed -n '2,/^set -uo/p' "$SELF" | sed '$d' | cut -c3-; exit 2 ;;
esac
