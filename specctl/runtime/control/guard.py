"""The measured guard of `--speculate auto`: a run that speculates is never behind `ar` for long.

The controller's prices come from a table measured once and a correction learnt as the run
goes (runtime/control/stepcost.py); both can be wrong (a drafter's host work the table never saw, a
GPU whose kernels cost unlike the table's, a neighbour on the machine). The guard does not
predict: it keeps a balance of what the run's drafting steps saved against `ar` for the same
progress, both measured in this run:

    balance += (1 + eps) * progress * ar_ms(b) - ms        (each drafting step)

where progress is the step's emitted tokens per sequence (the tokens an `ar` step of b
sequences emits, b, make 1) or, while the batch drains, the tokens the critical sequence
emitted (the job ends with it), and ar_ms(b) is `ar`'s lean step of b sequences as this run
timed it: its table price times the measured/table ratio of the run's lean steps (the steps
without drafts, which take `ar`'s own path).

The run is behind once the balance has lost a drafting step's time (ms). Savings bank credit
up to `credit` steps' time, so a verdict is on a loss that adds up, not on a run of steps
that accept nothing: acceptance comes in bursts (text a drafter knows, then text it does
not), a burst of misses costs each step only its extra width, and one accepted draft pays
back a whole `ar` step (with 8-step windows judged alone, bursty oracle chains at batch 1 on
the H100's table were held to `ar` for 1,021 of 1,271 steps and ran 1.14x `ar` against 1.36x
without the guard; Self-Draft on the H100 itself, 320 of 546). A drafter that never pays
loses one step's time and stops: ~4 steps at 30% a step, 2 while a batch of 32 drains on a
sequence that accepts nothing (~70% a step); one that paid and stops paying, at most its
credit more. The run's first balance is one drafting step's time (`start`), not 0: a
drafter's first steps draft on a prior, before the run has learnt its acceptance, and at 0
real text's chains at batch 1 tripped on the first request's early misses in noisy rounds and
were held to `ar` for most of a short job (0.99-1.13x, against 1.29x in the rounds that did
not trip; bench-results/2026-12-01-guard-hold); a drafter that never pays loses one step's
time more, once a run. Behind, the run holds to `ar` steps for `hold` steps, then tries again
from a balance of 0; each trip before the balance has won a step's time back doubles the hold (up
to `max_hold`). So a method that loses pays about one step in each doubling of the run's
length.

The steps are not the whole job. A lean step that searched and found nothing and slots held
free for a grouped admission fall outside the step account, so the guard keeps the job's
too: every controlled step's (held ones too) `excess`, the ms it took beyond what `ar` takes
for the same tokens (runtime/step/accounting.py prices each), in a second balance,

    job_balance += eps * ms - excess        (each step, up to `credit` steps' time)

behind once it has lost JOB_SLACK (2) steps' time. A job that loses a share x of each step
to its searches, admissions or bookkeeping falls back to `ar` within (2 + credit) / x steps
at most, 2 / x from a balance of 0 (4 steps at x = 50%, 20 at 10%). Such a trip holds the run
to `ar` for the job's own hold, which doubles at each job trip until the job has won a step's
time back (held steps are `ar`'s: not counted): a job that keeps losing pays ~2 steps' time
in each doubling of its length. The summary's "vs ar" takes the run's total excess off its
time (jobs/metrics.gain_vs_ar): the same measure.
"""

from __future__ import annotations

import math

GUARD_CREDIT = 16      # drafting steps' time that savings may bank against later losses
GUARD_EPS = 0.02       # how far behind ar a step may be (timing noise; no real loss)
GUARD_HOLD = 64        # ar steps held to after a first trip (doubling)
GUARD_START = 1.0      # drafting steps' time the run's balance starts with (module docstring)
GUARD_MAX_HOLD = 4096
AR_MEMORY = 16         # lean steps the ar ratio averages over
AR_OFF = 4             # how far off the ratio so far a lean step counts, at most (lean)
JOB_SLACK = 2.0        # steps' time the job's balance may be behind ar


class Guard:
    def __init__(self, credit: float = GUARD_CREDIT, eps: float = GUARD_EPS,
                 hold: int = GUARD_HOLD, max_hold: int = GUARD_MAX_HOLD, active: bool = True,
                 start: float = GUARD_START):
        self.credit, self.eps, self.base, self.max_hold = credit, eps, hold, max_hold
        self.start = start
        self.active = active   # (off: it still measures ar's step, and never holds a run)
        self.ar_log: float | None = None   # log(measured / table ms) of the lean steps
        self.ar_steps = 0
        self.ar_cut: float | None = None   # the last lean sample's log ratio, if AR_OFF cut it
        self.balance = 0.0                 # ms saved against ar since the last trip
        self.fresh = True                  # no drafting step judged yet
        self.next_hold = hold
        self.hold = 0                      # ar steps still to hold to
        self.trips = 0                     # times the balance fell behind
        self.held = 0                      # steps held to ar
        self.excess = 0.0                  # the job's ms beyond ar's, all told (job)
        self.job_balance = 0.0             # the job's ms saved against ar (job)
        self.job_won = 0.0                 # its savings since its last trip, eps aside
        self.step_ms = 0.0                 # a controlled step's ms, recent mean
        self.job_trips = 0                 # trips of those made by the job's account
        self.job_hold = hold               # the next of those trips' hold (doubling)

    def lean(self, table_ms: float, ms: float, steps: int = 1) -> None:
        """`steps` lean steps (no drafts, `ar`'s path) of table price table_ms took ms each on
        average: weighed as that many steps (one contrast step moves the average as one), and
        counted at most AR_OFF times off what `ar`'s step is taken to cost so far (the table's,
        at first): one step that hit a page-in is not `ar`'s price (a first lean step at 43x
        its table's made every drafting step look like a win for ~60 steps). A sample that
        agrees (within AR_OFF) with the one just cut says the cut one was the machine, not a
        page-in: the average starts again from the two (else a steady 10x off the table read
        9x after 8 steps)."""
        if not (table_ms > 0 and ms > 0):
            return
        e, off, raw = self.ar_log or 0.0, math.log(AR_OFF), math.log(ms / table_ms)
        x = min(e + off, max(e - off, raw))
        cut, self.ar_cut = self.ar_cut, (raw if x != raw else None)
        if cut is not None and abs(raw - cut) <= off:
            self.ar_log, self.ar_steps, x = None, steps, (cut + raw) / 2
            self.ar_cut = None
        self.ar_steps += steps
        self.ar_log = x if self.ar_log is None else \
            self.ar_log + (x - self.ar_log) * min(1.0, steps / min(self.ar_steps, AR_MEMORY))

    def ar_ms(self, table_ms: float) -> float | None:
        """`ar`'s lean step of that table price, as this run measures it (None: not yet)."""
        return None if self.ar_log is None else table_ms * math.exp(self.ar_log)

    def drafted(self, ms: float, ar_ms: float | None) -> None:
        """A drafting step took ms where `ar` would have taken ar_ms for its progress."""
        if ar_ms is None or not ms > 0 or not self.active:
            return
        if self.fresh:   # (the run's first drafting step judged)
            self.fresh, self.balance = False, self.start * ms
        self.balance = min(self.balance + (1 + self.eps) * ar_ms - ms, self.credit * ms)
        if self.balance >= ms:        # won a step's time back: a later trip starts over
            self.next_hold = self.base
        elif self.balance < -ms:
            self._trip()

    def job(self, excess: float, ms: float, steps: int = 1) -> None:
        """Part of the job took ms, excess of them beyond what `ar` takes for the same tokens:
        `steps` controlled steps (held ones too: the job's time is all of it; 0: told at once
        for a step tallied later). The job's balance, behind (module docstring), holds the run
        to `ar` for the job's own hold, doubling at each such trip until the job has won a
        step's time back (the step account's trips and wins do not move it)."""
        self.excess += excess
        if steps:   # (a mean over the last ~AR_MEMORY steps: the balance's unit)
            self.step_ms += (ms / steps - self.step_ms) * \
                (1.0 if not self.step_ms else min(1.0, steps / AR_MEMORY))
        if not self.active or not self.step_ms or self.hold:   # (held: ar's steps)
            return
        self.job_balance = min(self.job_balance + self.eps * ms - excess,
                               self.credit * self.step_ms)
        self.job_won -= excess
        if self.job_won >= self.step_ms:   # (real savings, not eps's slack)
            self.job_hold = self.base
        elif self.job_balance < -JOB_SLACK * self.step_ms:
            self.job_trips += 1
            self.trips += 1
            self.hold = self.job_hold
            self.job_hold = min(2 * self.job_hold, self.max_hold)
            self.job_balance = self.job_won = 0.0

    def _trip(self) -> None:
        """Behind: hold to `ar` for the next hold, doubling it for the next trip."""
        self.hold = self.next_hold
        self.next_hold = min(2 * self.next_hold, self.max_hold)
        self.trips += 1
        self.balance = 0.0

    def holding(self) -> bool:
        """Whether this step is held to `ar` (counts it)."""
        if self.hold <= 0:
            return False
        self.hold -= 1
        self.held += 1
        return True
