# b1 rows of the held-out bench, e6a2ce6 (a worktree at /tmp/wt-old) against this tree, alternating, 2 rounds
for r in 1 2; do
  for t in /tmp/wt-old /work/main; do
    echo "== round $r tree $(git -C $t rev-parse --short HEAD)"
    (cd $t && PYTHONPATH=$t python -m specctl bench recipes/prompts/mtbench16.jsonl --max-tokens 48 --methods ar,draft-verify,self-draft --batch-sizes 1 --repeats 3 --warmup 1 --device cpu --dtype fp32 --skip-set recipes/gpu/skip-attn-16-20-24-28.json 2>&1 | grep -E "^(ar|draft-verify|self-draft) b1")
  done
done
