"""What the GPU runbook's steps, its collect and its rehearsal compute (recipes/gpu/runbook.sh
calls each; they were Python inlined in its bash).

    python recipes/gpu/runbook_steps.py env-facts               the machine, as env.json
    python recipes/gpu/runbook_steps.py install-model DIR       an HF model folder as the demo model
    python recipes/gpu/runbook_steps.py repeat-table DIR        the repeat step's table (markdown)
    python recipes/gpu/runbook_steps.py merge-parts WORK N      collect: the parts' steps and commands
    python recipes/gpu/runbook_steps.py rehearsal-inputs ROOT SRC   the rehearsal's model and data
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def env_facts() -> dict:
    """Date, Python, torch, CUDA, cuDNN, the device (a CPU's model name where there is no GPU),
    the driver and transformers: the results folder's env.json."""
    out = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch
        out.update(torch=torch.__version__, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version() if torch.cuda.is_available() else None)
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            out.update(device=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1))
            try:
                out["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=20).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                pass
        else:
            name = platform.processor()
            try:
                name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                            if line.startswith("model name"))
            except (OSError, StopIteration):
                pass
            out["device"] = f"cpu ({name})"
    except ImportError as e:
        out["torch"] = f"not importable: {e}"
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def install_model(src: Path) -> str:
    """An HF model folder (the rehearsal's tiny model) into the store as the demo model."""
    from specctl.models.checkpoint import DEMO_ALIAS
    from specctl.store import Store, make_manifest
    with Store().building("models", DEMO_ALIAS, make_manifest(
            "models", DEMO_ALIAS, source={"tar": str(src)})) as out:
        for f in src.iterdir():
            shutil.copy2(f, out / f.name)
    return f"installed {src} as {DEMO_ALIAS}"


def repeat_table(d: Path) -> str:
    """The repeat step's two bf16 `ar` runs (default-1/2.jsonl), each output's text compared
    byte for byte."""
    def texts(name):
        p = d / f"{name}.jsonl"
        if not p.is_file():
            return None
        return [json.loads(line).get("text")
                for line in p.read_text(encoding="utf-8").split("\n") if line]
    ta, tb = texts("default-1"), texts("default-2")
    rows = ["ar, bf16: `specctl generate` twice, each output's text compared byte for byte (the "
            "lines also hold timings, which always differ)\n",
            "| compared | identical | outputs |", "|---|---|---|"]
    if ta is None or tb is None:
        rows.append("| default-1 vs default-2 | missing | - |")
    elif len(ta) != len(tb):
        rows.append(f"| default-1 vs default-2 | no | {len(ta)} vs {len(tb)} outputs |")
    else:
        diff = sum(x != y for x, y in zip(ta, tb))
        rows.append(f"| default-1 vs default-2 | {'yes' if diff == 0 else 'no'} | "
                    f"{diff} of {len(ta)} outputs differ |")
    return "\n".join(rows)


def merge_parts(work: Path, n: int) -> None:
    """collect: WORK/1 .. WORK/n unpacked calls into WORK/all's steps.tsv and commands.sh. A
    second call on a fresh machine has only its own part, so each part's rows and commands
    come from the last tarball that has them (commands.sh's sections open "# part N, ...")."""
    head, rows, cmds = None, {}, {}
    for i in range(1, n + 1):
        p = work / str(i) / "steps.tsv"
        if p.is_file():
            with open(p, newline="") as f:
                lines = list(csv.reader(f, delimiter="\t"))
            head = lines[0]
            for part in {r[0] for r in lines[1:]}:
                rows[part] = [r for r in lines[1:] if r[0] == part]
        p = work / str(i) / "commands.sh"
        if p.is_file():
            for sec in re.split(r"(?m)^(?=# part )", p.read_text()):
                m = re.match(r"# part (\S+),", sec)
                if m:
                    cmds[m.group(1)] = sec
    with open(work / "all" / "steps.tsv", "w", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(head or ["part", "step", "rc", "wall_s", "budget_s", "note"])
        for part in sorted(rows):
            out.writerows(rows[part])
    (work / "all" / "commands.sh").write_text("".join(cmds[k] for k in sorted(cmds)))


def rehearsal_inputs(root: Path, src: Path) -> None:
    """The rehearsal's stand-ins: a tiny random model (tarred, in the demo model's place), a
    ShareGPT file made of the committed prompts (the first 16 give the bench prompts, the rest
    the adapter's training data) and a skip set."""
    sys.path.insert(0, str(root / "tests"))
    from tiny import make_tiny_model
    m = make_tiny_model(src / "tiny")
    with tarfile.open(src / "tiny-model.tar", "w") as t:
        for f in sorted(m.iterdir()):
            t.add(f, arcname=f.name)
    with open(root / "recipes/gpu/sharegpt32.jsonl", encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": p[:120]},
                                              {"from": "gpt", "value": "In short: " + p[:80]}]}
            for i, p in enumerate(prompts)]
    (src / "sharegpt.json").write_text(json.dumps(recs))
    (src / "skip.json").write_text(json.dumps({"num_layers": 4, "attn": [2], "mlp": []}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env-facts")
    sub.add_parser("install-model").add_argument("dir", type=Path)
    sub.add_parser("repeat-table").add_argument("dir", type=Path)
    p = sub.add_parser("merge-parts")
    p.add_argument("work", type=Path)
    p.add_argument("n", type=int)
    p = sub.add_parser("rehearsal-inputs")
    p.add_argument("root", type=Path)
    p.add_argument("src", type=Path)
    a = ap.parse_args()
    if a.cmd == "env-facts":
        print(json.dumps(env_facts(), indent=1))
    elif a.cmd == "install-model":
        print(install_model(a.dir))
    elif a.cmd == "repeat-table":
        print(repeat_table(a.dir))
    elif a.cmd == "merge-parts":
        merge_parts(a.work, a.n)
    elif a.cmd == "rehearsal-inputs":
        rehearsal_inputs(a.root, a.src)


if __name__ == "__main__":
    main()
