"""A step's commit: the accepted rows into the KV cache, the emitted tokens into the
sequences (Answers.emit: each checked against EOS, stop strings, the token budget and the
context), and the step's counts into the run's stats."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specctl.speculative.verify import RowVerdicts

if TYPE_CHECKING:
    from specctl.runtime.step.answers import Answers
    from specctl.runtime.step.stats import RunStats
    from specctl.runtime.step.step import StepOutcome, StepPlan


def commit(plan: StepPlan, out: StepOutcome, kv, answers: Answers, st: RunStats) -> None:
    """Commit a verified step (Runner.step, after verify)."""
    n = len(plan.seqs)
    if plan.batch.num_tokens == n:   # an ar step (a row each): its token, nothing moves
        kv.advance(plan.batch.seq_slots)   # (the sequences' slots, in their order)
        emit, v = answers.emit, out.verdicts
        # (greedy: the tokens as read; sampling's verdicts are Verdicts)
        bonus = v.bonus if isinstance(v, RowVerdicts) else [x.bonus for x in v]
        for s, t in zip(plan.seqs, bonus):
            r = s.req
            r.steps += 1
            r.accept_lengths.append(0)
            r.draft_lengths.append(0)
            emit(s, [t])
        st.accept_hist[0] = st.accept_hist.get(0, 0) + n
        st.steps += 1
        st.step_tokens += n
        st.padded_tokens += n
        return
    root = [0]   # (a sequence that accepts nothing keeps its root's row; commit_many reads
    # its lists, never keeps nor edits them)
    kv.commit_many([(s.slot, [0] + [j + 1 for j in v.accepted] if v.accepted else root)
                    for s, v in zip(plan.seqs, out.verdicts)])
    emit, hist = answers.emit, st.accept_hist
    for s, p, v in zip(plan.seqs, plan.proposals, out.verdicts):
        r, a = s.req, len(v.accepted)
        n = emit(s, v.tokens(p.draft) if a else [v.bonus])
        a = a if n > a else n   # (the drafts its answer keeps: none past where it ends)
        r.steps += 1
        r.accept_lengths.append(a)
        r.draft_lengths.append(len(p.draft.tokens))
        hist[a] = hist.get(a, 0) + 1
    ran = [n + m for n, m in zip(plan.verified, plan.probed)]
    st.steps += 1
    st.step_tokens += sum(ran)
    st.probe_tokens += sum(plan.probed)
    st.padded_tokens += max(ran) * len(ran)


def commit_grid(plan: StepPlan, out: StepOutcome, kv, answers: Answers, st: RunStats) -> int:
    """A grid step's commit (runtime/step/grid.py), commit's from its verdicts' rows: each
    sequence's kept rows and emitted tokens; returns the drafts accepted."""
    rows, seqs = out.verdicts.rows, plan.seqs
    # (each sequence keeps its root and its accepted rows, in place since the verify's
    # GridStep.device_step)
    kv.advance(plan.batch.seq_slots, [r[0] + 1 for r in rows])
    emit, hist, accepted, accepting = answers.emit, st.accept_hist, 0, 0
    for s, r in zip(seqs, rows):
        a = r[0]
        q = s.req
        q.steps += 1
        n = emit(s, r[4:5 + a])
        a = a if n > a else n   # (the drafts its answer keeps: none past where it ends)
        q.accept_lengths.append(a)
        q.draft_lengths.append(r[3])
        if a:   # (the histogram's rare entries here; a step's zeros counted once, below)
            hist[a] = hist.get(a, 0) + 1
            accepted += a
            accepting += 1
    if accepting < len(rows):
        hist[0] = hist.get(0, 0) + len(rows) - accepting
    n = plan.batch.num_tokens
    st.steps += 1
    st.step_tokens += n
    st.padded_tokens += n
    return accepted
