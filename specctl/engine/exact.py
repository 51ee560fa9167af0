"""Batch-invariant numerics (`--exact`): a token's logits get the same bits whatever else is in
its forward: how many sequences, how many tokens each verifies, where the token sits, whether
the cache is paged. So a speculative method's greedy output is `ar`'s at batch 1 in bf16 too,
where plain kernels pick their reduction order by the step's shape and near-ties flip.

What varies with the batch in the plain path, and what this module does instead:
- Attention (SDPA's kernel splits keys and queries by the step's shapes; a tree's keys sit
  between other drafts'): each query attends over its own keys laid out by position, exactly
  as in a plain decode of that token (committed rows, then its ancestors in depth order), in
  groups that share a layout (a chain, or one root-to-leaf path of a tree). The scores are
  batched matmuls reducing over the head dimension; the weighted sum runs over keys in
  position order (zero weights past the query's own position) in blocks of KEY_BLOCK keys,
  each block one matmul of that fixed reduction length, the blocks added in fp32 in key
  order: the sum's order is specctl's, not the library's (oneDNN's AMX kernel cut a
  reduction by its length, so the longest key group in the forward changed a row's bits);
  the softmax runs in fp32.
- Transcendental elementwise ops (exp in softmax and SiLU, RoPE's sin/cos): CPU kernels take a
  vectorized path for most elements and a scalar one for a remainder whose place depends on the
  tensor's size, and the two round differently. Here exp is built from IEEE basic operations
  (each exactly rounded, so every path agrees), and RoPE's table is computed once per position.
- Matmuls: on CUDA a Triton kernel with one tile configuration (engine/bi_matmul.py; cuBLAS
  picks kernels and split-k by shape). On the CPU decided per machine and dtype by a probe on
  the model's own weights (`probe`): where the BLAS gives a row the same bits at any row count
  but one (oneDNN's bf16 on AVX512-BF16 CPUs: a single row runs as a matrix-vector product),
  F.linear on at least 2 rows; else a step's rows in one TILE-row call and a larger step's in
  tiles of BIG_TILE, where both shapes give a row the same bits; else rows in fixed tiles of
  TILE (one shape, one kernel); else
  --exact is refused (MKL's fp32 GEMM changes kernels with the row count, and its batched
  GEMM too, which attention needs). Attention's matmuls get at least 2 query rows too. The
  probe's choice is then checked on the model itself (engine/selfcheck.py).
RMSNorm, embedding, argmax and the residual adds are per row already.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

TILE = 8                    # rows per matmul call where the BLAS is not row-invariant
BIG_TILE = 64               # rows per call of a larger step's tiles (tiled_linear_8_64)
KEY_BLOCK = 64              # keys per block of attention's weighted sum (weighted_sum)
QUERY_BLOCK = 64            # a prefill's queries per group of attention (ExactMeta)
ROPE_CHUNK = 4096           # positions per piece of the RoPE table (each built in one call)
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4   # Cody-Waite split of ln 2 (n * HI exact)
_EXP_COEF = [1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0]   # Taylor, |r| <= ln2 / 2


def det_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of an fp32 tensor from multiplies, adds, floor and exponent bits only, so every
    element gets the same bits wherever it sits (within ~2 ulp of exp). Inputs are clamped to
    [-87, 88]: the result is never 0 or inf (callers mask what must be 0)."""
    x = x.clamp(-87.0, 88.0)
    n = torch.floor(x * 1.4426950408889634 + 0.5)
    r = x - n * _LN2_HI
    r = r - n * _LN2_LO
    p = torch.full_like(r, _EXP_COEF[0])
    for c in _EXP_COEF[1:]:
        p.mul_(r).add_(c)      # (in place: the same rounding, fewer temporaries)
    scale = torch.bitwise_left_shift(n.to(torch.int32) + 127, 23).view(torch.float32)
    return p.mul_(scale)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) in fp32 with det_exp, in x's dtype."""
    x32 = x.float()
    return (x32 / (det_exp(-x32) + 1.0)).to(x.dtype)


def det_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh of an fp32 tensor as 1 - 2 / (exp(2x) + 1) with det_exp (GeLU-tanh, soft-caps)."""
    return 1.0 - 2.0 / (det_exp(2.0 * x) + 1.0)


class RopeTable:
    """cos and sin [pos, 1, hd] per position (rotate_half's sign in sin), each piece of
    ROPE_CHUNK positions computed in one call, so a position's values never depend on which
    positions a step holds."""

    def __init__(self, rope, dtype: torch.dtype):
        """rope: an engine.rope.Rope (its angles and cos / sin)."""
        self.rope, self.dtype = rope, dtype
        self.cos = self.sin = None
        self.bound = 0   # positions below it are covered without looking (ensure)

    def ensure(self, n: int) -> None:
        """Cover positions below n from now on without reading them on the host (a captured
        forward cannot): the model covers its whole context when --exact is chosen, so the
        table never grows, and moves, under a captured graph."""
        while self.cos is None or self.cos.shape[0] < n:
            self._grow()
        self.bound = max(self.bound, n)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.bound:   # (the largest position, read on the host: never in a capture)
            need = int(positions.max()) + 1 if positions.numel() else 0
            while self.cos is None or self.cos.shape[0] < need:
                self._grow()
        return self.cos[positions], self.sin[positions]

    def _grow(self) -> None:
        start = 0 if self.cos is None else self.cos.shape[0]
        pos = torch.arange(start, start + ROPE_CHUNK, device=self.rope.inv.device)
        cos, sin = self.rope(pos, self.dtype)
        self.cos = cos if self.cos is None else torch.cat((self.cos, cos))
        self.sin = sin if self.sin is None else torch.cat((self.sin, sin))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """engine.model.apply_rope in separate multiplies and an add (addcmul's scalar remainder
    may fuse them, its vector body does not)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


def tiled_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ b) with the rows in tiles of TILE (the last one zero-padded): every call has
    one shape."""
    return _in_tiles(x, w, b, TILE)


def tiled_linear_8_64(x: torch.Tensor, w: torch.Tensor,
                      b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ b) in two fixed shapes: up to TILE rows one TILE-row call (a decoding step),
    more in tiles of BIG_TILE rows (a prefill chunk reads the weights BIG_TILE / TILE times
    less often than in TILE-row tiles: on an AMX CPU tiled_linear ran a 512-row chunk's
    matmuls in 896 ms against 153 ms untiled). Used only where the probe finds a row's bits
    the same in both shapes."""
    return _in_tiles(x, w, b, TILE if x.shape[0] <= TILE else BIG_TILE)


def _in_tiles(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              tile: int) -> torch.Tensor:
    m = x.shape[0]
    p = -(-m // tile) * tile
    xp = x if p == m else F.pad(x, (0, 0, 0, p - m))
    y = torch.cat([F.linear(t, w) for t in xp.split(tile)])[:m]
    return y + b if b is not None else y


def linear2(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on at least 2 rows: oneDNN computes a single bf16 row as a matrix-vector product
    that rounds otherwise than its GEMM does at any other row count (seen on the demo model)."""
    y = F.linear(F.pad(x, (0, 0, 0, 1)), w)[:1] if x.shape[0] == 1 else F.linear(x, w)
    return y + b if b is not None else y   # (the bias added as every candidate adds it)


def candidates(cuda: bool) -> tuple:
    """The linears --exact may use, in order of preference (the probe keeps those that hold)."""
    if not cuda:
        return linear2, tiled_linear_8_64, tiled_linear
    try:
        from specctl.engine import bi_matmul
    except ImportError:
        raise ValueError("--exact on CUDA needs triton (CUDA builds of torch bring it: "
                         "pip install triton)") from None
    return (bi_matmul.linear,)


def named_linear(name: str, cuda: bool):
    """The candidate of that name (a checked choice kept from an earlier run)."""
    for f in candidates(cuda):
        if f.__name__ == name:
            return f
    raise ValueError(f"--exact: no linear named {name!r} on {'CUDA' if cuda else 'the CPU'}")


def _threads() -> tuple[int, ...]:
    """The thread counts a run may use: the runner's tuner tries 1, half and all of the
    threads it starts with (runtime/step/threads.py); a fixed --threads N is checked with N
    as "all" (runtime/jobs/sizing.set_exact)."""
    n = torch.get_num_threads()
    return tuple(sorted({1, max(1, n // 2), n}))


def _invariant(f, weights: list[torch.Tensor], rows: tuple[int, ...]) -> bool:
    """Whether f(x, w) gives each row the same bits at every row count in `rows`, in every
    place of the call (each of the first rows alone, the first m rows together, the first row
    last among others) and at every thread count. A difference is rare per element, so many
    rows are compared."""
    g = torch.Generator().manual_seed(0)
    n0 = torch.get_num_threads()
    try:
        for w in weights:
            x = torch.randn(max(rows), w.shape[1], generator=g).to(w.device, w.dtype)
            full = f(x, w)
            for t in _threads():
                torch.set_num_threads(t)
                if not all(torch.equal(f(x[i:i + 1], w), full[i:i + 1]) for i in range(8)):
                    return False
                for m in rows if t > 1 or len(_threads()) == 1 else [r for r in rows if r <= 64]:
                    last = torch.randn(m, w.shape[1], generator=g).to(w.device, w.dtype)
                    last[-1] = x[0]
                    if not (torch.equal(f(x[:m], w), full[:m])
                            and torch.equal(f(last, w)[-1], full[0])):
                        return False
    finally:
        torch.set_num_threads(n0)
    return True


PROBE_ROWS = (1, 2, 3, 4, 5, 8, 13, 33, 64)
PREFILL_ROWS = 512   # a prefill chunk's rows (GenerateConfig.prefill_chunk)


def probe(layers: list[torch.Tensor], head: torch.Tensor, head_dim: int):
    """The linears to use under --exact on this machine for the layers' weights (a prefill's
    row count is probed on them too) and the LM head, in order of preference (a generator):
    on the CPU linear2 where it is row-invariant, then tiled_linear where that is; on CUDA the
    Triton kernel (checked all the same); none if attention's batched matmuls in this dtype
    are not invariant. 1-2 s for the demo model. The model's own self-check
    (engine/selfcheck.py) has the last word."""
    # each shape's weights of the first, middle and last layer (whether a rounding difference
    # shows depends on the values); a prefill's rows at the run's thread count only
    shapes: dict = {}
    for w in layers:
        shapes.setdefault(tuple(w.shape), []).append(w)
    by_shape = [w for ws in shapes.values() for w in {id(v): v for v in
                                                        (ws[0], ws[len(ws) // 2], ws[-1])}.values()]
    linears = candidates(head.is_cuda)
    with torch.inference_mode():
        if not _attention_invariant(head.dtype, head.device, head_dim):
            return
    for f in linears:
        with torch.inference_mode():   # (not held while the caller has the candidate)
            ok = _invariant(f, by_shape, PROBE_ROWS + (PREFILL_ROWS,)) \
                and _invariant(f, [head], PROBE_ROWS)
        if ok:
            yield f


class ExactMeta:
    """The groups of one forward (built once from its SdpaMeta, shared by every layer): each
    group is a run of key rows in position order and the queries that attend over a prefix of
    it. A chain (or a prefill) is one group; a tree, one per root-to-leaf path (each node
    computed once, in the first path that holds it).

    The groups are computed in parts of one shape each (G groups x L keys x N queries). In a
    forward of decoding steps, chains and trees that is one part, every group padded to the
    longest (the padding costs less than more calls would). In a prefill (a group of more than
    QUERY_BLOCK queries) each block of QUERY_BLOCK queries is a group of its own over only the
    keys its queries see, and blocks of one key length make a part: a prompt's scores, softmax
    and weighted sum then cover its live keys, not the square of the longest prompt. A query's
    result is the same either way: its scores are the same matmul rows, and the keys a block
    leaves out had zero weight (weighted_sum adds its key blocks in order)."""

    def __init__(self, meta, num_tokens: int, heads_per_kv: int = 1):
        """heads_per_kv: query heads per KV head, which a group's rows are multiplied by in
        attention's matmuls (so a decoding token alone makes 2 or more rows where the model
        groups its query heads, and needs no padding row)."""
        mask = meta.mask[:, 0].cpu().numpy()                             # [B, N, L]
        counts = np.bincount(meta.q_seq.cpu().numpy(), minlength=mask.shape[0])
        cu = np.concatenate(([0], np.cumsum(counts)))
        groups = []
        for b, n in enumerate(counts):
            for cols, members, rank in _paths(mask[b, :n]):
                groups.append((_storage(meta, b, cols), cu[b] + members, rank))
        parts: dict = {}
        if max(len(g[1]) for g in groups) > QUERY_BLOCK:
            for rows, members, rank in groups:
                for i in range(0, len(members), QUERY_BLOCK):
                    r = rank[i:i + QUERY_BLOCK]
                    keys = rows[:int(r.max()) + 1]
                    parts.setdefault(key_length(len(keys)), []).append(
                        (keys, members[i:i + QUERY_BLOCK], r))
        else:
            parts[0] = groups
        rows_min = 1 if heads_per_kv >= 2 else 2   # (at least 2 rows a matmul: module docstring)
        out = np.empty(num_tokens, np.int64)
        self.parts, done = [], 0
        for _, part in sorted(parts.items()):
            self.parts.append(_Part(part, rows_min, out, done, meta.mask.device))
            done += self.parts[-1].size
        self.out = torch.from_numpy(out).to(meta.mask.device)


class _Part:
    """Groups of one shape (G, L, N): the storage rows of each group's keys (padded with its
    first), its queries' tokens (padded with token 0) and which keys each query cannot see.
    Sets out[token] to the token's place in the concatenated parts' outputs."""

    def __init__(self, groups, rows_min: int, out: np.ndarray, offset: int, dev):
        G, L = len(groups), key_length(max(len(g[0]) for g in groups))
        N = max(rows_min, max(len(g[1]) for g in groups))
        keys, toks = np.empty((G, L), np.int64), np.zeros((G, N), np.int64)
        limit = np.zeros((G, N), np.int64)
        for g, (rows, members, rank) in enumerate(groups):
            keys[g, :len(rows)], keys[g, len(rows):] = rows, rows[0]
            toks[g, :len(members)], limit[g, :len(members)] = members, rank
            out[members] = offset + g * N + np.arange(len(members))
        self.shape, self.size = (G, L, N), G * N
        self.keys = torch.from_numpy(keys.reshape(-1)).to(dev)
        self.tokens = torch.from_numpy(toks.reshape(-1)).to(dev)
        limit = torch.from_numpy(limit).to(dev)
        self.limit = limit[:, :, None]
        self.hidden = (torch.arange(L, device=dev) > self.limit)[:, None, :, None, :]
        self._windows: dict = {}

    def windowed(self, window: int) -> torch.Tensor:
        """hidden, and the keys at or past `window` behind each query (position = index)."""
        h = self._windows.get(window)
        if h is None:
            far = torch.arange(self.shape[1], device=self.limit.device) <= self.limit - window
            h = self._windows[window] = self.hidden | far[:, None, :, None, :]
        return h


def _paths(m: np.ndarray):
    """One sequence's queries' visible columns m [n, L] -> (columns, query indices, each
    query's last column's index in them) per group."""
    n, L = m.shape
    own = L - 1 - np.argmax(m[:, ::-1], axis=1)          # each query's own (last) column
    seen = m[:, own]                                       # [j, i]: query j sees query i
    done = np.zeros(n, bool)
    for leaf in np.flatnonzero(seen.sum(0) == 1):         # seen by nobody else
        cols = np.flatnonzero(m[leaf])
        members = np.flatnonzero(~done & seen[leaf])
        length = m[members].sum(1)
        if not np.array_equal(m[members][:, cols], np.arange(len(cols))[None, :] < length[:, None]):
            raise ValueError("--exact: a token's visible new tokens are not one path of a tree")
        done[members] = True
        yield cols, members, length - 1
    if not done.all():
        raise ValueError("--exact: a token is on no path of its sequence's tree")


def _storage(meta, b: int, cols: np.ndarray) -> np.ndarray:
    """Storage rows of sequence b's cache columns."""
    t = meta.table
    if isinstance(t, slice):
        return (t.start + b) * meta.block + cols
    t = t.cpu().numpy()
    if t.ndim == 1:
        return int(t[b]) * meta.block + cols
    return t[b, cols // meta.block] * meta.block + cols % meta.block


def exact_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta, scale: float | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """sdpa_attention's contract, batch-invariant (see the module docstring). HF's eager
    attention numerics: scores and the weighted sum are matmuls in the model's dtype, the
    softmax in fp32; the normalizer comes out of the weighted sum's matmul (a column of ones
    beside the values), as no fp32 sum over keys has a fixed order. A sliding-window layer's
    meta (attention.windowed) shares its forward's groups: a group's key j sits at position
    j, so its window hides keys below the query's position - window + 1."""
    window = meta.window
    if meta.base is not None:
        meta = meta.base
    if meta.exact is None:
        meta.exact = ExactMeta(meta, q.shape[0], q.shape[1] // k_cache.shape[1])
    e = meta.exact
    how = (q.shape[-1] ** -0.5 if scale is None else scale, softcap, window)
    outs = [_attend(q, k_cache, v_cache, part, how) for part in e.parts]
    return (outs[0] if len(outs) == 1 else torch.cat(outs)).index_select(0, e.out).to(q.dtype)


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            e: _Part, how: tuple) -> torch.Tensor:
    """One part's attention: [G * N, H, hd], a group's queries in its rows."""
    G, L, N = e.shape
    T, H, hd = q.shape
    KV = k_cache.shape[1]
    k = k_cache.index_select(0, e.keys).view(G, L, KV, hd).transpose(1, 2)
    v = v_cache.index_select(0, e.keys).view(G, L, KV, hd).transpose(1, 2)
    v1 = torch.cat((v, v.new_ones(G, KV, L, 1)), -1).reshape(G * KV, L, hd + 1)
    qg = q.index_select(0, e.tokens).view(G, N, KV, H // KV, hd).transpose(1, 2)
    s = bmm(qg.reshape(G * KV, -1, hd), k.reshape(G * KV, L, hd).transpose(1, 2))
    scale, cap, window = how
    s = s.float() * scale
    if cap is not None:
        s = det_tanh(s / cap) * cap
    hidden = e.hidden if window is None else e.windowed(window)
    s = s.view(G, KV, N, H // KV, L).masked_fill(hidden, float("-inf"))
    p = det_exp(s - s.amax(-1, keepdim=True)).masked_fill(hidden, 0.0).to(q.dtype)
    o = weighted_sum(p.view(G * KV, -1, L), v1)                      # weighted sum and total
    o = (o[..., :hd] / o[..., hd:]).view(G, KV, N, H // KV, hd).transpose(1, 2)
    return o.reshape(G * N, H, hd)


def key_length(n: int) -> int:
    """The key length a group of n keys is padded to (zero weights): whole KEY_BLOCKs."""
    return -(-n // KEY_BLOCK) * KEY_BLOCK


def weighted_sum(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """p [B, N, L] @ v [B, L, D] in fp32, L a multiple of KEY_BLOCK: each block of KEY_BLOCK
    keys one batched matmul of that one reduction length, the blocks' products added in fp32
    in key order. The order of the sum over keys is fixed here, not by the library: a BLAS
    may cut a reduction of L by L (oneDNN's AMX kernel does: a bf16 row's bits changed with
    the longest key group in the forward, so with whatever else was in the batch)."""
    B, N, L = p.shape
    nb = L // KEY_BLOCK
    if nb == 1 or p.is_cuda:   # (bi_matmul sums k in fixed blocks from 0 up already)
        return bmm(p, v).float()
    pb = p.view(B, N, nb, KEY_BLOCK).transpose(1, 2).reshape(B * nb, N, KEY_BLOCK)
    part = bmm(pb, v.reshape(B * nb, KEY_BLOCK, -1)).view(B, nb, N, -1)
    out = part[:, 0].float()
    for j in range(1, nb):
        out += part[:, j]   # (elementwise: each element's own adds, in key order)
    return out


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm, on CUDA the batch-invariant kernel."""
    if a.is_cuda:
        from specctl.engine import bi_matmul
        return bi_matmul.bmm(a, b)
    return torch.bmm(a, b)


def _attention_invariant(dtype: torch.dtype, device, hd: int) -> bool:
    """Whether attention's batched matmuls in `dtype` give a row the same bits at any batch,
    row and key count and thread count: the scores (a reduction over hd), and the weighted sum
    as weighted_sum runs it, on softmax-like weights spanning 2^0 .. 2^-20 (uniform weights
    sum exactly in fp32, so no order shows on them; ~1 output in 20,000 flips on peaked ones)
    over 512 x 6 rows, each key length from n to n + 64 against n."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, 64, hd, generator=g).to(device, dtype)
    k = torch.randn(8, hd, 2048, generator=g).to(device, dtype)
    ref_s = bmm(q[:1, :2], k[:1, :, :50])[0, 0]
    sums = [_weighted_sum_case(g, dtype, device, hd, n) for n in (38, 100)]
    n0 = torch.get_num_threads()
    try:
        for t in _threads():
            torch.set_num_threads(t)
            for x, m, n in ((1, 2, 50), (3, 5, 64), (8, 40, 300), (2, 13, 201), (8, 3, 51),
                            (4, 64, 2048)):
                for at in (0, m - 1):
                    qq = q[:x, :m].clone()
                    qq[0, at] = q[0, 0]
                    if not torch.equal(bmm(qq, k[:x, :, :n])[0, at, :50], ref_s):
                        return False
            if not all(_weighted_sum_invariant(*case) for case in sums):
                return False
    finally:
        torch.set_num_threads(n0)
    return True


def _weighted_sum_case(g, dtype, device, hd: int, n: int) -> tuple:
    """512 x 6 rows of softmax-like weights over n keys, their values, 3 x 40 rows whose last
    is the first row of the first 3, and weighted_sum's reference at the run's thread count."""
    p = torch.exp2(-20 * torch.rand(512, 6, n, generator=g)).to(device, dtype)
    v = torch.randn(512, n, hd + 1, generator=g).to(device, dtype)
    many = torch.randn(3, 40, n, generator=g).abs().to(device, dtype)
    many[:, -1] = p[:3, 0]
    return p, v, many, _padded_sum(p, v, n)


def _padded_sum(p: torch.Tensor, v: torch.Tensor, L: int) -> torch.Tensor:
    """weighted_sum with the keys padded (zero weights) to L rounded up to KEY_BLOCK."""
    n, L = p.shape[-1], key_length(L)
    return weighted_sum(F.pad(p, (0, L - n)), F.pad(v, (0, 0, 0, L - n)))


def _weighted_sum_invariant(p, v, many, ref) -> bool:
    """weighted_sum's rows the same bits as ref with the keys padded to any length from n to
    n + 64, for the first 3 of the batch alone, and for a row among 40 others."""
    n = p.shape[-1]
    for L in sorted({key_length(L) for L in range(n, n + 65)}):
        if not (torch.equal(_padded_sum(p, v, L), ref)
                and torch.equal(_padded_sum(p[:3], v[:3], L), ref[:3])
                and torch.equal(_padded_sum(many, v[:3], L)[:, -1], ref[:3, 0])):
            return False
    return True
