"""Kangaroo's heads (speculative/kangaroo.py): the adapter as the head of the forwards a
drafter runs, its KV cache a one-layer sibling of the target's, and the layer-l states of lean
steps kept for the adapter's rows, which the next drafting step writes in one batched pass
(AdapterHead.catch_up). Kept by the model's graphs per cache, so a replay finds them where it
was captured."""

from __future__ import annotations

import functools

import numpy as np
import torch

from specctl.engine.batch import LayerPlan
from specctl.engine.kv import KVCache

PASS_ROWS = 8192   # the most rows one pass of a catch-up writes


class AdapterHead:
    """The adapter as the head of a layers-[0, l) forward (Model.run): layer-l
    states -> (the states, draft logits), writing the adapter's KV rows into its own cache.
    Its `hidden` holds a lean forward's states (AdapterWhole), whose adapter rows catch_up
    writes later; a drafting step's rows are written by its own forwards."""

    def __init__(self, adapter, akv: KVCache):
        self.adapter, self.akv = adapter, akv
        self.key = ("kangaroo", adapter.l)
        self.target = None   # the target's cache akv is a sibling of
        self.loaded = None   # the Adapter whose weights it holds (see KangarooDrafter._head)
        m = adapter.model   # (a row of layer-l states for each row of the KV cache's storage)
        self.hidden = torch.zeros(akv.k_all.shape[1], m.cfg.hidden_size, dtype=m.dtype,
                                  device=m.device)
        # each slot's rows [0, done) hold the adapter's keys and values; its rows [done,
        # lens) only their states in hidden (lean steps'), until catch_up writes them
        self.done = [0] * akv.num_slots
        self._pinned = self._copied = None   # (catch_up's host buffer, and its last copy)

        self.rows_only = AdapterRows(self)
        self.whole = AdapterWhole(self)

    def __call__(self, h, positions, meta):
        return h, self.adapter.decode(h, positions, meta, self.akv)

    def catch_up(self, slots: list[int], ahead: int = 0) -> None:
        """The adapter's rows of each slot's lean stretch (its rows [done, lens + ahead):
        ahead, what a lean forward in flight writes, ordered before this on the device) from
        their states, in batched passes of at most PASS_ROWS rows (a pass's temporaries are
        its rows' states a few times over); then those rows have them."""
        done, lens, akv = self.done, self.akv.lens, self.akv
        lag = [(s, done[s], lens[s] + ahead) for s in slots if done[s] < lens[s] + ahead]
        for s in slots:
            done[s] = lens[s] + ahead
        if not lag:
            return
        slot, start, end = (np.array(x, dtype=np.int64) for x in zip(*lag))
        counts = end - start
        first = np.cumsum(counts) - counts
        rows = np.repeat(start - first, counts) + np.arange(int(counts.sum()))
        index = akv.index_array(np.repeat(slot, counts), rows)
        index, rows = self._upload(np.stack([index, rows]))
        for i in range(0, len(rows), PASS_ROWS):
            at = index[i:i + PASS_ROWS]
            self.adapter.write_rows(self.hidden[at], rows[i:i + PASS_ROWS], at, akv)

    def _upload(self, a: np.ndarray) -> torch.Tensor:
        """a on the head's device, copied without waiting for the device (on CUDA a
        pageable copy synchronizes: the host would wait for the forward it runs beside)
        through a pinned buffer, which the last copy has finished reading."""
        dev = self.hidden.device
        if dev.type != "cuda":
            return torch.from_numpy(a)
        if self._copied is not None:
            self._copied.synchronize()
        if self._pinned is None or self._pinned.numel() < a.size:
            self._pinned = torch.empty(max(a.size, 4096), dtype=torch.long, pin_memory=True)
        host = self._pinned[:a.size].view(a.shape)
        host.numpy()[:] = a
        out = host.to(dev, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return out


class AdapterRows:
    """An AdapterHead that only writes the adapter's KV rows: the head of a shallow forward
    that drafts nothing (a full chain's last draft's, a prompt's)."""

    def __init__(self, head: AdapterHead):
        self.head = head
        self.key = ("kangaroo-rows", head.adapter.l)

    def __call__(self, h, positions, meta):
        self.head.adapter.write_rows(h, positions, meta.index, self.head.akv)
        return (h,)


class AdapterWhole:
    """The head of a whole-model forward that drafts nothing (Kangaroo's `ar` step): the
    captured layer-l states kept for the adapter's rows (AdapterHead.catch_up, at the next
    drafting step), the last layer's states returned. One forward (one graph replay) where
    the shallow and deep ones would be two, and a copy where the adapter's rows were ~10
    kernels."""

    def __init__(self, head: AdapterHead):
        self.head = head
        self.key = ("kangaroo-whole", head.adapter.l)

    def __call__(self, out, positions, meta):
        h, h_l = out
        self.head.hidden[meta.index] = h_l
        return (h,)


@functools.cache
def whole_plan(l: int) -> LayerPlan:
    """The plan of a whole-model forward capturing layer l's states (a lean step's): one
    object for every drafter, so a graph's key held since start-up is found by identity (an
    equal plan made anew cost its dataclass __eq__ at every lean step, and making one ~2 us)."""
    return LayerPlan(capture=l)
