# recipes/host_profile.py at b64, tiny model (recipes/tiny_model.py /tmp/tiny --input
# recipes/prompts/specbench128.jsonl --store /tmp/tiny-store), 2 rounds: host.txt
for r in 1 2; do
  PYTHONPATH=$PWD python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
    --store /tmp/tiny-store --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 \
    --methods ar,self-draft:grid:fixed,self-draft:grid-job:fixed --schedule cuda --repeats 3 \
    --skip-set /tmp/tiny/skip.json --graphs 2>&1 | grep "^|" | if [ $r = 1 ]; then cat; else grep -v "method\|---"; fi
done
