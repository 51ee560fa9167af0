"""Medians (and ranges) of ab_trees.txt's x ar, by cell, drafter and tree.
    python bench-results/2026-12-01-trace-grid/summary.py ab_trees.txt"""
import re
import statistics
import sys

got = {}
for line in open(sys.argv[1]):
    m = re.match(r"(old|new) (b\d+ \w+): (\S+) ([\d.]+)x ar \(rounds \[([^\]]*)\]", line)
    if m:
        tree, cell, name = m.group(1), m.group(2), m.group(3)
        got.setdefault((cell, name), {}).setdefault(tree, []).extend(
            float(x) for x in m.group(5).split(","))
print("| cell | drafter | old median (range) | new median (range) | rounds |")
print("|---|---|---|---|---|")
for (cell, name), v in got.items():
    o, n = v.get("old", []), v.get("new", [])
    f = lambda xs: f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})" if xs else "-"
    print(f"| {cell} | {name} | {f(o)} | {f(n)} | {len(o)} / {len(n)} |")
