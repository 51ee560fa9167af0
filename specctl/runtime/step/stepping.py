"""One step of the run and the learning around it, the half of the Runner that the step loop
(runtime/step/runner.py) calls once an iteration: plan -> forward -> verify -> commit
(runtime/step/step.py, commit.py), with what the host does while a forward computes where
forwards run on without it (CUDA: the last step's learning, the next step's search).

`Stepping` is the Runner's base: it reads the run's state the Runner keeps (its model, KV
cache, planner, answers, stats, controller and accounting, the learning waiting for the next
forward) and keeps none of its own.
"""

from __future__ import annotations

import time
from functools import partial

from specctl.runtime.step.commit import commit, commit_grid
from specctl.runtime.step.grid import GridStep
from specctl.runtime.step.logprobs import step_logprobs
from specctl.runtime.step.sequence import Sequence
from specctl.runtime.step.step import StepOutcome, read, verify


class Stepping:
    def _grid_step(self) -> GridStep | None:
        """Self-Draft's grid step (runtime/step/grid.py) where its drafter keeps a context
        table and the run can take it: greedy, no logprobs. Else None: the per-sequence
        steps. The last one is kept while its table and job cache are the drafter's: its
        gather (GridFill) is what the graphs captured for it read (Runner._warm)."""
        table = getattr(self.drafter, "context_table", None)
        if table is None or not self.sp.greedy or self.logprobs is not None:
            return None
        job = getattr(self.drafter, "job_table", None)
        grid = self.planner.grid
        if grid is None or grid.table is not table or grid.job is not job or \
                grid.C != min(self.drafter.grid_cands, table.R):
            grid = GridStep(table, self.drafter.grid_cands, job=job)
            grid.warm(self.kv)
        return grid

    def step(self, seqs: list[Sequence], drain: bool = False) -> float:
        """One plan -> forward -> verify -> commit step over prefilled, unfinished sequences
        (drain: no request waits); returns the step's work for the thread tuner (module
        docstring of runtime/step/threads.py): its packed tokens, or its step-cost-table ms
        where a controller prices steps and the step's learning is not left for the next
        (under_forward: CUDA, where no thread tuner runs)."""
        g = self.model.graphs
        captures = g.captures if g is not None else 0
        t0 = self.clock()
        plan = self.planner.plan(seqs, drain, self.clock)
        t1 = self.clock()
        h = self.planner.execute(plan)
        # (on CUDA the forward runs on while the host learns from the last step and searches
        # for the next: the argmax read is the step's first wait)
        ahead = self.under_forward(plan.seqs, drain, plan.lean)
        if plan.grid is not None:   # (Self-Draft's grid step: runtime/step/grid.py)
            out = StepOutcome(self.planner.grid.verify(plan.grid, self.model.argmax(h),
                                                       self.kv, plan.batch.filled), ())
            t2 = self.clock()
        else:
            target = read(plan, h, self.model, self.sp)
            t2 = self.clock() if self.sp.greedy else None   # (sampling verifies on the device)
            out = verify(plan, h, self.model, self.sp, self._uniforms, target)
        if not plan.lean and self.controller is not None and self.controller.unlearnt:
            # (the next decide reads it: observe may come a step late)
            self.controller.verified(plan.budgets, out.verdicts)
        # (what each had before the step: only a drafting step's accounting and --logprobs
        # read it; a lean step does nothing a sequence that `ar`'s does not)
        had = None if self.logprobs is None and (plan.lean or plan.budgets is None) else \
            [len(s.out_ids) for s in seqs]
        if plan.grid is not None:
            learn = self.drafter.grid_learned(
                seqs, commit_grid(plan, out, self.kv, self.answers, self.stats), plan.grid,
                out.verdicts)
        else:
            commit(plan, out, self.kv, self.answers, self.stats)
            learn = self.drafter.observe_lean(seqs) if plan.lean else \
                self.drafter.observe(seqs, list(plan.proposals), list(out.verdicts),
                                     list(out.probe_out))
        # (a drafting step's learning reads slots, the controller's: it waits for the next
        # forward too, even where a sequence ended, as its slot is forgotten after it
        # (_retire), both before the controller reads a sequence admitted into the slot
        # (under_prefill); a lean step's learning reads no slot, nor does a grid step's
        # drafter's (text into its table))
        defer = self._overlaps
        free = defer and (plan.lean or plan.grid is not None)
        if learn is not None and defer:
            (self._later_free if free else self._later).append(learn)
        elif learn is not None:   # (in the step's time, as before)
            learn()
        work = float(plan.batch.num_tokens)
        new = g.captures - captures if g is not None else 0
        self.stats.captures_in_steps += new   # (by design none: Runner._warm)
        if plan.budgets is not None:   # (a lean step's is most steps': its clock read, the
            # rest worked out with its learning, under the next forward where that waits)
            times = (t0, t1, t2, self.clock(), ahead, new, self._held, self.caught_ms)
            if defer:
                (self._later_free if plan.lean else self._later).append(
                    partial(self.accounting.step, plan, out, seqs, had, drain, times, True))
            else:
                work = self.accounting.step(plan, out, seqs, had, drain, times)
        if self.logprobs is not None:   # (not in the step's time: no method's cost)
            step_logprobs(self.model, plan, out, h, had, self.logprobs)
        return work

    def under_forward(self, seqs, drain: bool, lean: bool = False) -> float:
        """The host's work while a step's forward computes, where forwards run on without
        the host (Planner.overlaps): what the last step taught (the drafter's caches, the
        controller's acceptance, step time and guard: each a step late), then the next step's
        search (Planner.prefetch, its ms returned). lean: the step is a lean one."""
        self.caught_ms = 0.0
        if self._later or self._later_free:   # (the host's own seconds: a simulated clock
            t, c = time.perf_counter(), self.clock()   # may not charge them)
            self.catch_up()
            self.stats.learn_s += time.perf_counter() - t
            self.caught_ms = (self.clock() - c) * 1e3   # (on the run's clock: Accounting)
        # (a CPU's run searches at the step: Planner.prefetch would say so, a call later)
        return self._prefetch(list(seqs), drain, lean=lean) if self._overlaps else 0.0

    def under_prefill(self, seqs: list[Sequence], drain: bool) -> None:
        """The host's work while a prefill's forward computes (prefill's `under`): the
        learning that reads a slot, and the forgetting of the slots that retired since
        (_retire: before the controller reads an admitted sequence's slot, here or at
        decide), then what the next step's decide would work out over these sequences
        (Controller.prefetch_missing: the search where none prefetched serves it, else the
        admitted sequences' gains)."""
        if self._later:
            self.catch_up(slotted=True)
        if self._overlaps:
            self.stats.search_ms += self._prefetch(sorted(seqs, key=lambda s: s.slot), drain,
                                                   missing=True)

    def _prefetch(self, seqs: list[Sequence], drain: bool, missing: bool = False,
                  lean: bool = False) -> float:
        """The next step's search (Planner.prefetch), its ms returned; where it gives drafts,
        then what lean steps left the drafter (a lean stretch's text for Self-Draft's table,
        Kangaroo's adapter rows, the lean forward in flight's own too: Drafter.catch_up),
        now, not on the drafting step's path: there it took ~0.3 ms of a first drafting
        step's host at b32 on the demo model (bench-results/2026-11-30-plan-host). Without a
        controller every step drafts: it catches up here each step (with the job cache on
        the grid, its finished answers' indexing was ~20% of a b64 step's host in the plan)."""
        ms = self.planner.prefetch(seqs, drain, self.clock, missing)
        ctl = self.controller
        if ctl.drafts_next if ctl is not None else self.drafter.drafts:
            self.drafter.catch_up(seqs, int(lean), beside=True)
        return ms

    def catch_up(self, slotted: bool = False) -> None:
        """The last step's learning, if it waits (under_forward): now, and as the run ends;
        slotted: only what reads a slot, before a sequence retires (its slot and what was
        learnt of it are forgotten)."""
        later, self._later = self._later, []
        if not slotted:
            later += self._later_free
            self._later_free = []
        for f in later:
            f()
