cd /work/main && . .venv/bin/activate
for round in 1 2 3; do
for m in ar "self-draft:grid:fixed"; do
python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store --skip-set /tmp/tiny/skip.json --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 --schedule cuda --graphs --repeats 3 --methods $m 2>&1 | tail -1
done; done
