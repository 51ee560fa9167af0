"""Self-Draft (papers/000): multi-branch self-drafting with a context cache and a corpus cache.

Every step, one forward of the target carries, per sequence (all packed, no padding between
sequences):
- the pending token (the normal decoding input), the root;
- the candidate drafts retrieved from the caches, merged into a trie below the root (a shared
  prefix is computed once; sibling order = candidate priority) and verified as a draft tree;
- N draft branches ("probes": run, never verified): each a chain below the root that sees the
  whole prefix and itself only, blind to the other branches and to the candidates.

Branches start as 1-2 tokens drawn uniformly from the prompt (fixed seed), grow by the target's
prediction after their last token each step, and drop their first token past L tokens. From the
predictions D along a branch tau, every window tau[k-G:k] plus D[k-1] (k = G..len) is an n-gram
of G + 1 tokens: its first token is the key, the other G the continuation, pushed into the
context cache (an LRU queue of at most `lru` grams per key). Text the sequence emits is pushed
too (and, with `prompt_grams`, a specctl addition, the prompt's own grams when a sequence is
admitted). The context cache is shared by all sequences of a run and persists across prompts; every
`trim_every` finished prompts each key keeps only its `trim_to` newest grams (authors' code).
(Where the host runs beside the forward, specctl pushes an admitted prompt's grams and makes
the trims due at retirements when it next learns, under a forward: _settle.)

Candidates for a step: with `job_cache` (a specctl addition, job_cache.py), first up to
`job_cands` continuations of up to `job_len` tokens from the job cache (the run's prompts and
finished answers; longest key of the last 2..8 tokens); then up to `context_cands` grams keyed
by the pending token (newest first), then up to `corpus_cands` continuations from the corpus
cache (built offline by build-cache; longest key of the last 1..4 tokens first), deduplicated. Greedy verification keeps the longest
agreeing path of the trie (the candidate with the longest agreeing prefix); sampling walks the
trie the same way against the target's own draws (verify.verify_sampling_batch: a candidate is
accepted with probability p(x), as by sequential rejection, and the text is exactly what ar
samples with the same seed). The probe rows' KV is never committed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import partial

from specctl.speculative.drafter import DraftPrice, Drafter, Proposal
from specctl.speculative.context_cache import ContextCache
from specctl.speculative.context_table import ContextTable
from specctl.speculative.job_cache import JobCache, JobCacheParams
from specctl.speculative.job_table import JobTable, last_tokens
from specctl.speculative.trie import branch_probe, build_trie
from specctl.speculative.verify import DraftTree


@dataclass(frozen=True)
class SelfDraftParams:
    branches: int = 6         # N
    branch_len: int = 6       # L
    gram: int = 4             # G: a context gram is G + 1 tokens (key + G continuation tokens)
    context_cands: int = 10   # candidates from the context cache per step
    corpus_cands: int = 3     # candidates from the corpus cache per step
    lru: int = 10             # grams kept per key in the context cache
    trim_every: int = 2       # every this many finished prompts ...
    trim_to: int = 2          # ... each key keeps only its newest this many grams
    context_cache: bool = True
    corpus_cache: bool = True
    prompt_grams: bool = False  # specctl: also push the prompt's grams (not in the paper)
    seed: int = 0
    job_cache: bool = False   # specctl: draft from the job's prompts and answers (job_cache.py)
    job_cands: int = 2        # candidates from the job cache per step (its most frequent)
    job_len: int = 16         # tokens a job-cache candidate drafts at most
    grid: bool = False        # specctl: the context cache as an array table, its candidates
                              # drafted over the batch at once (runtime/step/grid.py)

    def __post_init__(self):
        for name in ("branches", "context_cands", "corpus_cands", "trim_to", "job_cands"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("branch_len", "gram", "lru", "trim_every", "job_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def tag(self) -> str:
        return (f"N{self.branches}L{self.branch_len}G{self.gram}c{self.context_cands}"
                f"k{self.corpus_cands}lru{self.lru}t{self.trim_every}/{self.trim_to}"
                f"{'' if self.context_cache else '-noctx'}{'' if self.corpus_cache else '-nocorpus'}"
                f"{'-pg' if self.prompt_grams else ''}s{self.seed}"
                # (only when on: runs recorded without a job cache keep their signature)
                # (not the grid: it changes how drafts are made, never an answer, and its
                # default follows the batch size, which a run resumes with another of)
                f"{f'-job{self.job_cands}x{self.job_len}' if self.job_cache else ''}")


_M64 = (1 << 64) - 1


def first_branches(key: tuple[int, ...], pool: list[int], n: int) -> list[list[int]]:
    """n branches of 1 or 2 tokens drawn from pool, the same for the same key on any machine
    (a splitmix64 stream from the key's ints): what a branch starts from only sets how soon
    the probe makes it useful. (random.Random seeded by a string cost ~12 us an admission, at
    batch 64 a whole step's host work every few steps.)"""
    x, out, m = 0, [], len(pool)
    for k in key:
        x = ((x ^ k) * 0x100000001B3 + 0x9E3779B97F4A7C15) & _M64
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & _M64
        z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        z ^= z >> 31
        out.append([pool[(z >> 8) % m], pool[(z >> 36) % m]] if z & 1 else [pool[(z >> 8) % m]])
    return out


class SelfDraftState:
    """A sequence's own: its branches (the probe grows each by the target's next token), and
    how many of its emitted tokens were pushed into the context cache. The branches are
    drawn (first_branches, from what the sequence was admitted with) where first read: a
    grid step has no probe, nor has a run the controller keeps lean (drawn at each admission,
    they were ~1% of a b64 grid run on the host-charged clock, 12 us each on this CPU,
    bench-results/2026-12-02-grid-host-price)."""
    __slots__ = ("_branches", "_draw", "pushed")

    def __init__(self, key: tuple[int, ...], pool: list[int], n: int):
        self._branches: list[list[int]] | None = None
        self._draw = (key, pool, n)
        self.pushed = 0

    @property
    def branches(self) -> list[list[int]]:
        if self._branches is None:
            self._branches = first_branches(*self._draw)
        return self._branches

    @branches.setter
    def branches(self, value: list[list[int]]) -> None:
        self._branches = value


@dataclass
class SelfDraftProposal(Proposal):
    # the draft's first job_nodes nodes were made by job-cache candidates, the nodes up to
    # ctx_nodes by context-cache ones, the rest by corpus-cache ones (candidates' trie order)
    job_nodes: int = 0
    ctx_nodes: int = 0


JOB_PENDING = 4096   # texts waiting for the job cache at most (SelfDraftDrafter.job_pending)
CTX_PENDING = 256    # admitted prompts whose grams wait for the context cache at most


# a sequence's proposal in the controller's lean step (Drafter.idle; shared: never edited):
# the text of such steps is indexed into the context cache when a later step drafts (propose),
# not after each (in a lean stretch the grams cost a lean step ~10% over ar's at batch 64 on
# the simulated H100, for drafts nobody may make). So the grams come later and in another
# order, and the tail of a sequence that ends inside a lean stretch is not indexed; `fixed`
# never makes a lean step and indexes every step's text as it comes.
IDLE = SelfDraftProposal()
NO_PROBE = DraftTree.trusted([], [])   # (the probe of a step without branches: shared, as
# every proposal is, never edited)


class SelfDraftDrafter(Drafter):
    name = "self-draft"

    def __init__(self, params: SelfDraftParams = SelfDraftParams(), corpus=None,
                 corpus_id: str | None = None, vocab: int | None = None):
        """corpus: an object with lookup(context, limit) -> list of continuations (the
        CorpusCache of build-cache), or None. vocab: the model's (params.grid: the context
        table's size)."""
        self.prm = params
        self.corpus = corpus if params.corpus_cache else None
        self.corpus_id = corpus_id if self.corpus is not None else None
        self.vocab = vocab
        if params.grid and vocab is None:
            raise ValueError("self-draft grid: the model's vocabulary size is needed")
        # (a grid step's candidates are one gather from the table; the per-sequence path
        # reads it too, where a step cannot be a grid step: ContextTable.get)
        self.ctx = ContextTable(vocab, params.lru, params.gram) if params.grid else \
            ContextCache(params.lru, params.gram)
        # (on the grid the job cache's arrays, job_table.py: a step's lookups are one product
        # over the batch, not ~3 dict probes a sequence)
        job = JobTable if params.grid else JobCache
        self.job = job(JobCacheParams(cont_len=params.job_len)) if params.job_cache else None
        # texts for the job cache, indexed when a step next drafts (flush_job): a run the
        # controller keeps lean pays nothing for it (indexing 32 admitted prompts cost a
        # drain of 32 on the simulated H200 ~7% with every step lean); at most JOB_PENDING
        self.job_pending: list[list[int]] = []
        # a corpus continuation is cut to the length the step's rows were counted with
        glen = self.glen = getattr(self.corpus, "gram_len", params.gram)
        # (a branch starts at 1-2 tokens and is trimmed back to at least 2: max(L, 2))
        most = (params.branches * max(params.branch_len, 2) + params.context_cands * params.gram
                + params.corpus_cands * glen + self._job_draft())
        self.kv_headroom = -(-most // 16) * 16 + 16
        self.step_rows = 1 + most   # the pending token, candidates and branches
        self.finished_prompts = 0
        self.unindexed = False   # a lean step's text waits for the next drafting step (IDLE)
        # where the host runs beside the forward (overlapped), admitted prompts' grams and the
        # trims due at retirements wait for the next learning, under a forward (_settle):
        # made at once they were ~2% of a 64-sequence drain on the simulated H200 with every
        # step lean, outside the forward's shadow; at most CTX_PENDING prompts wait. On a
        # CPU they are made at once (made at a drafting step, they were timed as its cost:
        # Self-Draft at batch 1 on the CPU bench fell 1.19x -> 1.04x ar)
        self.ctx_pending: deque[list[int]] = deque(maxlen=CTX_PENDING)
        self.trim_due = False
        # where the candidates of accepted tokens came from, for the ablation report
        self.accepted_from = {"job": 0, "context": 0, "corpus": 0}

    def _job_draft(self) -> int:
        return self.prm.job_cands * self.prm.job_len if self.job is not None else 0

    def price(self) -> DraftPrice:
        """Its drafts are a trie of cache candidates; its branches a probe beside them. On a
        grid (runtime/step/grid.py): the context cache's chains, cut by node order, no probe."""
        p = self.prm
        if self.context_table is not None:
            return DraftPrice(max_draft=self.grid_cands * p.gram, tree=True, chain=p.gram)
        return DraftPrice(max_draft=p.context_cands * p.gram + p.corpus_cands * self.glen
                          + self._job_draft(),
                          tree=True,
                          probe=p.branches * p.branch_len)

    def fresh(self) -> "SelfDraftDrafter":
        return SelfDraftDrafter(self.prm, self.corpus, self.corpus_id, self.vocab)

    def signature(self) -> str:
        return f"{self.name}:{self.prm.tag()}:{self.corpus_id or 'no-corpus'}"

    # -- per-sequence life --------------------------------------------------------------------
    def admit(self, seq) -> None:
        p = self.prm
        seq.state = SelfDraftState((p.seed, seq.req.index, len(seq.req.answers)),
                                   seq.prompt_ids or [0], p.branches)
        if p.prompt_grams and p.context_cache:   # answers often reuse the prompt's phrases
            if self.overlapped:   # (under a forward: _settle)
                self.ctx_pending.append(seq.prompt_ids)   # (past CTX_PENDING the oldest go)
            else:
                self.ctx.push_texts([seq.prompt_ids])
        if self.job is not None:
            self._job_text(seq.prompt_ids)

    def retire(self, seq) -> None:
        self.finished_prompts += 1
        if self.finished_prompts % self.prm.trim_every == 0:
            if self.overlapped:   # (under a forward: _settle)
                self.trim_due = True
            else:
                self.ctx.trim(self.prm.trim_to)
        if self.job is not None and seq.out_ids:
            self._job_answer(seq.prompt_ids, seq.out_ids)

    def _job_answer(self, prompt_ids, answer_ids) -> None:
        # (with the prompt's tail: an answer's first tokens follow its prompt's last ones)
        self._job_text(list(prompt_ids[-self.job.prm.max_key:]) + list(answer_ids))

    def _job_text(self, ids) -> None:
        self.job_pending.append(ids)
        if len(self.job_pending) > JOB_PENDING:   # (a long lean stretch: the oldest go)
            del self.job_pending[0]

    def flush_job(self) -> None:
        """Index the texts waiting for the job cache, in the order they came."""
        self.job.add_many(self.job_pending)
        self.job_pending = []

    def learn_finished(self, prompt_ids, answer_ids) -> None:
        """What admitting and retiring a sequence with this prompt and answer teach the job
        cache (--resume: the answers already written, in order, as a batch-1 run learnt them)."""
        if self.job is not None:
            self._job_text(prompt_ids)
            if answer_ids:
                self._job_answer(prompt_ids, answer_ids)

    # -- one step -----------------------------------------------------------------------------
    def candidates(self, seq) -> tuple[list[tuple[int, ...]], int, int]:
        """(candidates in priority order, how many came from the job cache, how many from the
        context cache after them). The job cache's come first: a match of 2-8 tokens of
        context continued by the job's own text; the controller's budget (acceptance learnt
        per trie node) cuts them where they are seldom right."""
        p = self.prm
        tail = None
        if self.job is not None or (self.corpus is not None and p.corpus_cands):
            tail = last_tokens(seq, 8)
        cands = self.job.lookup(tail, p.job_cands) if self.job is not None else []
        n_job = len(cands)
        if p.context_cache:
            got = self.ctx.get(seq.pending, p.context_cands)
            cands += [c for c in got if c not in cands] if n_job else got
        n_ctx = len(cands) - n_job
        if self.corpus is not None and p.corpus_cands:
            seen = set(cands)
            for c in self.corpus.lookup(tail, p.corpus_cands):
                c = tuple(c[:self.glen])
                if c not in seen:
                    seen.add(c)
                    cands.append(c)
        return cands, n_job, n_ctx

    def idle(self, seqs, kv) -> list[SelfDraftProposal]:
        self.unindexed = True
        return [IDLE] * len(seqs)

    def observe_lean(self, seqs):
        """A lean step's text is indexed when a step next drafts (propose), or under the next
        forward where that is hidden. A context table takes a lean stretch's text at the next
        drafting step, in one push: its pushes cost a few array calls each, whatever their
        size (a push a lean step made the grid ~5% slower than ar at batch 64 on the
        host-charged clock, with the dict at par). Its text is due again now it is committed:
        a catch-up under this step's forward (Runner._prefetch, before the next step drafts)
        indexed only the steps before it, and without this step's tokens the next drafts
        missed ~1% of the context's accepted tokens (a review, 2026-11-30)."""
        self.unindexed = True
        return partial(self._settle, seqs) if self.overlapped and not self.prm.grid else None

    def catch_up(self, seqs, ahead: int = 0, beside: bool = False) -> None:
        """The text of lean steps since (IDLE) into the context cache, and finished answers
        into the job cache, before the next drafting step's proposals. Where the host runs
        beside the forward, admitted prompts' grams and trims wait, on a drafting step's path,
        for the next learning (a step's first grid drafts after 64 admissions paid ~0.2 ms for
        them at batch 64, host_profile); beside a forward (beside: the catch-up before a step
        that drafts, under the last forward or an admission's prefill) they are made now.
        Without that, a run's first grid steps on CUDA drafted with none of their prompts'
        grams: nothing else settles them before a grid step's own learning (a grid's lean
        steps leave no learning). Finished answers wait for a catch-up beside a forward too
        (indexing those that retired after a b64 grid step took ~20% of the next step's host
        in its plan), so the drafts of the step after their retirement miss them."""
        self._settle(seqs if self.unindexed else None, admitted=beside or not self.overlapped)
        self.unindexed = False
        if self.job_pending and (beside or not self.overlapped):
            self.flush_job()

    def _settle(self, seqs=None, admitted: bool = True) -> None:
        """The trim due since, then the admitted prompts' grams into the context cache, then
        seqs' lean steps' text: the order of the retirements, admissions and steps they wait
        for (a trim after them cut a prompt's grams to `trim_to` a key at once). Lean text is
        indexed by the next drafting step (catch_up), or by observe's, under the next forward
        (a drafting step after a lean stretch then finds it indexed, not its own work). The
        job cache's texts still wait for a drafting step (flush_job: ~0.5 ms a text on this
        CPU, more than a forward hides at batch 64 when several finish at once). admitted
        False: the trim and the prompts wait. (A grid step's text, grid_learned, waits for
        the next forward even past the retirements and admissions after it: it then comes
        after their trim and prompts, which changes only what is drafted.)"""
        if admitted and self.trim_due:
            self.ctx.trim(self.prm.trim_to)
            self.trim_due = False
        if admitted and self.ctx_pending:
            self.ctx.push_texts(list(self.ctx_pending))   # (in order, one pass)
            self.ctx_pending.clear()
        if seqs is not None and self.prm.context_cache:
            texts = [t for t in map(self._text_tail, seqs) if t]
            if texts:
                self.ctx.push_texts(texts)

    @property
    def context_table(self) -> ContextTable | None:
        """The table a grid step drafts from (params.grid, with candidates to draft), else
        None (runtime/step/grid.py)."""
        p = self.prm
        ok = isinstance(self.ctx, ContextTable) and p.context_cache and p.context_cands > 0
        return self.ctx if ok else None

    @property
    def job_table(self) -> JobTable | None:
        """The job cache whose match a grid step drafts first (JobTable.match, GridFill), else
        None."""
        return self.job if isinstance(self.job, JobTable) and self.prm.job_cands > 0 else None

    @property
    def grid_cands(self) -> int:
        """Chains a grid step drafts a sequence: the context cache's candidates."""
        return min(self.prm.context_cands, self.prm.lru)

    def grid_learned(self, seqs, accepted: int, drafts=None, verdicts=None):
        """A grid step's outcome (runtime/step/grid.py): its emitted text is pushed as grams
        by the function returned (as observe's), the accepted drafts counted as the job
        cache's where they came from its chain (drafts.job, GridDrafts': the first chain, and
        the verdicts' best), else as the context cache's. accepted: the drafts the answers
        kept (commit_grid's: none past where an answer ended), as each request's last accept
        length counts them."""
        job = 0 if drafts is None or drafts.job is None else \
            sum(s.req.accept_lengths[-1] for s, c, f in
                zip(seqs, verdicts.best, drafts.job.tolist()) if f and c == 0)
        self.accepted_from["job"] += job
        self.accepted_from["context"] += accepted - job
        return lambda: self._settle(seqs)

    def propose(self, seqs, kv, limits) -> list[SelfDraftProposal]:
        if any(r > 0 for r in limits.room):   # (the planner's done it, unless called apart)
            self.catch_up(seqs)
        out, room, branches = [], limits.room, self.prm.branches
        for i, s in enumerate(seqs):
            r = room[i]
            if r <= 0:   # an ar step (the controller's budget 0, or the answer's last token)
                out.append(SelfDraftProposal())
                continue
            cands, n_job, n_ctx = self.candidates(s)
            sizes: list[int] = []
            draft = build_trie(cands, r, sizes)
            probe = NO_PROBE
            fit = limits.probe_room(i, len(draft.tokens)) if branches else 0
            if fit:   # (cut to the KV rows left: observe skips a branch cut short)
                probe = branch_probe(s.state.branches)
                if fit < len(probe.tokens):
                    probe = probe.prefix(fit)
            # nodes made by the job's and the context cache's candidates (first in the trie)
            n = n_job + n_ctx
            out.append(SelfDraftProposal(draft, probe, job_nodes=sizes[n_job - 1] if n_job else 0,
                                         ctx_nodes=sizes[n - 1] if n else 0))
        return out

    def observe(self, seqs, proposals, verdicts, probe_out):
        """A step's verdicts and probe outputs: each branch grows now (the next step probes
        it); the grams they and the emitted text make go into the context cache by the
        function returned (None: nothing to push), which the runner may call a step later,
        under the next forward (Runner.under_forward)."""
        if all(pr is IDLE for pr in proposals):   # (a lean step's, from the base's idle)
            return self.observe_lean(seqs)
        p = self.prm
        ctx, keep = p.context_cache, p.branch_len
        made: list = []   # (tokens, a branch's predictions or None: text), in push order
        for s, pr, v, out in zip(seqs, proposals, verdicts, probe_out):
            if v.accepted:   # (the candidate that made the path's deepest node)
                last = v.accepted[-1]
                src = ("job" if last < pr.job_nodes else "context" if last < pr.ctx_nodes
                       else "corpus")
                # (the drafts its answer kept, as the step's commit counted them: none past
                # where it ended)
                kept = s.req.accept_lengths
                self.accepted_from[src] += min(len(v.accepted), kept[-1]) if kept else \
                    len(v.accepted)
            if out is not None and pr.probe.tokens:
                at = 0
                for br in s.state.branches:
                    n = len(br)
                    d = out[at:at + n]
                    at += n
                    if len(d) < n:    # the probe was cut to fit the context
                        continue
                    if ctx:
                        made.append((br[:], d))
                    br.append(d[-1])
                    if n >= keep:
                        del br[0]
            if p.context_cache and pr is not IDLE:
                tail = self._text_tail(s)
                if tail:
                    made.append((tail, None))
        if not made and not self.ctx_pending and not self.trim_due:
            return None

        def learn():   # (the admissions' and retirements' waiting work first: _settle)
            self._settle()
            if made:
                self.ctx.push_many(self._grams(made))
        return learn

    def _grams(self, made) -> list:
        """The context grams of observe's branches (each window of G branch tokens and the
        target's prediction after its last) and texts (each window of G + 1 tokens)."""
        g, grams = self.prm.gram, []
        for toks, d in made:
            if d is None:
                grams += [(toks[j], tuple(toks[j + 1:j + g + 1])) for j in range(len(toks) - g)]
            else:
                grams += [(toks[k - g], (*toks[k - g + 1:k], d[k - 1]))
                          for k in range(g, len(toks) + 1)]
        return grams

    def _text_tail(self, s) -> list[int] | None:
        """The emitted text not yet pushed as grams, with the G tokens before it (the
        prompt's tail first), marked pushed; None when it makes no gram."""
        g, out = self.prm.gram, s.out_ids
        need = len(out) - s.state.pushed + g   # windows of g + 1 tokens ending in a new token
        if need <= g:
            return None
        # (the tail only: copying the whole answer every step grows with its length)
        tail = out[-need:] if len(out) >= need else s.prompt_ids[len(out) - need:] + out
        s.state.pushed = len(out)
        return tail
