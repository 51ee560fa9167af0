"""A run's counters (RunStats), filled by the runner step by step, and their sum over several
runs (the groups of a job with per-line settings, the ranks of a job run by several processes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class RunStats:
    steps: int = 0                 # verification forwards (decode steps; prefill not counted)
    prefill_forwards: int = 0
    prefill_replays: int = 0       # of those, replays of a captured graph (prefill's pieces)
    prefill_tokens: int = 0
    prefill_chunk: int = 0         # the most prompt tokens a prefill forward took (its chunk)
    # what the device measured a prefill forward at (runtime/step/prefill.py, PiecePrice) where
    # a grouped run priced its pieces: of piece_prompts prompts of PIECE tokens, eagerly and
    # replayed (the bench shows them: on the H200 Kangaroo prefilled eagerly where `ar` went
    # in pieces, 2026-12-04, and nothing said why)
    piece_prompts: int = 0
    piece_eager_ms: float = 0.0
    piece_replay_ms: float = 0.0
    prefill_s: float = 0.0         # seconds in prefill (it ends in a host read: on CUDA, its
    step_s: float = 0.0            # kernels' time too), and in decode steps
    step_tokens: int = 0           # packed tokens of all steps (sum of real tokens)
    padded_tokens: int = 0         # what a padded batch would have computed for the same steps
    generated: int = 0
    probe_tokens: int = 0          # probe rows (Self-Draft's branches) within step_tokens
    accept_hist: dict[int, int] = field(default_factory=dict)   # accepted drafts -> steps
    # accepted drafts by the cache whose candidate made them (Self-Draft: job, context, corpus)
    accepted_from: dict[str, int] = field(default_factory=dict)
    # speculation control (runtime/control/controller.py): budgets chosen (budget ->
    # sequence-steps), the controller's predicted ms of the steps and their measured ms, its expected tokens
    # and the tokens the steps verified (all summed over the controlled steps), and the
    # seconds spent measuring the step-cost profile
    budget_hist: dict[int, int] = field(default_factory=dict)
    predicted_step_ms: float = 0.0
    measured_step_ms: float = 0.0
    predicted_tokens: float = 0.0
    verified_tokens: int = 0       # the bonus token and the accepted drafts of each sequence
    controlled_steps: int = 0
    explored: int = 0              # sequence-steps given the controller's exploration budget
    contrasts: int = 0             # steps the controller ran without drafts to time them
    confidence_stops: int = 0      # chains the controller ended early on a draft's confidence
    profile_s: float = 0.0
    # the controlled steps' work priced as `ar` steps: per step, its progress (emitted tokens
    # over its sequences; draining, the critical sequence's) times `ar`'s step of that many
    # sequences as the run's lean steps measure it (Controller.drafted), a lean step its own ms
    ar_step_ms: float = 0.0
    lean_steps: int = 0            # controlled steps without drafts, run on `ar`'s path (in
    lean_step_ms: float = 0.0      # controlled_steps), and their measured ms (in measured_)
    searches: int = 0              # searches the controller ran (prefetched ones too, some
                                   # of them not taken: the next step did not search)
    search_ms: float = 0.0         # their time: decide's, and prefetch's (on CUDA under the
                                   # forward); not in a lean step's ms
    learn_s: float = 0.0           # the last step's learning, caught up under the next step's
                                   # forward where the host runs beside it (CUDA): in step_s,
                                   # hidden there while shorter than the forward (wall seconds)
    guard_trips: int = 0           # times the measured guard found the run behind `ar`
    guard_held: int = 0            # steps it held to `ar`
    guard_job_trips: int = 0       # of those trips, made by the job's account
    # the job's ms beyond what `ar` takes for the same tokens (runtime/step/accounting.py):
    # drafting steps against ar's for their progress, searches that found nothing, slots held
    # for a grouped admission
    job_excess_ms: float = 0.0
    captures: int = 0              # graph shapes captured when the runner started
    capture_s: float = 0.0         # the seconds they took (out of every step's time)
    exact_check_s: float = 0.0     # --exact's start-up check, where this run made it
    captures_in_steps: int = 0     # shapes captured inside a step (by design none; such a
                                   # step's time is not learnt)
    preemptions: int = 0           # stages preempted for KV blocks (paged cache), restarted
    recomputed: int = 0            # tokens they had generated, generated again
    kv_bytes: int = 0              # the KV cache's storage
    kv_blocks: int = 0             # blocks of its pool when paged (0: contiguous)

    def lean(self, b: int, steps: int, ms: float, ar_ms: float, contrast: bool) -> None:
        """Controlled steps of b sequences without drafts (`ar`'s path) took ms in all, where
        `ar` takes ar_ms; contrast: one of them was a contrast step."""
        self.controlled_steps += steps
        self.lean_steps += steps
        self.lean_step_ms += ms
        self.measured_step_ms += ms
        self.ar_step_ms += ar_ms
        self.budget_hist[0] = self.budget_hist.get(0, 0) + b * steps
        self.contrasts += contrast

    @property
    def padding_ratio(self) -> float:
        return 1.0 - self.step_tokens / self.padded_tokens if self.padded_tokens else 0.0


SETTINGS = ("prefill_chunk", "piece_prompts", "piece_eager_ms", "piece_replay_ms")


def sum_stats(parts: list[dict]) -> RunStats:
    """Per-rank RunStats (as dicts) added up: counters summed, histograms merged, so ratios
    such as the padding ratio come out pooled over every step of every rank."""
    total = RunStats()
    for p in parts:
        for f in fields(RunStats):
            v = p.get(f.name)
            cur = getattr(total, f.name)
            if isinstance(v, dict) and isinstance(cur, dict):
                for k, c in v.items():
                    try:
                        k = int(k)   # JSON made the histogram's int keys strings
                    except ValueError:
                        pass
                    cur[k] = cur.get(k, 0) + c
            elif f.name in SETTINGS:   # (settings, not counts)
                setattr(total, f.name, max(cur, v or 0))
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and \
                    isinstance(cur, (int, float)):
                setattr(total, f.name, cur + v)
    return total


def in_turn(parts: list[dict]) -> RunStats:
    """RunStats (as dicts) of runs made one after another in one process (a job's groups, a
    Ray actor's tasks) as one: sum_stats, but their KV caches were not held together, so the
    largest is theirs, not the sum (which said twice the --kv-memory budget for two groups)."""
    total = sum_stats(parts)
    big = max(parts, key=lambda p: p.get("kv_bytes", 0))
    total.kv_bytes, total.kv_blocks = big.get("kv_bytes", 0), big.get("kv_blocks", 0)
    return total


def merged(parts: list[RunStats]) -> RunStats:
    """RunStats of a process's runs, one after another, as one (in_turn)."""
    return parts[0] if len(parts) == 1 else in_turn([asdict(p) for p in parts])
