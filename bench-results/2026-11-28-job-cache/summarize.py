"""Tokens per step of a `generate` output (JSONL) over the whole job, its first and second half
(by line index) and per category: python summarize.py OUT.jsonl SUMMARY.json"""
import json
import sys

lines = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda l: l["index"])
n = len(lines)


def per_step(ls):
    steps = sum(l["steps"] for l in ls)
    return round(sum(l["new_tokens"] for l in ls) / steps, 3)


cats = {}
for l in lines:
    cats.setdefault(l["category"], []).append(l)
out = {"requests": n, "new_tokens": sum(l["new_tokens"] for l in lines),
       "steps": sum(l["steps"] for l in lines),
       "tokens_per_step": {"all": per_step(lines), "first_half": per_step(lines[:n // 2]),
                           "second_half": per_step(lines[n // 2:]),
                           **{k: per_step(v) for k, v in cats.items()}}}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(sys.argv[2], out["tokens_per_step"])
