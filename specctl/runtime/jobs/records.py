"""A run's record files: crash safety and --resume.

Every finished request is appended to `runs/<id>/records.jsonl` (written and flushed the moment
it finishes, fsynced by a thread of its own: RecordWriter), so Ctrl-C or a crash loses nothing
already generated; a resumed run (same input file contents and settings) skips the requests it
already has. Several processes share one run directory: rank r appends to
`records.rank<r>.jsonl`. What a run has done is the union of all its record files, so --resume
works with any number of processes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from dataclasses import asdict, replace
import shutil
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord
from specctl.io.shards import PromptInput
from specctl.io.shards import read_input as read_prompt_input
from specctl.runtime.jobs.config import UNKEYED, GenerateConfig
from specctl.runtime.jobs.depends import changed
from specctl.runtime.jobs.dist import DistEnv
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.tokenization import require_raw_prompts
from specctl.store import Store, jsonl_lines, writable_file


def read_input(cfg: GenerateConfig, in_path: Path, processes: int = 1) -> PromptInput:
    """The input of a generate run, read once (io/lines.py): its records (the first --limit
    lines; bad ones kept with --skip-bad) and its identity. Under several processes every
    rank reads it itself, which a pipe cannot give twice: refused before anything reads it."""
    if processes > 1:
        try:
            mode = os.stat(in_path).st_mode
        except OSError:
            mode = None   # (the read says what is wrong)
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise SpecctlError(f"{in_path}: not a regular file (a pipe?): each of the "
                               f"{processes} processes reads the input itself, and a pipe can "
                               "be read once: save it to a file and pass that")
    got = read_prompt_input(in_path, skip_bad=cfg.skip_bad, limit=cfg.limit)
    if not cfg.chat:
        got = replace(got, records=require_raw_prompts(got.records, in_path, cfg.skip_bad))
    return got


def per_line(own_settings: bool) -> str:
    """What a run key adds when lines carry settings of their own (anywhere in the file: a
    --limit run resumes to the rest; PromptInput.own_settings), which an older specctl
    ignored: so runs it made of such an input are not resumed."""
    return ":per-line" if own_settings else ""


def step_lengths(*reqs: Request) -> tuple[list[int], list[int]]:
    """(accepted, drafted) per verification step of these requests, one after the other; both
    empty when no step drafted (an `ar` run, or every budget 0): zeros per step say nothing."""
    if not any(any(q.draft_lengths) for q in reqs):
        return [], []
    return [x for q in reqs for x in q.accept_lengths], [x for q in reqs for x in q.draft_lengths]


def output_line(req: Request) -> dict:
    """The output line of a finished request (with n > 1 answers: the first's text at the top,
    every answer under `samples`, the counts over them all)."""
    if req.samples:
        subs = [_answer(q) for q in req.samples]   # (req is the first)
        out = dict(subs[0])
        out["samples"] = [{k: a[k] for k in ("text", "turns", "token_ids", "finish_reason",
                                             "finish_reasons", "logprobs") if k in a}
                          for a in subs]
        out["new_tokens"] = sum(a["new_tokens"] for a in subs)
        out["steps"] = sum(a["steps"] for a in subs)
        out["accept_lengths"], out["draft_lengths"] = step_lengths(*req.samples)
        out["mean_accepted"] = round(out["new_tokens"] / out["steps"], 4) if out["steps"] else 0.0
        out["wall_time_s"] = max(a["wall_time_s"] for a in subs)
        return out
    return _answer(req)


def _answer(req: Request) -> dict:
    out = dict(req.meta)
    out["text"] = req.answers[-1] if len(req.answers) == 1 else req.answers[0]
    if len(req.answers) > 1:   # (finish_reason is the last turn's: each turn's beside it)
        out["turns"], out["finish_reasons"] = list(req.answers), list(req.finish_reasons)
    new = sum(len(a) for a in req.answer_ids)
    accepted, drafted = step_lengths(req)
    out.update(new_tokens=new, steps=req.steps, prompt_tokens=req.prompt_tokens,
               mean_accepted=round(new / req.steps, 4) if req.steps else 0.0,
               accept_lengths=accepted, draft_lengths=drafted,
               finish_reason=req.finish_reasons[-1] if req.finish_reasons else None,
               wall_time_s=round(req.wall_time, 4),
               token_ids=[list(a) for a in req.answer_ids])   # one list per answer
    if req.logprobs:   # (--logprobs: per answer, per token [lp, [[id, lp], ...]])
        out["logprobs"] = req.logprobs
    return out


# what a finished request's record must hold to be taken as done (output_line's fields)
_RECORD = {"index": int, "text": str, "new_tokens": int, "steps": int, "prompt_tokens": int,
           "accept_lengths": list, "draft_lengths": list, "wall_time_s": (int, float)}


def _valid(r) -> bool:
    # (bool is an int to isinstance: `"index": true` is not a record of line 1)
    return (isinstance(r, dict) and all(isinstance(r.get(k), t) and not isinstance(r[k], bool)
                                        for k, t in _RECORD.items())
            and r["index"] >= 0 and all(type(x) is int for x in r["accept_lengths"])
            and all(type(x) is int for x in r["draft_lengths"])
            and _ids(r.get("token_ids", [])) and _lists(r.get("logprobs", []))
            and _lists(r.get("turns", []), str)
            and _lists(r.get("samples", []), dict))


def _lists(v, kind=list) -> bool:
    return isinstance(v, list) and all(isinstance(x, kind) for x in v)


def _ids(v) -> bool:
    """A record's token_ids: a list of lists of token ids (written by output_line)."""
    return isinstance(v, list) and all(isinstance(a, list) and all(type(t) is int for t in a)
                                       for a in v)


# what str.splitlines() breaks a line at that json.dumps(ensure_ascii=False) leaves raw (it
# escapes the ASCII ones): escaped, so that no reader, ours or a user's, splits a record
_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


def dumps(line: dict) -> str:
    """One JSON line as specctl writes output and record lines: UTF-8 text as it is but for
    the line breaks other than "\\n" (escaped: _BREAKS), and, for a string that UTF-8 cannot
    encode (a lone surrogate, which input reading refuses, but say in a file name from the
    command line), \\u escapes rather than a crash."""
    text = json.dumps(line, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(line)
    return text.translate(_BREAKS)


def _record_files(run_dir: Path) -> list[Path]:
    """A run's record files, whatever world size(s) wrote them: `records.jsonl` and every
    `records.rank<r>.jsonl`, in name order."""
    return [f for f in sorted(run_dir.glob("records*.jsonl"))
            if f.name == "records.jsonl" or re.fullmatch(r"records\.rank\d+\.jsonl", f.name)]


def _run_lines(run_dir: Path):
    """Each JSON line of a run's record files (_record_files). A line torn by a crash is
    skipped (that request is simply redone)."""
    for f in _record_files(run_dir):
        for line in jsonl_lines(f.read_text(encoding="utf-8")):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _torn_tail(path: Path) -> bool:
    """True when `path` is non-empty and its last line has no newline (a write cut short)."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:   # missing or empty
        return False


def find_resumable(store: Store, keys, depends: dict | None = None) -> tuple[Path | None, str]:
    """The run --resume continues: of the runs under one of `keys` (the run key, and its
    older form) that depend on exactly `depends` (runtime/jobs/depends.py: the model's files,
    the method's artifact, ... by content), the one with the most records, the newest of
    those. (None, why) when runs of this job exist but every one depended on something that
    has changed since: why names what, for the user."""
    runs = runs_of(store, keys)
    same = [e for e in runs if depends is None or e.manifest.get("depends") == depends]
    if same:   # (the furthest on, the newest of those: a newer run stopped early, an empty
        # one killed before its first answer say, hid an older one's answers)
        return max(same, key=lambda e: recorded_lines(e.path)).path, ""
    if not runs:
        return None, ""
    what = changed(runs[0].manifest.get("depends"), depends)
    return None, (f"not resuming {runs[0].path.name}: since it ran, {', '.join(what)} changed "
                  "(its answers would not be this job's); starting a new run (that one stays "
                  "in the store)")


def recorded_lines(run_dir: Path) -> int:
    """How far a run got: its record files' lines (counted, not parsed: an answer or a bad
    line's error each)."""
    n = 0
    for f in _record_files(run_dir):
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    n += chunk.count(b"\n")
        except OSError:
            continue
    return n


def recorded(run_dir: Path, records: list[PromptRecord]) -> tuple[int, int]:
    """Of the lines read, in one read of the run's records: how many it answered (read_done's),
    and how many it has a record of, an answer or the error a bad line was recorded with
    (--skip-bad: done, as far as the run goes)."""
    done = read_done(run_dir, records)
    answered = sum(not is_error_record(r) for r in done.values())
    return answered, len(done)


def read_done(run_dir: Path, records: list[PromptRecord]) -> dict[int, dict]:
    """The run's finished lines among those read (all of them, unless --limit): answers, and
    the errors bad lines were recorded with (--skip-bad: each is the line's output, as an
    answer is; a resumed run does not record it again). A later record of a line wins."""
    read, done = {r.index for r in records}, {}
    for r in _run_lines(run_dir):
        i = r.get("index") if isinstance(r, dict) else None
        if type(i) is int and i in read and (_valid(r) or is_error_record(r)):
            done[i] = r
    return done


def is_error_record(r: dict) -> bool:
    """A bad line's record (--skip-bad): its index and why."""
    return isinstance(r.get("error"), str) and "text" not in r


def nearest_run(store: Store, input_sha: str, cfg: GenerateConfig) -> str:
    """For a --resume that found nothing: the newest run of the same input, and what differs;
    or else the newest run of the same input path, whose contents changed since."""
    every = store.entries("runs")
    runs = [e for e in every if e.manifest.get("input_sha256") == input_sha]
    if not runs:
        where = str(Path(cfg.input).resolve())
        same = [e for e in every if e.manifest.get("input") == where]
        if not same:
            return ""
        e = max(same, key=lambda e: str(e.manifest.get("created", "")))
        return (f" (the newest run of {cfg.input}, {e.path.name}, read other contents: a line "
                "or shard changed, was added or removed since, so its answers are not reused)")
    e = max(runs, key=lambda e: str(e.manifest.get("created", "")))
    old, new, inert = e.manifest.get("config"), asdict(cfg), cfg.inert()
    old = old if isinstance(old, dict) else {}
    diff = [k for k in new if k not in UNKEYED and k not in inert and k in old
            and json.dumps(old[k]) != json.dumps(new[k])]
    # (device and dtype key a run as what they resolve to, not as given: named where both
    # were given and differ as a run's key does, the device by its kind; `auto` resolved to
    # either, and cuda:0 and cuda:1 are one kind)
    for k in ("device", "dtype"):
        a, b = (str(x.get(k, "auto")).split(":")[0] if k == "device" else str(x.get(k, "auto"))
                for x in (old, new))
        if "auto" not in (a, b) and a != b:
            diff.append(k)
    why = (", ".join(f"{k} {json.dumps(old[k])} there, {json.dumps(new[k])} here"   # (one
                     for k in diff) if diff else   # notation: the manifest's lists are tuples here)
           "the model, the kind of device or dtype it runs in, or the method's artifact (skip "
           "set, adapter, corpus cache)")
    return f" (the newest run of this input, {e.path.name}, differs in: {why})"


def record_file(run_dir: Path, env: DistEnv) -> Path:
    """Where this process appends its finished requests: `records.jsonl` for a single process,
    `records.rank<r>.jsonl` for rank r of several (each rank appends to its own file only)."""
    return run_dir / (f"records.rank{env.rank}.jsonl" if env.active else "records.jsonl")


def read_all_records(run_dir: Path) -> dict[int, dict]:
    """The union of a run's record files, whatever world size(s) wrote them: `records.jsonl`
    and every `records.rank<r>.jsonl`. That union is what a resumed run has done."""
    # (anything but a valid record, e.g. an edited line, is redone the same way; a later line
    # of the same index wins, as it did file by file)
    return {r["index"]: r for r in _run_lines(run_dir) if _valid(r)}


class RecordWriter:
    """This process's record file: one JSON line per finished request, written and flushed the
    moment it finishes (a killed process's lines are the OS's to keep: nothing generated is
    lost), and fsynced against a machine crash by a thread of its own, off the steps' path (an
    fsync costs ~0.2 ms on this machine's disk and milliseconds on a network one, per finished
    request; the thread's one fsync covers every line written before it). A torn last line
    left by a crash is ended first, so nothing is glued onto it."""

    def __init__(self, path: Path):
        self.path = path = writable_file(path)
        torn = _torn_tail(path)
        self.fh = open(path, "a", encoding="utf-8")
        if torn:
            self.fh.write("\n")
        self._dirty = threading.Event()
        self._closing = False
        self._error: OSError | None = None
        self._told = False   # (the error was raised by persist: close does not raise it again)
        self._syncer = threading.Thread(target=self._sync, name="specctl-fsync", daemon=True)
        self._syncer.start()

    def persist(self, line: dict) -> None:
        if self._error is not None:   # (the disk failed under the fsync thread)
            self._told = True
            raise unwritten(self.path, self._error)
        try:
            self.fh.write(dumps(line) + "\n")
            self.fh.flush()
        except OSError as e:
            self._told = True
            raise unwritten(self.path, e) from None
        self._dirty.set()

    def _sync(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()   # (a line flushed after this waits for the next round)
            if self._closing:
                return
            try:
                os.fsync(self.fh.fileno())
            except OSError as e:
                self._error = e
                return

    def size(self) -> int:
        self.fh.flush()
        return os.fstat(self.fh.fileno()).st_size

    def close(self) -> None:
        """Every line fsynced, then the file closed (an fsync error not yet raised: raised)."""
        if self.fh.closed:
            return
        self._closing = True
        self._dirty.set()
        self._syncer.join()
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
        except OSError as e:
            if not self._told:
                raise unwritten(self.path, e) from None
        finally:
            try:
                self.fh.close()
            except OSError:
                pass   # (the buffer's flush failed above, or was told already)
        if self._error is not None and not self._told:
            raise unwritten(self.path, self._error)


def unwritten(path: Path, e: OSError) -> SpecctlError:
    """A run's file that could not be written (a full disk, most often): which file, and that
    what the run had written before it is kept and --resume continues from there."""
    return SpecctlError(f"could not write {path} ({e.strerror or e}): the answers written "
                        f"before are kept in run {path.parent.name}; make room (or fix the "
                        "store), then run the same command with --resume to continue")


def drop_if_empty(run_dir: Path | None) -> None:
    """A run folder its job made, if no record reached it (a run rejected before generating:
    a prompt too long, an option found wrong late, Ctrl-C at once): nothing in it to resume."""
    if run_dir is None or not run_dir.is_dir():
        return
    try:
        if any(f.stat().st_size for f in run_dir.glob("records*.jsonl")):
            return
    except OSError:
        return
    shutil.rmtree(run_dir, ignore_errors=True)


def runs_of(store: Store, keys) -> list:
    """The stored runs whose key is one of `keys` (store entries), newest first (by created,
    then by the manifest's mtime: two runs made in one second)."""
    return sorted((e for e in store.entries("runs") if e.manifest.get("key") in keys),
                  key=lambda e: (str(e.manifest.get("created", "")),
                                 (e.path / "manifest.json").stat().st_mtime_ns), reverse=True)
