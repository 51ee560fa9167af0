#!/bin/bash
# A/B of a grid drafting step's host at b64 against ar's (issue 52): OLD and NEW are git
# worktrees of main (4aa8842) and the parked branch grid-device-plan (9fbee21). The rounds are
# ../2026-11-30-grid-calls/ab.sh's (three alternating, each row 3 repeats, with and without
# --device-core 1), run with NEW's recipes/host_profile.py (which times GridStep.device_plan as
# device work) made to skip device_plan where a tree has none.
# Usage: bash ab.sh OLD_TREE NEW_TREE OUT_PREFIX   (from the repo root; the tiny model at /tmp/tiny)
set -euo pipefail
hp=$(mktemp --suffix .py)
sed 's/^    GridStep.device_plan = \(timed\|there\)(GridStep.device_plan)/    if hasattr(GridStep, "device_plan"):\n        GridStep.device_plan = \1(GridStep.device_plan)/' \
    "$2/recipes/host_profile.py" > "$hp"
HP=$hp bash "$(dirname "$0")/../2026-11-30-grid-calls/ab.sh" "$@"
