#!/bin/bash
# `specctl generate` end to end (records written, fsynced; stop strings checked), ar at batch
# 64 on the tiny model, 512 lines (specbench128 four times), 48 tokens, 1 thread: before
# (/tmp/before) and after (/work/main) alternating, 3 rounds, without and with two stop
# strings; prints "<stop?> <checkout> <round> <tokens/s>" lines (gen-ab.txt)
OUT=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
for i in 1 2 3 4; do cat /work/main/recipes/prompts/specbench128.jsonl; done > $W/in.jsonl
for stop in none two; do
  S=(); [ $stop = two ] && S=(--stop "User:" --stop "zzqq")
  for round in 1 2 3; do
    for code in old new; do
      dir=/tmp/before; [ $code = new ] && dir=/work/main
      tps=$(cd $W && PYTHONPATH=$dir /work/main/.venv/bin/python -m specctl generate in.jsonl \
        -m /tmp/tiny --store $W/store-$code --method ar -b 64 --max-tokens 48 --threads 1 \
        --device cpu -q --out $W/o-$code.jsonl "${S[@]}" 2>&1 | grep -o '[0-9.]* tokens/s' | cut -d' ' -f1)
      echo "$stop $code $round $tps"
    done
  done
done
rm -rf $W
