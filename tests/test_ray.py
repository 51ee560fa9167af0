"""`generate --ray` on a local Ray cluster (2 CPU actors; runtime/jobs/ray_pool.py): every
method's output is the single process's, line for line in input order; a driver killed
mid-job resumes (with another actor count) losing and repeating no line; an actor killed
mid-job is restarted and its batch run again; bad lines as in one process; a directory of
JSONL and Parquet shards as its one file; the callable class
in a user's own Ray Data pipeline. Skipped where Ray is not installed (`specctl[ray]`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from specctl.cli import app  # noqa: E402
from specctl.errors import SpecctlError  # noqa: E402

runner = CliRunner(env={"COLUMNS": "200"})
WORDS = ["The quick brown fox", "To be or not to be", "A journey of a thousand miles",
         "All that glitters is not gold", "Paris is the capital of", "Write a poem",
         "Explain it step by step", "Count to ten"]
PROMPTS = [f"{w} {i}" for i in range(5) for w in WORDS]   # 40: several batches per actor
MAX_TOKENS = 8


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l]


ANSWER = ("index", "id", "text", "token_ids", "new_tokens", "finish_reason", "prompt_tokens",
          "error")


def same(lines: list[dict]) -> list:
    """A line's answer (how it was drafted aside: Self-Draft's drafts follow the other
    requests its process saw, and an actor sees a share of them)."""
    return [{k: l.get(k) for k in ANSWER} for l in lines]


def args(inp, out, store, model, *extra) -> list[str]:
    return [str(a) for a in ("generate", inp, "--model", model, "--store", store, "--out", out,
                             "--max-tokens", MAX_TOKENS, "--device", "cpu", "--dtype", "fp32",
                             "--batch-size", 2, "-q", *extra)]


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the in-process jobs (a job reuses a running one)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_llama) -> Path:
    w = tmp_path_factory.mktemp("ray")
    (w / "p.jsonl").write_text("".join(json.dumps({"prompt": p, "id": f"q{i}"}) + "\n"
                                       for i, p in enumerate(PROMPTS)), encoding="utf-8")
    (w / "skip.json").write_text(json.dumps({"num_layers": 4, "attn": [], "mlp": []}))
    from specctl.engine.loader import load_model
    from specctl.models.fingerprint import model_fingerprint
    from specctl.prep.adapter.train import save_adapter
    from specctl.speculative.kangaroo import Adapter
    from specctl.store import Store
    m = load_model(tiny_llama, "cpu", "fp32")
    save_adapter(Store(w / "store"), m, Adapter.init_from_model(m, 1),
                 model_fingerprint(tiny_llama), {"heldout_top1": 0.5})
    return w


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_model_dir) -> dict:
    """The demo model (a step slow enough to kill a job mid-way): 24 prompts and the single
    process's answers."""
    w = tmp_path_factory.mktemp("ray-demo")
    (w / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:24]),
                               encoding="utf-8")
    r = runner.invoke(app, args(w / "p.jsonl", w / "one.jsonl", w / "store-one",
                                demo_model_dir))
    assert r.exit_code == 0, r.output
    return {"dir": w, "model": demo_model_dir, "one": read_jsonl(w / "one.jsonl")}


METHODS = {"ar": (), "draft-verify": ("--skip-set", "skip.json"),
           "self-draft": ("--corpus-cache", "none", "--prompt-grams"), "kangaroo": ()}


def _extra(work, method):
    """The method's options, drafting at every step (--speculate fixed: the actors draft)."""
    return ["--method", method, "--speculate", "fixed"] + [
        str(work / a) if a.endswith(".json") else a for a in METHODS[method]]


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_on_two_actors_is_the_single_process(cluster, work, tiny_llama, method):
    outs = {}
    for name, extra in (("one", ()), ("ray", ("--ray", "local", "--actors", 2))):
        out = work / f"{method}-{name}.jsonl"
        r = runner.invoke(app, args(work / "p.jsonl", out, work / "store", tiny_llama,
                                    *_extra(work, method), *extra))
        assert r.exit_code == 0, r.output
        outs[name] = read_jsonl(out)
    assert [l["index"] for l in outs["ray"]] == list(range(len(PROMPTS)))
    assert same(outs["ray"]) == same(outs["one"])
    if method != "self-draft":   # (and line for line, how it was drafted too)
        strip = [[{k: v for k, v in l.items() if k != "wall_time_s"} for l in outs[n]]
                 for n in ("ray", "one")]
        assert strip[0] == strip[1]
    assert any(l["draft_lengths"] for l in outs["ray"]) == (method != "ar")
    runs = sorted((work / "store" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    m = json.loads((runs[-1] / "metrics.json").read_text())
    assert m["ray"]["actors"] == m["ray"]["started"] == 2 and m["requests"] == len(PROMPTS)
    assert sum(r["requests"] for r in m["per_rank"]) == len(PROMPTS)


def test_a_killed_driver_resumes_with_another_actor_count(cluster, demo, tmp_path):
    """SIGKILL to the driver (and its own local cluster) after a batch is done; --resume with
    one actor runs the rest: every line once, the single process's answers."""
    store, out, inp = tmp_path / "store", tmp_path / "o.jsonl", demo["dir"] / "p.jsonl"
    cmd = [sys.executable, "-m", "specctl"] + args(inp, out, store, demo["model"], "--ray",
                                                   "local", "--actors", 2)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    records = None
    try:
        for _ in range(1200):
            runs = list((store / "runs").glob("*/records.jsonl"))
            if runs and runs[0].read_text().strip():
                records = runs[0]
                break
            assert p.poll() is None, "the job ended before it could be killed"
            time.sleep(0.05)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert records is not None
    before = len(read_jsonl(records))
    assert 0 < before < len(demo["one"])
    r = runner.invoke(app, args(inp, out, store, demo["model"], "--ray", "local", "--actors", 1,
                                "--resume"))
    assert r.exit_code == 0, r.output
    assert sorted(l["index"] for l in read_jsonl(records)) == list(range(len(demo["one"])))
    assert same(read_jsonl(out)) == same(demo["one"])


def test_a_killed_actor_is_restarted_and_its_batch_run_again(cluster, demo, tmp_path):
    stop = threading.Event()
    killed = []

    def kill_one():   # (an actor's process is titled ray::MapWorker(MapBatches(...)))
        while not stop.is_set() and not killed:
            alive = subprocess.run(["pgrep", "-f", "MapBatches.GenerateBatches"],
                                   capture_output=True, text=True).stdout.split()
            runs = list((tmp_path / "store" / "runs").glob("*/records.jsonl"))
            if alive and runs and runs[0].read_text().strip():
                os.kill(int(alive[0]), signal.SIGKILL)
                killed.append(alive[0])
            time.sleep(0.05)
    t = threading.Thread(target=kill_one)
    t.start()
    try:
        r = runner.invoke(app, args(demo["dir"] / "p.jsonl", tmp_path / "o.jsonl",
                                    tmp_path / "store", demo["model"], "--ray", "local",
                                    "--actors", 2))
    finally:
        stop.set()
        t.join()
    assert r.exit_code == 0, r.output
    assert killed, "no actor was killed: the job ran too fast for the test"
    lines = read_jsonl(tmp_path / "o.jsonl")
    assert same(lines) == same(demo["one"])
    run = next((tmp_path / "store" / "runs").iterdir())
    assert sorted(l["index"] for l in read_jsonl(run / "records.jsonl")) == \
        list(range(len(demo["one"])))   # (each line once)
    m = json.loads((run / "metrics.json").read_text())
    assert m["ray"]["restarts"] >= 1, m["ray"]
    said = f"(Ray: 2 actors, {m['ray']['restarts']} restart"   # (the summary line counts them)
    assert said in " ".join(r.output.split()), r.output


def test_bad_lines_as_in_one_process(cluster, work, tiny_llama, tmp_path):
    inp = tmp_path / "bad.jsonl"
    inp.write_text(json.dumps({"prompt": "hello"}) + "\n{not json\n"
                   + json.dumps({"prompt": "bye"}) + "\n")
    outs = []
    for extra in ((), ("--ray", "local")):
        out = tmp_path / f"o{len(outs)}.jsonl"
        r = runner.invoke(app, args(inp, out, tmp_path / "store", tiny_llama, "--skip-bad",
                                    *extra))
        assert r.exit_code == 0, r.output
        outs.append(read_jsonl(out))
    assert same(outs[0]) == same(outs[1]) and "error" in outs[1][1]


def test_a_directory_of_shards_on_two_actors_is_the_single_process(cluster, work, tiny_llama,
                                                                   tmp_path):
    """JSONL and Parquet shards in one directory: the one JSONL file's answers, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    lines = read_jsonl(work / "p.jsonl")
    d = tmp_path / "shards"
    d.mkdir()
    (d / "part-0.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines[:15]))
    pq.write_table(pa.Table.from_pylist(lines[15:30]), d / "part-1.parquet")
    pq.write_table(pa.Table.from_pylist(lines[30:]), d / "part-2.parquet")
    outs = []
    for inp, extra in ((work / "p.jsonl", ()), (d, ("--ray", "local", "--actors", 2))):
        out = tmp_path / f"o{len(outs)}.jsonl"
        r = runner.invoke(app, args(inp, out, tmp_path / "store", tiny_llama, *extra))
        assert r.exit_code == 0, r.output
        outs.append(read_jsonl(out))
    assert same(outs[1]) == same(outs[0]) and len(outs[1]) == len(PROMPTS)


def test_the_callable_class_in_a_users_pipeline(cluster, tiny_llama, tmp_path):
    """ds.map_batches(GenerateBatches, ...) over a dataset of prompt rows: the Generator's
    answers, as "text" beside the row's own columns."""
    import ray.data
    from specctl import Generator
    from specctl.runtime.jobs.ray_pool import GenerateBatches
    opts = {"model": str(tiny_llama), "store": str(tmp_path / "store"), "device": "cpu",
            "dtype": "fp32", "max_tokens": MAX_TOKENS}
    rows = [{"prompt": p, "tag": i} for i, p in enumerate(PROMPTS[:6])]
    ds = ray.data.from_items(rows).map_batches(
        GenerateBatches, fn_constructor_kwargs=opts, batch_size=3, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1)
    got = sorted(ds.take_all(), key=lambda r: r["tag"])
    model = opts.pop("model")
    want = Generator(model, store=opts.pop("store"), **opts).generate(PROMPTS[:6])
    assert [r["text"] for r in got] == [o.text for o in want]


def test_without_ray_it_says_how_to_install(monkeypatch):
    import builtins
    from specctl.runtime.jobs import ray_pool
    real = builtins.__import__

    def no_ray(name, *a, **kw):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(SpecctlError, match=r"pip install 'specctl\[ray\]'"):
        ray_pool.import_ray()


def test_the_docs_pipeline_example_runs_as_written(cluster, demo_model_dir, tmp_path,
                                                   monkeypatch, capsys):
    """docs/commands.md's Ray Data example, verbatim, on the demo model (a store that has it,
    linked): it prints each prompt and its answer."""
    import re
    docs = (Path(__file__).resolve().parents[1] / "docs" / "commands.md").read_text("utf-8")
    section = docs[docs.index("### Across processes and machines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    (store / "models" / demo_model_dir.name).symlink_to(demo_model_dir)
    monkeypatch.setenv("SPECCTL_HOME", str(store))
    exec(compile(code, "docs/commands.md", "exec"), {"__name__": "docs"})
    printed = capsys.readouterr().out
    assert printed.count(" -> ") == 2 and "What is the capital of France? -> " in printed
    assert "Write a haiku about the sea. -> " in printed



BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
OWN = [   # every per-line setting, in every line format that carries them
    {"prompt": "The quick brown fox", "id": "all\u2028", "sampling": {
        "temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 5, "stop": [" is", "x"],
        "n": 2, "logprobs": 2}},
    {"messages": [{"role": "user", "content": "To be or not"}], "id": "one stop",
     "sampling": {"stop": " the", "temperature": 0}},
    {"custom_id": "batch\u2029", "body": {
        "messages": [{"role": "user", "content": "Write a poem"}], "max_tokens": 6,
        "temperature": 0.7, "top_p": 0.8, "seed": 3, "stop": "\n", "n": 2, "logprobs": True,
        "top_logprobs": 2}},
    {"question_id": 81, "turns": ["Count to ten", "And back"], "sampling": {"seed": 9,
                                                                             "temperature": 1}},
] + [{"prompt": f"Say {i}", "id": f"id{c}{i}"} for i, c in enumerate(BREAKS)]


def _split(line: dict) -> tuple[str, list[float]]:
    """A line as (its JSON without log-probabilities and wall time, those numbers)."""
    nums: list[float] = []

    def walk(v):
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, float):
            nums.append(v)
    rest = {k: v for k, v in line.items() if k not in ("logprobs", "samples")}
    samples = [{k: v for k, v in a.items() if k != "logprobs"} for a in line.get("samples", [])]
    walk(line.get("logprobs", []))
    for a in line.get("samples", []):
        walk(a.get("logprobs", []))
    return json.dumps([rest, samples], sort_keys=True), nums


def test_every_per_line_setting_and_line_break_through_ray_is_the_single_process(
        cluster, tiny_llama, tmp_path):
    """A line's own stop list failed the whole job on Ray ("unhashable type: 'list'" once the
    record had crossed as JSON, and a message of Ray's retry advice); ids holding a line
    break lost their lines. Every setting, every format, every break: the single process's
    lines, in order."""
    inp = tmp_path / "own.jsonl"
    inp.write_text("".join(json.dumps(l, ensure_ascii=False) + "\n" for l in OWN),
                   encoding="utf-8")
    outs = {}
    for name, extra in (("one", ()), ("ray", ("--ray", "local", "--actors", 2))):
        out = tmp_path / f"{name}.jsonl"
        r = runner.invoke(app, args(inp, out, tmp_path / "store", tiny_llama, *extra))
        assert r.exit_code == 0, r.output
        outs[name] = [{k: v for k, v in l.items() if k != "wall_time_s"}
                      for l in map(json.loads, out.read_text(encoding="utf-8").split("\n")[:-1])]
    # (log-probabilities to float rounding: an actor batches the samples otherwise)
    ray_, one = ([_split(l) for l in outs[n]] for n in ("ray", "one"))
    assert [r for r, _ in ray_] == [r for r, _ in one]
    assert [x for _, xs in ray_ for x in xs] == pytest.approx([x for _, xs in one for x in xs],
                                                              abs=1e-4)
    assert len(outs["one"]) == len(OWN)
    ident = lambda l: l.get("id", l.get("custom_id", l.get("question_id")))  # noqa: E731
    assert [ident(l) for l in outs["one"]] == [ident(l) for l in OWN]
    assert len(outs["one"][0]["samples"]) == 2 and outs["one"][0]["logprobs"]


def test_a_job_failed_on_the_cluster_says_the_first_task_error():
    """Ray's text: the task's traceback, then its own wrapping, whose last line is advice."""
    from specctl.runtime.jobs.ray_pool import _reason
    text = ("\x1b[36mray::MapWorker(MapBatches(C)).submit()\x1b[39m (pid=1, ip=1.2.3.4)\n"
            '  File "groups.py", line 41, in run_groups\n    groups.setdefault(...)\n'
            "TypeError: unhashable type: 'list'\n\nThe above exception was the direct cause "
            "of the following exception:\n\n\x1b[36mray::MapWorker(MapBatches(C)).submit()"
            "\x1b[39m (pid=1)\nray.exceptions.UserCodeException: UDF failed to process a data "
            "block.\nTo change retry attempts, backoff, or which errors are retried, configure "
            "`ray.data.DataContext.get_current()`")
    assert _reason(RuntimeError(text)) == "TypeError: unhashable type: 'list'"
    assert _reason(ConnectionError("no cluster at 1.2.3.4")) == "no cluster at 1.2.3.4"
