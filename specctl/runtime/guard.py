"""The measured guard of `--speculate auto`: a run that speculates is never behind `ar` for long.

The controller's prices come from a table measured once and a correction learnt as the run
goes (runtime/stepcost.py); both can be wrong (a drafter's host work the table never saw, a
GPU whose kernels cost unlike the table's, a neighbour on the machine). The guard does not
predict: it compares what the run's drafting steps took with what `ar` would have taken for
the same progress, both measured in this run:

    behind = sum(ms of the window's drafting steps) > (1 + eps) * sum(progress_j * ar_ms(b_j))

where progress is the step's emitted tokens per sequence (the tokens an `ar` step of b
sequences emits, b, make 1) or, while the batch drains, the tokens the critical sequence
emitted (the job ends with it), and ar_ms(b) is `ar`'s lean step of b sequences as this run
timed it: its table price times the measured/table ratio of the run's lean steps (the steps
without drafts, which take `ar`'s own path). A window that is behind makes the run hold to
`ar` steps for `hold` steps, then try again; each window behind in a row doubles the hold (up
to `max_hold`), one that keeps up resets it. A window that has lost two `ar` steps' worth
already ends there (a draining batch whose critical sequence accepts nothing loses ~70% a
step at batch 32 on the H100's table). So a method that loses pays for about one window
in each doubling of the run's length, and a method that wins never stops.
"""

from __future__ import annotations

import math

GUARD_WINDOW = 8       # drafting steps a verdict sums over
GUARD_EPS = 0.02       # how far behind ar a window may be (timing noise; no real loss)
GUARD_HOLD = 64        # ar steps after the first window behind (doubling)
GUARD_MAX_HOLD = 4096
AR_MEMORY = 16         # lean steps the ar ratio averages over


class Guard:
    def __init__(self, window: int = GUARD_WINDOW, eps: float = GUARD_EPS,
                 hold: int = GUARD_HOLD, max_hold: int = GUARD_MAX_HOLD, active: bool = True):
        self.window, self.eps, self.base, self.max_hold = window, eps, hold, max_hold
        self.active = active   # (off: it still measures ar's step, and never holds a run)
        self.ar_log: float | None = None   # log(measured / table ms) of the lean steps
        self.ar_steps = 0
        self.spent = self.ar_equiv = 0.0   # the open window's sums
        self.seen = 0
        self.next_hold = hold
        self.hold = 0                      # ar steps still to hold to
        self.trips = 0                     # windows found behind
        self.held = 0                      # steps held to ar

    def lean(self, table_ms: float, ms: float) -> None:
        """A lean step (no drafts, `ar`'s path) of table price table_ms took ms."""
        if not (table_ms > 0 and ms > 0):
            return
        x = math.log(ms / table_ms)
        self.ar_steps += 1
        self.ar_log = x if self.ar_log is None else \
            self.ar_log + (x - self.ar_log) / min(self.ar_steps, AR_MEMORY)

    def ar_ms(self, table_ms: float) -> float | None:
        """`ar`'s lean step of that table price, as this run measures it (None: not yet)."""
        return None if self.ar_log is None else table_ms * math.exp(self.ar_log)

    def drafted(self, ms: float, ar_ms: float | None) -> None:
        """A drafting step took ms where `ar` would have taken ar_ms for its progress."""
        if ar_ms is None or not ms > 0 or not self.active:
            return
        self.spent += ms
        self.ar_equiv += ar_ms
        self.seen += 1
        lost = self.spent - self.ar_equiv   # (a window that has already lost 2 ar steps' worth
        early = lost > 2 * self.ar_equiv / self.seen   # ends at once: a batch draining on a
        if self.seen < self.window and not early:      # sequence that accepts nothing)
            return
        if self.spent > (1 + self.eps) * self.ar_equiv:
            self.hold = self.next_hold
            self.next_hold = min(2 * self.next_hold, self.max_hold)
            self.trips += 1
        else:
            self.next_hold = self.base
        self.spent = self.ar_equiv = 0.0
        self.seen = 0

    def holding(self) -> bool:
        """Whether this step is held to `ar` (counts it)."""
        if self.hold <= 0:
            return False
        self.hold -= 1
        self.held += 1
        return True
