"""What each step runs (on the device, or the CPU when REHEARSE=1). `run` starts each in a
process of its own (`runbook.py _step NAME`), in the repo root, under its budget, its output
in OUT/<step>.log; the step reads its Settings back from the environment `run` gave it. Every
command a step runs goes to OUT/commands.sh first, so README.md lists what each step ran.

A step returns its exit status: 0 passed, 200 skipped (the log's last line says why), anything
else failed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from .carry import file_sha256, join_files
from .proc import shell_words
from .settings import RUNBOOK, Settings, die

STEPS = {}


def step(name: str):
    def register(fn):
        STEPS[name] = fn
        return fn
    return register


class Ctx:
    """A step's settings, OUT and inputs (art/), and the logged way to run a command."""

    def __init__(self, s: Settings):
        self.s, self.out, self.art, self.py = s, s.out, s.art, s.py
        self.rehearse = s.rehearse

    def x(self, *argv, stdout=None) -> int:
        """Run argv (stdout: a file for its output) after appending it to OUT/commands.sh."""
        with open(self.out / "commands.sh", "a") as f:
            f.write(shell_words(argv) + "\n")
        sys.stdout.flush()
        try:
            return subprocess.run(list(map(str, argv)), stdout=stdout).returncode
        except OSError as e:
            print(f"runbook: {argv[0]}: {e}", flush=True)
            return 127

    def x_to(self, name: str, *argv) -> int:
        """x with its output into OUT/NAME, then shown in the log."""
        with open(self.out / name, "w") as f:
            rc = self.x(*argv, stdout=f)
        print((self.out / name).read_text(), end="", flush=True)
        return rc

    def env_facts(self, show: bool = True) -> int:
        """The machine's facts (inputs.env_facts, under the steps' Python) as OUT/env.json."""
        with open(self.out / "env.json", "w") as f:
            rc = subprocess.run([self.py, str(RUNBOOK), "env-facts"], stdout=f).returncode
        if rc == 0 and show:
            print((self.out / "env.json").read_text(), end="", flush=True)
        return rc


def run_step(name: str) -> int:
    """`runbook.py _step NAME`: one step, in the process `run` watches."""
    s = Settings.from_env()
    if s.out is None:
        die("a step runs inside `runbook.py run` (no OUT)")
    if name not in STEPS:
        print(f"runbook: no step {name!r} (the steps: {', '.join(STEPS)})")
        return 127
    return STEPS[name](Ctx(s))


def _copy_quietly(src: Path, dst: Path) -> None:
    try:
        shutil.copyfile(src, dst)
    except OSError as e:
        print(f"runbook: {e}", flush=True)


# ---------------------------------------------------------------------------------------------
# call 1


@step("stage1")
def stage1(c: Ctx) -> int:
    src = c.s.carry_dir / ".gpu1"
    if not (src / "model.part1").is_file():
        print(f"no {src}/model.part1: call 1 carries .gpu1 (runbook.py stage)")
        return 1
    c.s.stage_tmp.mkdir(parents=True, exist_ok=True)
    if c.x("cp", src / "model.part1", c.s.stage_tmp / "model.part1"):
        return 1
    _copy_quietly(src / "stage.json", c.out / "stage.json")
    return c.env_facts()


@step("step-table-7b")
def step_table_7b(c: Ctx) -> int:
    """ar's step cost at Llama-2-7B's shapes (recipes/gpu/shapes.py "7b"), random bf16 weights
    made on the device: 1-64 rows a sequence at batch 1, 8 and 32, as StepTable JSON for
    simulating real-size steps on a CPU."""
    size = (["mini", "--batches", "1,2", "--ns", "1,2", "--context", "32", "--repeats", "2"]
            if c.rehearse else
            ["7b", "--batches", "1,8,32", "--ns", "1,2,4,8,16,32,64", "--context", "256",
             "--repeats", "10"])
    return c.x(c.py, "recipes/step_table.py", "--random", *size,
               "--out", c.out / "step-table-7b.json")


@step("gpu-tests")
def gpu_tests(c: Ctx) -> int:
    """(on a CPU every test skips itself: the rehearsal checks the call only) The flex tests
    (~35 s of 81) are left out: flex is not the default attention, and call 1 has 2 minutes;
    so is --exact on the unfused layer (21 s of 76 at 8890873, which left prefill-cost no
    time): the fused layer's --exact stays, and call 2's exact step runs it on the demo model."""
    return c.x(c.py, "-m", "pytest", "-q", "-m", "gpu", "-k", GPU_TESTS, "tests/test_gpu.py",
               "-p", "no:cacheprovider")


GPU_TESTS = "not flex and not (exact_in_bf16 and sdpa)"   # (pytest -k: what gpu-tests runs)


@step("prefill-cost")
def prefill_cost(c: Ctx) -> int:
    """An eager prefill forward's ms by its tokens (the demo shape, random bf16 weights): the
    fixed cost F that admitting requests in groups saves; and a prefill piece's replay beside
    an eager forward of the same 64 tokens a prompt (runtime/step/prefill.py)."""
    size = (["mini", "--tokens", "1,8,32", "--prompts", "1,2", "--repeats", "2"] if c.rehearse
            else ["demo", "--tokens", "1,8,32,128,512", "--prompts", "1,4,16", "--repeats", "10"])
    return c.x(c.py, "recipes/gpu/prefill_cost.py", "--shape", *size,
               "--out", c.out / "prefill-cost.json")


# ---------------------------------------------------------------------------------------------
# call 2


@step("stage2")
def stage2(c: Ctx) -> int:
    """Model part 1 (left in /tmp by call 1) and part 2 joined and pulled into the run's store,
    the wheels installed, art.tgz unpacked."""
    s = c.s
    src, part1 = s.carry_dir / ".gpu2", s.stage_tmp / "model.part1"
    if not (src / "model.part2").is_file():
        print(f"no {src}/model.part2: call 2 carries .gpu2 (runbook.py stage)")
        return 1
    if not part1.is_file():
        part1 = s.carry_dir / ".gpu1" / "model.part1"
    if not part1.is_file():
        print("model part 1 is not here: the machine was given back between the calls (a fresh "
              "one\nstarted). Make call 1 again, then call 2 at once.")
        return 1
    s.stage_tmp.mkdir(parents=True, exist_ok=True)
    if not (c.out / "stage.json").is_file():
        _copy_quietly(src / "stage.json", c.out / "stage.json")
    if not (c.out / "env.json").is_file():
        c.env_facts(show=False)
    staged = _json(src / "stage.json")
    name, sha = staged.get("model_file") or "", staged.get("model_sha256") or ""
    if not name:
        print(f"{src}/stage.json names no model_file")
        return 1
    model = s.stage_tmp / name
    join_files([part1, src / "model.part2"], model)
    if file_sha256(model) != sha:
        print(f"{model}: sha256 differs from the staged model's: parts 1 and 2 come from "
              "different stages")
        return 1
    rc = _install(c, src, model, name)
    if rc:
        return rc
    info = {"file": name, "sha256": sha, "bytes": model.stat().st_size,
            "store": f"{s.store}/models/smollm2-135m-instruct"}
    (c.out / "model.json").write_text(json.dumps(info) + "\n")
    print(json.dumps(info), flush=True)
    return 0


def _install(c: Ctx, src: Path, model: Path, name: str) -> int:
    """The wheels into STAGE_TMP/site (first on the steps' PYTHONPATH), the inputs into ART,
    the model into the run's store."""
    s = c.s
    whls = sorted((src / "whl").glob("*.whl"))
    if whls and c.x(s.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", s.stage_tmp / "site", *whls):
        return 1
    shutil.rmtree(s.art, ignore_errors=True)
    if c.x("tar", "xzf", src / "art.tgz", "-C", s.stage_tmp):
        return 1
    if name.endswith(".gguf"):
        return 1 if c.x(s.py, "-m", "specctl", "models", "pull", "--from", model) else 0
    if name.endswith(".tar"):   # an HF model folder (the rehearsal's tiny model) instead
        folder = s.stage_tmp / "model-src"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if c.x("tar", "xf", model, "-C", folder) or \
                c.x(s.py, RUNBOOK, "install-model", folder):
            return 1
        return 0
    print(f"unknown model file type: {name}")
    return 1


def _json(path: Path) -> dict:
    try:
        v = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def bench(c: Ctx, name: str, inp: Path, *args) -> int:
    """One `specctl bench` with the staged skip set, corpus cache and adapter (the one `stage`
    carried: the GPU's own training does not fit a call); its table as OUT/NAME.md, its stored
    run under OUT/store/ (`specctl report --store OUT/store --all` renders it)."""
    benches = c.s.store / "benches"
    corpus = c.art / "corpus" if (c.art / "corpus").is_dir() else "none"
    adapter = ["--adapter", c.art / "adapter"] if (c.art / "adapter").is_dir() else []
    before = set(_listing(benches))
    rc = c.x(c.py, "-m", "specctl", "bench", inp, "-q", "--skip-set", c.art / "skip.json",
             "--corpus-cache", corpus, *adapter, *args)
    new = max(_listing(benches), key=lambda n: (benches / n).stat().st_mtime, default=None)
    if new is None or new in before:
        print("no bench run was stored", flush=True)
        return rc or 1
    try:
        shutil.copytree(benches / new, c.out / "store" / "benches" / new, dirs_exist_ok=True)
        shutil.copyfile(benches / new / "table.md", c.out / f"{name}.md")
    except OSError as e:
        print(f"runbook: {e}", flush=True)
    return rc


def _listing(d: Path) -> list:
    try:
        return sorted(p.name for p in d.iterdir())
    except OSError:
        return []


@step("bench-batch")
def bench_batch(c: Ctx) -> int:
    """Batch 8/32/64 over every staged prompt (256: a batch-64 row keeps 64 in flight to the end
    of 4 rounds, where 32 prompts made it batch 32). 64 tokens and 1 repeat (after the warm-up
    pass, which on CUDA runs the whole workload): at 128 tokens and 2 repeats it would take
    ~8 min of call 2's 9."""
    size = (["--batch-sizes", "2", "--limit", "4", "--max-tokens", "4"] if c.rehearse else
            ["--batch-sizes", "8,32,64", "--max-tokens", "64"])
    rc = bench(c, "bench-batch", c.art / "sharegpt-prompts.jsonl", "--methods", c.s.methods,
               *size, "--repeats", "1", "--warmup", "1")
    # (the staged prediction for the same rows: README's "measured against the prediction")
    if (c.art / "prediction.md").is_file():
        _copy_quietly(c.art / "prediction.md", c.out / "bench-batch-prediction.md")
    return rc


@step("prefill-chunk")
def prefill_chunk(c: Ctx) -> int:
    """`ar` at batch 32 and 64 over bench-batch's prompts with 512 prompt tokens a prefill
    forward, the chunk before CUDA's default became 4096 (runtime/jobs/sizing.py): beside
    bench-batch's `ar` rows, what the larger chunk saves (its prefill forwards and seconds in
    each row's time split)."""
    size = (["--batch-sizes", "2", "--limit", "4", "--max-tokens", "4"] if c.rehearse else
            ["--batch-sizes", "32,64", "--max-tokens", "64"])
    return bench(c, "prefill-chunk", c.art / "sharegpt-prompts.jsonl", "--methods", "ar",
                 *size, "--repeats", "1", "--warmup", "1", "--prefill-chunk", "512")


@step("bench-b1")
def bench_b1(c: Ctx) -> int:
    """Batch 1 on 8 prompts: at 32 it would take 4x as long for little more; one repeat (two
    read the same ratios at 7f4cca3, and call 2 needs the time)."""
    size = (["--limit", "2", "--max-tokens", "4", "--repeats", "1"] if c.rehearse else
            ["--limit", "8", "--max-tokens", "128", "--repeats", "1"])
    return bench(c, "bench-b1", c.art / "sharegpt32.jsonl", "--methods", c.s.methods_b1,
                 "--batch-sizes", "1", *size, "--warmup", "1")


@step("fused-probe")
def fused_probe(c: Ctx) -> int:
    """The fused layer against the unfused one (issue 43): a captured step's ms, launches a step
    and a layer, Triton's compile, logits agreement."""
    size = (["--shapes", "1x1,2x2", "--replays", "2", "--context", "64"] if c.rehearse else
            ["--shapes", "1x1,8x1,32x1,8x8", "--replays", "100"])
    return c.x_to("fused-probe.md", c.py, "recipes/gpu/fused_probe.py", *size,
                  "--json", c.out / "fused-probe.json")


@step("exact")
def exact(c: Ctx) -> int:
    """--exact (issue 29): each row's tokens against ar:exact at batch 1 in bf16 (captured, on
    the fused layer), and what it costs against plain bf16 ar. Sized to fit: 32 prompts x 64
    tokens at b1/8/32 did not finish in 120 s (graphs off, a step is launch-bound); 8 prompts x
    32 tokens is an eighth of the batch-1 work, and with 8 prompts a batch of 32 would run the
    same batch of 8 again, so b1/8."""
    methods = "ar,ar:exact,self-draft:auto:exact,draft-verify:auto:exact,kangaroo:auto:exact"
    size = (["--batch-sizes", "1,2", "--limit", "2", "--max-tokens", "4"] if c.rehearse else
            ["--batch-sizes", "1,8", "--limit", "8", "--max-tokens", "32"])
    return bench(c, "exact", c.art / "sharegpt32.jsonl", "--methods", methods, *size,
                 "--repeats", "1", "--warmup", "1", "--dtype", "bf16")


@step("repeat")
def repeat(c: Ctx) -> int:
    """The same bf16 generate run twice: byte for byte? (the fused layer's kernels have one
    reduction order; cuDNN's attention, not repeatable, is off; --speculate fixed: admissions
    at once, a schedule of the inputs alone, as auto's grouped ones, following the clock, are
    not)"""
    args = ["generate", c.art / "sharegpt32.jsonl", "--method", "ar", "--speculate", "fixed",
            "--dtype", "bf16", "-q"]
    args += (["--limit", "2", "--batch-size", "2", "--max-tokens", "4"] if c.rehearse else
             ["--batch-size", "8", "--max-tokens", "128"])
    (c.out / "repeat").mkdir(parents=True, exist_ok=True)
    rc = 0
    for i in (1, 2):
        if c.x(c.py, "-m", "specctl", *args, "--out", c.out / "repeat" / f"default-{i}.jsonl"):
            rc = 1
    table = repeat_table(c.out / "repeat")
    (c.out / "repeat.md").write_text(table + "\n")
    print(table, flush=True)
    return rc


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


@step("grid-kernel")
def grid_kernel(c: Ctx) -> int:
    """The grid step's verification kernel compiled for CUDA, against its tensor operations
    (tests/test_grid_kernel.py: interpreted on a CPU, in the default suite)."""
    return c.x(c.py, "-m", "pytest", "-q", "tests/test_grid_kernel.py", "-p",
               "no:cacheprovider")


@step("host-profile")
def host_profile(c: Ctx) -> int:
    """The host's share of a step, ar and Self-Draft, at batch 1 and 8; then at batch 64 over
    128 prompts (a batch fills twice), with a drafting step every step (self-draft:light:fixed
    and the grid's, self-draft:grid:fixed: issue 52's bar is their host time against ar's)
    and each row's launches a step counted (--launches), and each row once under torch.profiler
    (OUT/torch-profile.<method>.b64.txt: the kernels and host ops of its steps). (REHEARSE:
    --threads, since the step's wrapper gives the CPU thread tuner no work.)"""
    small = c.rehearse
    rc = c.x_to("host-profile.md", c.py, "recipes/host_profile.py", "--input",
                c.art / "sharegpt32.jsonl", "--methods", "ar,self-draft,self-draft:light",
                "--batch-sizes", "1,2" if small else "1,8", "--prompts", "2" if small else "16",
                "--max-tokens", "4" if small else "64", *(["--threads", "2"] if small else []),
                "--skip-set", c.art / "skip.json")
    rc64 = c.x_to("host-profile-b64.md", c.py, "recipes/host_profile.py", "--input",
                  c.art / "sharegpt-prompts.jsonl", "--methods",
                  "ar,self-draft,self-draft:light:fixed,self-draft:grid:fixed",
                  "--batch-sizes", "4" if small else "64",
                  "--prompts", "8" if small else "128", "--max-tokens", "4" if small else "48",
                  *(["--threads", "2"] if small else []), "--schedule", "cuda",
                  "--skip-set", c.art / "skip.json", "--launches",
                  "--torch-profile", c.out / "torch-profile")
    return rc or rc64
