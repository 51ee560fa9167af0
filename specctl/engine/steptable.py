"""The step-cost table: what one decoding step costs by batch size and tokens per sequence.

    table = measure_step_table(model, batches=(1, 8, 32), ns=(1, 2, 4, 8, 16, 32, 64, 96))
    table.ms(32, 16)          # ms of a step of 32 sequences x 16 new tokens each
    table.ms(32, 16) / table.ms(32, 1)   # what verifying 15 extra tokens per sequence costs

A step here is what the runner does for a greedy verify: one Model.run over b sequences of n new
tokens each (every sequence `context` committed rows deep; on CUDA through the captured graphs),
then the greedy head over every row, read back to the host. This is the price list a speculation
controller needs: a draft of k tokens pays off only while ms(b, k + 1) / ms(b, 1) stays below the
tokens it is expected to emit.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.model import tile_rows
from specctl.io.schema import SchemaError, boolean, fields, integer, list_of, number, string

# Raised whenever the engine's forward changes what a step costs, or the table is measured
# differently (a stored table from an earlier engine is measured again): 2 = the CPU matmul form
# of engine/model.py `linear`, 3 = the fastest of round-robin repeats, 4 = rows lowered to
# non-decreasing (nondecreasing) rather than raised, 5 = CPU matmul rows padded (gemm_rows),
# 6 = the median of round-robin rounds, 7 = each round's first step timed warm.
ENGINE_COSTS = 7
FLOOR = 0.5   # the least a step of more sequences may cost against fewer (StepTable.implausible:
# timing noise, not a table measured wrong; an eager H200 table read b8 at 0.82x b1 at one
# point, the corrupt ones 0.03-0.06x)


_SCHEMA = {"device": string(nonempty=True), "dtype": string(nonempty=True),
           "attention": string(nonempty=True), "context": integer(0),
           "batches": list_of(integer(1), unique=True, nonempty=True),
           "ns": list_of(integer(1), unique=True, nonempty=True),
           "table": list_of(list_of(number(above=0)))}
_OPTIONAL = {"engine": integer(1), "tiles": boolean}


@dataclass(frozen=True)
class StepTable:
    device: str
    dtype: str
    attention: str
    context: int
    batches: tuple[int, ...]
    ns: tuple[int, ...]
    table: tuple[tuple[float, ...], ...]   # table[i][j]: ms of batches[i] x ns[j]
    engine: int = ENGINE_COSTS             # the engine costs it measured (ENGINE_COSTS)
    tiles: bool = False                    # rows cost by tile_rows (a CPU table)

    def ms(self, b: int, n: float) -> float:
        """Measured ms of b x n; between measured points, linear in n at the nearest batch
        size at or above b (the largest one past the table). n may be fractional: the mean
        tokens of an uneven batch. With tiles (a CPU table) the row is read in rows rounded
        up to the tile they cost (tile_rows), the step's b * n against the row's measured
        points: at batch 8, n = 1.125 (one draft token, 9 rows) costs what n = 2 (16 rows)
        does, and 2 sequences of 1.5 tokens (3 rows, as 4) what the batch-8 row's first
        point (8 rows) does."""
        return float(self.ms_many(b, np.array([n], dtype=np.float64))[0])

    def ms_many(self, b: int, n: np.ndarray) -> np.ndarray:
        """ms(b, x) for every x in the float array n, at once (a controller prices hundreds
        of candidate steps per step)."""
        row, ns = self._row(b)
        if self.tiles:
            n = tile_rows(np.ceil(b * n - 1e-6).astype(np.int64)).astype(np.float64)
        j = np.clip(np.searchsorted(ns, n), 1, len(ns) - 1)   # ns[j - 1] < n <= ns[j]
        lo, dy = ns[j - 1], row[j] - row[j - 1]
        out = row[j - 1] + (n - lo) / np.maximum(ns[j] - lo, 1e-300) * dy
        return np.where(n <= ns[0], row[0], np.where(n > ns[-1], row[-1] * n / ns[-1], out))

    def _row(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The row ms(b, .) is read from and its points (in rows rounded to tiles, on a CPU)."""
        rows = self.__dict__.setdefault("_rows", {})   # (a cache: the table is frozen)
        got = rows.get(b)
        if got is None:
            i = next((i for i, x in enumerate(self.batches) if x >= b), len(self.batches) - 1)
            ns = np.asarray(self.ns)
            if self.tiles:
                ns = tile_rows(self.batches[i] * ns)
            got = rows[b] = (np.asarray(self.table[i], dtype=np.float64), ns.astype(np.float64))
        return got

    def implausible(self) -> str | None:
        """Why no machine could have measured this table, or None: a step of more sequences
        priced below FLOOR times a step of fewer at the same tokens each (more rows through
        the same weights never cost less; a table measured while another process had the
        CPU's cores priced batch 1 at 17x batch 64, and every run that read it was told it
        won 2x against `ar` while it lost)."""
        rows = sorted(zip(self.batches, self.table))
        for (a, low), (b, high) in zip(rows, rows[1:]):
            for n, fewer, more in zip(self.ns, low, high):
                if more < FLOOR * fewer:
                    return (f"batch {b} x {n} tokens priced at {more:.3g} ms, below batch "
                            f"{a}'s {fewer:.3g}")
        return None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d) -> "StepTable":
        """A table as `to_json` wrote it, every field checked, never coerced (SchemaError, a
        ValueError, naming the field). Older tables lack engine (1) and tiles (a CPU's)."""
        try:
            f = fields(d, _SCHEMA, _OPTIONAL, what="step table")
        except SchemaError as e:
            raise ValueError(f"malformed step table: {e}") from None
        t = cls(f["device"], f["dtype"], f["attention"], f["context"], tuple(f["batches"]),
                tuple(f["ns"]), tuple(tuple(row) for row in f["table"]), f.get("engine", 1),
                f.get("tiles", f["device"] == "cpu"))
        if len(t.table) != len(t.batches) or any(len(r) != len(t.ns) for r in t.table):
            raise ValueError("malformed step table: table is not batches x ns")
        return t

    def markdown(self) -> str:
        head = "| batch \\ n | " + " | ".join(str(n) for n in self.ns) + " |"
        rows = [head, "|---" * (len(self.ns) + 1) + "|"]
        for b, r in zip(self.batches, self.table):
            rows.append(f"| {b} | " + " | ".join(f"{v:.3f}" for v in r) + " |")
        return "\n".join(rows)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def measure_step_table(model, batches=(1, 8, 32, 64), ns=(1, 2, 4, 8, 16, 32, 64, 96),
                       context: int = 256, repeats: int = 10, warmup: int = 2,
                       progress=None, kv=None) -> StepTable:
    """Time a greedy step for every (batch, n): the median of `repeats` rounds, each round a
    sweep over the ns after `warmup` runs of each (which also capture the graphs). A shared
    machine's speed changes in spells of seconds: a round takes a fraction of one, so a spell
    lands on all the points of a round alike, and the median over rounds drops a spike that
    hit one point. (The fastest of the rounds let one fast spell price a single point: a
    batch-1 table had 1 token at 25 ms and 2 at 38, where both run the same matmuls.) Each row
    is then made non-decreasing in n. progress(b, n, ms), if given, is called for each point.
    kv: an idle cache to measure on, of every batch's slots and context + max(ns) + 1 rows (a
    run's own: a new cache would let go of the run's cache and the graphs captured on it, see
    Model.new_kv_cache); its slots are left empty."""
    dev = model.device
    g = torch.Generator().manual_seed(0)
    table = []
    own = kv is None
    for b in batches:
        if own:
            kv = model.new_kv_cache(b, context + max(ns) + 1)
        elif b > kv.num_slots or context + max(ns) + 1 > kv.max_len:
            raise ValueError(f"a cache of {kv.num_slots} x {kv.max_len} rows cannot measure "
                             f"batch {b} at {context} + {max(ns)} rows")
        for s in range(b):
            if not kv.reserve(s, context + max(ns) + 1):
                raise ValueError("the KV cache has too few free blocks to measure on")
            kv.lens[s] = context   # committed rows (their values do not change the cost)
        steps = []
        for n in ns:
            toks = torch.randint(0, model.cfg.vocab_size, (b, n), generator=g).tolist()
            steps.append(ForwardBatch([SeqInput(s, toks[s], context) for s in range(b)], dev))
        times: list[list[float]] = [[] for _ in ns]
        for i in range(warmup + repeats):
            # a round starts from its smallest step right after its largest, which leaves the
            # caches and the allocator cold for it: one untimed run of it first (a decoding
            # step follows steps of its own size). Timed cold at batch 8 on the 2-core CPU,
            # n = 1 after n = 64 took 81 ms against 67 after n = 1.
            model.argmax(model.run(steps[0], kv)).tolist()
            for j, batch in enumerate(steps):
                _sync(dev)
                t = time.perf_counter()
                model.argmax(model.run(batch, kv)).tolist()   # (reading it back syncs)
                if i >= warmup:
                    times[j].append((time.perf_counter() - t) * 1e3)
        row = nondecreasing([statistics.median(ts) for ts in times])
        if progress:
            for n, ms in zip(ns, row):
                progress(b, n, ms)
        table.append(tuple(row))
        for s in range(b):
            kv.reset(s)
    return StepTable(dev.type, str(model.dtype).replace("torch.", ""), model.attention, context,
                     tuple(batches), tuple(ns), tuple(table), tiles=dev.type == "cpu")


def nondecreasing(y: list[float]) -> list[float]:
    """The largest non-decreasing sequence at or below `y` (a running minimum from the right).
    More tokens are never less work: a point timed above a larger n's was slowed by noise, so
    it is lowered to that one (which prices drafting as dearer, never as cheaper). A table in
    which n + 1 tokens cost less than n would make drafts look free."""
    out = list(y)
    for j in range(len(out) - 2, -1, -1):
        out[j] = min(out[j], out[j + 1])
    return out


def _numel(ts) -> int:
    return sum(t.numel() for t in ts if t is not None)


def weight_shares(model) -> tuple[list[int], list[int], int]:
    """(attention weights per layer, MLP weights per layer, LM head weights): the cost shares
    of the blocks a layer-skip or early-exit draft runs (matmul work ~ weights per token)."""
    attn = [_numel([L.wqkv, L.wo]) for L in model.layers]
    mlp = [_numel([L.w_gate_up, L.w_down]) for L in model.layers]
    return attn, mlp, model.lm_head.numel()
