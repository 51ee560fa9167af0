"""A drafting step as array operations over the batch (issue 52: a Self-Draft drafting step
whose host work does not grow in Python with the batch; bench-results/2026-11-29-drafting-host):
the context cache's candidates as C chains of G tokens below each sequence's pending token,
one layout for every sequence.

    root, chain 0 (G nodes), chain 1, ... chain C-1:   n = 1 + C G rows a sequence

Its positions, mask and parents are a template made once; its tokens are one gather from the
context table's rows on the step's device, made in its forward (GridFill: inside the captured
graph on a GPU, where the host then stages a row a sequence, as for `ar`, and reads no
candidate; speculative/context_table.py); greedy verification keeps, per chain, the prefix
that agrees with the target's own argmax, and takes the longest chain (the first on a tie: tied
chains emit the same tokens, the target's). A candidate its key lacks, or a node deeper than
the sequence's room, is never accepted; its slot still holds some token, which is safe: an
accepted draft equals the target's own token whatever it came from. So the step emits exactly
`ar`'s text, and what it does a sequence in Python is what `ar`'s step does: read its tokens
and emit them.

Verification and the KV moves are tensor operations on the step's device (device_step: 41
launches at any batch, none reading a value back; on CUDA one Triton kernel, grid_kernel.py,
as each launch costs a GPU's host), queued behind the forward on a GPU; the
host then reads one [B, G + 5] result, as `ar` reads its [B] tokens. The drafter's learning
from the step (its text into the table) reads no slot: it waits for the next forward even
where a sequence ended (Runner.step).

The price of one layout for every sequence and step: a chain costs more rows than the trie
the per-sequence path merges the same candidates into (~20% on the demo model, shape.py
there), and a sequence without candidates still runs its C G rows. Where the budgets fit in
one chain, the chain is only as deep as the most any sequence may accept (a drain's first
drafting step at batch 64 ran 5 rows a sequence for budgets of 1-3, padded to 8 on a graph).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from specctl.engine.batch import ForwardBatch
from specctl.engine.kv import KVCache
from specctl.speculative.context_table import ContextTable
from specctl.speculative.job_table import JobTable
from specctl.speculative.drafter import Proposal
from specctl.speculative.verify import DraftTree, Verdict


def chain_layout(C: int, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(depth [n], ancestors [n, n] bool, parents [n]) of a root and C chains of G nodes below
    it, n = 1 + C G: node j of chain c is row 1 + c G + j, at depth j + 1, its parent the row
    before it (a chain's first node's: the root, row 0; the root's: itself), and it sees the
    root, the nodes of its chain up to itself, and nothing else new."""
    n = 1 + C * G
    depth = np.concatenate([[0], np.tile(np.arange(1, G + 1), C)]).astype(np.int64)
    anc = np.zeros((n, n), dtype=bool)
    anc[:, 0] = True
    for c in range(C):
        for j in range(G):
            r = 1 + c * G + j
            anc[r, 1 + c * G:r + 1] = True
    parents = np.maximum(np.arange(n) - 1, 0)
    parents[1::G] = 0
    return depth, anc, parents


def verify_chains(cands: torch.Tensor, usable: torch.Tensor,
                  target: torch.Tensor) -> torch.Tensor:
    """cands [B, C, G] drafts, usable [B, C, G] which of them may be accepted, target [B, n]
    the target's argmax after the root and after each node, all on the step's device: [B,
    G + 3] there, each sequence's (accepted, the chain they come from, the emitted tokens:
    the accepted drafts, then the target's token after the last, then anything). A fixed
    number of tensor operations at any batch, none of which reads a value back."""
    B, C, G = cands.shape
    chains = target[:, 1:].view(B, C, G)
    after = torch.cat([target[:, :1, None].expand(B, C, 1), chains[:, :, :G - 1]], dim=2)
    lens = ((cands == after) & usable).long().cumprod(dim=2).sum(dim=2)   # [B, C]
    best = lens.argmax(dim=1, keepdim=True)                               # (the first longest)
    acc = lens.gather(1, best)
    drafts = cands.gather(1, best[:, :, None].expand(B, 1, G))[:, 0]
    bonus = target.gather(1, torch.where(acc > 0, best * G + acc, 0))    # (the root's: 0)
    out = torch.cat([drafts, torch.zeros_like(acc)], dim=1).scatter(1, acc, bonus)
    return torch.cat([acc, best, out], dim=1)


_ZEROS: dict[tuple[int, int], np.ndarray] = {}


def _zeros(B: int, n: int) -> np.ndarray:
    """[B, n] zeros, made once a shape (read-only: copied into each step's rows)."""
    z = _ZEROS.get((B, n))
    if z is None:
        z = _ZEROS[B, n] = np.zeros((B, n), dtype=np.int64)
        z.flags.writeable = False
    return z


CANDS = 6   # up's first candidate column: slot, committed rows, pending token, room, budget,
            # held (GridDrafts.host), then the candidates


@dataclass(frozen=True)
class GridDrafts:
    """A grid step's drafts (GridStep.plan): C chains of G nodes a sequence; `host`, the row
    a sequence that the device's verification and moves read (up), as the host stages it: its
    slot, committed rows, pending token, room, budget, and whether its first chain is the job
    cache's (then that chain in the next G columns); the forward writes each row's C G
    candidates from column CANDS, then per chain its allowed slots (the first so many nodes
    its room and budget allow), and its chains held over the job flag (GridFill). A paged
    cache's block-table entries follow the allowed slots (`tables_at`; a contiguous cache's,
    its slot, is column 0). `job`, with a job cache, which sequences' first chain is its (what
    the drafter's report counts)."""
    C: int
    G: int
    host: np.ndarray
    job: np.ndarray | None = None   # [B] whether its first chain is the job cache's
    tables_at: int = 0

    @classmethod
    def make(cls, seq: np.ndarray, C: int, G: int, chains: np.ndarray | None = None,
             allowed: np.ndarray | None = None, tables: np.ndarray | None = None,
             job: np.ndarray | None = None) -> "GridDrafts":
        """seq [6, B]: slots, committed rows, pending tokens, rooms, budgets (C G: none),
        held (0; with a job cache, whether its first chain is the job's); chains [B, C G]
        (where the host gives them: the job cache's first G, or, with allowed [B, C] too, all
        of them, a test's); tables [B, blocks] (a paged cache's: the step's rows' block-table
        entries). Host work a step: one transpose view, without a job cache or a paged cache."""
        host, at = seq.T, 0
        if chains is not None or tables is not None:
            B = seq.shape[1]
            rest = [seq.T] + ([] if chains is None else [chains])
            if tables is not None:   # (after the candidates and allowed slots)
                rest += [] if allowed is not None else \
                    [_zeros(B, C * G - (0 if chains is None else chains.shape[1]) + C)]
                at = CANDS + C * G + C
                rest.append(tables)
            if allowed is not None:
                rest.insert(2, allowed)
            host = np.concatenate(rest, axis=1)
        return cls(C, G, host, job, at)

    @cached_property
    def allowed(self) -> np.ndarray:
        """[B, C] each chain's allowed slots (as the forward works them out, GridFill: made
        where asked for, by the controller and the accounting)."""
        room, budget = self.host[:, 3:4], self.host[:, 4:5]
        return np.maximum(np.minimum(np.minimum(room, self.G),
                                     budget - np.arange(self.C) * self.G), 0)


class GridFill:
    """A grid step's candidates gathered in its forward, on the step's device, from the
    context table's rows there (ContextTable.device_rows): an in-graph gather, not host work
    before the launch (a b64 step's candidates, their packing and upload took ~110 us of its
    host in a run on a CPU, bench-results/2026-12-03-grid-fill). The forward calls it with
    `up` (GridDrafts.host's rows, staged into a buffer at least CANDS + 2 C G + 1 wide) and an
    index (index()); it writes each sequence's candidates, allowed slots and chains held into
    up, which the verification reads after it, and returns the step's tokens. Where a
    sequence's first chain is the job cache's (up's held column staged 1), that chain is kept
    and the context's move down one, the last dropped (JobTable.match)."""

    def __init__(self, ready: torch.Tensor, G: int):
        self.ready, self.G = ready, G   # ([V + 1, 1 + R G] the table's rows; its chain length)
        self.key = ("grid-fill", tuple(ready.shape), G)   # (a graph's: its shape)
        self._index: dict[tuple, np.ndarray] = {}

    @staticmethod
    def width(C: int, G: int, w: int) -> int:
        """The columns of a buffer the gather writes rows w wide into (GridDrafts.host's),
        their last unread (its `dump`)."""
        return max(w, CANDS + C * G + C) + 1

    def index(self, C: int, G: int, n: int, dump: int) -> np.ndarray:
        """[6 (n - 1) + 1] of a step of C chains of G in rows of n tokens a sequence (padded
        where n > 1 + C G) whose `up` buffer's column `dump` no one reads: for each token after
        the pending one, its column of a table row; 1 where a sequence with the job's first
        chain reads it one chain lower (chains past the first); 1 where that sequence keeps
        up's value (the first chain's); its column of up; for each chain (the first C of
        n - 1), its allowed column of up and its first node; then G. Padding tokens gather
        what the last candidate does and land in `dump`, as do chains past C. Made once a
        shape (shared: never edited)."""
        key = (C, G, n, dump)
        got = self._index.get(key)
        if got is None:
            at = np.arange(n - 1)
            real, chain = at < C * G, at < C
            k = np.minimum(at, C * G - 1)   # (padding: the last candidate's)
            got = self._index[key] = np.concatenate(
                [1 + k // G * self.G + k % G, k >= G, real & (k < G),
                 np.where(real, CANDS + k, dump), np.where(chain, CANDS + C * G + at, dump),
                 at * G, [G]]).astype(np.int64)
        return got

    def __call__(self, up: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
        """[B, n] the step's tokens (each sequence's pending one, then its candidates), its
        candidates, allowed slots and chains held written into up (index: index()'s, on up's
        device). A fixed set of tensor operations, none reading a value back."""
        m, B = n - 1, up.shape[0]
        src, down, keep, dst, acol, first = index[:6 * m].view(6, m)
        G = index[6 * m:]
        pending, job = up[:, 2], up[:, 5:6]   # (job: 1 where its first chain is the job's)
        rows = self.ready.index_select(0, pending).long()   # [B, 1 + R G]: held, then chains
        vals = rows.gather(1, src - job * down * self.G)
        to = dst.expand(B, m)
        vals = torch.where((job * keep).bool(), up.gather(1, to), vals)
        # each chain's allowed slots: its nodes within the room and the budget
        allowed = torch.minimum(torch.minimum(up[:, 3:4], G), up[:, 4:5] - first).clamp(min=0)
        up.scatter_(1, to, vals)
        up.scatter_(1, acol.expand(B, m), allowed)
        up[:, 5:6] = rows[:, :1] + job   # (its chains held: the job's first, if any, too)
        return torch.cat([pending[:, None], vals], dim=1)


class GridProposals(Sequence):
    """The step's proposals as the controller and the accounting read them (a draft of so many
    nodes, no probe, no confidence stop), made one at a time where they are asked for: the
    step itself never makes them. Their size is the slots the budget allowed, with or without
    a candidate: the step runs every one of them, so the controller learns what a slot of the
    grid is worth (an empty one accepts nothing), not only a candidate's (counting candidates
    alone, one b64 run expected 1.7x the tokens its drafting steps gave, and lost)."""

    def __init__(self, drafts: GridDrafts):
        self._drafts = drafts   # (its allowed slots summed where first asked for: a run
        self._sizes = None      # without a controller never reads them)

    @property
    def sizes(self) -> list[int]:
        if self._sizes is None:
            self._sizes = self._drafts.allowed.sum(axis=1).tolist()
        return self._sizes

    def __len__(self) -> int:
        return len(self._drafts.host)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Proposal(DraftTree.trusted([0] * self.sizes[i], [-1] * self.sizes[i]))


class GridVerdicts(Sequence):
    """The step's verdicts, made one at a time where they are asked for. A verdict's accepted
    nodes are numbered as the controller learns them: the sequence's allowed slots chain after
    chain (GridProposals' sizes), so its chain's first node is the slots before it (`start`:
    c G where room lets every chain be whole)."""

    def __init__(self, rows: list[list[int]]):
        """rows: device_step's result a sequence (one read-back, one tolist of its rows as
        they lie: no transpose): its accepted drafts a, best chain, start, drafts it could
        accept (`drafted`), then its emitted tokens from column 4 (its first a + 1: the
        accepted drafts, then the target's token after the last)."""
        self.rows = rows

    def _col(self, k: int) -> list[int]:
        return [r[k] for r in self.rows]

    acc = property(lambda self: self._col(0))
    best = property(lambda self: self._col(1))
    start = property(lambda self: self._col(2))
    drafted = property(lambda self: self._col(3))

    @property
    def accepted(self) -> list[list[int]]:
        """Each sequence's accepted nodes (its Verdict's), all at once (Controller.observe)."""
        return [list(range(r[2], r[2] + r[0])) if r[0] else [] for r in self.rows]

    @property
    def out(self) -> list[list[int]]:
        """The emitted tokens by column, out[j][i] the j-th of sequence i."""
        return [list(c) for c in zip(*self.rows)][4:]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a, _, c = self.rows[i][:3]
        return Verdict(list(range(c, c + a)), self.rows[i][4 + a])


class GridStep:
    """Self-Draft's drafting step over a batch, from a context table (greedy): its plan on
    the host (sizes, room and budgets; the candidates are gathered in its forward, GridFill),
    then on the step's device its verification and its KV moves (device_step, behind the
    forward: nothing read back), then one read of [B, G + 5] (verify); its commit
    (runtime/step/commit.py, commit_grid) only counts the rows kept."""

    kernel: bool | None = None   # verify and move in one Triton launch (grid_kernel.py; None: on
    # CUDA, where Triton is there)

    def __init__(self, table: ContextTable, cands: int, kernel: bool | None = None,
                 job: JobTable | None = None):
        self.table, self.C, self.G = table, min(cands, table.R), table.G
        self.job = job   # (the job cache's first chain: JobTable.match; plan's tails)
        self._layouts: dict[tuple[int, int], tuple] = {}
        self._fill: GridFill | None = None   # (fill(): the table's rows on the step's device)
        if kernel is not None:
            self.kernel = kernel

    def _kernel(self, device: torch.device):
        """grid_kernel, where verification runs there on `device`, else None."""
        if self.kernel is False or (self.kernel is None and device.type != "cuda"):
            return None
        try:
            from specctl.runtime.step import grid_kernel
        except ImportError:   # (no Triton: the tensor operations, as on a CPU)
            if self.kernel:
                raise
            return None
        return grid_kernel

    def warm(self, kv) -> None:
        """Where verification is a kernel on kv's device: compiled now, as a run starts (not
        in its first drafting step), and checked against the tensor operations on a few
        random sequences in a scratch cache of kv's rows; where it fails or differs, the
        tensor operations verify, and a warning says so."""
        kernel = self._kernel(kv.k_all.device)
        if kernel is None or not kernel.fits(kv):
            return
        try:
            why = None if self._agrees(kernel, kv) else "differs from its tensor operations"
        except Exception as e:   # (a compiler or driver that cannot run it)
            why = f"failed ({type(e).__name__}: {e})"
        if why is not None:
            warnings.warn(f"self-draft grid: its CUDA kernel {why}; verifying with those")
            self.kernel = False

    def _agrees(self, kernel, kv) -> bool:
        """The kernel's verdicts and moves equal the tensor operations' on random drafts that
        often agree with their target (tests/test_grid_kernel.py tries many more)."""
        rng, B, C, G = np.random.default_rng(0), 4, self.C, self.G
        dev, (L, _, heads, dim) = kv.k_all.device, kv.k_all.shape
        seq = np.array([np.arange(B), rng.integers(0, 4, B), rng.integers(0, 2, B),
                        np.zeros(B), np.zeros(B), rng.integers(0, C + 1, B)], dtype=np.int64)
        drafts = (seq, C, G, rng.integers(0, 2, (B, C * G)), rng.integers(0, G + 1, (B, C)))
        target = torch.from_numpy(rng.integers(0, 2, B * (1 + C * G))).to(dev)
        keys = torch.randn(min(L, 2), B * (8 + C * G), heads, dim,
                           generator=torch.Generator().manual_seed(0)).to(kv.k_all)
        got = []
        for k in (kernel, None):
            scratch = KVCache(len(keys), B, 8 + C * G, heads, dim, kv.k_all.dtype, dev)
            scratch.k_all.copy_(keys)
            scratch.v_all.copy_(-keys)
            d = GridDrafts.make(*drafts)
            up = torch.from_numpy(d.host).to(dev)
            res = k.verify(up, target, C, G, d.tables_at, scratch, (C, G)) if k else \
                self._tensors(d, target, scratch, up)
            got.append((res, scratch.k_all, scratch.v_all))
        return all(torch.equal(a, b) for a, b in zip(*got))

    def layout(self, C: int, G: int) -> tuple[np.ndarray, ...]:
        """(depth [n], ancestors [n, n], parents [n]) of C chains of G nodes: made once (a
        step's plan makes as few numpy calls as it can)."""
        got = self._layouts.get((C, G))
        if got is None:
            got = self._layouts[C, G] = chain_layout(C, G)
            for a in got:   # (read-only: shared by every step of this shape)
                a.flags.writeable = False
        return got

    def fill(self, device) -> GridFill:
        """The step's in-forward gather (GridFill), from the table's rows on `device`."""
        rows = self.table.device_rows(device)
        if self._fill is None or self._fill.ready is not rows:
            self._fill = GridFill(rows, self.table.G)
        return self._fill

    def plan(self, slots: list[int], lens: list[int], pending: list[int], room: list[int],
             budget: list[int] | None, kv, device,
             tails: np.ndarray | None = None) -> tuple[ForwardBatch, GridDrafts]:
        """The step's batch and drafts: each sequence's C newest candidates (C: enough chains
        for the largest budget, at most the drafter's), accepted no deeper than its room and,
        chain after chain, within its budget of nodes (None: every node); its forward gathers
        them (GridFill). (Few numpy calls, each over the whole batch: in a run, between two
        CPU forwards, each costs ~5x what it costs warm, bench-results/2026-11-30-grid-host.)"""
        G = self.G
        C = self.C if budget is None else max(1, min(self.C, -(-max(budget) // G)))
        if C == 1:   # (one chain: as deep as some sequence may accept, no deeper; a budget of
            # 2 runs 3 rows a sequence, not 1 + G, which the padded shape would round up to 8)
            reach = max(room) if budget is None else max(map(min, budget, room))
            G = max(1, min(G, reach))
        depth, anc, parents = self.layout(C, G)
        B = len(slots)
        zero = [0] * B
        seq = np.array((slots, lens, pending, room, [C * G] * B if budget is None else budget,
                        zero), dtype=np.int64)
        first = job = None
        if self.job is not None and tails is not None:
            first, job = self.job.match(tails, G)   # (its first chain: staged, GridFill)
            seq[5] = job
        # (the block-table entries of every row the step writes: a paged cache's; a
        # contiguous cache's is the slot's one block, its number: column 0)
        tables = kv.table_rows(slots, -(-(max(lens) + 1 + C * G) // kv.block)) if kv.paged \
            else None
        drafts = GridDrafts.make(seq, C, G, first, None, tables, job)
        return ForwardBatch.grid(slots, lens, drafts.host, C, G, self.fill(device), depth, anc,
                                 parents, device), drafts

    def device_step(self, drafts: GridDrafts, target: torch.Tensor, kv,
                    up: torch.Tensor) -> torch.Tensor:
        """On the step's device, issued behind the forward and read back by nobody here: the
        verdicts ([B, G + 5]: verify_chains' accepted and best chain, the allowed slots
        before that chain, the drafts it could accept, then its emitted tokens), and each
        sequence's best chain's rows moved below its root (all G of them, whatever was
        accepted: rows past what commit keeps are garbage the next forward overwrites; the
        first chain's move onto itself). up: the drafts' rows as the forward filled them
        (ForwardBatch.filled). A fixed number of tensor operations at any batch
        (tests/test_grid.py counts them); on CUDA one Triton launch (grid_kernel.py)."""
        kernel = self._kernel(up.device)
        if kernel is not None and kernel.fits(kv):   # (one launch, not 41)
            return kernel.verify(up, target.view(-1), drafts.C, drafts.G, drafts.tables_at, kv,
                                 (self.C, self.G))
        return self._tensors(drafts, target, kv, up)

    def _tensors(self, drafts: GridDrafts, target: torch.Tensor, kv,
                 up: torch.Tensor) -> torch.Tensor:
        """device_step as tensor operations."""
        C, G = drafts.C, drafts.G
        B, n = up.shape[0], C * G
        at = torch.arange(1 + n, device=up.device)
        k = CANDS
        allowed = up[:, k + n:k + n + C]
        lim = allowed * (at[:C] < up[:, 5:6])   # (usable: a held chain's)
        res = verify_chains(up[:, k:k + n].view(B, C, G), at[:G] < lim[:, :, None],
                            target.view(B, 1 + n))
        best = res[:, 1:2]
        start = (allowed.cumsum(1) - allowed).gather(1, best)   # (GridVerdicts' numbering)
        rows = up[:, 1:2] + at                                      # [B, 1 + n] the step's
        # (its block-table entries, and columns no one reads after them; a contiguous cache's:
        # its slot, column 0)
        tables, block = up[:, drafts.tables_at:], kv.block
        stored = tables.gather(1, rows // block) * block + rows % block   # (their storage)
        kv.copy_rows(stored[:, 1:1 + G], stored.gather(1, at[1:1 + G] + best * G))
        return torch.cat([res[:, :2], start, lim.sum(1, keepdim=True), res[:, 2:]], dim=1)

    def verify(self, drafts: GridDrafts, target: torch.Tensor, kv,
               up: torch.Tensor) -> GridVerdicts:
        """The step's verdicts from the target's argmax over its rows (a tensor: device_step,
        then the step's one read-back)."""
        return GridVerdicts(self.device_step(drafts, target, kv, up).cpu().tolist())
