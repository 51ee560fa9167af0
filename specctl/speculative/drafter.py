"""The drafter interface every method implements, and `ar`'s (no drafts).

A drafter is a plain object with two calls per step (transformers' candidate-generator shape):
- `propose(seqs, kv, room, stop=None) -> list[Proposal]`: one proposal per running sequence. It may run
  forwards of the model itself (layer-skip or early-exit drafting), writing KV rows past the
  committed length only; such rows never survive verification. `room[i]` caps how many draft
  nodes sequence i may get (KV space, the tokens it may still emit, and the controller's budget
  for the step); room 0 asks for an `ar` step: no drafts and no probe (Kangaroo still runs
  its shallow forward of the pending token, which its verify starts from). `stop`, when given
  (the controller's stop_rule), is asked by a chain drafter after each draft: stop(i, j,
  conf) -> whether sequence i, with j drafts the last of confidence `conf`, drafts no more.
  A chain drafter records each draft's confidence in `Proposal.conf`.
- `observe(seqs, proposals, verdicts)`: learn from the verification (adaptive thresholds,
  caches). The proposals are the ones verified: the runner may have cut a draft or probe to
  the rows it had.
A proposal's `probe` is a forest of nodes below the root that the step's forward runs beside the
draft (their own masks and positions) but never verifies (Self-Draft's branches); the runner
fills `probe_out` with the target's argmax after each probe node, and the probe's KV rows are
discarded with the rejected drafts.
`admit(seq)` / `retire(seq)` bracket a sequence's life in a slot; `admit` sets `seq.state`, the
drafter's own per-sequence state (a dataclass of its own). Sequences are duck-typed
(runtime.sequence.Sequence): the spec layer does not import the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specctl.speculative.verify import DraftTree


@dataclass
class Proposal:
    """One sequence's proposal for a step."""
    draft: DraftTree = field(default_factory=DraftTree)   # verified; .q: the drafter's
                                                          # distribution at each sampled node
    probe: DraftTree = field(default_factory=DraftTree)   # run beside the draft, never verified
    probe_out: list[int] | None = None   # (runner) the target's argmax after each probe node
    forwards: int = 0                    # draft forwards this sequence ran for it
    conf: list[float] = field(default_factory=list)   # chains: the drafter's confidence of
                                                      # each draft (the controller learns from it)


class Drafter:
    name = "base"
    # KV rows past a sequence's limit that one step may write (probe nodes, graph padding):
    # the runner allocates them on top of max_len so late steps keep their full shape
    kv_headroom = 0
    # KV rows past a sequence's committed length that one step may write (the pending token,
    # drafts, probe nodes, rows of draft forwards): a paged cache reserves them before the step
    step_rows = 1
    # layers of KV cache the drafter keeps beside the target's (same rows): a budget covers both
    kv_layers = 0

    def admit(self, seq) -> None:
        pass

    def retire(self, seq) -> None:
        pass

    def propose(self, seqs: list, kv, room: list[int], stop=None) -> list[Proposal]:
        raise NotImplementedError

    def observe(self, seqs: list, proposals: list[Proposal], verdicts: list) -> None:
        pass

    # a drafter may verify its own way (kangaroo starts at its exit layer from saved states);
    # the default is one full forward of the target over [pending + drafts]
    custom_verify = False

    def verify_hidden(self, batch, kv, seqs, proposals):
        """The verify forward's last-layer states [T, D] (the runner applies the LM head)."""
        raise NotImplementedError

    # a drafter that needs the prompt's hidden states entering layer `prefill_capture` (Kangaroo:
    # its exit layer) gets them from each prefill forward through `prefilled`
    prefill_capture: int | None = None

    def prefilled(self, batch, kv, hidden) -> None:
        pass

    def fresh(self) -> "Drafter":
        """A new drafter with the same artifacts and settings and nothing learnt yet."""
        raise NotImplementedError

    def signature(self) -> str:
        """What identifies this drafter's artifact (a run resumes only with the same one)."""
        return self.name


class NoDraft(Drafter):
    """`ar`: the degenerate case, an empty tree, so one token per step."""
    name = "ar"

    def propose(self, seqs, kv, room, stop=None) -> list[Proposal]:
        return [Proposal() for _ in seqs]

    def fresh(self) -> "NoDraft":
        return NoDraft()
