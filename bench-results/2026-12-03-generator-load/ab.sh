#!/bin/bash
# ab.sh BASE_TREE NEW_TREE ROUNDS: calls.py alternated between two checkouts
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq "$3"); do
  (cd "$1" && PYTHONPATH=$PWD python "$here/calls.py" "base $(git rev-parse --short HEAD)")
  (cd "$2" && PYTHONPATH=$PWD python "$here/calls.py" "new $(git rev-parse --short HEAD)")
done
