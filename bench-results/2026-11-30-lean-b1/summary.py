"""Each round's host time a step of every method against ar's in the same process (ab.sh's
output): python summary.py ab-b1.txt. b1 reads host us/seq-step (0.1 us), wider batches host
ms/step (1 us)."""
import collections
import re
import sys

rows = collections.defaultdict(dict)   # (tree, mode, batch, round) -> {method: us}
cur = None
for line in open(sys.argv[1]):
    m = re.match(r"== round (\d+) tree (\S+) mode (\w+)", line)
    if m:
        cur = (m.group(2), m.group(3), m.group(1))
        continue
    if line.startswith("| ") and not line.startswith("| method"):
        f = [x.strip() for x in line.strip("|\n").split("|")]
        b = int(f[1])
        us = float(f[6]) if b == 1 else float(f[5]) * 1e3
        rows[(cur[0], cur[1], b, cur[2])][f[0]] = us
print("| tree | mode | batch | round | ar us | self-draft | draft-verify | kangaroo |")
print("|---|---|---|---|---|---|---|---|")
for (tree, mode, b, r), got in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0], kv[0][3])):
    ar = got["ar"]
    cells = [f"{got[m]:.1f} ({got[m] / ar - 1:+.1%})" if m in got else "-"
             for m in ("self-draft", "draft-verify", "kangaroo")]
    print(f"| {tree} | {mode} | {b} | {r} | {ar:.1f} | " + " | ".join(cells) + " |")
