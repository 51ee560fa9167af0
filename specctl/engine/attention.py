"""Attention over the packed batch: masked SDPA (the default, and the reference everywhere) and
FlexAttention (`--attention flex`, meant for CUDA).

Keys and values are read straight from the slots' cache rows (committed prefix + this forward's
new rows, which were written before attention runs), through the cache's block tables
(engine/kv.py): a contiguous cache's slot is one block, read as a slice of it; a paged cache's
blocks are gathered in table order. Queries are laid out per sequence as
`[B, N_max]`; with N_max = 1 (every decode step of `ar`) or equal counts this is a free reshape of
the packed queries, otherwise a scatter. Only attention sees that layout: projections and MLPs run
on the T packed tokens. The mask is built once per forward and shared by every layer.

SDPA gathers each sequence's rows [0, L_max) out of the cache and attends under the dense
mask. FlexAttention (contiguous caches only) reads the cache in place: the whole cache of a layer is one key sequence of
(slots x max_len) rows, and a block mask built on the device from the same dense mask lists, per
sequence and block of 128 queries, only the 128-row key blocks of its own slot that it may see
(so nothing past a sequence's length is read, whatever max_len is); the mask_mod decides within
those blocks. Nothing in it synchronizes with the host, so it runs inside captured CUDA graphs.
On CUDA the flex kernel is compiled (torch.compile, once per shape); elsewhere it runs the
unfused reference implementation, which is what the CPU tests check against SDPA.

A sliding-window layer (ModelConfig.layer_windows) attends under its own mask, `windowed`: the
forward's mask with the keys at or past the window behind each query's position masked too
(made once per forward and window, shared by those layers). Every backend takes a layer's
softmax scale and soft-cap (Gemma 2's cap * tanh(score / cap)): SDPA has no soft-cap, so a
capped layer's scores are computed apart (`_capped`), as transformers' eager attention does.

On CUDA, SDPA runs with cuDNN's attention kernel off (`cudnn_attention`): torch's default sends
it there, and that kernel is not repeatable run to run in bf16 (two identical `ar` runs on an
H100 differed in 2 of 32 outputs; with it off, in none).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import torch.nn.functional as F

from specctl.engine.batch import ForwardBatch

# device types whose SDPA calls here run with cuDNN's kernel off (cudnn_attention)
_NO_CUDNN = {"cuda"}


def cudnn_attention(allowed: bool) -> None:
    """Whether specctl's SDPA calls on CUDA may use cuDNN's attention kernel (off by default:
    not repeatable in bf16; the loader sets it from --cudnn-attention, for the process).
    Off is applied around each call rather than once through torch's global switch, so code
    that turns the switch back on (a library, a caller's own model) cannot undo it, and a
    caller's own SDPA calls keep torch's default."""
    if allowed:
        _NO_CUDNN.discard("cuda")
    else:
        _NO_CUDNN.add("cuda")


def _sdpa_without_cudnn(*args, **kw) -> torch.Tensor:
    """F.scaled_dot_product_attention with torch's cuDNN switch off for this call only (two
    flag writes: well under a microsecond; a captured graph keeps the kernel chosen at capture).
    The switch is process-wide: another thread's SDPA during the call runs without cuDNN too."""
    cuda = torch.backends.cuda
    if not cuda.cudnn_sdp_enabled():
        return F.scaled_dot_product_attention(*args, **kw)
    cuda.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(*args, **kw)
    finally:
        cuda.enable_cudnn_sdp(True)


@dataclass
class SdpaMeta:
    table: torch.Tensor | slice      # contiguous cache: the slot of each sequence ([B] or a
                                     # slice); paged: its block table [B, blocks]
    block: int                       # rows per block of the cache
    index: torch.Tensor              # [T] storage row each new token's K/V is written to
    kv_len: int                      # L_max: columns of the mask
    n_max: int                       # N_max: query rows per sequence
    uniform: bool                    # every sequence has n_max new tokens (reshape, no scatter)
    q_seq: torch.Tensor              # [T] sequence index of each packed token
    q_idx: torch.Tensor              # [T] index of the token among its sequence's new tokens
    mask: torch.Tensor               # [B, 1, N_max, L_max] bool, True = may attend
    block_mask: tuple | None = None  # ((slots, max_len), FlexAttention BlockMask), made on first use
    tables: list | None = None       # the block tables it addresses (a batch keeps one meta)
    static: bool = False             # shapes fixed (a captured graph's forward): see _flex_kernel
    bias: torch.Tensor | None = None  # [B, 1, g * N_max, L] 0 / -inf in q.dtype (first use)
    exact: object = None             # engine.exact.ExactMeta, made on first use under --exact
    # per sequence, for the fused layer's attention (engine/fused.py)
    prefix: torch.Tensor | None = None   # [B] committed rows
    starts: torch.Tensor | None = None   # [B] its first packed token
    counts: torch.Tensor | None = None   # [B] its new tokens (query rows)
    window: int | None = None        # a sliding-window layer's meta (windowed): its window,
    base: "SdpaMeta | None" = None   # and the forward's meta it narrows

    @property
    def blocks(self) -> torch.Tensor:
        """[B, blocks] the cache blocks of each sequence's rows in order (a contiguous cache:
        one block a slot), as the fused attention reads them (made once per forward)."""
        b = self.__dict__.get("_blocks")
        if b is None:
            t = self.table
            if isinstance(t, slice):
                t = torch.arange(t.start, t.stop, device=self.index.device)
            b = self.__dict__["_blocks"] = t if t.dim() == 2 else t[:, None]
        return b


def sdpa_meta(batch: ForwardBatch, kv) -> SdpaMeta:
    """The attention metadata of an eager forward over `kv` (made once, kept on the batch)."""
    if batch._attn_meta is not None and batch._attn_meta.tables is kv.tables:
        return batch._attn_meta
    dev = batch.device
    B = len(batch.num_new)
    n_max = max(batch.num_new)
    L = batch.max_kv_len
    prefix = torch.tensor(batch.prefix_lens, device=dev)
    # default causal: query i of sequence b sees columns [0, prefix_b + i]
    limit = prefix[:, None] + torch.arange(n_max, device=dev)[None, :]           # [B, N_max]
    mask = torch.arange(L, device=dev)[None, None, :] <= limit[:, :, None]      # [B, N_max, L]
    if batch.masked:   # their new tokens' columns from the batch's local masks
        _place_local(mask, batch)
    counts = torch.tensor(batch.num_new, device=dev)
    q_seq = torch.repeat_interleave(torch.arange(B, device=dev), counts)
    starts = torch.tensor(batch.cu_seqlens[:-1], device=dev)
    q_idx = torch.arange(batch.num_tokens, device=dev) - starts[q_seq]
    slots = batch.seq_slots
    kv.check_reserved(slots, [p + n for p, n in zip(batch.prefix_lens, batch.num_new)])
    if kv.paged:
        table = kv.table(slots, L, dev)
        rows = batch.rows
        index = table[q_seq, rows // kv.block] * kv.block + rows % kv.block
    else:
        table = slice(0, B) if slots == list(range(B)) else torch.tensor(slots, device=dev)
        index = batch.slots * kv.block + batch.rows
    meta = SdpaMeta(table, kv.block, index, L, n_max, all(n == n_max for n in batch.num_new),
                    q_seq, q_idx, mask[:, None], tables=kv.tables, prefix=prefix,
                    starts=starts, counts=counts)
    batch._attn_meta = meta
    return meta


def windowed(meta: SdpaMeta, positions: torch.Tensor, window: int) -> SdpaMeta:
    """The meta of a sliding-window layer: meta's mask, and a key is seen only while
    q_pos - k_pos < window (transformers' sliding_window_overlay), by the tokens' positions
    (a committed row's is its index; a new token's, its position in the batch: a tree's
    tokens sit deeper than their columns). Made once per forward and window, on the device
    (no host read: a captured forward makes it too)."""
    kept = meta.__dict__.setdefault("_windows", {})
    if window in kept:
        return kept[window]
    B, _, N, L = meta.mask.shape
    dev = meta.mask.device
    tok = torch.zeros(B, N, dtype=torch.long, device=dev)    # [B, N] packed token of a query
    tok[meta.q_seq, meta.q_idx] = torch.arange(positions.shape[0], device=dev)
    qpos = positions[tok]
    cols = torch.arange(L, device=dev)[None, :]
    new = cols - meta.prefix[:, None]                                   # [B, L]
    kpos = torch.where(new >= 0, positions[tok.gather(1, new.clamp(0, N - 1))], cols)
    keep = kpos[:, None, :] > qpos[:, :, None] - window                 # [B, N, L]
    out = replace(meta, mask=meta.mask & keep[:, None], bias=None, block_mask=None, exact=None,
                  window=window, base=meta)
    kept[window] = out
    return out


def _place_local(mask: torch.Tensor, batch: ForwardBatch, host: bool | None = None) -> None:
    """mask[b, :, p_b:p_b + N_max] = batch.local[b] for the batch's masked sequences (past a
    sequence's own tokens its local mask is False: nothing new beyond them is seen). On the CPU
    (host) a numpy slice per sequence (~1 us); elsewhere one upload and one scatter."""
    n, L, masked = mask.shape[1], mask.shape[2], batch.masked
    if host if host is not None else mask.device.type == "cpu":
        m, local = mask.numpy(), batch.local
        for b in masked:
            p = batch.prefix_lens[b]
            w = min(n, L - p)
            m[b, :, p:p + w] = local[b, :, :w]
        return
    local = torch.from_numpy(batch.local[masked]).to(mask.device)
    p = torch.tensor([batch.prefix_lens[b] for b in masked], device=mask.device)
    cols = (p[:, None, None] + torch.arange(n, device=mask.device)).expand(len(masked), n, n)
    wide = torch.nn.functional.pad(mask[masked], (0, n))   # (a window may run past L)
    wide.scatter_(2, cols, local)
    mask[masked] = wide[..., :L]


def _per_seq(q: torch.Tensor, meta: SdpaMeta) -> torch.Tensor:
    """Packed queries [T, H, hd] -> [B, H, N_max, hd]."""
    T, H, hd = q.shape
    B = meta.mask.shape[0]
    if meta.uniform:
        qp = q.view(B, meta.n_max, H, hd)
    else:
        qp = q.new_zeros(B, meta.n_max, H, hd)
        qp[meta.q_seq, meta.q_idx] = q
    return qp.transpose(1, 2)


def _packed(out: torch.Tensor, meta: SdpaMeta, T: int) -> torch.Tensor:
    """[B, H, N_max, hd] -> the packed [T, H, hd]."""
    out = out.transpose(1, 2)                                         # [B, N_max, H, hd]
    if meta.uniform:
        return out.reshape(T, *out.shape[2:])
    return out[meta.q_seq, meta.q_idx]


def _rows(cache: torch.Tensor, meta: SdpaMeta) -> torch.Tensor:
    """A layer's cache [rows, KV, hd] -> each sequence's rows [B, KV, L_max, hd]."""
    blocks = cache.view(-1, meta.block, *cache.shape[1:])
    t = meta.table
    if isinstance(t, slice):   # one block per slot, the batch's slots in a row: a view
        return blocks[t, :meta.kv_len].transpose(1, 2)
    # (index_select: on the CPU ~6x faster than the same gather by advanced indexing)
    if t.dim() == 1:           # one block per slot
        return blocks[:, :meta.kv_len].index_select(0, t).transpose(1, 2)
    rows = blocks.index_select(0, t.reshape(-1)).view(t.shape[0], -1, *cache.shape[1:])
    return rows[:, :meta.kv_len].transpose(1, 2)


def sdpa_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: SdpaMeta, scale: float | None = None,
                   softcap: float | None = None) -> torch.Tensor:
    """q: [T, H, hd]; k_cache, v_cache: a layer's cache [rows, KV, hd] -> [T, H, hd].

    Grouped queries are folded into the query dimension: the g = H / KV heads sharing a KV head
    attend as g * N_max query rows of one head ([B, KV, g * N_max, hd], the mask's rows repeated
    per head). No backend then has to support GQA (`enable_gqa`), so on CUDA without cuDNN SDPA
    takes the memory-efficient kernel (masks, bf16, repeatable), not the math fallback's
    expanded K/V and separate softmax, and K/V are read once per KV head."""
    k, v = _rows(k_cache, meta), _rows(v_cache, meta)
    T, H, hd = q.shape
    B, KV, N = meta.mask.shape[0], k.shape[1], meta.n_max
    g = H // KV
    if meta.bias is None or meta.bias.dtype != q.dtype:
        # once per forward: given the boolean mask, SDPA would convert it in every layer
        meta.bias = torch.zeros(meta.mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~meta.mask, float("-inf")).repeat(1, 1, g, 1)              # [B, 1, g * N, L]
    qf = _per_seq(q, meta).reshape(B, KV, g * N, hd)   # head h = kv * g + j (GQA's grouping)
    if softcap is not None:
        out = _capped(qf, k, v, meta.bias, scale, softcap).reshape(B, H, N, hd)
        return _packed(out, meta, T)
    sdpa = _sdpa_without_cudnn if q.device.type in _NO_CUDNN else F.scaled_dot_product_attention
    out = sdpa(qf, k, v, attn_mask=meta.bias, scale=scale).reshape(B, H, N, hd)
    return _packed(out, meta, T)


def _capped(q, k, v, bias, scale: float | None, cap: float) -> torch.Tensor:
    """Soft-capped attention as transformers' eager attention runs it: scores in the model's
    dtype, capped, masked, softmax in fp32."""
    s = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    s = torch.tanh(s / cap) * cap + bias
    return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)


FLEX_BLOCK = 128   # rows of a FlexAttention block, queries and keys alike


def flex_block_mask(meta: SdpaMeta, num_slots: int, max_len: int):
    """The BlockMask of one forward over a whole-cache key sequence of num_slots * max_len rows
    (max_len a multiple of FLEX_BLOCK). Built from meta.mask on the device, without host sync."""
    from torch.nn.attention.flex_attention import BlockMask
    dense = meta.mask[:, 0]                                           # [B, N, C]
    B, N, C = dense.shape
    dev = dense.device
    slots = meta.table if isinstance(meta.table, torch.Tensor) else \
        torch.arange(meta.table.start, meta.table.stop, device=dev)
    nq, per = -(-N // FLEX_BLOCK), max_len // FLEX_BLOCK
    # the columns each block of queries needs: up to its last visible one
    last = torch.where(dense, torch.arange(1, C + 1, dtype=torch.int32, device=dev), 0).amax(-1)
    need = F.pad(last, (0, nq * FLEX_BLOCK - N)).view(B, nq, FLEX_BLOCK).amax(-1)   # [B, nq]
    num = ((need + FLEX_BLOCK - 1) // FLEX_BLOCK).to(torch.int32)[:, None]   # [B, 1, nq]
    total = num_slots * per
    first = torch.arange(total, device=dev)
    idx = (slots[:, None] * per + first[None, :]) % total             # own slot's blocks first
    idx = idx.to(torch.int32)[:, None, None, :].expand(B, 1, nq, total).contiguous()

    def mask_mod(b, h, q_idx, kv_idx):
        col = kv_idx - slots[b] * max_len
        ok = (col >= 0) & (col < C)
        return ok & dense[b, q_idx, col.clamp(0, C - 1)]

    return BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(N, total * FLEX_BLOCK),
                                    compute_q_blocks=False)


@lru_cache(maxsize=None)
def _flex_kernel(device_type: str):
    """The flex kernel: on CUDA compiled, whole, with automatic dynamic shapes, so a new token
    count compiles once more, not once per count. Captured graphs' forwards keep their batch
    dimension static (flex_attention() marks it): flex's decoding kernel needs a static batch,
    so they compile once or twice per batch bucket. A graph break or the recompile limit would
    fall back to the unfused reference, which materializes scores over the whole cache: both
    fail loudly instead."""
    from torch.nn.attention.flex_attention import flex_attention
    if device_type == "cuda":
        import torch._dynamo
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, 256)
        if hasattr(cfg, "fail_on_recompile_limit_hit"):
            cfg.fail_on_recompile_limit_hit = True
        return torch.compile(flex_attention, fullgraph=True)
    # elsewhere the unfused reference implementation (correct, not fast: for tests)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return flex_attention


def flex_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: SdpaMeta, scale: float | None = None,
                   softcap: float | None = None) -> torch.Tensor:
    """Same contract as sdpa_attention; reads the cache in place (see the module docstring)."""
    if not isinstance(meta.table, slice) and meta.table.dim() != 1:
        raise ValueError("flex attention reads a contiguous KV cache, not a paged one")
    Lm = meta.block
    S, KV, hd = k_cache.shape[0] // Lm, k_cache.shape[1], k_cache.shape[2]
    if Lm % FLEX_BLOCK:
        raise ValueError(f"flex attention needs a cache length that is a multiple of "
                         f"{FLEX_BLOCK}, got {Lm}")
    if meta.block_mask is None or meta.block_mask[0] != (S, Lm):   # once per forward
        meta.block_mask = ((S, Lm), flex_block_mask(meta, S, Lm))
    bm = meta.block_mask[1]
    k = k_cache.view(1, S * Lm, KV, hd).transpose(1, 2)               # [1, KV, S*Lm, hd]
    v = v_cache.view(1, S * Lm, KV, hd).transpose(1, 2)
    qp = _per_seq(q, meta)
    if meta.static and q.is_cuda:
        import torch._dynamo
        torch._dynamo.mark_static(qp, 0)
    mod = None if softcap is None else _softcap_mod(softcap)
    out = _flex_kernel(q.device.type)(qp, k, v, block_mask=bm, enable_gqa=KV != q.shape[1],
                                      scale=scale, score_mod=mod)
    return _packed(out, meta, q.shape[0])


def _softcap_mod(cap: float):
    """Flex's score_mod for a soft-cap (at module level: flex_attention's own scope binds
    `torch` locally, which a closure there would see unbound)."""
    def mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap
    return mod


BACKENDS = {"sdpa": sdpa_attention, "flex": flex_attention}
# what --attention takes: fused is the fused layer (engine/fused.py, its prefill on sdpa);
# auto is fused on CUDA where Triton is installed, else sdpa (Model.set_attention)
ATTENTION = ("auto", "sdpa", "flex", "fused")


def load_fused(device: torch.device):
    """engine.fused, where it can run: on CUDA, or on the CPU under Triton's interpreter."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not (device.type == "cpu" and interpreted):
        raise ValueError(f"--attention fused runs on CUDA, and this model is on "
                         f"{device.type}: use --attention auto or sdpa (the CPU runs the fused "
                         "kernels only under Triton's interpreter, TRITON_INTERPRET=1, for tests)")
    try:
        from specctl.engine import fused
    except ImportError as e:
        raise ValueError(f"--attention fused needs Triton ({e})") from None
    return fused
