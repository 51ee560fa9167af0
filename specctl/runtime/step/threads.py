"""How many CPU threads a step uses, chosen by measuring (CPU only).

A decoding step on a CPU is a few hundred small ops. Spread over all cores each op ends in a
barrier that waits for every thread; when another process holds one of the cores, the thread
parked there is descheduled for a whole time slice at every barrier, and the step slows down
many times over (seen on a 2-core machine: `ar` at batch 1 fell from ~22 to 3.9 tokens/s with
one busy process beside it, while one thread would have kept most of a core). No setting is
right for both a quiet and a busy machine, and the load changes during a run, so the tuner
tries the candidates now and then and keeps the fastest:

    tuner = ThreadTuner(max_threads)
    while ...:
        tuner.before()               # sets torch's thread count for this step
        step()
        tuner.after(seconds, work)   # seconds per unit of work of this step (packed
                                     # tokens, or the step-cost table's ms of the step)

It trials every candidate for `trial` steps, keeps the one with the lowest median time per
unit of work, and trials again after `period` steps; a trial that confirms the choice doubles
the period (up to `max_period`), a switch resets it, so a steady machine pays for trials
rarely. Two steps in a row at SLOWER times the choice's trial median start a trial at once:
a process that takes a core between trials made two threads ~150x slower for the 64 steps
to the next one (a new-user probe on this 2-core machine, --threads 1 unaffected).
"""

from __future__ import annotations

import os
import statistics

import torch

SLOWER = 4.0   # a step this many times the choice's trial median per unit of work is slow


class ThreadTuner:
    def __init__(self, max_threads: int, trial: int = 2, period: int = 64,
                 max_period: int = 1024):
        self.options = sorted({1, max(1, max_threads // 2), max(1, max_threads)})
        self.trial, self.base, self.max_period = trial, period, max_period
        self.period = period
        self.choice = self.options[-1]
        self._queue: list[int] = []              # threads of the trial steps still to run
        self._seen: dict[int, list[float]] = {}
        self._since = period                     # steps since the last trial: trial first
        self._current = None
        self._ref = None   # the choice's median seconds per unit of work at its trial
        self._slow = 0     # steps in a row since that were SLOWER times it

    def before(self) -> None:
        if len(self.options) == 1:
            return
        if not self._queue and self._since >= self.period:
            self._queue = [n for n in self.options for _ in range(self.trial)]
            self._seen = {}
            self._since = 0
        n = self._queue[0] if self._queue else self.choice
        if n != self._current:
            torch.set_num_threads(n)
            self._current = n

    def after(self, seconds: float, work: float) -> None:
        if len(self.options) == 1:
            return
        per = seconds / work if work > 0 else seconds
        if not self._queue:
            self._since += 1
            slow = self._ref is not None and per > SLOWER * self._ref
            self._slow = self._slow + 1 if slow else 0
            if self._slow >= 2:   # (the load changed: trial now, not `period` steps on)
                self._since, self._slow = self.period, 0
            return
        n = self._queue.pop(0)
        self._seen.setdefault(n, []).append(per)
        if not self._queue:   # trial over: keep the fastest
            best = min(self._seen, key=lambda k: statistics.median(self._seen[k]))
            self.period = min(2 * self.period, self.max_period) if best == self.choice \
                else self.base
            self.choice = best
            self._ref, self._slow = statistics.median(self._seen[best]), 0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: taskset's, a cpuset's; a CPU quota,
    `docker --cpus`, is not seen here)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1


def say_threads(threads: int | None, model, log) -> None:
    """Once a job (its model's load, runtime/jobs/loaded.py; bench's), where the user's
    --threads is more than the CPUs the process may run on (it ran silently oversubscribed)."""
    cpus = usable_cpus()
    if threads and threads > cpus and model.device.type == "cpu":
        log(f"--threads {threads} is more than the {cpus} CPUs this process may run on: its "
            "threads will take turns on them, which is slower than one each (leave --threads "
            "out to have it measured)")
