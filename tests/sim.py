"""A simulated step clock: the GPU's time on the CPU. Every decoding forward (Model.run) advances
the clock by what a step table says that forward costs on the device the table was measured on
(the committed H100 table: bench-results/2026-11-23-engine-step/steps-demo.json), padded as
captured graphs pad it (engine/graphs.py: batch bucket, tokens per sequence on the grid), and
the runner reads that clock instead of the wall's. So the controller, the lean steps and the
guard decide on the GPU's prices, deterministically, while the tiny model's tokens stay real
(losslessness is still checked).

The host-charged clock (host > 0) also charges what the GPU's host pays serially with its
launches: every second of this process's own CPU time outside the model's forwards (the
controller's search, drafting logic, verification, commit, admission, the prefill's
bookkeeping, and each forward's staging of its inputs for a graph's replay: Staging) times
`host`, the ratio of the GPU machine's host to this one on the same work
(HOST: the H200 machine's host ran `ar`'s step bookkeeping at 0.12 / 0.22 / 0.32 ms a step
at batch 1 / 8 / 32, bench-results/2026-11-28-gpu-74f1c5f/host-profile.md, without a profiler;
this 2-core EPYC at 0.037 / 0.076 / 0.12 with `recipes/host_profile.py --repeats 3` on the tiny
model, the same prompts' count and lengths: 3.3 / 2.9 / 2.7x, so 3.0; the issue's 2.5 came from
the H100's machine), and prices each prefill
forward by the GPU's measured prefill table (prefill_table(): eager, 8.5 ms for one prompt,
~15 for 4 or 16, whatever their tokens). CPU time, not wall: another process on the machine
does not count as this one's host work, nor does the clock's own (its pricing of a forward,
its counting of kernels: ~70 us a step here, once charged to every method's host). Device
work no table prices (a grid step's gather in its forward, its verification and KV moves
behind it) costs KERNEL_US a kernel, counted as CUDA launches them (timed_model).

    clock = SimClock(table, slots=32)
    out, stats = sim_run(model, prompts, drafter, clock, monkeypatch, batch_size=32, ...)
    clock.t   # seconds of device time the run's steps took
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import types
from pathlib import Path

import numpy as np
import torch

from specctl.engine.batch import FULL
from specctl.engine.graphs import CudaGraphs, grid_n
from specctl.engine.launches import counting
from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import Controller
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request
from specctl.runtime.control.stepcost import StepCost
from specctl.speculative.drafter import (NO_DRAFT, DraftLimits, DraftPrice, Drafter, NoDraft,
                                         Proposal)
from specctl.speculative.kangaroo_heads import AdapterRows
from specctl.speculative.sampling import SamplingParams
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
from specctl.speculative.verify import DraftTree

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "bench-results/2026-11-23-engine-step/steps-demo.json"
H200_FUSED = ROOT / "bench-results/2026-11-28-gpu-74f1c5f/steps-demo-fused.json"
PREFILL = ROOT / "bench-results/2026-11-28-gpu-74f1c5f/prefill-cost.json"
HOST = 3.0   # the GPU machine's host time per unit of this machine's (module docstring)
KERNEL_US = 5.0   # device time of a small kernel a step table does not price (an H100 runs
# small kernels back to back at ~2-4 us each: the larger errs against what is charged it)


def h100_table() -> StepTable:
    return StepTable.from_json(json.loads(H100.read_text()))


def h200_fused_table() -> StepTable:
    """The demo shape's step on the H200 with the fused layer, CUDA's default since 74f1c5f
    (h100_table is the SDPA step of 2026-11-23)."""
    return StepTable.from_json(json.loads(H200_FUSED.read_text()))


def prefill_table():
    """ms of an eager prefill forward of p prompts on the GPU (the committed measurement: the
    median over its token counts for each prompt count, linear between them)."""
    import numpy as np
    rows = json.loads(PREFILL.read_text())["rows"]
    ps = sorted({r["prompts"] for r in rows})
    ms = [float(np.median([r["ms"] for r in rows if r["prompts"] == p])) for p in ps]
    return lambda p: float(np.interp(p, ps, ms))


class SimClock:
    """Seconds of simulated device time. dear(plan, n): a factor on a forward's table price
    (a device slower than its table for some forwards). A prefill forward (no table prices
    it: eager on a GPU) costs prefill_ms plus token_us a prompt token (default nothing)."""

    def __init__(self, table: StepTable, slots: int, dear=None, prefill_ms: float = 0.0,
                 token_us: float = 0.0, host: float = 0.0, prefill=None):
        self.table, self.slots, self.dear = table, slots, dear
        self.prefill_ms, self.token_us = prefill_ms, token_us
        self.host, self.prefill = host, prefill   # (prefill: ms by prompts, prefill_table)
        self.price = DraftPrice()
        self.paused = False   # (prefill: its forwards are not what a step table prices)
        self.reset()

    def reset(self) -> None:
        """Zero: the device's seconds and the host's (from now on)."""
        self.t = 0.0
        self.window = 0.0   # device seconds of the last forward not yet overlapped by the host
        self.host_from_now()

    def host_from_now(self) -> None:
        """The host's charge starts again from now."""
        self.inside = 0.0   # this thread's CPU seconds inside the model's forwards
        self.cpu0 = time.thread_time()
        self.hidden = 0.0   # host seconds charged that ran while a forward did

    @contextlib.contextmanager
    def device(self):
        """Work in the block is the device's (a forward): its CPU time is not the host's."""
        t = time.thread_time()
        try:
            yield
        finally:
            self.inside += time.thread_time() - t

    def host_s(self) -> float:
        """The host's charged seconds so far: CPU time outside the forwards, times host, less
        what ran while the device computed (overlapped)."""
        if not self.host:
            return 0.0
        return self.host * (time.thread_time() - self.cpu0 - self.inside) - self.hidden

    def overlapped(self, fn):
        """fn, whose host time runs while the last forward computes on the device (issued
        between a forward and the host's first read of its output, as on CUDA): it costs
        only what it takes beyond that forward's device time."""
        def run(*a, **kw):
            c0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                hid = min(self.host * (time.thread_time() - c0), self.window)
                self.hidden += hid
                self.window -= hid
        return run

    def __call__(self) -> float:
        return self.t + self.host_s()

    def forward(self, batch, plan, tail: bool = False, pad_n: int = 1) -> None:
        """Charge one forward; tail: a shallow forward that drafts nothing (Kangaroo's, its
        head only writing the adapter's KV rows), priced as the drafter prices it (tail_frac).
        A prefill's piece (pad_n: runtime/step/prefill.py) is a replay: the table's price of
        its rows, not the eager forward's."""
        if self.paused and pad_n == 1:
            fixed = self.prefill(len(batch.num_new)) if self.prefill else self.prefill_ms
            ms = fixed + self.token_us * batch.num_tokens / 1e3
            self.t += ms / 1e3
            # (what the host does under a prefill's forward is hidden only behind its tokens'
            # work: an eager prefill on the GPU is bound by its launches, the host's own time,
            # the H200's 8.4-8.9 ms for one prompt whether of 1 or 512 tokens)
            self.window = self.token_us * batch.num_tokens / 1e6
            return
        b, n = len(batch.num_new), max(grid_n(max(batch.num_new)), pad_n)
        ms = self.table.ms(CudaGraphs.bucket(b, self.slots), n)
        if self.paused:
            pass
        elif plan.start > 0:
            ms *= self.price.verify_frac
        elif tail and self.price.tail_frac is not None:
            ms *= self.price.tail_frac
        elif plan.end is not None or plan.skip_attn or plan.skip_mlp:
            ms *= self.price.draft_frac
        if self.dear is not None:
            ms *= self.dear(plan, n)
        self.t += ms / 1e3
        self.window = ms / 1e3

    def sleep(self, s: float) -> None:
        self.t += s


class Staging:
    """What a GPU's host does for a forward before its graph's launch: the step's inputs
    staged into the graph's buffers (CudaGraphs._stage_inputs: numpy, padded onto the graph
    grid, each row's parent; no mask nor position), here into buffers of its own, so the
    forward itself stays the eager one the clock prices (the graph path's eager stand-in
    computes every padded row on this CPU, and its larger forwards leave the host's caches
    colder than a GPU's replay does: the host-charged `ar` at b64 read 143.6-184.2 ms of host
    in 8 runs on it, against 118.4-134.6 in 5 without, bench-results/2026-11-30-graph-staging).
    Near enough: it stages every forward, ones a GPU runs eagerly too (past the graphs' max
    tokens, a paged cache), into one buffer per (bucket, tokens), where a GPU's graphs have
    one per KV-column bucket and plan as well."""

    def __init__(self):
        self.graphs = CudaGraphs(None, capture=False)
        self.caps: dict = {}
        self.kv = types.SimpleNamespace(scratch=0)   # (the scratch slot: padded batch rows')

    def __call__(self, batch, slots: int) -> None:
        B, n = len(batch.num_new), grid_n(max(batch.num_new))
        Bb, fill = CudaGraphs.bucket(B, slots), batch.fill
        cap = self.caps.get((Bb, n, fill))
        if cap is None:   # (a graph's inputs, as CudaGraphs._capture_one makes them)
            ints, *_, parents, table, up, index = CudaGraphs.inputs(Bb, n, 0, "cpu",
                                                                    fill is not None)
            cap = self.caps[Bb, n, fill] = _Cap(ints=ints, table=table, parents=parents,
                                                fill=fill, up=up, index=index)
        self.graphs._stage_inputs(cap, batch, self.kv, Bb, n)


class _Cap(types.SimpleNamespace):
    """A graph's inputs (Staging's): held weakly, as CudaGraphs._stage_inputs holds a graph."""


def timed_model(model, clock: SimClock, monkeypatch):
    """model whose decoding forwards advance the clock: Model.run's, and Model.forward's called
    by others (Kangaroo's whole-model step); sim_run pauses it for prefill (a prompt's forward
    is not a decoding step, and methods that finish sequences at other steps prefill the next
    ones in other groups: a real cost, which a step table does not price)."""
    cls, inside = type(model), []
    stage = Staging()

    def run(batch, kv, plan=FULL, hidden=None, head=None, pad_n=1):
        with clock.device():   # (the clock's own pricing: no one's host work, ~70 us here)
            clock.forward(batch, plan, tail=isinstance(head, AdapterRows), pad_n=pad_n)
        stage(batch, kv.num_slots)   # (the host's, before the launch)
        inside.append(1)
        try:
            with clock.device():
                return cls.run(model, batch, kv, plan, hidden, head, pad_n)
        finally:
            inside.pop()

    def forward(batch, kv, plan=FULL, hidden=None):
        if inside:
            return cls.forward(model, batch, kv, plan, hidden)
        with clock.device():
            clock.forward(batch, plan)
            return cls.forward(model, batch, kv, plan, hidden)
    monkeypatch.setattr(model, "run", run)
    monkeypatch.setattr(model, "forward", forward)
    def on_device(fn):   # (its CPU time is the device's: inside a forward, counted there)
        def run_(*a, **kw):
            if inside:
                return fn(*a, **kw)
            with clock.device():
                return fn(*a, **kw)
        return run_
    # the LM head and its argmax over a step's (or a prefill's) last states are the device's
    # too: with a real vocabulary (the demo model's 49k) they cost this CPU more than a
    # small batch's layers, and nothing of them is the host's on a GPU
    for name in ("argmax", "logits"):
        monkeypatch.setattr(model, name, on_device(getattr(model, name)))
    # Kangaroo's adapter is device work too (inside the captured forwards on a GPU; its
    # prefill rows a few eager kernels): its CPU time here is not the host's
    from specctl.speculative.kangaroo import Adapter
    for name in ("decode", "write_rows"):
        monkeypatch.setattr(Adapter, name, on_device(getattr(Adapter, name)))
    # a grid step's verification and KV moves are the device's too, queued behind the forward
    # (GridStep.device_step), and so is its gather inside the forward (GridFill: in the
    # captured graph on a GPU): the step table prices neither, so each kernel CUDA launches
    # for them is charged KERNEL_US of device time. On CUDA verification and moves are one
    # Triton launch where the kernel fits the cache (grid_kernel.fits; CUDA torch ships
    # Triton), not the 41 tensor operations this CPU runs (those only where it does not fit)
    from specctl.runtime.step.grid import GridFill, GridStep
    device_step, fill = GridStep.device_step, GridFill.__call__

    def grid_device_step(self, drafts, target, kv, up):
        with clock.device(), counting() as ops:   # (the count too: the test's, not the host's)
            out = device_step(self, drafts, target, kv, up)
        clock.sleep((1 if _one_kernel(kv) else ops.count) * KERNEL_US / 1e6)
        return out

    def grid_fill(self, *a, **kw):
        with counting() as ops:
            out = fill(self, *a, **kw)
        clock.sleep(ops.count * KERNEL_US / 1e6)
        return out
    monkeypatch.setattr(GridStep, "device_step", grid_device_step)
    monkeypatch.setattr(GridFill, "__call__", grid_fill)
    return model


def _one_kernel(kv) -> bool:
    """Whether a grid step's verification and moves are one kernel on CUDA
    (runtime/step/grid_kernel.py, where Triton is: else its 41 tensor operations)."""
    return _GRID_KERNEL is not None and _GRID_KERNEL.fits(kv)


def _grid_kernel():
    """runtime/step/grid_kernel.py, imported once here (as GridStep.warm imports it as a run
    starts: not a step's host), or None without Triton. Where there is no GPU, under Triton's
    interpreter, as tests/helpers.triton_module imports its modules: TRITON_INTERPRET is read
    when triton is first imported, and this module is imported as the suite is collected,
    before the kernel tests' modules (imported first without it, their kernels compiled for a
    GPU and every interpreter test failed)."""
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from specctl.runtime.step import grid_kernel
    except Exception:   # (none, or a Triton that cannot load: GridStep.warm's fallback)
        return None
    return grid_kernel


_GRID_KERNEL = _grid_kernel()


class NoUndo:
    """pytest's monkeypatch outside pytest (bench-results' scripts on this clock): setattr,
    without undo (one process, one model)."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def script_model():
    """(the tests' tiny Llama on the CPU in fp32, one thread, a NoUndo): what a script that
    runs this clock outside pytest starts from."""
    import tempfile

    import torch
    from conftest import make_tiny_model
    from specctl.engine.loader import load_model
    torch.set_num_threads(1)
    return load_model(make_tiny_model(Path(tempfile.mkdtemp()), "llama"), "cpu", "fp32"), \
        NoUndo()


def sim_controller(drafter, table: StepTable, **kw) -> Controller:
    """--speculate auto's controller as on CUDA: steps priced padded, on `table`."""
    price = drafter.price()
    return Controller(StepCost.of(table, price, padded=True), price.max_draft,
                      tree=price.tree, **kw)


def piece_price(clock: SimClock, most: int):
    """The PiecePrice a GPU's runner would measure where its costs are the clock's: an eager
    prefill forward the prefill table's, a replay of PIECE tokens a prompt the step table's."""
    from specctl.engine.graphs import PIECE
    from specctl.runtime.step.prefill import PiecePrice
    ends = (1, most)
    return PiecePrice(most, tuple(clock.prefill(p) for p in ends),
                      tuple(clock.table.ms(CudaGraphs.bucket(p, clock.slots), PIECE)
                            for p in ends))


def sim_run(model, prompts, drafter, clock: SimClock, *, batch_size: int, max_tokens,
            controller=None, max_len: int = 320, grouped: bool = True,
            ends_known: bool = True, pieces: bool = False, prefill_chunk: int = 512):
    """(outputs in input order, RunStats) of a run on the simulated clock. max_tokens: one
    for every prompt, or a list (answers of different lengths). The host is charged from the
    run's start (the runner's construction is not the run's). grouped: freed slots admitted in
    groups, as --speculate auto's runs are, `ar`'s too (make_runner); False: at once, as under
    --speculate fixed (a run under a controller is grouped either way). ends_known: False
    shows admission's known-end rule (Runner._soon) every answer's budget as the longest's, a
    job's one --max-tokens, not the length it was cut to here: answers that EOS ends hide
    their ends, and a run whose every answer ends at its budget would let `ar` group by
    foresight no real job has. pieces: prefill as a GPU's run would by piece_price (the
    prefill table's eager forwards against the step table's replays); prefill_chunk: the
    runner's (a CPU's 512; CUDA's 4096 for the demo model on an H200)."""
    drafter = drafter or NoDraft()
    clock.price = drafter.price()
    lens = max_tokens if isinstance(max_tokens, (list, tuple)) else [max_tokens] * len(prompts)
    reqs = [Request(i, [[{"role": "user", "content": str(i)}]], n)
            for i, n in enumerate(lens)]
    out: dict[int, list[int]] = {}
    t = clock.t   # (what the runner's construction does, Controller.warm's searches, is not
    runner = Runner(model, drafter, SamplingParams(), batch_size=batch_size, max_len=max_len,
                    eos_ids=set(), render=lambda r: prompts[r.index],
                    decode=lambda ids: " ".join(map(str, ids)), controller=controller,
                    threads=1, prefill_chunk=prefill_chunk)
    clock.t = t   # the run's: a test's search that sleeps the clock sleeps it there too)
    runner.clock = clock
    runner.grouped = grouped or controller is not None
    if pieces:
        from specctl.runtime.step.prefill import piece_prompts
        runner.prefill_price = piece_price(clock, piece_prompts(runner.kv,
                                                                runner.prefill_chunk))
    if not ends_known:   # (the shorter answers end "by EOS")
        cap = max(lens)
        runner._soon = lambda running: min((cap - len(s.out_ids) for s in running
                                            if not s.finished), default=max_len)
    prefill = runner._prefill

    def untimed(seqs, under=None):
        clock.paused = True
        try:
            return prefill(seqs, under)
        finally:
            clock.paused = False
    runner._prefill = untimed
    # (the last step's learning and the next step's search run while the forward does; the
    # run's first search, and one a drain's first step needs, while a prefill's does)
    runner.under_forward = clock.overlapped(runner.under_forward)
    runner.under_prefill = clock.overlapped(runner.under_prefill)
    clock.host_from_now()
    stats = runner.run(reqs, lambda r: out.__setitem__(r.index, r.answer_ids[0]))
    return [out[i] for i in range(len(prompts))], stats


class OracleChains(Drafter):
    """Chains that know the answer: each draft is the reference's next token with its
    sequence's probability p[index] (else a wrong token, and the chain's rest with it), so
    acceptance is whatever a test sets, sequence by sequence. Drafting costs no forward.
    period > 0: bursty acceptance, p[index] over `period` output positions, then none over the
    next `period` (text that a drafter knows, then text it does not)."""
    name = "oracle"

    def __init__(self, ref: list[list[int]], p: list[float], K: int = 8, seed: int = 0,
                 period: int = 0):
        import random
        self.ref, self.p, self.K, self.period = ref, p, K, period
        self.rng = random.Random(seed)
        self.step_rows = 1 + K

    def _p(self, index: int, at: int) -> float:
        off = self.period and (at // self.period) % 2
        return 0.0 if off else self.p[index]

    def propose(self, seqs, kv, limits: DraftLimits) -> list[Proposal]:
        out = []
        for s, r in zip(seqs, limits.room):
            want, at = self.ref[s.req.index], len(s.out_ids)
            toks = []
            for j in range(min(max(r, 0), self.K)):
                right = at + j < len(want) and self.rng.random() < self._p(s.req.index, at + j)
                toks.append(want[at + j] if right else (want[min(at + j, len(want) - 1)] + 1) % 7)
            out.append(Proposal(DraftTree.chain(toks), forwards=0, conf=[1.0] * len(toks)))
        return out

    def idle(self, seqs, kv) -> list[Proposal]:   # (as every real drafter's: no per-sequence
        return [NO_DRAFT] * len(seqs)               # work in a lean step)

    def price(self) -> DraftPrice:
        return DraftPrice(max_draft=self.K)

    def fresh(self) -> "OracleChains":
        return OracleChains(self.ref, self.p, self.K, period=self.period)


TRACES = ROOT / "tests/data/selfdraft-traces.json"


def traces() -> list[str]:
    """Real text's acceptance: for each answer the demo model gave to a held-out ShareGPT
    question (greedy, fp32, Self-Draft fixed at batch 1, context cache only), a character per
    output position: "1" where Self-Draft's draft for it was accepted, "0" where it drafted
    for it and was wrong, "-" where it had nothing to draft (tests/data/make_traces.py).
    Acceptance drifts within an answer: stretches the drafter knows, then stretches it does
    not, and early in an answer (its caches still empty) it mostly has nothing to offer."""
    return json.loads(TRACES.read_text())["known"]


class TraceChains(OracleChains):
    """Oracle chains whose acceptance replays a trace (traces()): sequence i's draft for
    output position j is right iff known[i % len(known)][j] is "1" (past the trace's end:
    wrong), and a sequence whose next position is "-" proposes nothing (as Self-Draft, with
    no candidate, drafts nothing). With lengths = trace_lengths(n) the answers also end where
    the real ones did."""
    name = "trace"

    def __init__(self, ref: list[list[int]], known: list[str], K: int = 8):
        super().__init__(ref, [1.0] * len(ref), K)
        self.known = known

    def _p(self, index: int, at: int) -> float:
        bits = self.known[index % len(self.known)]
        return 1.0 if at < len(bits) and bits[at] == "1" else 0.0

    def propose(self, seqs, kv, limits: DraftLimits) -> list[Proposal]:
        out = super().propose(seqs, kv, limits)
        for i, s in enumerate(seqs):
            bits, at = self.known[s.req.index % len(self.known)], len(s.out_ids)
            if at >= len(bits) or bits[at] == "-":
                out[i] = Proposal(DraftTree.chain([]), forwards=0, conf=[])
        return out

    def fresh(self) -> "TraceChains":
        return TraceChains(self.ref, self.known, self.K)


class TraceGrid(SelfDraftDrafter):
    """Self-Draft as it drafts on the grid (runtime/step/grid.py: the product's own plan,
    verification, commit and learning, their host work charged), its acceptance replaying
    the traces (traces(), as TraceChains'): each sequence's first chain is the reference's
    next G tokens, right where its trace says "1", wrong from its first "0" on; it holds no
    other chain (a trace knows one draft a position), and none where its next position is
    "-" or past its trace. The real context table still learns the run's text; the step's
    forward gathers from a table that holds nothing (its device work, the product's), and
    the trace's chain comes in as the job cache's would (GridFill), worked out off the
    host's charge (clock.device: a test's bookkeeping, not the product's)."""

    def __init__(self, ref: list[list[int]], known: list[str], vocab: int, clock: SimClock,
                 params: SelfDraftParams = SelfDraftParams(grid=True, corpus_cache=False)):
        super().__init__(params, vocab=vocab)
        self.ref, self.known, self.clock = ref, known, clock
        self.live: dict[int, object] = {}   # slot -> its sequence (admit, retire)
        self.table, self.trace = _TraceTable(self), _TraceJob(self)

    def admit(self, seq) -> None:
        super().admit(seq)
        self.live[seq.slot] = seq

    def retire(self, seq) -> None:
        super().retire(seq)
        if self.live.get(seq.slot) is seq:
            del self.live[seq.slot]

    @property
    def context_table(self):
        return None if super().context_table is None else self.table

    @property
    def job_table(self):
        return self.trace

    def fresh(self) -> "TraceGrid":
        return TraceGrid(self.ref, self.known, self.vocab, self.clock, self.prm)

    def chains(self, seqs, G: int) -> tuple[np.ndarray, np.ndarray]:
        """The trace's ([B, G] first chains, [B] whether each holds one) of the step's
        sequences."""
        live = [s for _, s in sorted(self.live.items()) if s.finish_reason is None]
        assert live == list(seqs), "trace-grid: not the step's batch"
        cands, held = np.zeros((len(seqs), G), dtype=np.int64), np.zeros(len(seqs), bool)
        for b, s in enumerate(seqs):
            want, at = self.ref[s.req.index], len(s.out_ids)
            bits = self.known[s.req.index % len(self.known)]
            for j in range(G):
                k = at + j
                right = k < len(bits) and bits[k] == "1" and k < len(want)
                cands[b, j] = want[k] if right else (want[min(k, len(want) - 1)] + 1) % 7
            held[b] = at < len(bits) and bits[at] != "-"
        return cands, held


class _TraceTable:
    """TraceGrid's table: the real one's size, its rows on the device holding nothing."""

    def __init__(self, drafter: TraceGrid):
        self.R, self.G = drafter.ctx.R, drafter.ctx.G
        self._rows = torch.zeros(drafter.ctx.ready.shape, dtype=torch.int32)

    def device_rows(self, device):
        return self._rows


class _TraceJob:
    """TraceGrid's first chains, as a job cache's come (JobTable.tails, match)."""

    def __init__(self, drafter: TraceGrid):
        self.drafter = drafter

    def tails(self, seqs):
        return list(seqs)

    def match(self, seqs, G: int):
        with self.drafter.clock.device():
            return self.drafter.chains(seqs, G)


def trace_lengths(n: int, known: list[str]) -> list[int]:
    """The answer lengths of n requests replaying the traces in turn."""
    return [len(known[i % len(known)]) for i in range(n)]


def against_ar(model, prompts, drafters: dict, table: StepTable, monkeypatch, *,
               batch_size: int, max_tokens: int, ref=None):
    """ar, then every drafter under auto, on one simulated clock over `table`: (ar's seconds,
    its RunStats, {name: (x ar, RunStats)}); each output is checked against ref (ar's)."""
    clock = SimClock(table, batch_size)
    timed_model(model, clock, monkeypatch)
    out, ar = sim_run(model, prompts, None, clock, batch_size=batch_size, max_tokens=max_tokens)
    ar_s, ref, seen = clock.t, ref or out, {}
    for name, dr in drafters.items():
        clock.t = 0.0
        got, st = sim_run(model, prompts, dr, clock, batch_size=batch_size,
                          max_tokens=max_tokens, controller=sim_controller(dr, table))
        assert got == ref, name
        seen[name] = (ar_s / clock.t, st)
    return ar_s, ar, seen
