"""How long a whole preparation command will take, from costs measured on this machine.

A command is a sequence of phases (encoding, an exit-layer sweep, target features, training,
held-out evaluation, saving ...). Each is priced up front in seconds: work counted from the data
(conversations and their lengths, steps, epochs) times costs timed here on a few real inputs. The
estimate of the whole command is the time spent so far plus what the unfinished phases still
hold. As phases run they report the predicted seconds of the work they finish; the ratio of wall
seconds to predicted seconds over all work done so far then scales what remains (a machine
busier than during the timing, a cost curve a little off).

    eta = Eta(started)
    eta.add("features", 420.0); eta.add("training", 380.0)
    eta.begin("features"); eta.advance("features", 2.1) ...; eta.end("features")
    eta.total()   # elapsed + remaining, in seconds
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Phase:
    name: str
    estimate: float          # predicted seconds of the whole phase
    done: float = 0.0        # predicted seconds of the work finished so far
    began: float | None = None
    spent: float = 0.0       # wall seconds of a finished phase
    finished: bool = False


class Eta:
    """Phases priced in seconds; `total()` = elapsed + what remains, corrected by the wall time
    the work done so far actually took (once `min_evidence` predicted seconds are done)."""

    def __init__(self, started: float | None = None, clock: Callable[[], float] = time.monotonic,
                 min_evidence: float = 10.0):
        self.clock = clock
        self.started = clock() if started is None else started
        self.min_evidence = min_evidence
        self.phases: dict[str, Phase] = {}

    def add(self, name: str, seconds: float) -> None:
        """Set a phase's estimate (a phase not begun yet may be re-priced)."""
        p = self.phases.get(name)
        if p is None:
            self.phases[name] = Phase(name, max(seconds, 0.0))
        else:
            p.estimate = max(seconds, 0.0)

    def drop(self, name: str) -> None:
        """A phase that will not run after all."""
        self.phases.pop(name, None)

    def begin(self, name: str) -> None:
        p = self.phases.setdefault(name, Phase(name, 0.0))
        p.began = self.clock()

    def advance(self, name: str, seconds: float) -> None:
        """`seconds`: the predicted cost of the work just finished in phase `name`."""
        self.phases[name].done += seconds

    def end(self, name: str) -> None:
        p = self.phases[name]
        if p.began is None:
            p.began = self.clock()
        p.spent, p.finished = self.clock() - p.began, True
        p.done = max(p.done, p.estimate)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def _spent(self, p: Phase) -> float:
        if p.finished:
            return p.spent
        return 0.0 if p.began is None else self.clock() - p.began

    def factor(self) -> float:
        """Wall seconds per predicted second over the work done so far (1 until enough is)."""
        done = sum(p.done for p in self.phases.values())
        if done < self.min_evidence:
            return 1.0
        return sum(self._spent(p) for p in self.phases.values() if p.done > 0) / done

    def remaining(self) -> float:
        f = self.factor()
        return sum(max(p.estimate - p.done, 0.0) * f for p in self.phases.values()
                   if not p.finished)

    def total(self) -> float:
        return self.elapsed() + self.remaining()

    def left(self, name: str) -> float:
        """Predicted seconds a phase still holds (corrected)."""
        p = self.phases.get(name)
        if p is None or p.finished:
            return 0.0
        return max(p.estimate - p.done, 0.0) * self.factor()

    def summary(self) -> str:
        """'14 min 5 s (so far 22 s; sweep 3 min, features 6 min, ...)'."""
        parts = [f"{n} {duration(self.left(n))}" for n, p in self.phases.items()
                 if not p.finished and self.left(n) >= 0.5]
        return (f"{duration(self.total())} (so far {duration(self.elapsed())}"
                + ("; " + ", ".join(parts) if parts else "") + ")")


def duration(s: float) -> str:
    """Seconds for people: '45 s', '14 min 5 s', '2 h 3 min'."""
    s = max(int(round(s)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s < 600 else f"{round(s / 60)} min"
    h, m = divmod(round(s / 60), 60)
    return f"{h} h {m} min"


def poly(coef: tuple[float, ...], x: float) -> float:
    return sum(c * x ** k for k, c in enumerate(coef))


def fit_cost(points: list[tuple[float, float]], degree: int = 2) -> tuple[float, ...]:
    """Non-negative least squares fit of seconds = a + b x (+ c x^2) to measured (x, seconds):
    costs never fall with size, and no coefficient of a cost may be negative. Returns
    (a, b, c) (c = 0 for degree 1)."""
    n = degree + 1
    X = max(max(abs(x) for x, _ in points), 1e-12)   # fit in x / X: a well-conditioned system
    pts = [(x / X, y) for x, y in points]
    best, best_err = None, float("inf")
    for mask in range(1, 1 << n):
        cols = [k for k in range(n) if mask >> k & 1]
        if len(cols) > len(pts):
            continue
        coef = _lstsq([[x ** k for k in cols] for x, _ in pts], [y for _, y in pts])
        if coef is None or min(coef) < 0:
            continue
        full = [0.0] * n
        for k, c in zip(cols, coef):
            full[k] = c
        err = sum((poly(tuple(full), x) - y) ** 2 for x, y in pts)
        if err < best_err - 1e-15:
            best, best_err = full, err
    if best is None:   # (only with no points above zero)
        best = [max(y for _, y in pts)] + [0.0] * degree
    out = tuple(c / X ** k for k, c in enumerate(best))
    return out + (0.0,) * (3 - len(out))


def _lstsq(A: list[list[float]], y: list[float]) -> list[float] | None:
    """Least squares by the normal equations (at most 3 unknowns); None when singular."""
    n = len(A[0])
    M = [[sum(r[i] * r[j] for r in A) for j in range(n)] + [sum(r[i] * v for r, v in zip(A, y))]
         for i in range(n)]
    for i in range(n):
        piv = max(range(i, n), key=lambda r: abs(M[r][i]))
        if abs(M[piv][i]) < 1e-300:
            return None
        M[i], M[piv] = M[piv], M[i]
        for r in range(n):
            if r != i:
                f = M[r][i] / M[i][i]
                M[r] = [a - f * b for a, b in zip(M[r], M[i])]
    return [M[i][n] / M[i][i] for i in range(n)]
