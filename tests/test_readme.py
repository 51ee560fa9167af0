"""The README's Python example, run as written (the real tier: it needs the demo model)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.demo
def test_readme_python_example_runs_as_written(tmp_path, demo_model_dir, monkeypatch, capsys):
    """Its one ```python block, verbatim, from a folder laid out as the repository's root (the
    example prompts) with a fresh store that has the demo model (linked, not fetched again).
    Its step-cost tables are a stand-in: the ms a step of so many rows took the demo model on
    a 2-core EPYC (its measured batch-8 table, bench-results/2026-12-03-heldout-nine's
    store). Measuring the two it asks for (batches 3 and 6) took 44 s of the suite on an idle
    machine and 151 s on a busy one (tests/test_controller.py measures and keeps tables)."""
    import numpy as np
    import specctl.runtime.control.steptables as steptables
    from specctl.engine.steptable import StepTable
    rows = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    ms = (39.1, 39.1, 47.6, 90.0, 96.0, 140.0, 215.0, 356.7, 716.3, 1216.3)

    def stand_in(model, batches, ns, context, **kw):
        return StepTable("cpu", "float32", model.attention, context, tuple(batches), tuple(ns),
                         tuple(tuple(float(np.interp(b * n, rows, ms)) for n in ns)
                               for b in batches), tiles=True)
    monkeypatch.setattr(steptables, "measure_step_table", stand_in)
    (code,) = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text("utf-8"), re.S)
    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    (store / "models" / demo_model_dir.name).symlink_to(demo_model_dir)
    (tmp_path / "recipes" / "prompts").mkdir(parents=True)
    shutil.copy(ROOT / "recipes/prompts/demo.jsonl", tmp_path / "recipes/prompts/demo.jsonl")
    monkeypatch.setenv("SPECCTL_HOME", str(store))
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), ns)
    outputs, res = ns["outputs"], ns["res"]
    assert [len(o.turns) for o in outputs] == [1, 1, 2]   # every turn's answer is printed
    printed = capsys.readouterr().out
    assert all(a.strip() in printed for o in outputs for a in o.turns)
    lines = (tmp_path / "answers.jsonl").read_text("utf-8").splitlines()
    assert len(lines) == 6 and res["metrics"]["requests"] == 6
    assert res["metrics"]["gain_vs_ar_est"] > 0 and "x ar (est.)" in printed
