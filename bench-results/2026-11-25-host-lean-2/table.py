"""The before/after table of host-{old,new}-{1,2}.md (host_profile's raw tables) in this
folder, or in the folder given: python table.py [DIR]"""
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent


def load(f):
    d = {}
    for line in (HERE / f).read_text().splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) > 6 and c[1].isdigit():
            d[(c[0], int(c[1]))] = (float(c[5]), float(c[6]))
    return d


o1, o2, n1, n2 = (load(f"host-{c}-{r}.md") for c in ("old", "new") for r in (1, 2))
print("| method | batch | before host ms/step (round 1 / 2) | after | before us/seq-step | after |")
print("|---|---|---|---|---|---|")
for k in o1:
    print(f"| {k[0]} | {k[1]} | {o1[k][0]:.2f} / {o2[k][0]:.2f} | {n1[k][0]:.2f} / {n2[k][0]:.2f} "
          f"| {o1[k][1]:.1f} / {o2[k][1]:.1f} | {n1[k][1]:.1f} / {n2[k][1]:.1f} |")
