"""The packed (unpadded) batch of one forward, and the layer plan.

All new tokens of all sequences in a step are packed into one flat sequence of T tokens, T being
the sum of the sequences' real token counts (EMS-SD's unpadded inputs). Per token we keep its
position (for RoPE), its slot in the KV cache and the cache row it writes; per sequence its number
of committed (prefix) rows and a mask among its new tokens (`local`).

Worked example, two sequences in one step:

    seq A: slot 3, prefix 7, new tokens [a0]                 (a plain decode step)
    seq B: slot 0, prefix 4, new tokens [b0 b1 b2],          (a root and two sibling drafts)
           parents = [-1, -1]    b1 and b2 are both children of b0, so both sit at
                                 position 5 and see b0 but not each other:
           local   = [[1,0,0],
                      [1,1,0],
                      [1,0,1]]
    tokens    = [a0, b0, b1, b2]      positions = [7, 4, 5, 5]
    slots     = [3, 0, 0, 0]          rows      = [7, 4, 5, 6]   (rows = prefix + index)
    cu_seqlens = [0, 1, 4]

A token attends to all committed rows of its slot and to the new tokens of its own sequence that
its mask allows (default: causal among the new tokens). A step's trees are laid out together,
where an eager forward reads them (tree_layout: every tree's ancestors and depths as array
operations over the batch), or by a captured graph on the device from each row's parent
(tree_closure, engine/graphs.py): then the host only checks that every parent precedes its node
(tree_nodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain

import numpy as np
import torch


@dataclass(frozen=True)
class SeqInput:
    """One sequence's share of a forward: by default its new tokens are a chain (causal, at
    prefix_len + index); `parents` makes them a draft tree below the first (speculative/verify.py:
    parents[j] is node j's parent among tokens[1:], -1 = tokens[0]); `positions` and `mask`
    set both by hand (any mask with its diagonal)."""
    slot: int
    tokens: list[int]
    prefix_len: int
    positions: list[int] | None = None   # default: prefix_len + arange(n), or + depth (trees)
    mask: torch.Tensor | None = None     # [n, n] bool among the new tokens; default causal
    parents: list[int] | None = None     # a tree's n - 1 parents (checked by ForwardBatch)

    def __post_init__(self):
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a sequence in a batch needs at least one new token")
        if self.positions is not None and len(self.positions) != n:
            raise ValueError("positions must have one entry per new token")
        if self.parents is not None:
            if self.positions is not None or self.mask is not None:
                raise ValueError("a tree's parents set its positions and mask")
            if len(self.parents) != n - 1:
                raise ValueError("a tree needs one parent per token after the first")
        if self.mask is not None:
            if tuple(self.mask.shape) != (n, n) or self.mask.dtype != torch.bool:
                raise ValueError(f"mask must be bool [{n}, {n}], got {self.mask.dtype} "
                                 f"{tuple(self.mask.shape)}")
            m = self.mask   # (a host mask is checked in numpy: a torch op costs ~20 us)
            if not (m.numpy() if m.device.type == "cpu" else m).diagonal().all():
                raise ValueError("every token must attend to itself (mask diagonal)")


ROWS_NODES = 240   # where tree_layout's two ways cost about the same: at 8 trees of 15 nodes
# the bit rows took 27 us warm and 45 after a forward's worth of cache traffic, the arrays 54
# and 84; at 16 x 15, 52 / 87 against 59 / 98; at 32 x 8, 70 / 94 against 49 / 93
# (bench-results/2026-11-30-plan-host/layout.txt; it was 96)


class BadTree(ValueError):
    """Tree `tree` of a layout has a node whose parent does not precede it."""

    def __init__(self, tree: int, node: int, parent: int):
        super().__init__(f"draft tree node {node}: its parent {parent} must precede it")
        self.tree = tree


def tree_layout(parents: list[list[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Trees of at most n tokens each (token 0 the root, parents[b][j] the parent of token
    j + 1 among tokens 1.., -1 = the root), all at once: (ancestors [B, n, n] bool, each token
    seeing itself and its ancestors; depth [B, n], the root's 0). Padding past a tree's end
    sees itself only. Raises BadTree unless every parent precedes its node.
    Up to ROWS_NODES nodes in all: a Python bit row per node (~0.2-0.35 us a node, the
    per-sequence drafting steps below batch 32 take it); more: the nodes flat, each walked
    up to the root one level a pass, only those not there yet (~40 us + ~0.04 us a node: at
    64 Self-Draft trees of 50 tokens 0.17 ms against 0.25 by pointer steps over the padded
    [B, n] grid, 0.8 by rows)."""
    if sum(map(len, parents)) <= ROWS_NODES:
        return _layout_rows(parents, n)
    B = len(parents)
    lens = np.fromiter(map(len, parents), np.int64, B)
    N = int(lens.sum())
    flat = np.fromiter(chain.from_iterable(parents), np.int64, N)
    start = np.zeros(B, np.int64)   # each tree's first node in `flat`
    np.cumsum(lens[:-1], out=start[1:])
    tree = np.repeat(np.arange(B), lens)
    node = np.arange(N) - start[tree]   # j: the tree's node j, its token j + 1
    bad = np.flatnonzero((flat < -1) | (flat >= node))
    if len(bad):
        i = int(bad[0])
        raise BadTree(int(tree[i]), int(node[i]), int(flat[i]))
    up = np.where(flat >= 0, flat + start[tree], -1)   # the parent's index in `flat`, or -1
    anc = np.zeros((B, n, n), dtype=bool)
    anc.reshape(B, n * n)[:, ::n + 1] = True   # (each token sees itself)
    cells = anc.reshape(-1)
    row = tree * (n * n) + (node + 1) * n      # each node's row of `anc`, flat
    cells[row] = True                          # (and the root)
    depth = np.ones(N, np.int64)
    at = np.flatnonzero(up >= 0)   # nodes with an ancestor below the root, and that ancestor
    cur = up[at]
    while len(at):
        depth[at] += 1
        cells[row[at] + node[cur] + 1] = True
        cur = up[cur]
        keep = cur >= 0
        at, cur = at[keep], cur[keep]
    out = np.zeros((B, n), dtype=np.int64)
    out.reshape(-1)[tree * n + node + 1] = depth
    return anc, out


def _layout_rows(parents: list[list[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """tree_layout of a few trees: each token's ancestors as the bits of a Python int."""
    nb = -(-n // 8)
    out = bytearray()
    depth = np.zeros((len(parents), n), dtype=np.int64)
    for b, ps in enumerate(parents):
        bits, dep = [1], [0]
        for j, p in enumerate(ps, 1):
            if not -1 <= p < j - 1:
                raise BadTree(b, j - 1, p)
            bits.append(bits[p + 1] | (1 << j))
            dep.append(dep[p + 1] + 1)
        bits += [1 << j for j in range(len(bits), n)]
        out += b"".join(x.to_bytes(nb, "little") for x in bits)
        depth[b, :len(dep)] = dep
    rows = np.frombuffer(bytes(out), np.uint8).reshape(len(parents), n, nb)
    return np.unpackbits(rows, axis=2, count=n, bitorder="little").view(bool), depth


def tree_nodes(parents: list[list[int]], which: list[int]) -> tuple:
    """Every node of some trees (tree t: the batch's sequence which[t], parents[t] its nodes'
    parents) as (its sequence, its row: its index among the nodes + 1, its parent's row: the
    root's 0), three lists up to ROWS_NODES nodes (a Python pass: ~3 us warm for 48 nodes,
    ~15 after a forward's cache traffic, where numpy's nine calls took 8 and ~50), arrays past
    them. Raises BadTree (naming the sequence) unless every parent precedes its node, so what
    a replay lays out on the device (tree_closure) is a tree."""
    if sum(map(len, parents)) <= ROWS_NODES:
        b: list[int] = []
        rows: list[int] = []
        up: list[int] = []
        for t, ps in zip(which, parents):
            for j, p in enumerate(ps):
                if not -1 <= p < j:
                    raise BadTree(t, j, p)
            b += [t] * len(ps)
            rows += range(1, len(ps) + 1)
            up += [p + 1 for p in ps]
        return b, rows, up
    lens = np.fromiter(map(len, parents), np.int64, len(parents))
    N = int(lens.sum())
    p = np.fromiter(chain.from_iterable(parents), np.int64, N)
    b = np.repeat(np.asarray(which, np.int64), lens)
    j = np.arange(N) - np.repeat(np.cumsum(lens) - lens, lens)
    bad = np.flatnonzero((p < -1) | (p >= j))
    if len(bad):
        i = int(bad[0])
        raise BadTree(int(b[i]), int(j[i]), int(p[i]))
    return b, j + 1, p + 1


def tree_closure(par: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tree_layout on the device, for a captured graph (CudaGraphs): par [B, n] each row's
    parent row (a row of its own: a root, seeing only itself) -> (ancestors [B, n, n] bool,
    each row seeing itself and its ancestors; depth [B, n]). Each doubling adds the ancestors
    of a row's 2^k-th ancestor (then ancestors as far as 2^(k + 1) are known): ceil(log2(n - 1))
    of them reach the deepest a row of n can be, a fixed number of tensor operations, nothing
    read back."""
    B, n = par.shape
    anc = torch.eye(n, dtype=torch.bool, device=par.device).expand(B, n, n).clone()
    anc.scatter_(2, par[:, :, None], True)
    up, k = par, 1
    while k < n - 1:
        anc |= anc.gather(1, up[:, :, None].expand(B, n, n))
        up = up.gather(1, up)
        k *= 2
    return anc, anc.sum(2) - 1


@dataclass(frozen=True)
class LayerPlan:
    """Which blocks a forward runs.

    Layers [start, end) run; an attention block of layer i is skipped when i in skip_attn, an MLP
    block when i in skip_mlp (a skipped block returns its residual input unchanged). With
    start > 0 the forward starts from given hidden states of layer `start` (the residual stream
    entering that layer). `capture` names a layer whose input hidden states are returned too.
    """
    start: int = 0
    end: int | None = None
    skip_attn: frozenset[int] = field(default_factory=frozenset)
    skip_mlp: frozenset[int] = field(default_factory=frozenset)
    capture: int | None = None

    def run(self, x, end: int, attn, mlp):
        """Layers [start, end) over the residual stream x: attn(i, x) and mlp(i, x) each give
        x after that block, unless it is skipped. Returns x, or (x, the input of layer
        `capture`) when capture is set (the forward's contract, whatever its kernels)."""
        captured = None
        for i in range(self.start, end):
            if i == self.capture:
                captured = x
            if i not in self.skip_attn:
                x = attn(i, x)
            if i not in self.skip_mlp:
                x = mlp(i, x)
        if self.capture is not None and self.capture == end:
            captured = x
        return x if self.capture is None else (x, captured)


FULL = LayerPlan()


class ForwardBatch:
    """Flat packed tensors for one forward (see module docstring)."""

    tree_rows = False   # every sequence a tree (`local` is then tree_layout's)
    fill = None         # a grid's in-forward gather of its tokens (ForwardBatch.grid)
    by_hand = False     # a sequence's mask or positions set by hand (SeqInput), not by parents
    template_parents = None   # a grid's template's parents (ForwardBatch.grid)

    def __init__(self, seqs: list[SeqInput], device: torch.device | str = "cpu"):
        if not seqs:
            raise ValueError("empty batch")
        self._seqs = seqs
        self.device = torch.device(device)
        toks, counts, trees, hand, by_hand = [], [], [], [], False
        for b, s in enumerate(seqs):   # (lists: for one decode token numpy's calls cost more)
            toks += s.tokens
            counts.append(len(s.tokens))
            if s.parents is not None:
                trees.append(b)
            elif s.mask is not None:
                hand.append(b)
            by_hand = by_hand or s.positions is not None
        self.num_new = counts
        self.num_tokens = len(toks)  # T: the sum of real tokens, nothing padded
        # host lists; the device tensors are made on first use (a CUDA-graph replay copies the
        # lists into its static buffers in one transfer and never needs them)
        self.token_list = toks
        self.seq_slots = [s.slot for s in seqs]
        self.prefix_lens = [s.prefix_len for s in seqs]
        cu = [0]
        for n in counts:
            cu.append(cu[-1] + n)
        self.cu_seqlens = cu
        self.max_kv_len = max(p + n for p, n in zip(self.prefix_lens, counts))
        # the sequences whose `local` rows are read (the others: causal); positions and local
        # masks are laid out where first read (_lay: an eager forward's), as a replay lays its
        # out on the device from `tree_nodes` (CudaGraphs: the host then walks no tree)
        self.masked = sorted(trees + hand)
        self.by_hand = by_hand or bool(hand)   # (a mask or positions not from parents: no
        # replay can lay them out)
        self.tree_rows = len(trees) == len(seqs)
        self.template = None   # (a grid's, ForwardBatch.grid)
        self._position_list = self._local = None
        self.tree_nodes = None
        if trees:
            try:
                self.tree_nodes = tree_nodes([seqs[b].parents for b in trees], trees)
            except BadTree as e:
                raise ValueError(f"slot {seqs[e.tree].slot}: {e}") from None
        self._attn_meta = None

    @property
    def position_list(self) -> list[int] | np.ndarray:
        """[T] each token's position (a tree's: prefix + depth)."""
        if self._position_list is None:
            self._lay()
        return self._position_list

    @property
    def local(self) -> np.ndarray | None:
        """[B, n, n] bool among each sequence's new tokens, for the sequences in `masked` (the
        others': causal, their rows unset); None when every sequence is causal."""
        if self._local is None and (self.masked or self.template is not None):
            self._lay()
        return self._local

    def _lay(self) -> None:
        """Positions and local masks from the sequences (tree_layout for the trees), where an
        eager forward reads them."""
        if self.template is not None:   # (a grid's: its template for every sequence)
            self._local = np.broadcast_to(self.template, (len(self.num_new),) +
                                          self.template.shape)
            self._position_list = (np.asarray(self.prefix_lens)[:, None] +
                                   self._depth).ravel()
            return
        seqs, counts, cu, pos = self._seqs, self.num_new, self.cu_seqlens, []
        trees = [b for b in self.masked if seqs[b].parents is not None]
        if not self.tree_rows:
            for s in seqs:
                pos += (s.positions if s.positions is not None
                        else range(s.prefix_len, s.prefix_len + len(s.tokens)))
        if trees:
            n = max(counts)
            anc, depth = tree_layout([seqs[b].parents for b in trees], n)
            depth += np.asarray([self.prefix_lens[b] for b in trees])[:, None]
            if self.tree_rows:   # positions at prefix + depth: each tree's first counts[b]
                real = np.arange(n)[None, :] < np.asarray(counts)[:, None]
                pos += depth[real].tolist()
            else:
                for b, d in zip(trees, depth.tolist()):
                    pos[cu[b]:cu[b + 1]] = d[:counts[b]]
        self._position_list = pos
        if self.tree_rows:
            self._local = anc
        elif self.masked:   # (only the masked sequences' rows are read)
            n = max(counts)
            self._local = np.zeros((len(seqs), n, n), dtype=bool)
            if trees:
                self._local[trees] = anc
            for b in self.masked:
                if seqs[b].parents is None:
                    k = counts[b]
                    self._local[b] = np.tri(n, dtype=bool)
                    self._local[b, :k, :k] = seqs[b].mask.cpu().numpy()

    @classmethod
    def decode(cls, slots: list[int], tokens: list[int], lens: list[int],
               device: torch.device | str = "cpu") -> "ForwardBatch":
        """A step of one new token per sequence (every sequence's `ar` step): token i of
        slot slots[i] at position lens[i], its cache that many rows deep. The batch
        SeqInput(slots[i], [tokens[i]], lens[i]) each would make, from the lists directly
        (~1.5 us a sequence less: the host's share of an `ar` step at batch 64 on a GPU)."""
        if not slots:
            raise ValueError("empty batch")
        self = cls.__new__(cls)
        n = len(slots)
        self._seqs, self.device = None, torch.device(device)
        self.num_new, self.num_tokens = [1] * n, n
        self.token_list, self._position_list = list(tokens), list(lens)
        self.seq_slots, self.prefix_lens = list(slots), list(lens)
        self.cu_seqlens = list(range(n + 1))
        self.max_kv_len = max(lens) + 1
        self._local, self.masked, self._attn_meta = None, [], None
        self.template = self.tree_nodes = None
        return self

    @classmethod
    def grid(cls, slots: list[int], lens: list[int], up: np.ndarray, C: int, G: int, fill,
             depth: np.ndarray, local: np.ndarray, parents: np.ndarray,
             device: torch.device | str = "cpu") -> "ForwardBatch":
        """Every sequence's new tokens in one tree shape, a template (a drafting step's,
        runtime/step/grid.py): n = 1 + C G tokens a sequence, its pending one (up's column 2)
        and C chains of G candidates that fill (GridFill) gathers on the device in the
        forward from up [B, W] (the rows the verification reads after it, `filled`); depth
        [n] each token's depth below the first, local [n, n] the mask among them (a token's
        row: itself and its ancestors), parents [n] each token's parent row (the first's:
        itself). Nothing is walked per sequence, and no token is read on the host."""
        self = cls.__new__(cls)
        B, n = len(slots), 1 + C * G
        self._seqs, self.device = None, torch.device(device)
        self.num_new, self.num_tokens = [n] * B, B * n
        self.token_list = None   # (on the device only: tokens)
        self.fill, self.up, self.chains, self.filled = fill, up, (C, G), None
        self.seq_slots, self.prefix_lens = slots, lens   # (the caller's, never edited)
        self.cu_seqlens = list(range(0, B * n + 1, n))
        self.max_kv_len = max(lens) + n
        self.masked, self._attn_meta, self._local = list(range(B)), None, None
        self._position_list, self._depth, self.tree_nodes = None, depth, None
        # (every step of this shape has this mask: a replay stages the parents, and neither it
        # nor its positions are laid out on the host unless an eager forward reads them)
        self.template, self.template_parents = local, parents
        return self

    @property
    def seqs(self) -> list[SeqInput]:
        """Each sequence's share (a decode batch's made when first asked for)."""
        if self._seqs is None:
            self._seqs = [SeqInput(s, [t], p) for s, t, p in
                          zip(self.seq_slots, self.token_list, self.prefix_lens)]
        return self._seqs

    def _dev(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @cached_property
    def tokens(self) -> torch.Tensor:      # [T]
        if self.fill is not None:   # (a grid's, gathered here: an eager forward's)
            C, G = self.chains   # (up: the rows in a buffer as wide as the gather writes)
            n, w = 1 + C * G, self.up.shape[1]
            up = torch.zeros(len(self.up), self.fill.width(C, G, w), dtype=torch.long,
                             device=self.device)
            up[:, :w] = torch.from_numpy(self.up).to(self.device)
            index = self._host(self.fill.index(C, G, n, up.shape[1] - 1))
            tokens = self.fill(up, index, n)
            self.filled = up
            return tokens.view(-1)
        return self._dev(self.token_list)

    @cached_property
    def positions(self) -> torch.Tensor:   # [T]
        return self._dev(self.position_list)

    # (slots and rows repeat a value a sequence: made from the per-sequence lists in numpy,
    # not kept as lists of T a step that no replay reads)
    @cached_property
    def slots(self) -> torch.Tensor:       # [T]
        return self._host(np.repeat(np.asarray(self.seq_slots, np.int64), self.num_new))

    @cached_property
    def rows(self) -> torch.Tensor:        # [T]: prefix_len + index among the new tokens
        cu, n = np.asarray(self.cu_seqlens, np.int64), self.num_new
        start = np.asarray(self.prefix_lens, np.int64) - cu[:-1]
        return self._host(np.arange(self.num_tokens, dtype=np.int64) + np.repeat(start, n))

    def _host(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def last_index(self) -> list[int]:
        """Index in the flat batch of each sequence's last new token."""
        return [c - 1 for c in self.cu_seqlens[1:]]
