"""docs/commands.md's cluster commands, run as written in a fresh home: a token generated, a
head and a worker started with `ray start` (token authentication on, as Ray 2.59+ has it; the
worker reads the head's token, in the same home), `specctl generate --ray auto` on them,
`ray stop`. Both nodes on this machine; only the port, the head's address, the input, the store
and the actor count are this machine's. A module of its own: `ray stop` ends every Ray process
here, so it runs after tests/test_ray.py's cluster is gone, and not where another cluster
runs."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from specctl.cli import app  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "commands.md"
PROMPTS = [f"{w} {i}" for i in range(3) for w in ("The quick brown fox", "Count to ten",
                                                  "Paris is the capital of", "Write a poem")]


def doc_commands() -> list[str]:
    """The bash block of the docs' cluster section, a command a line, comments cut."""
    section = DOCS.read_text("utf-8").split("### Across processes and machines")[1]
    block = next(b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "ray start" in b)
    return [l.split("  #")[0].strip() for l in block.splitlines() if l.split("#")[0].strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_the_docs_cluster_commands_run_as_written(tiny_llama, tmp_path):
    running = subprocess.run(["pgrep", "-f", "ray/core/src/ray/gcs/gcs_server"],
                             capture_output=True, text=True).stdout.split()
    if running:   # (the docs' `ray stop` would end it)
        pytest.skip("a Ray cluster is running on this machine")
    cmds = doc_commands()
    assert [c.split()[:2] for c in cmds] == [
        ["export", "RAY_AUTH_MODE=token"], ["ray", "get-auth-token"], ["ray", "start"],
        ["ray", "start"], ["specctl", "generate"], ["ray", "stop"]]
    inp = tmp_path / "big.jsonl"
    inp.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    port = str(free_port())
    here = {"6379": port, "HEAD": ray.util.get_node_ip_address(), "big.jsonl": str(inp),
            "/shared/specctl": str(tmp_path / "store"), "--actors 8": "--actors 2"}
    job = ["--model", str(tiny_llama), "--out", str(tmp_path / "ray.out.jsonl"),
           "--max-tokens", "6", "--device", "cpu", "--dtype", "fp32", "--batch-size", "2", "-q"]
    # (HOME: the head's token file, ~/.ray/auth_token, is this test's; both nodes read it)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    try:
        for cmd in cmds[:-1]:
            for a, b in here.items():
                cmd = cmd.replace(a, b)
            if cmd.startswith("export "):
                key, value = cmd.split()[1].split("=", 1)
                env[key] = value
                continue
            argv = cmd.split() + (job if cmd.startswith("specctl") else [])
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    finally:
        subprocess.run(cmds[-1].split() + ["--force"], env=env, capture_output=True, timeout=120)
    one = tmp_path / "one.out.jsonl"
    r = CliRunner().invoke(app, ["generate", str(inp), "--store", str(tmp_path / "store"),
                                 *job[:2], "--out", str(one), *job[4:]])
    assert r.exit_code == 0, r.output
    keys = ("index", "text", "token_ids", "finish_reason")
    answers = [[{k: json.loads(l)[k] for k in keys} for l in p.read_text().splitlines()]
               for p in (tmp_path / "ray.out.jsonl", one)]
    assert answers[0] == answers[1] and len(answers[0]) == len(PROMPTS)
    pools = [m["ray"] for m in (json.loads((d / "metrics.json").read_text())
                                for d in (tmp_path / "store" / "runs").iterdir()) if "ray" in m]
    assert len(pools) == 1 and pools[0]["actors"] == pools[0]["started"] == 2
