"""Run the Runner directly on token-id prompts (no tokenizer, no store) for exact comparisons."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import make_controller
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request
from specctl.speculative.drafter import NoDraft
from specctl.speculative.sampling import SamplingParams


def run_ids(model, prompts: list[list[int]], *, batch_size: int = 1, max_tokens: int = 16,
            drafter=None, sampling: SamplingParams | None = None, eos_ids=(),
            max_len: int = 256, prefill_chunk: int = 512, speculate: str = "fixed",
            controller=None, kv_budget: int | None = None, prefill_price=None):
    """Returns (list of generated id lists in input order, RunStats). prefill_price: a
    runtime/step/prefill.PiecePrice the run prefills by, grouped (as a GPU's run measures
    one)."""
    reqs = [Request(i, [[{"role": "user", "content": str(i)}]], max_tokens)
            for i in range(len(prompts))]
    results: dict[int, list[int]] = {}
    drafter = drafter or NoDraft()
    if speculate == "auto" and controller is None and drafter.price().max_draft > 0:
        controller = make_controller(drafter, model, batch_size)
    runner = Runner(model, drafter, sampling or SamplingParams(),
                    batch_size=batch_size, max_len=max_len, eos_ids=set(eos_ids),
                    render=lambda r: prompts[r.index], decode=lambda ids: " ".join(map(str, ids)),
                    prefill_chunk=prefill_chunk,
                    controller=controller if speculate == "auto" else None,
                    kv_budget=kv_budget)
    if prefill_price is not None:
        runner.prefill_price, runner.grouped = prefill_price, True
    stats = runner.run(reqs, lambda r: results.__setitem__(r.index, r.answer_ids[0]))
    return [results[i] for i in range(len(prompts))], stats


def step_table(f, batches=tuple(range(1, 9)), device: str = "cpu") -> StepTable:
    """A synthetic step-cost table: ms(b, n) = f(b, n), n = 1, 2, 4 .. 64."""
    ns = (1, 2, 4, 8, 16, 32, 64)
    return StepTable(device, "float32", "sdpa", 128, tuple(batches), ns,
                     tuple(tuple(float(f(b, n)) for n in ns) for b in batches))


def kv_budget(model, drafter, max_len: int, sequences: float) -> int:
    """Bytes of a paged KV cache holding `sequences` full-length sequences of a
    Runner(max_len) with this drafter: below batch_size of them, the runner's cache is paged."""
    from specctl.engine.kv import BLOCK, row_bytes
    head = drafter.kv_headroom if drafter is not None else 0
    if model.graphs is not None:
        head = max(head, model.graphs.max_n)
    rows = -(-(max_len + head) // BLOCK) * BLOCK
    c = model.cfg
    extra = getattr(drafter, "kv_layers", 0)   # a drafter's own cache layers (Kangaroo's)
    per_row = row_bytes(c.num_layers + extra, c.num_kv_heads, c.head_dim, model.dtype)
    return int((int(rows * sequences) + BLOCK) * per_row)   # (+ the pool's null block)


def hf_greedy(model_dir, prompt: list[int], max_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = m.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0, min_new_tokens=max_tokens)
    return out[0, len(prompt):].tolist()


def chi_square_ok(counts: torch.Tensor, p: torch.Tensor) -> bool:
    """Pearson chi-square over cells with expected count >= 5 (the rest pooled), accepted when
    below dof + 5 standard deviations: generous for a right sampler, failed by a wrong one."""
    n = counts.sum()
    exp = p.double() * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    ex = torch.cat([exp[big], exp[~big].sum()[None]])
    chi2 = ((obs - ex) ** 2 / ex.clamp_min(1e-9)).sum().item()
    dof = int(big.sum())
    return chi2 < dof + 5 * (2 * dof) ** 0.5


def check_three_token_sampling(model, prompt: list[int], sp: SamplingParams, drafter,
                               n: int = 3000):
    """Sample 3 tokens n times with `drafter` and test them against the target's exact joint
    p(x1) p(x2|x1) p(x3|x1 x2) (sp should use a small top-k so the support stays small): x1
    comes from prefill, x2 and x3 from draft + verify steps. Returns the run's stats."""
    from specctl.engine.batch import ForwardBatch, SeqInput
    from specctl.speculative.sampling import warp

    def dist(ids):
        kv = model.new_kv_cache(1, len(ids) + 1)
        out = model.logits(model.forward(ForwardBatch([SeqInput(0, ids, 0)]), kv))[-1:]
        return warp(out, sp)[0].double()
    joint = {}
    p1 = dist(prompt)
    for x1 in torch.nonzero(p1).flatten().tolist():
        p2 = dist(prompt + [x1])
        for x2 in torch.nonzero(p2).flatten().tolist():
            p3 = dist(prompt + [x1, x2])
            for x3 in torch.nonzero(p3).flatten().tolist():
                joint[(x1, x2, x3)] = (p1[x1] * p2[x2] * p3[x3]).item()
    cells = sorted(joint)
    outs, stats = run_ids(model, [prompt] * n, batch_size=60, max_tokens=3, sampling=sp,
                          drafter=drafter)
    counts = torch.zeros(len(cells) + 1, dtype=torch.float64)
    for o in outs:
        counts[cells.index(tuple(o)) if tuple(o) in joint else -1] += 1
    assert counts[-1] == 0   # nothing outside the support
    assert chi_square_ok(counts, torch.tensor([joint[c] for c in cells] + [0.0]))
    return stats


def random_prompts(n: int, seed: int = 0, max_len: int = 30) -> list[list[int]]:
    """n token-id prompts of 3 .. max_len - 1 tokens from the tiny models' vocabulary."""
    import random
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 300) for _ in range(rnd.randrange(3, max_len))] for _ in range(n)]


def fails(r, *needles) -> str:
    """Non-zero exit through the CLI's error printer: exactly one `error:` line naming the
    needles, and no traceback (an uncaught exception would show up as r.exception)."""
    assert r.exit_code != 0, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    if r.stderr_bytes is not None:
        assert "Traceback" not in r.stderr
    errs = [l for l in r.output.splitlines() if l.startswith("error:")]
    assert len(errs) == 1, r.output
    for n in needles:
        assert n in errs[0], errs[0]
    return errs[0]


def interrupt_search_at(monkeypatch, n: int, stop=KeyboardInterrupt) -> None:
    """search-skip's probe n (from 1) is a Ctrl-C (KeyboardInterrupt; stop: another, such as
    SIGTERM's) where it would run."""
    import specctl.prep.skip.search as S
    real, calls = S._probe, []

    def probe(*a, **kw):
        calls.append(1)
        if len(calls) == n:
            raise stop
        return real(*a, **kw)
    monkeypatch.setattr(S, "_probe", probe)


def tree_input(slot: int, root: int, nodes, base: int):
    """A step's input for one sequence: its pending token `root` and a DraftTree's nodes (draft
    and probe) at base + depth, under the tree's mask (what Runner.step_input builds)."""
    from specctl.engine.batch import SeqInput
    return SeqInput(slot, [root] + nodes.tokens, base, parents=nodes.parents)


def prefill_slots(model, kv, prompts: list[list[int]], device="cpu"):
    """Prefill prompt i into KV slot i and commit it; returns kv."""
    from specctl.engine.batch import ForwardBatch, SeqInput
    for s, p in enumerate(prompts):
        kv.reserve(s, kv.max_len)
        model.forward(ForwardBatch([SeqInput(s, p, 0)], device), kv)
        kv.lens[s] = len(p)
    return kv


class Oracle:
    """A corpus cache that knows the answers: the continuation after the last 2 tokens as seen
    in the reference texts (plus a wrong candidate first, so verification has to choose)."""

    def __init__(self, texts: list[list[int]], g: int = 4):
        self.gram_len = g   # (as a corpus cache declares: the drafter counts its rows by it)
        self.next: dict[tuple[int, int], list[int]] = {}
        for t in texts:
            for i in range(len(t) - 2 - g + 1):
                self.next.setdefault((t[i], t[i + 1]), t[i + 2:i + 2 + g])
        self.calls = 0

    def lookup(self, context: list[int], limit: int = 3) -> list[list[int]]:
        self.calls += 1
        hit = self.next.get(tuple(context[-2:]))
        out = [[7, 8, 9, 10]] + ([hit] if hit else [])
        return out[:limit]



def triton_module(name: str):
    """The specctl module `name` of Triton kernels, for a test module to import at its top:
    under Triton's interpreter where there is no GPU (TRITON_INTERPRET is read when triton
    is first imported), the test module skipped where triton or the module is missing."""
    import pytest
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton")
    return pytest.importorskip(name)

def method_drafters(m, prompts, ref, adapter=None):
    """{method: drafter} (None for ar) for the tiny 4-layer model: one drafter of every method,
    each set up so that drafts get accepted."""
    from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
    from specctl.speculative.kangaroo import Adapter, KangarooDrafter, KangarooParams
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    return {
        "ar": None,
        "draft-verify": LayerSkipDrafter(m, SkipSet(4, frozenset({2}), frozenset({3})),
                                         SamplingParams(), ExitParams(K=4, gamma0=0.0)),
        "kangaroo": KangarooDrafter(m, adapter or Adapter.init_from_model(m, 1),
                                    SamplingParams(), KangarooParams(eta=0.0, gamma=4)),
        "self-draft": SelfDraftDrafter(SelfDraftParams(job_cache=True),
                                       Oracle([p + r for p, r in zip(prompts, ref)])),
    }


class HostReads:
    """Records what a piece of code does that a CUDA-graph capture cannot hold, so the CPU tests
    can check the captured forwards (engine/graphs.py) without a GPU:
    - reads of tensor data by the host (item, tolist, bool(), numpy, .cpu(), .to(device)),
      which on CUDA synchronize and fail a capture;
    - ops whose output size depends on the data (nonzero, masked_select, boolean-mask
      indexing, unique) and ops that return a Python value (equal, is_nonzero): they sync too;
    - tensors made from Python data (torch.tensor(list)): a host-to-device copy at capture
      time, baked into the graph as a constant;
    - tensors made without a device (they would land on the CPU next to CUDA tensors): the
      default device is 'meta' inside, so such a tensor fails the first op that mixes it in.

        with HostReads() as reads:
            fn()
        assert reads.found == []
    """

    READS = {"item", "tolist", "numpy", "cpu", "cuda", "to", "__bool__", "__int__",
             "__float__", "__index__"}
    SYNC_OPS = {"nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
                "_local_scalar_dense", "lift_fresh", "lift_fresh_copy", "bincount", "histc"}

    def __init__(self):
        import torch
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode
        self.found: list[str] = []
        guard = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                if name in guard.READS and not (name == "to" and not _moves(args, kwargs)):
                    guard.found.append(f"Tensor.{name}")
                return func(*args, **kwargs)

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name in guard.SYNC_OPS or (name in ("index", "index_put", "index_put_")
                                              and _bool_index(args)) or (
                        name == "repeat_interleave"   # tensor repeats: the size is read back
                        and func._overloadname != "self_int"
                        and (kwargs or {}).get("output_size") is None):
                    guard.found.append(f"aten.{name}")
                out = func(*args, **(kwargs or {}))
                if isinstance(out, (bool, int, float)):
                    guard.found.append(f"aten.{name} -> {type(out).__name__}")
                return out

        def _moves(args, kwargs):
            return "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:])

        def _bool_index(args):
            idx = args[1] if len(args) > 1 else []
            return any(getattr(i, "dtype", None) == torch.bool for i in (idx or []))

        self._modes = [torch.device("meta"), Functions(), Ops()]
        self.active = False

    def __enter__(self):
        for m in self._modes:
            m.__enter__()
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False
        for m in reversed(self._modes):
            m.__exit__(*exc)
        return False

    def outside(self, fn):
        """fn run with the recording paused (a compiled kernel that the modes cannot enter)."""
        def run(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            self.__exit__(None, None, None)
            try:
                return fn(*args, **kwargs)
            finally:
                self.__enter__()
        return run


def cache_root() -> Path:
    """Where the real tier keeps what it downloads (the demo model, ShareGPT, gensim's texts):
    $SPECCTL_TEST_CACHE, else the user's own store ($SPECCTL_HOME or ~/.cache/specctl), so a
    machine that ran the quickstart does not download the demo model a second time."""
    from specctl.store import default_root
    env = os.environ.get("SPECCTL_TEST_CACHE")
    return Path(env).expanduser() if env else default_root()
