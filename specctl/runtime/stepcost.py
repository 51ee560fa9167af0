"""What a step costs: the step-cost table of a run, priced for a drafter, corrected online.

The speculation policy (runtime/policy.py) needs the ms of a step with draft budgets
k_1 .. k_B before it runs. `StepCost` predicts it from the step-cost table (engine/steptable.py:
StepTable.ms(b, n) = ms of one verify step of b sequences with n new tokens each) and what the
drafter says its steps cost (DraftPrice, speculative/drafter.py):
    cost(k) = verify_frac * verify_ms + sum_{d=1..D} draft_frac * table.ms(n_d, 1)
- verify_ms: with n_i = 1 + k_i (+ probe tokens when k_i > 0) the tokens sequence i puts into
  the verify forward,
    padded (CUDA: the captured graphs pad every sequence to a common bucket n):
        verify_ms = table.ms(B, max_i n_i)
    packed (CPU: no padding, cost follows the total packed tokens, the matmuls dominate):
        verify_ms = table.ms(B, sum_i n_i / B)      (the batch-B row at the mean tokens)
  The CPU row is read at a fractional n (linear interpolation), which is the total-token model
  while keeping the measured per-sequence attention overhead of batch B, after rounding the
  rows up to the tile they cost (StepTable.ms, tile_rows): at batch 8 one draft token makes
  9 rows and costs what 16 do, so a CPU step's cost is a staircase in its total tokens.
- draft forwards: drafting runs in lockstep, one forward per draft depth over the sequences
  still drafting; n_d = #{i: k_i + extra >= d} sequences are in the d-th forward. For
  draft-verify extra = 0 (budget 0: no draft forward at all), draft_frac = the share of the
  model's weights (blocks kept + LM head) the skip set runs. For Kangaroo extra = 1 (the
  shallow forward of the pending token always runs: the verify starts at its layer-l states),
  draft_frac = (l layers + adapter + head) / model, verify_frac = (L - l layers + head) / model;
  its last shallow forward drafts nothing when no sequence has budget left, and then costs only
  the l layers (tail_frac: the adapter's KV rows are written without its attention or head).
  Self-Draft's host work per candidate is negligible against a forward (not modelled).
Measured against predicted: the table is measured once, on an idle moment, at one context
length, and prices the model's forwards only; a run's steps also pay the drafter's host
work, attention over longer contexts, and whatever else shares the machine (on the 2-core CPU
the same batch-8 step timed 67 ms in one minute and 100 the next, and the cost of a draft
token for each sequence moved from +40% to +10% of it). So every step's measured ms is fed
back (StepCost.learn): x = log(measured / table ms) is modelled as a drift (what
every step costs beyond the table now: the last ~16 steps) plus a class (whether the step
drafts) plus a kind (its batch size, the table point its verify is priced at, its draft
forwards), the last two learnt over their last ~64 steps each and shrunk toward 0 with 2
steps, so a kind never run is priced by the drift and its class; a step more than twice off
its expected cost counts as twice (one page-in must not price a kind for a dozen steps),
but for the first of its class. The predicted cost of a step is the table's times exp(x): a
stair of drafts that turns out dearer than the table says is priced at what it costs, and
drafted less. (A uniform drift changes no decision: only ratios between kinds do.) Classes
and kinds are learnt only from steps that run: a run that drafts in every step never times a
step without drafts, the one it must beat, so the controller runs contrast steps
(runtime/controller.py).

The table is measured on first use (a small grid, a few seconds), or ahead by `specctl
prepare`, and kept in the store, per model, device, dtype, attention backend and batch size:
`step_table_for`. It is the one cost profile: search-skip and train-adapter's exit-layer sweep
price on the batch-1 table with the same drafter prices (StepCost.of).
"""

from __future__ import annotations

import json
import math
import platform
import re
import time
from dataclasses import dataclass, field

import torch

from specctl.engine.steptable import ENGINE_COSTS, StepTable, measure_step_table
from specctl.speculative.drafter import DraftPrice
from specctl.store import atomic_write_json, make_manifest


@dataclass
class StepCost:
    """Predicted ms of one step from the step-cost table and the method's draft cost, corrected
    online by what the run's steps measure (`learn`, module docstring). `probes`: whether the
    step's speculating sequences run their probes (the policy decides it per step)."""
    table: StepTable
    padded: bool = False
    verify_frac: float = 1.0   # share of a full step the verify forward costs (Kangaroo < 1)
    draft_frac: float = 0.0    # one draft forward of b sequences = draft_frac * table.ms(b, 1)
    draft_extra: int = 0       # draft forwards a sequence runs beyond its budget (Kangaroo: 1)
    tail_frac: float | None = None   # a draft forward in which no sequence drafts (Kangaroo's
                                     # last, shallow layers only); None: draft_frac
    probe: int = 0             # probe tokens a speculating sequence adds (Self-Draft's branches)
    idle_whole: bool = False   # a step with no drafts is one plain forward (Kangaroo, eager)
    drift: float = 0.0         # log(measured / table ms) common to every step now (learn)
    steps: int = 0             # steps learnt from
    scale: dict = field(default_factory=dict, repr=False)   # a class of step (whether it
                     # drafts) or a kind (table_ms) -> [its log ratio beyond the drift, steps]
    _memo: dict = field(default_factory=dict, repr=False)
    # step_ms by the step's shape, factor by kind: kept until learn changes them
    _steps: dict = field(default_factory=dict, repr=False)
    _factors: dict = field(default_factory=dict, repr=False)

    def ms(self, b: int, n: float) -> float:
        key = (b, n)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = self.table.ms(b, n)
        return v

    @classmethod
    def of(cls, table: StepTable, price: DraftPrice, padded: bool) -> "StepCost":
        """The cost of a drafter's steps (its DraftPrice) on `table`; padded: steps replay
        captured graphs, which pad every sequence to the step's longest."""
        return cls(table, padded, verify_frac=price.verify_frac, draft_frac=price.draft_frac,
                   draft_extra=price.draft_extra, tail_frac=price.tail_frac,
                   probe=price.probe, idle_whole=price.idle_whole)

    def tokens(self, k: int, probes: bool = True) -> int:
        return 1 + k + (self.probe if k > 0 and probes else 0)

    def packed(self, probes: bool = True) -> bool:
        """Whether a step costs by its total tokens alone (no padding, draft forwards or
        probes to price): then packed_ms prices it in O(1)."""
        return not self.padded and not self.draft_frac and not (self.probe and probes)

    def packed_ms(self, b: int, tokens: int) -> float:
        """step_ms of a packed() step of b sequences, `tokens` of them in all, some drafting."""
        key = (b, tokens)
        t = self._steps.get(key)
        if t is None:
            v = self.ms(b, tokens / b)
            t = self._steps[key] = self.verify_frac * v * self.factor(step_kind(b, v, 0, True))
        return t

    def table_ms(self, ks: list[int], probes: bool = True) -> tuple[float, tuple]:
        """(the table's ms of a step with budgets ks, the kind of step: its batch size, the
        table point its verify is priced at, its draft forwards, whether anything drafts).
        It depends on the budgets' counts only, not on which sequence has which."""
        b = len(ks)
        if not b:
            return 0.0, ()
        top = max(ks)
        if self.padded:
            v = self.ms(b, self.tokens(top, probes))
        else:
            drafting = b - ks.count(0)
            v = self.ms(b, (b + sum(ks) + (self.probe * drafting if probes else 0)) / b)
        if self.idle_whole and not top:
            return v, step_kind(b, v, -1, False)
        total = self.verify_frac * v
        depth = 0
        if self.draft_frac:
            depth = top + self.draft_extra
            at_least = [0] * (top + 2)   # at_least[k]: sequences with budget >= k
            for k in ks:
                at_least[k] += 1
            for k in range(top - 1, -1, -1):
                at_least[k] += at_least[k + 1]
            for d in range(1, depth + 1):
                n_d = at_least[max(0, d - self.draft_extra)]
                frac = self.draft_frac if d <= top or self.tail_frac is None else self.tail_frac
                total += frac * self.ms(n_d, 1)
        return total, step_kind(b, v, depth, top > 0)

    def _rel(self, key) -> float:
        s = self.scale.get(key)
        if s is None:
            return 0.0
        n = min(s[1], 4 * SCALE_MEMORY)
        return s[0] * n / (n + SCALE_PRIOR)

    def factor(self, kind: tuple) -> float:
        """measured / table ms expected of a step of this kind (learn)."""
        f = self._factors.get(kind)
        if f is None:
            f = self._factors[kind] = math.exp(self.drift + self._rel(kind[3:]) + self._rel(kind))
        return f

    def step_ms(self, ks: list[int], probes: bool = True) -> float:
        key = (tuple(sorted(ks)), probes)   # (a search prices the same counts many times)
        t = self._steps.get(key)
        if t is None:
            ms, kind = self.table_ms(ks, probes)
            t = self._steps[key] = ms * self.factor(kind) if ms else 0.0
        return t

    def learn(self, ks: list[int], measured_ms: float, probes: bool = True) -> float:
        """A step with budgets ks took measured_ms (returns its table ms); x = log(measured /
        table ms) is modelled
        as drift + class + kind:
        - the drift, what every step costs beyond the table now (the machine's state, the
          context length): a moving average of x less the other two over the last
          ~SCALE_MEMORY steps;
        - the class (whether the step drafts: the drafter's host work, what the table's
          drafting points misprice) and the kind (table_ms: batch size, table point, draft
          forwards): moving averages of what is left of x over their last ~4 x SCALE_MEMORY
          steps, each shrunk toward 0 with SCALE_PRIOR steps, so a kind never run is priced
          by the drift and its class.
        In logs, and a step more than twice off what it was expected to cost counts as twice
        (one step that hit a page-in or a neighbour's burst must not price its kind for the
        next dozen), unless its class has never been timed: a contrast step's first timing
        is the news it was run for."""
        ms, kind = self.table_ms(ks, probes)
        if not ms > 0 or not measured_ms > 0:
            return ms
        self._steps.clear()
        self._factors.clear()
        cls = kind[3:]
        x = math.log(measured_ms / ms)
        if cls in self.scale:
            e = math.log(self.factor(kind))
            x = min(e + math.log(2), max(e - math.log(2), x))
        self.steps += 1
        self.drift += (x - self._rel(cls) - self._rel(kind) - self.drift) / \
            min(self.steps, SCALE_MEMORY)
        x -= self.drift
        for key in (cls, kind):
            s = self.scale.setdefault(key, [0.0, 0])
            s[1] += 1
            s[0] += (x - s[0]) / min(s[1], 4 * SCALE_MEMORY)
            x -= self._rel(key)
        return ms


def step_kind(b: int, verify_ms: float, depth: int, drafts: bool) -> tuple:
    """The kind of a step StepCost.learn prices apart: its batch size, the table point its
    verify is priced at, its draft forwards (-1: one plain forward), whether anything drafts
    (the last, alone, is its class)."""
    return b, round(verify_ms, 3), depth, drafts


SCALE_PRIOR = 2      # steps of no difference a class's or kind's own ratio is shrunk with
SCALE_MEMORY = 16    # steps the drift averages over (a class's or kind's ratio: 4x as many)


# -- the step-cost table of a run ----------------------------------------------------------------

_TABLES: dict = {}


def device_tag(model) -> str:
    """What prices a step besides the model and dtype: on a CPU its model and the threads a
    step runs on; on CUDA the GPU's model (an H100 costs unlike an A10) and whether steps
    replay captured graphs."""
    if model.device.type == "cuda":
        name = torch.cuda.get_device_name(model.device)
        how = "graphs" if model.graphs is not None else "eager"
    else:
        name = _cpu_name()
        how = f"t{torch.get_num_threads()}"
    return f"{model.device.type}-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{how}"


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


STEP_NS = (1, 2, 4, 8, 16, 32, 64)   # tokens per sequence a stored table measures
STEP_WARMUP, STEP_REPEATS = 1, 5     # runs of each of its points: untimed, then timed


def step_table_id(fingerprint: str, model, batch_size: int) -> str:
    return (f"{fingerprint}-{device_tag(model)}-{str(model.dtype).replace('torch.', '')}"
            f"-{model.attention}-steps-b{batch_size}")


def step_table_path(store, fingerprint: str, model, batch_size: int):
    """Where step_table_for keeps the table of `model` for `batch_size` slots."""
    ident = step_table_id(fingerprint, model, batch_size)
    return store.path("profiles", ident) / "steptable.json"


def step_table_seconds(batch_size: int, step_s) -> float:
    """About how long step_table_for measures, given step_s(b, n): seconds of a step of b
    sequences x n tokens (for an estimate before measuring). Each round runs its first step
    once more, untimed (measure_step_table)."""
    batches = sorted({1, batch_size})
    steps = sum(step_s(b, n) for b in batches for n in STEP_NS) + \
        sum(step_s(b, STEP_NS[0]) for b in batches)
    return (STEP_WARMUP + STEP_REPEATS) * steps


def step_table_for(model, batch_size: int, *, store=None, fingerprint: str | None = None,
                   log=lambda msg: None, ns=STEP_NS, context: int = 128,
                   repeats: int = STEP_REPEATS, warmup: int = STEP_WARMUP,
                   fresh: bool = False) -> StepTable:
    """The step-cost table of `model` for runs of `batch_size` slots (batches {1, batch_size},
    a small grid of tokens per sequence): kept for the process, and with a store and the
    model's fingerprint kept in the store too (profiles/), so it is measured once per model,
    device, dtype, attention backend and batch size. fresh: measure it again."""
    batches = tuple(sorted({1, batch_size}))
    key = (id(model), str(model.device), str(model.dtype), batches, tuple(ns))
    t = None if fresh else _TABLES.get(key)
    if t is not None:
        return t
    ident = step_table_id(fingerprint, model, batch_size) if store and fingerprint else None
    if ident is not None and not fresh:
        path = step_table_path(store, fingerprint, model, batch_size)
        if path.is_file():
            try:
                t = StepTable.from_json(json.loads(path.read_text()))
                if t.engine != ENGINE_COSTS:
                    log(f"{path}: measured by an earlier engine; measuring again")
                    t = None
                elif t.batches != batches or t.ns != tuple(ns) or t.context != context:
                    t = None
            except (ValueError, TypeError, KeyError) as e:
                log(f"{path}: unreadable step-cost table ({e}); measuring again")
                t = None
    if t is None:
        t0 = time.perf_counter()
        t = measure_step_table(model, batches=batches, ns=ns, context=context,
                               repeats=repeats, warmup=warmup)
        if ident is not None:
            try:
                with store.building("profiles", ident, make_manifest(
                        "step-table", ident, model_fingerprint=fingerprint,
                        device=device_tag(model))) as d:
                    atomic_write_json(d / "steptable.json", t.to_json())
                log(f"step-cost table measured in {time.perf_counter() - t0:.1f} s, kept as "
                    f"profiles/{ident}")
            except OSError as e:   # a cache: a store that cannot keep it costs a measurement
                log(f"step-cost table measured, not kept in the store ({e})")
    _TABLES[key] = t
    return t


def padded_steps(model) -> bool:
    """Whether the model's steps replay captured graphs (CUDA), which pad every sequence."""
    return model.device.type == "cuda" and model.graphs is not None


def cost_for(drafter, model, table: StepTable) -> StepCost:
    """The StepCost of a drafter's steps on `model`, from the price it states."""
    return StepCost.of(table, drafter.price(), padded_steps(model))
