"""README.md of a results folder: what ran where, from its stage.json, env.json, steps.tsv
and commands.sh. `run` rewrites it after every step, `collect` once the parts are merged."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .plan import PLAN
from .settings import device_command


def write_readme(d: Path) -> None:
    def load(name):
        try:
            return json.loads((d / name).read_text())
        except (OSError, ValueError):
            return {}
    st, env = load("stage.json"), load("env.json")
    est = {s.name: f"{s.estimate_s / 60:.1f}" for s in PLAN}
    rows = []
    if (d / "steps.tsv").is_file():
        with open(d / "steps.tsv", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    commit = st.get("commit") or "unknown"
    name = f"{env.get('date', 'unknown')}-gpu-{commit}"
    ad = st.get("adapter")
    if isinstance(ad, dict) and ad.get("dir"):   # (older stage.json: a path or None)
        ad = f"{ad['dir']} ({ad.get('how', '?')})"
    L = [f"# GPU runbook results, {env.get('date', '?')}, {env.get('device', '?')}", "",
         f"Folder name: `bench-results/{name}/` (`recipes/gpu/runbook.py collect` makes it).", "",
         f"- code: commit {commit}" + (f", with {st['changed_files']} files changed in the "
                                       "working tree when staged" if st.get("changed_files")
                                       else "")
         + (f" (staged {st['staged']})" if st.get("staged") else ""),
         f"- device: {env.get('device', '?')}" + (f", {env['gpu_memory_gib']} GiB" if
                                                   env.get("gpu_memory_gib") else "")
         + (f", driver {env['driver']}" if env.get("driver") else ""),
         f"- torch {env.get('torch', '?')}, CUDA {env.get('cuda') or '-'}, cuDNN "
         f"{env.get('cudnn') or '-'}, transformers {env.get('transformers', '?')}, Python "
         f"{env.get('python', '?')}",
         f"- model: {st.get('model_file', '?')} (sha256 {str(st.get('model_sha256', '?'))[:16]}"
         f"...); inputs in art.tgz: {', '.join(st.get('art', [])) or '?'}"
         + (f" ({st['prompts']} batch prompts)" if st.get("prompts") else "")
         + (f"; corpus cache from {st['corpus']}" if st.get("corpus") else "")
         + (f"; Kangaroo adapter: {ad}" if isinstance(ad, str) else ""), "",
         "## Calls", "",
         "Staged with `python3 recipes/gpu/runbook.py stage`, then (device tool, back to back):",
         "", f'1. carry `[".gpu1"]`: `{device_command(1)}`',
         f'2. carry `[".gpu2"]`: `{device_command(2)}`', "",
         "## Steps (steps.tsv; each step's output in `<step>.log`)", "",
         "| part | step | exit | wall s | budget s | estimate min | note |",
         "|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r.get('part')} | {r.get('step')} | {r.get('rc')} | {r.get('wall_s')} | "
                 f"{r.get('budget_s')} | {est.get(r.get('step'), '-')} | {r.get('note') or ''} |")
    L += ["", "Bench tables: `bench-*.md`, `exact.md`; the stored runs under `store/benches/` "
          f"render with `specctl report --store bench-results/{name}/store --all --no-plots`.",
          "`step-table-7b.json`: the 7B shape's step costs (`StepTable.from_json`), for "
          "simulating real-size steps on the CPU.",
          "`prefill-cost.json`: an eager prefill forward's ms by its tokens and prompts (the "
          "demo shape), with F, its fixed part (runtime/step/admission.py), and `pieces`: a "
          "prefill piece's replay against the eager forward of the same tokens "
          "(runtime/step/prefill.py).", "",
          "## Commands (commands.sh)", "", "```"]
    try:
        L.append((d / "commands.sh").read_text().rstrip())
    except OSError:
        pass
    L += ["```", ""]
    (d / "README.md").write_text("\n".join(L))
