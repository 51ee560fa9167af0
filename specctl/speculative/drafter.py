"""The drafter interface every method implements, and `ar`'s (no drafts).

A drafter is a plain object with two calls per step (transformers' candidate-generator shape):
- `propose(seqs, kv, limits) -> list[Proposal]`: one proposal per running sequence, within
  `limits` (DraftLimits: draft nodes and KV rows per sequence, whether probes run, the
  confidence stop for chains). It may run forwards of the model itself (layer-skip or
  early-exit drafting), writing KV rows past the committed length only; such rows never
  survive verification. room 0 asks for an `ar` step: no drafts and no probe (Kangaroo still
  runs its shallow forward of the pending token, which its verify starts from). Nothing edits
  a proposal afterwards: what it proposes is what is verified.
- `observe(seqs, proposals, verdicts, probe_out)`: learn from the verification (adaptive
  thresholds, caches); probe_out[i] is the target's argmax after each of sequence i's probe
  nodes (None without a probe).
A proposal's `probe` is a forest of nodes below the root that the step's forward runs beside the
draft (their own masks and positions) but never verifies (Self-Draft's branches); the probe's
KV rows are discarded with the rejected drafts.
`admit(seq)` / `retire(seq)` bracket a sequence's life in a slot; `admit` sets `seq.state`, the
drafter's own per-sequence state (a dataclass of its own). Sequences are duck-typed
(runtime.step.sequence.Sequence): the spec layer does not import the runtime.
`price()` states what its steps cost (DraftPrice), so the speculation controller prices any
drafter without knowing which method it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specctl.engine.batch import FULL
from specctl.speculative.verify import DraftTree

StopRule = Callable[[int, int, float], bool]   # (sequence i, drafts so far j, last confidence)


@dataclass(frozen=True)
class DraftLimits:
    """What one step lets each sequence i draft."""
    room: tuple[int, ...]                 # draft nodes at most (0: an ar step, no probe either)
    rows: tuple[int, ...] | None = None   # KV rows past the pending token for draft and probe
                                          # nodes together (None: no limit beyond room)
    probes: bool = True                   # whether probes run this step
    stop: StopRule | None = None          # chains: asked after each draft whether to stop

    def probe_room(self, i: int, drafted: int) -> int:
        """Probe nodes sequence i may add to a draft of `drafted` nodes."""
        if not self.probes or self.room[i] <= 0:
            return 0
        return 1 << 30 if self.rows is None else max(0, self.rows[i] - drafted)


@dataclass
class Proposal:
    """One sequence's proposal for a step."""
    draft: DraftTree = field(default_factory=DraftTree)   # verified; .q: the drafter's
                                                          # distribution at each sampled node
    probe: DraftTree = field(default_factory=DraftTree)   # run beside the draft, never verified
    forwards: int = 0                    # draft forwards this sequence ran for it
    conf: list[float] = field(default_factory=list)   # chains: the drafter's confidence of
                                                      # each draft (the controller learns from it)
    stopped_at: int | None = None        # chains: drafts when limits.stop ended the chain


NO_DRAFT = Proposal()   # a sequence's proposal when it drafts nothing (shared: never edited)


@dataclass(frozen=True)
class DraftPrice:
    """What a step of this drafter costs beyond `ar`'s, in shares of one plain step of the
    target (the controller prices budgets with it, runtime/control/stepcost.py): the drafter
    states it, so nothing above it needs to know which method it is."""
    max_draft: int = 0          # the largest useful draft (nodes) of one sequence in one step
    tree: bool = False          # drafts are tries cut by node order (else chains)
    verify_frac: float = 1.0    # the verify forward, as a share of a full step (Kangaroo < 1)
    draft_frac: float = 0.0     # one draft forward of b sequences = draft_frac * step(b, 1)
    draft_extra: int = 0        # draft forwards a sequence runs beyond its budget (Kangaroo: 1)
    tail_frac: float | None = None   # a draft forward in which no sequence drafts (Kangaroo's
                                     # last: its shallow layers only); None: draft_frac
    probe: int = 0              # probe tokens a speculating sequence adds (Self-Draft's branches)
    idle_whole: bool = False    # a step with no drafts is one plain forward (Kangaroo)
    chain: int = 0              # a grid's (runtime/step/grid.py): every sequence of a drafting
    # step runs the same rows, 1 + the largest budget where it fits in one chain of this many
    # nodes, else as many whole chains as it needs; 0: each sequence runs its own


class Drafter:
    name = "base"
    # KV rows past a sequence's limit that one step may write (probe nodes, graph padding):
    # the runner allocates them on top of max_len so late steps keep their full shape
    kv_headroom = 0
    # KV rows past a sequence's committed length that one step may write (the pending token,
    # drafts, probe nodes, rows of draft forwards): a paged cache reserves them before the step
    step_rows = 1
    # layers of KV cache the drafter keeps beside the target's (same rows), in KV layers' worth
    # of bytes a row (a float where it keeps rows of another width): a budget covers both
    kv_layers = 0
    # False: it never drafts (`ar`): each step is its lean step (idle), without room or limits
    drafts = True
    # whether the runner calls what observe returns under the next step's forward (set as a
    # run starts, Runner.run): work there is hidden from the step, so a drafter may do more
    overlapped = False

    def admit(self, seq) -> None:
        pass

    def retire(self, seq) -> None:
        pass

    def propose(self, seqs: list, kv, limits: DraftLimits) -> list[Proposal]:
        raise NotImplementedError

    def idle(self, seqs: list, kv) -> list[Proposal]:
        """The proposals of a step in which no sequence may draft (the controller's lean
        step, `ar`'s): propose's with room 0 everywhere, with neither drafts nor probes (the
        step is ar's, a row a sequence), which a drafter may give without propose's
        per-sequence work (a lean step is to cost what `ar`'s does: one shared proposal)."""
        return self.propose(seqs, kv, DraftLimits((0,) * len(seqs)))

    def observe(self, seqs: list, proposals: list[Proposal], verdicts: list,
                probe_out: list) -> Callable[[], None] | None:
        """A step's outcome, after its commit: what the next proposal needs is learnt now;
        what may wait (a cache's update) is returned as a function, which the runner calls
        before any sequence retires, at once on a CPU or under the next step's forward where
        the host goes on beside it (Runner.under_forward). None: nothing waits."""
        return None

    def catch_up(self, seqs: list, ahead: int = 0, beside: bool = False) -> None:
        """Learning left for the next drafting step (Self-Draft: a lean stretch's text,
        finished answers; Kangaroo: its adapter's rows), done before its proposals: the
        planner times it apart, as what lean steps left, not the drafting step's own host
        work (StepCost.learn_host). ahead: rows of each sequence that a lean forward in
        flight writes and commits (1: Runner._prefetch under a lean step's forward); beside:
        under a forward (Runner._prefetch), not on the step's path (the planner's)."""

    def observe_lean(self, seqs: list) -> Callable[[], None] | None:
        """observe for a lean step (its proposals idle's): what it teaches, without a look at
        each sequence's verdict where the drafter learns nothing from it (the default)."""
        return None

    # a drafter may verify its own way (kangaroo starts at its exit layer from saved states);
    # the default is one full forward of the target over [pending + drafts]
    custom_verify = False

    def verify_hidden(self, batch, kv, seqs, proposals):
        """The verify forward's last-layer states [T, D] (the runner applies the LM head);
        seqs and proposals: the step's, as sequences to read (the StepPlan's tuples)."""
        raise NotImplementedError

    def lean_forward(self, kv) -> tuple:
        """A lean step's forward on kv (idle's proposals), for a drafter that verifies its own
        way: (plan, head) for Model.run, its outputs (h,). Asked at a run's first lean step
        (Planner.execute): the run's later lean steps ask nothing of the drafter."""
        raise NotImplementedError

    # a drafter that needs the prompt's hidden states entering layer `prefill_capture` (Kangaroo:
    # its exit layer) gets them from each prefill forward through `prefilled`
    prefill_capture: int | None = None

    def prefilled(self, batch, kv, hidden) -> None:
        pass

    def price(self) -> DraftPrice:
        """What its steps cost (DraftPrice); `ar`'s: nothing beyond the verify."""
        return DraftPrice()

    def graph_forwards(self, kv) -> list[tuple]:
        """The forwards its steps run through Model.run on cache kv, as (layer plan, head or
        None, most tokens per sequence): a runner captures all their shapes when it starts
        (engine/graphs.py CudaGraphs.warm). The default: one full verify forward."""
        return [(FULL, None, self.step_rows)]

    def fresh(self) -> "Drafter":
        """A new drafter with the same artifacts and settings and nothing learnt yet."""
        raise NotImplementedError

    def sampled(self, sp) -> "Drafter":
        """This drafter for requests sampled by `sp` (SamplingParams): itself, unless its drafts
        are drawn by the sampling settings (a drafter with its own `sp` overrides this)."""
        return self

    def signature(self) -> str:
        """What identifies this drafter's artifact (a run resumes only with the same one)."""
        return self.name


class NoDraft(Drafter):
    """`ar`: the degenerate case, an empty tree, so one token per step."""
    name = "ar"

    @property
    def drafts(self) -> bool:   # (a subclass with a propose of its own drafts)
        return type(self).propose is not NoDraft.propose

    def propose(self, seqs, kv, limits) -> list[Proposal]:
        return [NO_DRAFT] * len(seqs)

    def idle(self, seqs, kv) -> list[Proposal]:
        return [NO_DRAFT] * len(seqs)

    def fresh(self) -> "NoDraft":
        return NoDraft()
