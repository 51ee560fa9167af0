#!/bin/bash
# alternate old/new checkouts, same recipe file, same tiny model and store
M="ar,draft-verify:fixed,draft-verify,self-draft:fixed,self-draft:light:fixed,self-draft,self-draft:light,kangaroo:fixed,kangaroo"
for round in 1 2; do
  for code in old new; do
    dir=/tmp/old; [ $code = new ] && dir=/work/main
    (cd /tmp && PYTHONPATH=$dir /work/main/.venv/bin/python /tmp/hp/host_profile.py --model /tmp/tiny --input /tmp/specbench128.jsonl --store /tmp/tiny-store --skip-set /tmp/tiny/skip.json --batch-sizes 1,64 --threads 1 --max-tokens 48 --prompts 128 --device cpu --methods $M 2>/dev/null | grep '^|' > /tmp/hp/$code-$round.md)
  done
done
echo done > /tmp/hp/done
