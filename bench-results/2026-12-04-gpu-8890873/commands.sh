# part 1, 2026-12-04T17:56:29Z: SPECCTL_HOME=/tmp/specctl-gpu/store PYTHONPATH=/tmp/specctl-gpu/site:/work/main
# step stage1
cp /work/main/.gpu1/model.part1 /tmp/specctl-gpu/model.part1
# step step-table-7b
python3 recipes/step_table.py --random 7b --batches 1,8,32 --ns 1,2,4,8,16,32,64 --context 256 --repeats 10 --out /tmp/gpu-out/step-table-7b.json
# step gpu-tests
python3 -m pytest -q -m gpu -k 'not flex' tests/test_gpu.py -p no:cacheprovider
# part 2, 2026-12-04T17:58:24Z: SPECCTL_HOME=/tmp/specctl-gpu/store PYTHONPATH=/tmp/specctl-gpu/site:/work/main
# step stage2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/specctl-gpu/site /work/main/.gpu2/whl/bayesian_optimization-3.4.0-py3-none-any.whl /work/main/.gpu2/whl/datasets-5.2.0-py3-none-any.whl /work/main/.gpu2/whl/dill-0.4.1-py3-none-any.whl /work/main/.gpu2/whl/gguf-0.19.0-py3-none-any.whl /work/main/.gpu2/whl/multiprocess-0.70.19-py312-none-any.whl
tar xzf /work/main/.gpu2/art.tgz -C /tmp/specctl-gpu
python3 -m specctl models pull --from /tmp/specctl-gpu/SmolLM2-135M-Instruct.Q4_1.gguf
# step bench-batch
python3 -m specctl bench /tmp/specctl-gpu/art/sharegpt-prompts.jsonl -q --skip-set /tmp/specctl-gpu/art/skip.json --corpus-cache none --adapter /tmp/specctl-gpu/art/adapter --methods ar,self-draft:no-grid:auto,self-draft:auto,self-draft:light:auto,draft-verify:auto,kangaroo:auto --batch-sizes 8,32,64 --max-tokens 64 --repeats 1 --warmup 1
# step prefill-chunk
python3 -m specctl bench /tmp/specctl-gpu/art/sharegpt-prompts.jsonl -q --skip-set /tmp/specctl-gpu/art/skip.json --corpus-cache none --adapter /tmp/specctl-gpu/art/adapter --methods ar --batch-sizes 32,64 --max-tokens 64 --repeats 1 --warmup 1 --prefill-chunk 512
# step bench-b1
python3 -m specctl bench /tmp/specctl-gpu/art/sharegpt32.jsonl -q --skip-set /tmp/specctl-gpu/art/skip.json --corpus-cache none --adapter /tmp/specctl-gpu/art/adapter --methods ar,hf-static,self-draft:auto,self-draft:light:auto,draft-verify:auto,kangaroo:auto --batch-sizes 1 --limit 8 --max-tokens 128 --repeats 1 --warmup 1
# step fused-probe
python3 recipes/gpu/fused_probe.py --shapes 1x1,8x1,32x1,8x8 --replays 100 --json /tmp/gpu-out/fused-probe.json
# step exact
python3 -m specctl bench /tmp/specctl-gpu/art/sharegpt32.jsonl -q --skip-set /tmp/specctl-gpu/art/skip.json --corpus-cache none --adapter /tmp/specctl-gpu/art/adapter --methods ar,ar:exact,self-draft:auto:exact,draft-verify:auto:exact,kangaroo:auto:exact --batch-sizes 1,8 --limit 8 --max-tokens 32 --repeats 1 --warmup 1 --dtype bf16
# step repeat
python3 -m specctl generate /tmp/specctl-gpu/art/sharegpt32.jsonl --method ar --speculate fixed --dtype bf16 -q --batch-size 8 --max-tokens 128 --out /tmp/gpu-out/repeat/default-1.jsonl
python3 -m specctl generate /tmp/specctl-gpu/art/sharegpt32.jsonl --method ar --speculate fixed --dtype bf16 -q --batch-size 8 --max-tokens 128 --out /tmp/gpu-out/repeat/default-2.jsonl
# step grid-kernel
python3 -m pytest -q tests/test_grid_kernel.py -p no:cacheprovider
# step host-profile
python3 recipes/host_profile.py --input /tmp/specctl-gpu/art/sharegpt32.jsonl --methods ar,self-draft,self-draft:light --batch-sizes 1,8 --prompts 16 --max-tokens 64 --skip-set /tmp/specctl-gpu/art/skip.json
python3 recipes/host_profile.py --input /tmp/specctl-gpu/art/sharegpt-prompts.jsonl --methods ar,self-draft,self-draft:light:fixed,self-draft:grid:fixed --batch-sizes 64 --prompts 128 --max-tokens 48 --schedule cuda --skip-set /tmp/specctl-gpu/art/skip.json --launches --torch-profile /tmp/gpu-out/torch-profile
