"""Commands under a time limit, as coreutils' `timeout -k` ran them for the bash runbook: the
command leads a process group of its own, and at the limit the whole group gets SIGTERM, then
SIGKILL. A step's pytest or bench starts workers of its own; killing the leader alone would
leave them holding the GPU through the next step."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time

from .settings import KILL_AFTER_S

KILLED = 124        # ended by SIGTERM at the limit (timeout's status)
KILLED_HARD = 137   # still there KILL_AFTER_S later: SIGKILL (128 + 9)

_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@%-]+")


def shell_words(argv) -> str:
    """argv as one shell line, quoted only where the shell needs it, so a list of commands
    reads as typed."""
    words = []
    for a in map(str, argv):
        if _PLAIN.fullmatch(a):
            words.append(a)
        elif "'" not in a:
            words.append(f"'{a}'")
        else:
            words.append(shlex.quote(a))
    return " ".join(words)


def run_limited(argv, timeout_s: float, *, kill_after_s: float = KILL_AFTER_S, **popen) -> int:
    """Run argv (Popen's keyword arguments in popen) for at most timeout_s seconds. Returns its
    exit status (128 + N for a signal N, as a shell says), KILLED or KILLED_HARD."""
    p = subprocess.Popen(list(map(str, argv)), start_new_session=True, **popen)
    try:
        rc = p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return end_group(p, kill_after_s)
    except BaseException:
        # (Ctrl-C: the group is not the terminal's, so it would not get the signal itself)
        end_group(p, kill_after_s)
        raise
    return 128 - rc if rc < 0 else rc


def end_group(p: subprocess.Popen, kill_after_s: float = KILL_AFTER_S) -> int:
    """SIGTERM to p's process group; SIGKILL to whatever of it is left kill_after_s later.
    KILLED when p itself ended on the SIGTERM, else KILLED_HARD."""
    deadline = time.monotonic() + kill_after_s
    _signal_group(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=kill_after_s)
        rc = KILLED
    except subprocess.TimeoutExpired:
        rc = KILLED_HARD
    # the leader gone, its workers get the rest of the grace to finish dying
    while _group_running(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(p.pid, signal.SIGKILL)
    p.wait()
    return rc


def _signal_group(pgid: int, sig: int) -> bool:
    """False once no process of the group is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _group_running(pgid: int) -> bool:
    """Whether a process of the group still runs. An ended one stays in the group until its
    parent (init, for a step's orphaned workers) reaps it: /proc tells the two apart, so a slow
    init does not hold the next step for the whole grace."""
    if not _signal_group(pgid, 0):
        return False
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:   # (no /proc: take kill's word)
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state not in "ZX":
            return True
    return False
