"""Several processes, one job (torchrun / Slurm style: RANK, WORLD_SIZE, MASTER_ADDR/PORT): two
CPU processes over gloo, each `python -m specctl generate` on its shard, give the single
process's output line for line; a run whose ranks died part-way is completed by --resume (with
another world size, too); an error on one rank stops every rank, reported once by rank 0."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.dist import shard
from specctl.runtime.jobs.metrics import merged_metrics, metrics
from specctl.runtime.step.stats import sum_stats
from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.runtime.jobs.dist import DistEnv, Group, dist_env

runner = CliRunner(env={"COLUMNS": "200"})
PROMPTS = ["The quick brown fox", "To be or not to be", "A journey of a thousand miles",
           "All that glitters is not gold", "Paris is the capital of", "Write a poem",
           "Explain it step by step"]   # 7: the shards are uneven (4 + 3)
MAX_TOKENS = 8


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def strip(lines: list[dict], keys=("wall_time_s",)) -> list[dict]:
    return [{k: v for k, v in l.items() if k not in keys} for l in lines]


def args(inp: Path, out: Path, store: Path, model: Path, *extra) -> list[str]:
    return [str(a) for a in ("generate", inp, "--model", model, "--store", store, "--out", out,
                             "--max-tokens", MAX_TOKENS, "--device", "cpu", "--dtype", "fp32",
                             *extra)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(argv: list[str], env: dict, log: str) -> None:
    """A forked rank: the launcher's environment, stdout/stderr to a file, the CLI, exit."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__   # not pytest's capture
    os.environ.update(env)
    import torch
    torch.set_num_threads(1)   # as torchrun does; also keeps OpenMP out of a forked child
    code = 0
    try:
        from specctl.cli import app
        app(argv, prog_name="specctl", standalone_mode=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(world: int, argv: list[str], cwd: Path, timeout: float = 90) -> list[dict]:
    """What torchrun does, by hand: `world` processes with RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT set, each running `specctl ARGV`, forked from this process
    (cheap: torch is already imported; test_torchrun_python_m_specctl runs the real thing).
    Returns each rank's exit code and output."""
    import multiprocessing as mp
    port = free_port()
    ctx = mp.get_context("fork")
    procs, logs = [], [cwd / f".rank{r}.log" for r in range(world)]
    for r in range(world):
        env = {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "COLUMNS": "200"}
        procs.append(ctx.Process(target=_rank_main, args=(argv, env, str(logs[r]))))
        procs[-1].start()
    res = []
    for p, log in zip(procs, logs):
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
        res.append({"rc": p.exitcode, "err": log.read_text(errors="replace")})
    return res


def ok(res: list[dict]) -> list[dict]:
    for r, x in enumerate(res):
        assert x["rc"] == 0, f"rank {r}: {x['err']}"
        assert "Traceback" not in x["err"]
    return res


def run_dirs(store: Path) -> list[Path]:
    d = store / "runs"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


@pytest.fixture(autouse=True)
def single_process_env(monkeypatch):
    """The in-process runs below are single-process whatever launched pytest."""
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    w = tmp_path_factory.mktemp("scaleout")
    (w / "p.jsonl").write_text("".join(json.dumps({"prompt": p, "id": f"q{i}"}) + "\n"
                                       for i, p in enumerate(PROMPTS)), encoding="utf-8")
    (w / "skip.json").write_text(json.dumps({"num_layers": 4, "attn": [], "mlp": []}))
    return w


@pytest.fixture(scope="module")
def baseline(work, tiny_llama) -> list[dict]:
    """One process, greedy ar: the reference output."""
    r = runner.invoke(app, args(work / "p.jsonl", work / "one.jsonl", work / "store-one",
                                tiny_llama, "-q"))
    assert r.exit_code == 0, r.output
    return read_jsonl(work / "one.jsonl")


@pytest.fixture(scope="module")
def two_ranks(work, tiny_llama, baseline) -> dict:
    """Two processes, greedy ar, the progress bar on (rank 0 tails rank 1's records)."""
    store = work / "store-two"
    res = ok(launch(2, args(work / "p.jsonl", work / "two.jsonl", store, tiny_llama), work))
    return {"res": res, "store": store, "out": work / "two.jsonl"}


def test_two_ranks_equal_one_process(two_ranks, baseline):
    assert strip(read_jsonl(two_ranks["out"])) == strip(baseline)
    (run,) = run_dirs(two_ranks["store"])   # one run: the ranks agreed on its id
    r0, r1 = (read_jsonl(run / f"records.rank{r}.jsonl") for r in (0, 1))
    # round-robin shards: rank 0 has requests 0, 2, 4, 6 and rank 1 has 1, 3, 5
    assert sorted(l["index"] for l in r0) == [0, 2, 4, 6]
    assert sorted(l["index"] for l in r1) == [1, 3, 5]
    assert not (run / "records.jsonl").exists()
    assert read_jsonl(run / "outputs.jsonl") == read_jsonl(two_ranks["out"])
    m = json.loads((run / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["requests"] == 7 and m["errors"] == 0
    assert m["new_tokens"] == sum(l["new_tokens"] for l in baseline)
    assert [p["requests"] for p in m["per_rank"]] == [4, 3]
    assert sum(p["generated_tokens"] for p in m["per_rank"]) == m["new_tokens"]
    assert m["tokens_per_s"] > 0 and m["steps"] == sum(l["steps"] for l in baseline)
    assert [s["index"] for s in m["per_sample"]] == list(range(7))
    # only rank 0 talks
    rank0, rank1 = two_ranks["res"]
    assert "done: 7 requests" in " ".join(rank0["err"].split()) and "2 processes" in rank0["err"]
    assert "done:" not in rank1["err"] and rank1["err"].strip() == ""


@pytest.mark.slow
def test_torchrun_python_m_specctl(work, tiny_llama, baseline, tmp_path):
    """The real launcher: `torchrun --nproc-per-node 2 -m specctl generate ...` (fresh
    interpreters, so slow: each imports torch and transformers)."""
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    if not Path(torchrun).exists():
        pytest.skip("torchrun is not installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                        "-m", "specctl", *args(work / "p.jsonl", tmp_path / "o.jsonl",
                                               tmp_path / "store", tiny_llama, "-q")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert strip(read_jsonl(tmp_path / "o.jsonl")) == strip(baseline)
    assert p.stderr.count("done: 7 requests") == 1   # rank 0 only


def test_two_ranks_draft_verify_equals_ar(work, tiny_llama, baseline):
    """draft-verify (an empty skip set: the draft is the full model) is lossless across ranks."""
    store = work / "store-dv"
    ok(launch(2, args(work / "p.jsonl", work / "dv.jsonl", store, tiny_llama, "-q",
                      "--method", "draft-verify", "--skip-set", work / "skip.json"), work))
    got = read_jsonl(work / "dv.jsonl")
    assert [(l["index"], l["text"], l["new_tokens"]) for l in got] == \
        [(l["index"], l["text"], l["new_tokens"]) for l in baseline]
    (run,) = run_dirs(store)
    m = json.loads((run / "metrics.json").read_text())
    assert m["method"] == "draft-verify" and m["steps"] == sum(l["steps"] for l in got)
    assert m["mean_accepted_tokens"] == round(m["new_tokens"] / m["steps"], 4)


def _crashed_copy(two_ranks, tmp_path) -> tuple[Path, Path, set[int]]:
    """The two-rank run as crashes would have left it, and as if a 3-process run had also had a
    go: rank 0's file keeps 1 request plus a torn half line, rank 1's keeps 1, and a
    records.rank2.jsonl holds 1 more. Returns (store, run dir, indices done)."""
    store = tmp_path / "store"
    shutil.copytree(two_ranks["store"], store)
    (run,) = run_dirs(store)
    r0 = (run / "records.rank0.jsonl").read_text().splitlines(keepends=True)
    r1 = (run / "records.rank1.jsonl").read_text().splitlines(keepends=True)
    (run / "records.rank0.jsonl").write_text(r0[0] + r0[1][: len(r0[1]) // 2])
    (run / "records.rank1.jsonl").write_text(r1[0])
    (run / "records.rank2.jsonl").write_text(r0[2])
    (run / "outputs.jsonl").unlink()
    (run / "metrics.json").unlink()
    return store, run, {json.loads(l)["index"] for l in (r0[0], r1[0], r0[2])}


def test_resume_two_ranks_after_crash(two_ranks, baseline, work, tiny_llama, tmp_path):
    store, run, kept = _crashed_copy(two_ranks, tmp_path)
    before = {r: len(read_jsonl_lenient(run / f"records.rank{r}.jsonl")) for r in (0, 1, 2)}
    res = ok(launch(2, args(work / "p.jsonl", tmp_path / "o.jsonl", store, tiny_llama, "-q",
                            "--resume"), tmp_path))
    assert f"resuming {run.name}: 3 of 7 requests already done" in " ".join(res[0]["err"].split())
    assert run_dirs(store) == [run]
    assert strip(read_jsonl(tmp_path / "o.jsonl")) == strip(baseline)
    # only the 4 missing requests were generated, 2 per rank (round-robin over what is missing)
    after = {r: len(read_jsonl_lenient(run / f"records.rank{r}.jsonl")) for r in (0, 1, 2)}
    assert after[0] - before[0] == 2 and after[1] - before[1] == 2 and after[2] == before[2]
    m = json.loads((run / "metrics.json").read_text())
    assert m["requests"] == 7 and sum(p["requests"] for p in m["per_rank"]) == 4
    assert len(kept) == 3


def read_jsonl_lenient(path: Path) -> list[dict]:
    out = []
    for l in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(l))
        except json.JSONDecodeError:
            pass
    return out


def test_resume_one_process_after_two_ranks(two_ranks, baseline, work, tiny_llama, tmp_path,
                                            count_generated):
    """A single process resumes a multi-process run from the union of its rank files."""
    store, run, kept = _crashed_copy(two_ranks, tmp_path)
    r = runner.invoke(app, args(work / "p.jsonl", tmp_path / "o.jsonl", store, tiny_llama, "-q",
                                "--resume"))
    assert r.exit_code == 0, r.output
    assert "3 of 7 requests already done" in " ".join(r.output.split())
    assert sorted(count_generated) == sorted(set(range(7)) - kept)
    assert strip(read_jsonl(tmp_path / "o.jsonl")) == strip(baseline)
    assert len(read_jsonl(run / "records.jsonl")) == 4   # a single process writes records.jsonl
    m = json.loads((run / "metrics.json").read_text())
    assert "world_size" not in m and m["requests"] == 7


def test_error_on_one_rank_stops_all_reported_once(work, tiny_llama, tmp_path):
    """Request 1 (rank 1's) is longer than the context: both ranks stop before generating,
    rank 0 prints the one error naming rank 1, rank 1 exits quietly."""
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"prompt": p}) + "\n"
                           for p in ["hello", "word " * 700, "bye"]), encoding="utf-8")
    res = launch(2, args(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "-q"),
                 tmp_path)
    assert [x["rc"] for x in res] == [2, 2], res
    errs = [l for l in res[0]["err"].splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "rank 1:" in errs[0] and "p.jsonl:2" in errs[0], res[0]["err"]
    assert "context" in errs[0]
    assert "error" not in res[1]["err"] and "Traceback" not in res[1]["err"] + res[0]["err"]
    assert not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# the pieces, in-process


def test_dist_env_parsing():
    assert dist_env({}) == DistEnv() and not dist_env({"WORLD_SIZE": "1", "RANK": "0"}).active
    assert dist_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == DistEnv(3, 4, 1)
    assert dist_env({"WORLD_SIZE": "2", "RANK": "1"}) == DistEnv(1, 2, 1)   # LOCAL_RANK = RANK
    for bad, needle in [({"WORLD_SIZE": "2"}, "RANK is not"), ({"WORLD_SIZE": "x"}, "integer"),
                        ({"WORLD_SIZE": "2", "RANK": "2"}, "not in 0..1")]:
        with pytest.raises(SpecctlError, match=needle):
            dist_env(bad)


def test_shards_cover_everything_once():
    items = list(range(11))
    for world in (1, 2, 3, 4, 16):
        parts = [shard(items, r, world) for r in range(world)]
        assert sorted(i for p in parts for i in p) == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_merged_metrics_pool_acceptance_over_ranks():
    from specctl.runtime.step.stats import RunStats
    cfg = GenerateConfig("x.jsonl")
    lines = [{"index": 0, "new_tokens": 6, "steps": 2, "accept_lengths": [3, 1],
              "draft_lengths": [4, 4]},
             {"index": 1, "new_tokens": 2, "steps": 2, "accept_lengths": [0, 0],
              "draft_lengths": [2, 2]}]
    a = RunStats(steps=2, step_tokens=10, padded_tokens=10, generated=6, accept_hist={3: 1, 1: 1})
    b = RunStats(steps=2, step_tokens=6, padded_tokens=10, generated=2, accept_hist={0: 2})
    from dataclasses import asdict
    ranks = [{"rank": r, "device": "cpu", "requests": 1, "errors": 0, "stats": asdict(s),
              "wall_time_s": w, "peak_memory_mb": p}
             for r, (s, w, p) in enumerate([(a, 1.0, 100.0), (b, 0.5, 300.0)])]
    ranks = json.loads(json.dumps(ranks))   # as they travel between ranks
    m = merged_metrics(cfg, lines, ranks, 2.0, torch.device("cpu"))
    one = metrics(cfg, lines, None, 2.0, torch.device("cpu"))
    for k in ("new_tokens", "steps", "mean_accepted_tokens", "acceptance_rate", "ctar"):
        assert m[k] == one[k]                    # pooled over the lines, as for one process
    assert m["acceptance_rate"] == round(4 / 12, 4) and m["mean_accepted_tokens"] == 2.0
    assert m["tokens_per_s"] == 4.0             # (6 + 2) tokens / 2 s of job wall time
    assert m["padding_ratio"] == round(1 - 16 / 20, 4) and m["step_tokens"] == 16
    assert m["peak_memory_mb"] == 300.0
    assert [p["tokens_per_s"] for p in m["per_rank"]] == [6.0, 4.0]
    assert sum_stats([asdict(a), json.loads(json.dumps(asdict(b)))]).accept_hist == \
        {3: 1, 1: 1, 0: 2}


def test_groups_of_one_process_report_the_largest_kv_cache_not_their_sum():
    """A job's per-line settings split it into groups run one after another, each with its
    own KV cache: the job's is the largest (the summary said 72 blocks, twice a 36-block
    --kv-memory budget, for two groups); their counts still add up."""
    from dataclasses import asdict
    from specctl.runtime.step.stats import RunStats, merged
    a = RunStats(steps=3, kv_blocks=36, kv_bytes=300, preemptions=1)
    b = RunStats(steps=4, kv_blocks=30, kv_bytes=250, preemptions=2)
    m = merged([a, b])
    assert (m.kv_blocks, m.kv_bytes, m.steps, m.preemptions) == (36, 300, 7, 3)
    # a Ray actor's tasks, one after another, each with a cache of its own: the same
    from specctl.runtime.jobs.ray_pool import _tally
    actors: dict = {}
    for st in (a, b, a):
        _tally(actors, {"actor": "n:1", "device": "cpu", "requests": 1, "stats": asdict(st),
                        "wall_time_s": 1.0, "peak_memory_mb": 5.0})
    got = actors["n:1"]["stats"]
    assert (got["kv_blocks"], got["kv_bytes"], got["steps"]) == (36, 300, 10)


def test_single_process_group_is_transparent():
    g = Group(DistEnv()).start()
    assert g.gather({"a": 1}) == [{"a": 1}] and g.broadcast(5) == 5
    g.check(None)
    with pytest.raises(KeyError):
        g.check(KeyError("x"))   # one process: the error itself, unchanged
    g.close()


def test_every_line_break_in_ids_on_two_ranks(work, tiny_llama, tmp_path):
    """An id holding U+2028 under two ranks: 'done: 3 requests' and 2 lines in the output
    (records split at it when merged). Every break str.splitlines() knows, both ways."""
    breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    inp = tmp_path / "b.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Say {i}", "id": f"id{c}{i}"},
                                      ensure_ascii=False) + "\n"
                           for i, c in enumerate(breaks)), encoding="utf-8")
    r = runner.invoke(app, args(inp, tmp_path / "one.jsonl", tmp_path / "s1", tiny_llama, "-q"))
    assert r.exit_code == 0, r.output
    ok(launch(2, args(inp, tmp_path / "two.jsonl", tmp_path / "s2", tiny_llama), tmp_path))
    lines = [json.loads(l) for l in (tmp_path / "two.jsonl").read_text().split("\n")[:-1]]
    assert [l["id"] for l in lines] == [f"id{c}{i}" for i, c in enumerate(breaks)]
    one = [json.loads(l) for l in (tmp_path / "one.jsonl").read_text().split("\n")[:-1]]
    assert strip(lines) == strip(one)


def test_skip_bad_lines_on_two_ranks_are_in_the_output(work, tiny_llama, tmp_path):
    """--skip-bad under two ranks: a bad line's error is its output line, as with one process
    (the merge read the answers alone, and dropped them); a job of bad lines only fails."""
    inp = tmp_path / "a.jsonl"
    inp.write_text('{"prompt": "Say hi", "id": "q1"}\n{"prompt": "", "id": "bad"}\n'
                   '{"prompt": "Count", "id": "q3"}\n', encoding="utf-8")
    r = runner.invoke(app, args(inp, tmp_path / "one.jsonl", tmp_path / "s1", tiny_llama, "-q",
                                "--skip-bad"))
    assert r.exit_code == 0, r.output
    ok(launch(2, args(inp, tmp_path / "two.jsonl", tmp_path / "s2", tiny_llama, "--skip-bad"),
              tmp_path))
    two, one = read_jsonl(tmp_path / "two.jsonl"), read_jsonl(tmp_path / "one.jsonl")
    assert [l["index"] for l in two] == [0, 1, 2] and "error" in two[1] and two[1]["id"] == "bad"
    assert strip(two) == strip(one)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n{"prompt": 5}\n', encoding="utf-8")
    res = launch(2, args(bad, tmp_path / "bad.out.jsonl", tmp_path / "s2", tiny_llama,
                         "--skip-bad"), tmp_path)
    assert res[0]["rc"] == 1 and "no line of" in res[0]["err"]
    assert len(read_jsonl(tmp_path / "bad.out.jsonl")) == 2
