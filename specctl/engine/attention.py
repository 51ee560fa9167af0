"""Attention over the packed batch: the masked-SDPA backend (CPU, and the reference everywhere).

Keys and values are read straight from the slots' cache rows (committed prefix + this forward's
new rows, which were written before attention runs). Queries are laid out per sequence as
`[B, N_max]`; with N_max = 1 (every decode step of `ar`) or equal counts this is a free reshape of
the packed queries, otherwise a scatter. Only attention sees that layout: projections and MLPs run
on the T packed tokens. The mask is built once per forward and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specctl.engine.batch import ForwardBatch


@dataclass
class SdpaMeta:
    slots: torch.Tensor | slice      # which cache slots, in batch order ([B] or a slice)
    kv_len: int                      # L_max: columns of the mask
    n_max: int                       # N_max: query rows per sequence
    uniform: bool                    # every sequence has n_max new tokens (reshape, no scatter)
    q_seq: torch.Tensor              # [T] sequence index of each packed token
    q_idx: torch.Tensor              # [T] index of the token among its sequence's new tokens
    mask: torch.Tensor               # [B, 1, N_max, L_max] bool, True = may attend


def sdpa_meta(batch: ForwardBatch) -> SdpaMeta:
    if batch._attn_meta is not None:
        return batch._attn_meta
    dev = batch.device
    B = len(batch.seqs)
    n_max = max(batch.num_new)
    L = batch.max_kv_len
    prefix = torch.tensor(batch.prefix_lens, device=dev)
    # default causal: query i of sequence b sees columns [0, prefix_b + i]
    limit = prefix[:, None] + torch.arange(n_max, device=dev)[None, :]           # [B, N_max]
    mask = torch.arange(L, device=dev)[None, None, :] <= limit[:, :, None]      # [B, N_max, L]
    for b, s in enumerate(batch.seqs):
        if s.mask is not None:
            n, p = len(s.tokens), s.prefix_len
            mask[b, :n, p:p + n] = s.mask.to(dev)
            mask[b, :n, p + n:] = False
    counts = torch.tensor(batch.num_new, device=dev)
    q_seq = torch.repeat_interleave(torch.arange(B, device=dev), counts)
    starts = torch.tensor(batch.cu_seqlens[:-1], device=dev)
    q_idx = torch.arange(batch.num_tokens, device=dev) - starts[q_seq]
    slots = batch.seq_slots
    slot_sel = slice(0, B) if slots == list(range(B)) else torch.tensor(slots, device=dev)
    meta = SdpaMeta(slot_sel, L, n_max, all(n == n_max for n in batch.num_new), q_seq, q_idx,
                    mask[:, None])
    batch._attn_meta = meta
    return meta


def sdpa_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: SdpaMeta) -> torch.Tensor:
    """q: [T, H, hd]; k_cache, v_cache: [slots, max_len, KV, hd] -> [T, H, hd]."""
    T, H, hd = q.shape
    B = meta.mask.shape[0]
    if meta.uniform:
        qp = q.view(B, meta.n_max, H, hd)
    else:
        qp = q.new_zeros(B, meta.n_max, H, hd)
        qp[meta.q_seq, meta.q_idx] = q
    k = k_cache[meta.slots, :meta.kv_len].transpose(1, 2)   # [B, KV, L, hd]
    v = v_cache[meta.slots, :meta.kv_len].transpose(1, 2)
    out = F.scaled_dot_product_attention(qp.transpose(1, 2), k, v, attn_mask=meta.mask,
                                         enable_gqa=k.shape[1] != H)   # [B, H, N_max, hd]
    out = out.transpose(1, 2)                                         # [B, N_max, H, hd]
    if meta.uniform:
        return out.reshape(T, H, hd)
    return out[meta.q_seq, meta.q_idx]
