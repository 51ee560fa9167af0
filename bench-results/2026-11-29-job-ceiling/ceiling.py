"""How far any drafting from the job cache could go on a job's real answers (issue 55): the
answers of an `ar` run (greedy, so every method's), replayed in input order as a batch-1 run
learns them. At each step the job cache (specctl's JobCache: the job's prompts and finished
answers) offers its top `nexts` continuations of the context; the step accepts the longest
matching prefix of any of them, with no budget and no step cost (`--speculate fixed` with
room for every candidate, on a machine where drafted rows are free), then emits the target's
next token. `own`: the answer's own text so far is searched too (the context cache's part).
Prints tokens a step over the job's first and second half (by input line).

    python bench-results/2026-11-29-job-ceiling/ceiling.py IN.jsonl AR_OUT.jsonl [NEXTS] [CONT] [own]
"""
import json
import sys

from transformers import AutoTokenizer

from specctl.models.checkpoint import resolve_model
from specctl.speculative.job_cache import JobCache, JobCacheParams
from specctl.store import Store

inp, out = sys.argv[1], sys.argv[2]
nexts = int(sys.argv[3]) if len(sys.argv) > 3 else 1
cont = int(sys.argv[4]) if len(sys.argv) > 4 else 16
own = len(sys.argv) > 5 and sys.argv[5] == "own"
tok = AutoTokenizer.from_pretrained(resolve_model(None, Store(None)))
recs = [json.loads(line) for line in open(inp)]
ans = sorted((json.loads(line) for line in open(out)), key=lambda r: r["index"])
prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                              add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False) for r in recs]
params = JobCacheParams(cont_len=cont, nexts=max(3, nexts))
job = JobCache(params)
for p in prompts:   # (a batch-1 run admits each prompt before its answer; all, as a bound)
    job.add(p)
halves = [[0, 0], [0, 0]]
for i, a in enumerate(ans):
    ids = a["token_ids"]
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    ctx, p, steps = list(prompts[i]), 0, 0
    while p < len(ids):
        cands = job.lookup(ctx, nexts)
        if own and p >= 2:
            mine = JobCache(params)
            mine.add(ctx[len(prompts[i]):])
            cands += mine.lookup(ctx, nexts)
        best = 0
        for c in cands:
            m = 0
            while m < len(c) and p + m < len(ids) and c[m] == ids[p + m]:
                m += 1
            best = max(best, m)
        adv = min(best + 1, len(ids) - p)
        ctx += ids[p:p + adv]
        p += adv
        steps += 1
    h = halves[i >= len(ans) // 2]
    h[0] += len(ids)
    h[1] += steps
    job.add(list(prompts[i][-params.max_key:]) + ids)
for name, (t, s) in zip(("first half", "second half"), halves):
    print(f"{name}: {t} tokens in {s} steps, {t / s:.2f} tokens a step")
