"""CUDA-graph replay of decoding forwards (the GPU fast path): the executor of decoding steps.

On a GPU a small model's eager forward is bound by kernel launches, not by the GPU: hundreds of
launches per forward cost more CPU time than the GPU needs for the math. So the forwards of a
decoding step are captured once per shape and replayed. Callers hand `run` an unpadded batch
and get unpadded outputs (one row per real token, in packed order); the shapes, padding and
static buffers are this module's business:

- a captured shape is (batch bucket B_b, tokens per sequence n, KV columns C, layer plan, head),
  every coordinate on one fixed grid: B_b a power of two (at most the cache's slots), n a power
  of two (GRID_NS: 1, 2, 4 .. max_n; the step-cost table measures the same points), C = 128 x
  a power of 4 (or the cache's length). `warm` captures every shape of the grid that a
  drafter's forwards (Drafter.graph_forwards) can meet when a runner starts, on the run's own
  KV cache, so no shape is ever captured inside a timed step (vLLM's CudagraphDispatcher does
  the same); `captures` and `capture_s` count what was captured, wherever it was. Every
  sequence is padded to one n: an `ar` step has n = 1, a draft forward n = 1 with a skip plan,
  a verify of chains, trees or Self-Draft's candidates + branches pads up to the grid. Padding
  tokens sit past a sequence's real rows and no real token sees them (each follows the row
  before it, as a chain's rows do); their KV rows are never committed and their outputs are
  dropped. Batch
  rows past the real batch point to a scratch slot (the KV cache has one spare slot), so
  padding never touches a real sequence. Anything past `max_n` tokens runs eagerly, and so
  does prefill, unless it goes in pieces of PIECE tokens a prompt (runtime/step/prefill.py:
  a chain below the prompt's rows so far, its one n captured as a run starts).
- attention reads C columns of the cache: the batch's longest prefix + n, rounded up onto the
  grid (at most the cache length), so a step over 300-token contexts does not read a 2,000-row
  cache. With a batch of 4 or more that fills most slots, attention runs over every
  slot's rows of the cache as a view (queries placed by slot; idle slots compute a row that is
  dropped) rather than gathering the batch's slots first: a gather reads and writes every K/V
  row once more.
- inputs are staged on the host with numpy into one (pinned, on CUDA) buffer and copied to the
  graph's static buffers in one transfer: tokens [B_b * n], slot and prefix length per
  sequence [B_b], the index of each real row among the padded ones, and (n > 1) each row's
  parent row in its sequence [B_b * n]: a chain's the row before it, a draft tree's its
  parent. The graph lays out each sequence's mask (a row sees itself and its ancestors) and
  positions (prefix + depth) from them, so the host walks no tree: on CUDA in one Triton
  kernel (engine/layout_kernel.py, checked against tree_closure when the graphs are made),
  elsewhere by batch.tree_closure's ~20 tensor operations. A batch with a mask or positions
  set by hand (SeqInput) runs eagerly.
- the captured graph ends at the last layer's states [B_b * n, D]: the LM head runs on the rows
  the caller needs (argmax for greedy, fp32 logits only for sampled rows; Model.argmax/logits).
  Or with a caller's head (Model.run): Kangaroo's draft forward is layers [0, l) plus its
  adapter, yielding the layer-l states and the draft logits. A plan starting past layer 0 takes
  its input hidden states from a static buffer too (Kangaroo's verify from the exit layer).
- cuBLAS workspaces are cleared right before and after each capture (as inductor's cudagraph
  trees do), so a graph owns the workspace it captured and eager work (another library's
  compiled graphs included) cannot free it underneath.
No host synchronization happens inside a replay; the caller reads back only what it decides on.

Off CUDA (`capture=False`, the CPU tests) everything above runs the same (buckets, static
buffers, scratch slot, device-side masks, padded rows), except that a "replay" runs the
captured function eagerly into the static outputs (made by its first replay), so what the graph
path does to decoding is tested without a GPU.
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from specctl.engine.attention import SdpaMeta
from specctl.engine.inference import inference
from specctl.engine.batch import ForwardBatch, LayerPlan, tree_closure

KV_BLOCK = 128   # KV columns are read in KV_BLOCK x a power of KV_GROWTH (or the whole cache)
KV_GROWTH = 4    # (coarse: every column count is captured when a run starts)
PIECE = 64       # prompt tokens a sequence a prefill forward replays (runtime/step/prefill.py):
                 # the step tables' largest point (runtime/control/steptables.STEP_NS)


def grid_n(n: int) -> int:
    """The grid point a step of n tokens per sequence is padded to: the next power of two."""
    return 1 << (max(n, 1) - 1).bit_length()


@dataclass
class _Captured:
    kv: object                # the cache the graph's pointers refer to (kept alive with it)
    head: object              # the head it was captured with (None: none, states out)
    graph: object             # torch.cuda.CUDAGraph (or _EagerReplay off CUDA)
    ints: torch.Tensor        # the segments below (tokens .. table), filled by one copy
    tokens: torch.Tensor      # [Bb * n]
    slots: torch.Tensor       # [Bb]
    prefix: torch.Tensor      # [Bb]
    real: torch.Tensor        # [Bb * n] index of each real row among the padded rows (a prefix)
    parents: torch.Tensor | None  # [Bb * n] each row's parent row in its sequence (n > 1):
                              # its mask and position (prefix + depth) are laid out from them
    table: torch.Tensor | None    # [Bb, C / block] block tables (a paged cache), else None
    hidden: torch.Tensor | None   # [Bb * n, D] input states when the plan starts past layer 0
    outputs: tuple | list     # [Bb * n, ...] each: (states,) or the head's outputs
    fill: object = None       # a grid step's in-forward gather (ForwardBatch.grid), if any:
    up: torch.Tensor | None = None      # [Bb, fill_width] its rows (the tokens' source)
    index: torch.Tensor | None = None   # [4 (n - 1) + 1] its index (GridFill.index)
    views: dict = field(default_factory=dict)   # (B, m): a grid batch's [B, m, D] of states


def checked_kernel(device: torch.device, most: int):
    """engine/layout_kernel.py, where `device` runs it (Triton) and it agrees with
    tree_closure there on random trees at every n of the grid up to `most`; else None, with a
    warning where it failed or differed (CudaGraphs then lays masks out with tensor
    operations)."""
    try:
        from specctl.engine import layout_kernel
    except ImportError:   # (no Triton)
        return None
    gen = torch.Generator().manual_seed(0)
    try:
        for n in (1 << i for i in range(1, most.bit_length())):
            ar = torch.arange(n)
            cut = torch.randint(1, n + 1, (3, 1), generator=gen)
            rand = (torch.rand(3, n, generator=gen) * ar).long()   # (a parent before each row)
            par = torch.where(ar < cut, rand, (ar - 1).clamp(min=0)).to(device)
            prefix = torch.randint(0, 100, (3,), generator=gen).to(device)
            local, depth = tree_closure(par)
            anc, pos = layout_kernel.layout(par, prefix, most)
            if not (torch.equal(anc, local) and
                    torch.equal(pos, (prefix[:, None] + depth).view(-1))):
                raise ValueError(f"differs from tree_closure at n = {n}")
    except Exception as e:   # (a compiler or driver that cannot run it)
        warnings.warn(f"graphs: the layout kernel failed ({type(e).__name__}: {e}); laying "
                      "out masks with tensor operations")
        return None
    return layout_kernel


def _dead() -> None:
    """A weak reference's stand-in before there is anything to refer to."""
    return None


class _EagerReplay:
    """Stands in for a CUDA graph off CUDA: a replay reruns the function into the outputs (a
    list filled at the first replay: "capturing" runs nothing, so a runner's start-up capture of
    every shape costs the CPU tests nothing)."""

    def __init__(self, fn):
        self.fn, self.outputs = fn, []

    def replay(self) -> None:
        if not self.outputs:
            self.outputs.extend(self.fn())
            return
        for o, new in zip(self.outputs, self.fn()):
            o.copy_(new)


class CudaGraphs:
    def __init__(self, model, max_n: int = 128, capture: bool | None = None):
        self.model = model
        self.max_n = max_n
        self.capture = model.device.type == "cuda" if capture is None else capture
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.cache: dict[tuple, _Captured] = {}
        self.kept: dict[tuple, object] = {}
        self.replays = 0
        self.captures = 0        # shapes captured, at start-up or (never, by design) in a run
        self.capture_s = 0.0     # seconds they took
        self._stage = torch.empty(0, dtype=torch.long)       # host staging (pinned on CUDA)
        self._stage_np = self._stage.numpy()                 # (its numpy view)
        self._last = None                                    # what _stage_inputs last laid out
        self._ones_by: dict[int, torch.Tensor] = {}             # (_ones)
        self._kernel = checked_kernel(model.device, max_n) if self.capture else None   # (_layout)
        self._staged = None                                  # event: the last copy is done
        self._kv = _dead                                     # the cache the graphs hold (_use)

    def keep(self, key: tuple, kv, make):
        """An object made once and handed out again for the same key while the model's KV
        cache is kv: the state a head reads (weights, its own KV cache) must stay at one
        address for its graphs to stay valid. A new cache (whose graphs are captured anew)
        replaces it, so one object per key is ever held."""
        got = self.kept.get(key)
        if got is None or got[0] is not kv:
            got = self.kept[key] = (kv, make())
        return got[1]

    @staticmethod
    def bucket(b: int, slots: int | None = None) -> int:
        """The batch bucket of b sequences: a power of two, at most the cache's slots (rows past
        the batch go to the scratch slot, however many)."""
        p = grid_n(b)
        return p if slots is None else max(b, min(p, slots))

    def padded_n(self, n: int) -> int | None:
        """Tokens per sequence a step of at most n is padded to (grid_n), or None past max_n
        (that step runs eagerly)."""
        return grid_n(n) if n <= self.max_n else None

    def ns(self, most: int) -> list[int]:
        """The grid's n up to the one a step of `most` tokens per sequence pads to."""
        top = self.padded_n(min(most, self.max_n))
        return [1 << i for i in range(top.bit_length())]

    @staticmethod
    def kv_columns(need: int, max_len: int) -> int:
        """KV columns a step attends over: `need` rounded up onto the grid (KV_BLOCK x a power of
        KV_GROWTH), at most the cache's length."""
        c = KV_BLOCK
        while c < need:
            c *= KV_GROWTH
        return min(max_len, c)

    @staticmethod
    def columns(max_len: int) -> list[int]:
        """Every column count kv_columns gives for a cache of max_len rows."""
        out, c = [], KV_BLOCK
        while c < max_len:
            out.append(c)
            c *= KV_GROWTH
        return out + [max_len]

    def _use(self, kv) -> None:
        """Graphs hold raw pointers into one KV cache: a new cache means new graphs (and the old
        ones must go, or a reused id() could replay into freed memory). Every replay asks:
        the last cache seen answers it at once (a look at every graph held cost a lean step
        ~0.5 us at batch 1, with a drafter's shapes; weakly held, to die with its run)."""
        if self._kv() is kv:
            return
        self._kv = weakref.ref(kv)
        if any(c.kv is not kv for c in self.cache.values()):
            self.cache.clear()
            if self.capture:
                self.pool = torch.cuda.graph_pool_handle()   # the old pool dies with its graphs

    def warm(self, kv, forwards, pieces: tuple = ()) -> int:
        """Capture, on kv, every grid shape the forwards can meet: forwards is a list of
        (plan, head or None, most tokens per sequence) (Drafter.graph_forwards); every batch
        bucket up to kv's slots, every n up to the forward's most, every column count. pieces:
        (layer plan, most prompts) of prefill's pieces (runtime/step/prefill.py), captured at
        n = PIECE alone, in the buckets up to the most prompts'. Returns how many shapes it
        captured (those already held are kept)."""
        if kv.scratch is None:   # (a paged cache's steps run eagerly)
            return 0
        self._use(kv)
        before = self.captures
        buckets = sorted({self.bucket(b, kv.num_slots) for b in range(1, kv.num_slots + 1)})
        todo = [(f[0], f[1], self.ns(f[2]), kv.num_slots, (*f, None)[3]) for f in forwards] + \
            [(plan, None, [PIECE], self.bucket(most, kv.num_slots), None)
             for plan, most in pieces]
        for plan, head, ns, top, fill in todo:
            if head is not None and self.model.exact:
                continue   # (run eagerly: see run)
            for Bb in (b for b in buckets if b <= top):
                for n in (n for n in ns if fill is None or n > 1):
                    for C in self.columns(kv.max_len):
                        key = self._key(Bb, n, plan, head, C, fill)
                        cap = self.cache.get(key)
                        if cap is None or cap.head is not head or cap.fill is not fill:
                            self.cache[key] = self._capture(kv, Bb, n, C, plan, head, fill)
        return self.captures - before

    @staticmethod
    def _key(Bb: int, n: int, plan: LayerPlan, head, C: int, fill) -> tuple:
        """A captured shape's key: its bucket, tokens a sequence, layer plan, head, KV columns
        and in-forward gather (the two by their keys: the objects are checked apart)."""
        return (Bb, n, plan, None if head is None else head.key, C,
                None if fill is None else fill.key)

    def _shape(self, batch: ForwardBatch, kv, pad_n: int = 1) -> int | None:
        """The padded n this batch replays with (at least pad_n), or None (it runs eagerly)."""
        if kv.scratch is None:
            return None
        n = self.padded_n(max(batch.num_new))
        if n is None or max(batch.prefix_lens) + max(n, pad_n) > kv.max_len:
            return None
        return max(n, pad_n)

    @inference
    def run(self, batch: ForwardBatch, kv, plan: LayerPlan, hidden: torch.Tensor | None = None,
            head=None, pad_n: int = 1):
        """The forward's outputs from a replay, one row per real token of the batch (see
        Model.run), or None where no graph fits (the caller runs it eagerly). pad_n: the
        least n it replays with (a prefill piece's PIECE: the one n captured for it)."""
        if (plan.start > 0) != (hidden is not None) or (head is not None and self.model.exact) \
                or batch.by_hand:   # (a head under --exact: its attention is exact's, built on
            return None   # the host; a mask or positions by hand: no parents to lay them out)
        n = self._shape(batch, kv, pad_n)
        if n is None:
            return None
        B = len(batch.num_new)
        if kv.paged:   # a real row past its slot's blocks would land in the null block
            kv.check_reserved(batch.seq_slots, [p + k for p, k in zip(batch.prefix_lens,
                                                                       batch.num_new)])
        self._use(kv)
        Bb = self.bucket(B, kv.num_slots)
        C = self.kv_columns(max(batch.prefix_lens) + n, kv.max_len)
        fill = batch.fill
        key = self._key(Bb, n, plan, head, C, fill)
        cap = self.cache.get(key)
        if cap is None or cap.head is not head or cap.fill is not fill:   # (a new head or
            # gather object: its tensors moved)
            cap = self.cache[key] = self._capture(kv, Bb, n, C, plan, head, fill)
        padded = self._stage_inputs(cap, batch, kv, Bb, n)
        if fill is not None:   # (the rows the verification reads: filled by the replay)
            batch.filled = cap.up[:B]
        T = batch.num_tokens
        if hidden is not None:
            if padded:
                cap.hidden.index_copy_(0, cap.real[:T], hidden)
            else:
                cap.hidden[:T].copy_(hidden)
        cap.graph.replay()
        self.replays += 1
        if batch.template is not None and head is None and plan.capture is None:
            # (a grid step's rows, the first m of each sequence's n: a view, not a gather,
            # whose copy of [B m, D] rows took ~50 us of a b64 step's host on a CPU; made
            # once, as the buffer it views stays)
            m = batch.num_new[0]
            view = cap.views.get((B, m))
            if view is None:
                view = cap.views[B, m] = cap.outputs[0].view(Bb, n, -1)[:B, :m]
            return view
        if padded:
            outs = tuple(o.index_select(0, cap.real[:T]) for o in cap.outputs)
        else:
            outs = tuple(o[:T] for o in cap.outputs)
        return outs[0] if head is None and plan.capture is None else outs

    def _host_buffer(self, numel: int) -> np.ndarray:
        """The staging buffer's first numel ints, as numpy (a view of the buffer's one numpy
        view: a tensor's slice and its .numpy() cost ~25 us of a b64 step's host in a run)."""
        if self._stage.numel() < numel:
            self._stage = torch.empty(max(numel, 2 * self._stage.numel()), dtype=torch.long,
                                      pin_memory=self.capture)
            self._stage_np, self._last = self._stage.numpy(), None
        return self._stage_np[:numel]

    def _stage_inputs(self, cap: _Captured, batch: ForwardBatch, kv, Bb: int, n: int) -> bool:
        """Write the batch, padded to Bb x n, into the graph's static inputs: numpy into one
        host buffer, one copy. No mask and no position is staged: the graph lays them out from
        each row's parent (tree_closure), a chain's the row before it, a tree's its parent (the
        host walks no tree: tree_layout took a b8 Self-Draft step ~80 us warm, ~130 in a run).
        Returns whether any sequence was padded."""
        if self._staged is not None:
            self._staged.synchronize()   # the host buffers' last copy has been read
        B, counts = len(batch.num_new), batch.num_new
        padded = batch.num_tokens != B * n   # (no sequence has more than n)
        ints = self._host_buffer(cap.ints.numel())
        # (slices, not np.split: a lean step's staging is on every step's critical path)
        R = Bb * n
        tok, slots, prefix = ints[:R], ints[R:R + Bb], ints[R + Bb:R + 2 * Bb]
        real = ints[R + 2 * Bb:2 * R + 2 * Bb]
        at = 2 * R + 2 * Bb
        par = None if cap.parents is None else ints[at:at + R].reshape(Bb, n)
        at += 0 if par is None else R
        table = ints[at:at + (0 if cap.table is None else cap.table.numel())]
        at += table.size
        # what a step of the last one's shape left in the buffer stays: the padded batch rows
        # and, for a template (a grid step's), its real rows and parents (~30 us of a b64
        # grid step's host in a run, ~10 of ar's); a tree's parents are its own each step
        # (the graph held weakly: a strong hold kept a replaced KV cache alive through its
        # graph, Model.new_kv_cache; a graph freed since answers None, never `cap`)
        last, m = self._last, counts[0]
        same = last is not None and last[0]() is cap and last[1] == B and last[2] == m and \
            last[3] is batch.template_parents   # (never None: only a template's is kept)
        self._last = None   # (until this step's layout is in the buffer, below)
        if not same and B < Bb:   # padded batch rows: the scratch slot's
            tok[B * n:] = 0
            slots[B:], prefix[B:] = kv.scratch, 0
        slots[:B], prefix[:B] = batch.seq_slots, batch.prefix_lens
        if cap.table is not None:   # unallocated entries and padded batch rows: the null block
            table = table.reshape(Bb, -1)
            table[B:] = 0
            table[:B] = kv.table_rows(batch.seq_slots, table.shape[1])
        if cap.fill is not None:   # (its tokens: gathered in the forward from up, GridFill)
            self._stage_fill(cap, batch, ints[at:], real, B, Bb, n, same)
        else:
            self._stage_tokens(batch, tok, real, B, n, padded, same)
        if par is not None and not same:
            # every row's parent the row before it (a chain; padding rows follow their
            # sequence's last, and no real row sees them), a tree's nodes their own
            par[:] = self._chain(n)
            if batch.template is not None:
                par[:B, :m] = batch.template_parents
            elif batch.tree_nodes is not None:
                b, rows, up = batch.tree_nodes
                par[b, rows] = up
        if batch.template_parents is not None:
            self._last = (weakref.ref(cap), B, m, batch.template_parents)
        cap.ints.copy_(self._stage[:cap.ints.numel()], non_blocking=True)
        if self.capture:
            self._staged = torch.cuda.Event()
            self._staged.record()
        return padded

    def _stage_tokens(self, batch: ForwardBatch, tok, real, B: int, n: int, padded: bool,
                      same: bool) -> None:
        """The batch's tokens into tok [Bb n] (each sequence's padded to n: its last again)
        and, where padded, its real rows' indices into real."""
        counts, m = batch.num_new, batch.num_new[0]
        toks = np.asarray(batch.token_list)
        if not padded:
            tok[:B * n] = toks
        elif counts.count(m) == B:   # (m rows every sequence, a grid's or one sequence's: as
            t2 = tok[:B * n].reshape(B, n)   # below in fewer calls)
            t2[:, :m], t2[:, m:] = toks.reshape(B, m), toks[m - 1::m, None]
            if not same:
                real[:B * m] = self._real(B, m, n)
        else:   # (whole arrays: a loop over the sequences took a grid step at batch 64 ~300
            # us of host on a CPU, 2.5x `ar`'s whole host step; tests/test_graph_path.py)
            cu, k = np.asarray(batch.cu_seqlens), np.asarray(counts)
            # padding, a sequence's rows past its own: its last token again; then its real
            # rows over the first k of its n
            tok[:B * n] = np.repeat(toks[cu[1:] - 1], n)
            at = np.repeat(np.arange(B) * n - cu[:-1], k) + np.arange(cu[-1])
            tok[at], real[:cu[-1]] = toks, at

    def _stage_fill(self, cap: _Captured, batch: ForwardBatch, ints, real, B: int, Bb: int,
                    n: int, same: bool) -> None:
        """A grid batch's rows (ForwardBatch.grid's up) and its gather's index into the
        graph's up and index segments (ints: from up's), its real rows' indices into real;
        padded batch rows' up zeros (a token 0, no job chain: the forward wrote into them)."""
        W = cap.up.shape[1]
        up, index = ints[:Bb * W].reshape(Bb, W), ints[Bb * W:Bb * W + cap.index.numel()]
        w = batch.up.shape[1]
        up[:B, :w] = batch.up
        up[B:] = 0
        if not same:
            C, G = batch.chains
            m = batch.num_new[0]
            index[:] = batch.fill.index(C, G, n, W - 1)
            if m < n:
                real[:B * m] = self._real(B, m, n)

    _chains: dict[int, np.ndarray] = {}
    _reals: dict[tuple[int, int, int], np.ndarray] = {}

    @classmethod
    def _chain(cls, n: int) -> np.ndarray:
        """[n] each row's parent in a chain: the row before it (the first row: itself)."""
        c = cls._chains.get(n)
        if c is None:
            c = cls._chains[n] = np.maximum(np.arange(n) - 1, 0)
        return c

    @classmethod
    def _real(cls, B: int, m: int, n: int) -> np.ndarray:
        """The rows of B sequences' first m of n each (a grid step's real rows)."""
        r = cls._reals.get((B, m, n))
        if r is None:
            r = cls._reals[B, m, n] = (np.arange(B)[:, None] * n + np.arange(m)).ravel()
        return r

    def _meta(self, kv, Bb: int, n: int, C: int, slots, prefix, local, table) -> SdpaMeta:
        """Attention metadata of a captured forward, computed on the device. Column c of a
        sequence's row: committed (c < prefix) or new token c - prefix when the local mask lets
        the query see it. With most slots of a contiguous cache in the batch, attention runs over
        every slot of the cache (a view, no gather): per-slot prefix and local mask, queries
        placed by slot. A paged cache's rows are gathered through the block tables."""
        dev = self.model.device
        S = kv.k[0].shape[0] // kv.block   # blocks (contiguous: slots, with the scratch slot)
        idx = torch.arange(n, device=dev)
        rows = (prefix[:, None] + idx[None, :])                           # [Bb, n]
        if table is not None:
            index = (table.gather(1, rows // kv.block) * kv.block + rows % kv.block).reshape(-1)
        else:
            index = (slots[:, None] * kv.block + rows).reshape(-1)
        fused = self.model.attention == "fused"   # (reads each sequence's rows in place)
        if table is None and Bb >= 4 and 3 * Bb > S and not fused:   # (1-2 slots: a gather)
            pre = torch.zeros(S, dtype=prefix.dtype, device=dev).index_copy_(0, slots, prefix)
            loc = torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(S, n, n) \
                .clone().index_copy_(0, slots, local)
            att_slots, rows_of, uniform = slice(0, S), slots.repeat_interleave(n), False
        else:
            pre, loc = prefix, local
            att_slots, uniform = (slots if table is None else table), True
            rows_of = torch.arange(Bb, device=dev).repeat_interleave(n)
        rel = torch.arange(C, device=dev)[None, None, :] - pre[:, None, None]
        new = loc.gather(2, rel.clamp(0, n - 1).expand(loc.shape[0], n, C))
        mask = (rel < 0) | ((rel < n) & new)                             # [S or Bb, n, C]
        return SdpaMeta(att_slots, kv.block, index, C, n, uniform, rows_of, idx.repeat(Bb),
                        mask[:, None], static=True, prefix=pre,
                        starts=torch.arange(0, Bb * n, n, device=dev) if fused else None,
                        counts=torch.full((Bb,), n, device=dev) if fused else None)

    def _forward(self, kv, Bb: int, n: int, C: int, plan: LayerPlan, tokens, slots, prefix,
                 parents, table, hidden=None, head=None) -> tuple:
        """The captured computation: tokens [Bb n], or a grid step's (gather, up, index),
        GridFill, which makes them from up."""
        m = self.model
        if parents is None:   # (a row a sequence: at its prefix, seeing it and itself)
            positions, local = prefix, self._ones(Bb)
        else:   # (each sequence's mask and positions from its rows' parents)
            local, positions = self._layout(parents.view(Bb, n), prefix)
        meta = self._meta(kv, Bb, n, C, slots, prefix, local, table)
        if isinstance(tokens, tuple):   # (a grid's: its gather, GridFill, from its rows)
            fill, up, index = tokens
            tokens = fill(up, index, n).view(-1)
        x = m.embed_tokens(tokens) if hidden is None else hidden
        end = m.cfg.num_layers if plan.end is None else plan.end
        h = m._layers(x, positions, meta, kv, plan, end)   # (h, captured) with plan.capture
        if head is not None:
            return tuple(head(h, positions, meta))
        return h if plan.capture is not None else (h,)

    def _layout(self, parents: torch.Tensor, prefix: torch.Tensor) -> tuple:
        """(masks [Bb, n, n], positions [Bb n]) from each row's parent and each sequence's
        prefix: on CUDA one Triton launch (engine/layout_kernel.py) where it agrees with
        tree_closure on this device, else tree_closure's tensor operations."""
        if self._kernel:
            return self._kernel.layout(parents, prefix, self.max_n)
        local, depth = tree_closure(parents)
        return local, (prefix[:, None] + depth).view(-1)

    def _ones(self, Bb: int) -> torch.Tensor:
        """[Bb, 1, 1] True: the mask of a row a sequence (made once a bucket, before any
        capture reads it)."""
        t = self._ones_by.get(Bb)
        if t is None:
            t = self._ones_by[Bb] = torch.ones(Bb, 1, 1, dtype=torch.bool,
                                               device=self.model.device)
        return t

    @torch.inference_mode()
    def _capture(self, kv, Bb: int, n: int, C: int, plan: LayerPlan, head=None,
                 fill=None) -> _Captured:
        t0 = time.perf_counter()
        try:
            return self._capture_one(kv, Bb, n, C, plan, head, fill)
        finally:
            self.captures += 1
            self.capture_s += time.perf_counter() - t0

    @staticmethod
    def inputs(Bb: int, n: int, nb: int, device, fill: bool = False) -> tuple:
        """A graph's static inputs, one tensor and its segments, in the order _stage_inputs
        fills them: (ints, tokens [Bb n], slots [Bb], prefix [Bb], real [Bb n], parents [Bb n]
        (n > 1, else None), table [Bb, nb] (nb block-table entries a sequence, else None),
        and with a grid's gather (fill) up [Bb, 2 n + 5 + max(nb, 1)] (GridDrafts.host's rows,
        at most 2 n + 5 + nb wide, its last column unread) and its index [6 (n - 1) + 1],
        else None and None)."""
        par = Bb * n if n > 1 else 0
        W = 2 * n + 5 + max(nb, 1) if fill else 0
        k = 6 * (n - 1) + 1 if fill else 0
        ints = torch.zeros(2 * Bb * n + 2 * Bb + par + Bb * nb + Bb * W + k, dtype=torch.long,
                           device=device)
        tokens, slots, prefix, real, parents, table, up, index = ints.split(
            [Bb * n, Bb, Bb, Bb * n, par, Bb * nb, Bb * W, k])
        return (ints, tokens, slots, prefix, real, parents if par else None,
                table.view(Bb, nb) if nb else None, up.view(Bb, W) if fill else None,
                index if fill else None)

    def _capture_one(self, kv, Bb: int, n: int, C: int, plan: LayerPlan, head,
                     fill) -> _Captured:
        dev = self.model.device
        nb = -(-C // kv.block) if kv.paged else 0
        ints, tokens, slots, prefix, real, parents, table, up, index = self.inputs(
            Bb, n, nb, dev, fill is not None)
        if fill is not None:   # (an index the capture's gather can read: one token's)
            index.copy_(torch.from_numpy(fill.index(1, 1, n, up.shape[1] - 1)))
        slots.fill_(kv.scratch)
        if n == 1:
            self._ones(Bb)
        hidden = None if plan.start == 0 else torch.zeros(
            Bb * n, self.model.cfg.hidden_size, dtype=self.model.dtype, device=dev)
        if fill is not None:   # (the tokens: gathered from up, in the forward)
            tokens = (fill, up, index)
        args = (kv, Bb, n, C, plan, tokens, slots, prefix, parents, table, hidden, head)
        if self.capture:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):   # warm-up outside the graph (allocator, autotuning)
                for _ in range(2):
                    self._forward(*args)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            torch._C._cuda_clearCublasWorkspaces()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                outputs = self._forward(*args)
            torch._C._cuda_clearCublasWorkspaces()
        else:
            graph = _EagerReplay(lambda: self._forward(*args))
            outputs = graph.outputs
        return _Captured(kv, head, graph, ints, None if fill else tokens, slots, prefix, real,
                         parents, table, hidden, outputs, fill, up, index)
