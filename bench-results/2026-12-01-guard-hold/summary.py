"""ab.sh's output (ARGV[1]) as one line a cell and method: each tree's median x ar over the
rounds, and their range."""
import collections, re, statistics, sys
cur = cell = None
res = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    line = line.rstrip()
    if line.startswith("== /"):
        cur = line.split()[1]
        continue
    m = re.match(r"-- trace b1 (\w+)", line) or re.match(r"== (b\d+ \w+)", line)
    if m:
        cell = ("b1 " + m.group(1) + " (trips.py)") if line.startswith("--") else m.group(1)
        continue
    m = re.match(r"trace: ([\d.]+)x, \d+ steps", line) or re.match(r"(?:\S+): median ([\d.]+)x", line)
    if m and cell:
        name = "trace" if line.startswith("trace") else line.split(":")[0]
        res[f"{cell} {name}"][cur].append(float(m.group(1)))
trees = sorted({t for v in res.values() for t in v})
print("cell method | " + " | ".join(trees))
for k, v in res.items():
    print(k, "|", " | ".join(f"{statistics.median(v[t]):.3f} [{min(v[t]):.3f}-{max(v[t]):.3f}]"
                             for t in trees))
