"""Several processes, one job: `torchrun` (or any launcher that sets RANK / WORLD_SIZE) runs one
specctl process per GPU (or per CPU process), on one node or many.

The processes talk only through a small gloo process group (MASTER_ADDR / MASTER_PORT, the
`env://` rendezvous): barriers and small JSON messages (run id, done indices, errors, per-rank
stats). Model computation is independent per rank, and a rank's outputs go to its own file in the
shared store, so the control plane never carries tokens or tensors. gloo, not NCCL, even on GPUs:
the messages are tiny and gloo needs no device memory or CUDA stream. Messages are JSON, never
pickle (torch's `*_object` collectives unpickle what a peer sends).

WORLD_SIZE unset or 1 is the ordinary single process: every call here is then a no-op and errors
propagate unchanged.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from specctl.errors import SpecctlError
from specctl.store import jsonl_lines

# a barrier may wait for the slowest rank's whole shard: hours, not gloo's default 30 minutes
DEFAULT_TIMEOUT_S = 7 * 24 * 3600


class RankStopped(SpecctlError):
    """This rank stops because the job failed; rank 0 prints the reason (so it is printed once)."""

    def __init__(self, exit_code: int = 1):
        super().__init__("stopped: the job failed (rank 0 reports why)", exit_code)


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1


def dist_env(environ=None) -> DistEnv:
    """RANK / WORLD_SIZE / LOCAL_RANK as set by torchrun, torch.distributed.launch, or by hand
    (e.g. from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID). LOCAL_RANK defaults to RANK."""
    env = os.environ if environ is None else environ

    def num(name: str, default: int | None) -> int | None:
        v = env.get(name)
        if v is None or v.strip() == "":
            return default
        try:
            return int(v)
        except ValueError:
            raise SpecctlError(f"{name}={v!r} is not an integer") from None

    world = num("WORLD_SIZE", 1)
    if world is None or world <= 1:
        if world is not None and world < 1:
            raise SpecctlError(f"WORLD_SIZE={world} must be at least 1")
        return DistEnv()
    rank = num("RANK", None)
    if rank is None:
        raise SpecctlError(f"WORLD_SIZE={world} is set but RANK is not (set both, or launch "
                           "with torchrun)")
    if not 0 <= rank < world:
        raise SpecctlError(f"RANK={rank} is not in 0..{world - 1} (WORLD_SIZE={world})")
    local = num("LOCAL_RANK", rank)
    if local < 0:
        raise SpecctlError(f"LOCAL_RANK={local} must not be negative")
    return DistEnv(rank, world, local)


def rank_device(device: str, env: DistEnv) -> str:
    """The device a rank computes on: with several ranks, 'auto'/'cuda' become cuda:LOCAL_RANK
    (one GPU per process), or cuda:0 when the process sees a single GPU (a launcher that binds
    one GPU per task through CUDA_VISIBLE_DEVICES, e.g. srun --gpus-per-task=1); an explicit
    'cuda:N' or 'cpu' is kept (a cuda:N past the devices this process sees is an error)."""
    if device.startswith("cuda:") and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if int(device[5:]) >= n:
            have = "cuda:0" + (f" to cuda:{n - 1}" if n > 1 else "")
            raise SpecctlError(f"--device {device}: this process sees {n} CUDA device"
                               f"{'s' if n != 1 else ''} ({have})")
    if not env.active or device not in ("auto", "cuda"):
        return device
    if device == "auto" and not torch.cuda.is_available():
        return device
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return device   # the loader says that no CUDA device is available
    if n == 1:
        return "cuda:0"
    if env.local_rank >= n:
        raise SpecctlError(f"LOCAL_RANK={env.local_rank} but this process sees {n} CUDA "
                           "devices: start at most that many processes per node")
    return f"cuda:{env.local_rank}"


def describe(err: BaseException) -> str:
    """One line for an error, as the CLI would print it."""
    if isinstance(err, OSError) and not isinstance(err, SpecctlError):
        where = err.filename2 or err.filename
        if where and err.strerror:
            return f"{where}: {err.strerror}"
    if isinstance(err, SpecctlError):
        return str(err)
    return f"{type(err).__name__}: {err}"


class Group:
    """The job's ranks. With one process every method is trivial."""

    def __init__(self, env: DistEnv):
        self.env = env
        self.rank, self.world = env.rank, env.world
        self._owned = False

    def start(self) -> "Group":
        if not self.env.active:
            return self
        import torch.distributed as dist
        if dist.is_initialized():   # the caller set it up (e.g. a test or an embedding program)
            if dist.get_world_size() != self.world or dist.get_rank() != self.rank:
                raise SpecctlError("torch.distributed is initialized with a different rank/world "
                                   "size than RANK/WORLD_SIZE say")
            return self
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise SpecctlError(f"WORLD_SIZE={self.world} but {' and '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} not set: launch with "
                               "torchrun, or set MASTER_ADDR/MASTER_PORT to rank 0's host and a "
                               "free port")
        timeout = float(os.environ.get("SPECCTL_DIST_TIMEOUT_S") or DEFAULT_TIMEOUT_S)
        dist.init_process_group("gloo", init_method="env://", rank=self.rank,
                                world_size=self.world, timeout=timedelta(seconds=timeout))
        self._owned = True
        return self

    def close(self) -> None:
        if self._owned:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
            self._owned = False

    # -- small JSON messages -------------------------------------------------------------------
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (JSON-serializable), in rank order, on every rank."""
        if not self.env.active:
            return [obj]
        import torch.distributed as dist
        data = json.dumps(obj).encode("utf-8")
        n = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        try:
            dist.all_gather(sizes, n)
            most = max(int(s) for s in sizes)
            buf = torch.zeros(most, dtype=torch.uint8)
            if data:
                buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            bufs = [torch.zeros(most, dtype=torch.uint8) for _ in range(self.world)]
            dist.all_gather(bufs, buf)
        except RuntimeError as e:   # a peer died or the wait timed out (DistBackendError & co.)
            why = re.sub(r"^\[[^\]]*\]\s*", "", (str(e).splitlines() or [""])[0])
            why = why.split(". ")[0] or type(e).__name__   # gloo: "[pair.cc:553] Connection..."
            raise SpecctlError(f"rank {self.rank} lost contact with the other ranks ({why}): "
                               "a rank probably died; every finished request is kept, run the "
                               "same command with --resume to do the rest", 1) from None
        return [json.loads(bytes(b[: int(s)].tolist()).decode("utf-8")) for b, s in zip(bufs, sizes)]

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank."""
        return self.gather(obj if self.rank == 0 else None)[0]

    def check(self, err: BaseException | None) -> None:
        """Collective: every rank says whether its part failed; if any did, every rank raises.

        One process: re-raises `err` as it is. Several: a rank with a programming error re-raises
        it (its traceback is printed there); rank 0 raises a SpecctlError naming every failed
        rank's message (plainly, as one process would, when all ranks failed the same way, e.g.
        a bad input line, or only rank 0 failed); the other ranks raise RankStopped, which the
        CLI turns into a silent exit."""
        if not self.env.active:
            if err is not None:
                raise err
            return
        mine = None if err is None else [describe(err), _exit_code(err)]
        got = self.gather(mine)
        if all(g is None for g in got):
            return
        if err is not None and not isinstance(err, (SpecctlError, OSError)):
            raise err
        failed = [(r, g[0], g[1]) for r, g in enumerate(got) if g is not None]
        code = failed[0][2]   # the first failed rank's: as if that process had run alone
        if self.rank != 0:
            raise RankStopped(code)
        msgs = {m for _, m, _ in failed}
        if len(msgs) == 1 and (len(failed) == self.world or failed[0][0] == 0):
            text = failed[0][1]
        else:
            text = "; ".join(f"rank {r}: {m}" for r, m, _ in failed)
        raise SpecctlError(text, code) from err


def _exit_code(err: BaseException) -> int:
    return err.exit_code if isinstance(err, SpecctlError) else 1


def shard(items: list, rank: int, world: int) -> list:
    """Rank r's share of the requests still to do: the k-th goes to rank k % world (round-robin
    over the requests still missing, in input order). Interleaving balances better than
    contiguous blocks: inputs are often grouped (MT-bench by category, files by length), and a
    block of long prompts would hold the whole job back on one rank; the shares differ by at
    most one request. Computed over what is missing, so a resumed run (any world size) spreads
    the remaining work evenly."""
    return items[rank::world]


def ranges(ix: list[int]) -> list[list[int]]:
    """Sorted ints as [first, last] runs (compact to send between ranks)."""
    out: list[list[int]] = []
    for i in ix:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def unranges(rs: list[list[int]]) -> set[int]:
    return {i for a, b in rs for i in range(a, b + 1)}


class PeerProgress:
    """Rank 0's progress bar over the whole job: a thread tails the other ranks' record files
    (one complete line = one finished request) from where they stood when generation began."""

    def __init__(self, files: dict[Path, int], progress, lock: threading.Lock,
                 interval: float = 0.5):
        self.offsets, self.progress, self.lock, self.interval = dict(files), progress, lock, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="specctl-peer-progress",
                                       daemon=True)

    def start(self) -> "PeerProgress":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        for f, off in self.offsets.items():
            try:
                with open(f, "rb") as fh:
                    fh.seek(off)
                    chunk = fh.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1   # complete lines only; a partial one waits
            if not end:
                continue
            self.offsets[f] = off + end
            for raw in jsonl_lines(chunk[:end]):
                try:
                    n = int(json.loads(raw).get("new_tokens") or 0)
                except (ValueError, AttributeError, TypeError):
                    continue
                with self.lock:
                    self.progress.advance(1)
                    if n:
                        self.progress.tokens(n)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.poll()
