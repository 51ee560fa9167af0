"""`--method auto`: the method with the best goodput on this job, measured.

Which method pays depends on the model, the machine, the batch size, the prompts and the
artifacts at hand (on a 2-core CPU Self-Draft's paper settings run at 0.2-0.6x of ar, on the
H100 at 1.8x at batch 1 and 0.55x at batch 32), so it is measured, not guessed: every method
whose artifacts are in the store (`ar`; Self-Draft, with its corpus cache if there is one;
draft-verify with a skip set; Kangaroo with an adapter) runs a short pilot on the job's own
first prompts (PILOT_PROMPTS, or a batch of them when the batch is larger) at the job's batch
size and speculation mode, and the method with the most emitted tokens per second wins. Each
pilot is run three times, the methods taking turns: the first untimed, so one-time costs (CUDA
graph captures, the controller's step-cost table) do not count against whichever method happens
to go first, and of the two timed the quicker counts (a neighbour on the machine only ever adds
to a pass's time: one timed pass of `ar` slowed 100x by a burst on a shared 2-core CPU once
made a method that accepted nothing "154x ar"); on a CPU all run at a fixed thread count (the
thread tuner's trial steps would weigh more in a method with fewer, wider steps). A method that cannot run here (its KV cache does not fit, say)
is left out with the reason. Pilot answers are thrown away: with greedy decoding they are the
job's own answers' first tokens, so only the time is lost (`pilot_s` in metrics.json). So a
job whose pilots would cost more than a quarter of its own work (in new tokens: the passes of
every method's pilot against every answer it asks for) runs `ar` without a race, saying so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import METHODS, GenerateConfig
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.jobs.sizing import make_runner
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows, to_request
from specctl.speculative.drafter import NoDraft

PILOT_TOKENS = 32     # new tokens per pilot answer
PILOT_PROMPTS = 8     # at least this many prompts (a batch's worth when the batch is larger)
PILOT_SHARE = 0.25    # the most of a job's work its pilots may cost
PILOT_PASSES = 3      # each method's passes: one to warm, the quicker of the others counts


@dataclass
class Pilot:
    method: str
    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    skipped: str | None = None   # why the method was not run (no artifact)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        if self.skipped:
            return {"method": self.method, "skipped": self.skipped}
        return {"method": self.method, "prompts": self.prompts, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "tokens_per_s": round(self.rate, 2),
                "tokens_per_step": round(self.tokens / self.steps, 3) if self.steps else None}


def candidates(cfg: GenerateConfig, model, model_dir, store) -> tuple[dict, dict, list[Pilot]]:
    """({method: drafter} for the methods that can run here, {method: what loading it said},
    [the methods that cannot, and why])."""
    ready, said, skipped = {"ar": NoDraft()}, {"ar": []}, []
    named = {"draft-verify": cfg.skip_set, "kangaroo": cfg.adapter,
             "self-draft": cfg.corpus_cache if cfg.corpus_cache != "none" else None}
    for m in METHODS:
        if m == "ar":
            continue
        said[m] = []
        try:
            ready[m] = make_drafter(replace(cfg, method=m), model, model_dir, store, said[m].append)
        except SpecctlError as e:   # no artifact of its kind for this model (or a bad one)
            if named[m]:   # one the user named is an error, not a method left out
                raise
            skipped.append(Pilot(m, skipped=str(e).split(": run", 1)[0]))
    return ready, said, skipped


def pilot(cfg: GenerateConfig, model, tk: Tokenization, drafters: dict, records,
          **profiles) -> list[Pilot]:
    """Each drafter's pilot on the first prompts of `records` (the job's readable lines), each
    pass with a fresh copy of the drafter (Drafter.fresh: what one pass learnt, such as
    Self-Draft's context cache holding these very answers, must not speed up the next).
    profiles: make_runner's store, fingerprint and log (where step-cost tables are kept)."""
    want = max(PILOT_PROMPTS, cfg.batch_size)
    ctx = model.cfg.max_position
    picked, rows = [], []
    for rec in records:
        if rec.error is not None:
            continue
        req = to_request(rec, min(cfg.max_tokens, PILOT_TOKENS))
        req.max_tokens = min(req.max_tokens, PILOT_TOKENS)
        n, r = kv_rows(tk, req)
        if n < ctx:
            picked.append(rec)
            rows.append(r)
        if len(picked) == want:
            break
    if not picked:
        return []
    threads = cfg.threads or (torch.get_num_threads() if model.device.type == "cpu" else None)
    pcfg = replace(cfg, max_tokens=PILOT_TOKENS, threads=threads)
    out = {name: Pilot(name, len(picked)) for name in drafters}
    for n in range(PILOT_PASSES):   # (the methods take turns: a burst hits one pass of one)
        for name, drafter in drafters.items():
            p = out[name]
            if p.skipped:
                continue
            try:
                _pass(pcfg, model, tk, p, drafter, picked, rows, profiles, timed=n > 0)
            except (SpecctlError, torch.OutOfMemoryError) as e:
                out[name] = Pilot(name, skipped=f"could not run here ({e})")
    return list(out.values())


def _pass(pcfg: GenerateConfig, model, tk: Tokenization, p: Pilot, drafter, picked, rows,
          profiles: dict, timed: bool) -> None:
    """One pass of p's pilot; timed, it counts when quicker than p's passes so far."""
    runner = make_runner(pcfg, model, drafter.fresh(), tk, rows, **profiles)
    reqs = [to_request(rec, PILOT_TOKENS) for rec in picked]
    for q in reqs:
        q.max_tokens = min(q.max_tokens, PILOT_TOKENS)
    t0 = time.perf_counter()
    stats = runner.run(reqs, lambda req: None)
    took = time.perf_counter() - t0
    if timed and (not p.seconds or took < p.seconds):
        p.seconds, p.tokens, p.steps = took, stats.generated, stats.steps


def choose(pilots: list[Pilot]) -> Pilot:
    """The fastest; `ar` on a tie (it needs no artifact and has no drafting to go wrong)."""
    ran = [p for p in pilots if not p.skipped]
    if not ran:
        return Pilot("ar", skipped="no method could run")
    best = max(ran, key=lambda p: p.rate)
    ar = next((p for p in ran if p.method == "ar"), None)
    return ar if ar is not None and ar.rate >= best.rate else best


def explain(best: Pilot, pilots: list[Pilot]) -> str:
    ar = next((p for p in pilots if p.method == "ar" and not p.skipped), None)
    parts = []
    for p in pilots:
        if p.skipped:
            parts.append(f"{p.method}: {p.skipped}")
        elif ar is not None and ar.rate > 0:
            parts.append(f"{p.method} {p.rate:.1f} tok/s ({p.rate / ar.rate:.2f}x ar)")
        else:
            parts.append(f"{p.method} {p.rate:.1f} tok/s")
    return (f"--method auto: {best.method}, the fastest on a pilot of {best.prompts} prompts x "
            f"{PILOT_TOKENS} tokens: " + "; ".join(parts))


def race(cfg: GenerateConfig, model, tk: Tokenization, drafters: dict, skipped: list[Pilot],
         records, *, log, store=None, fingerprint: str | None = None) -> tuple[str, dict | None]:
    """The pilot, the choice, and the line that says it: (method, report for metrics.json);
    `ar` and no report when no prompt can be tried."""
    t0 = time.perf_counter()
    reqs = [to_request(rec, cfg.max_tokens) for rec in records if rec.error is None]
    work = sum(q.max_tokens * len(q.stages) * (q.sampling or {}).get("n", 1) for q in reqs)
    pilots = PILOT_PASSES * len(drafters) * PILOT_TOKENS * min(len(reqs), max(PILOT_PROMPTS,
                                                                              cfg.batch_size))
    if pilots > PILOT_SHARE * work:
        log(f"--method auto: ar, without a pilot: the job is small ({len(reqs)} prompts, at "
            f"most {work} new tokens) and piloting every method would cost more than it "
            "could save")
        return "ar", {"chosen": "ar", "pilot_s": 0.0, "pilots": [], "small_job": work}
    pilots = pilot(cfg, model, tk, drafters, records, store=store, fingerprint=fingerprint,
                   log=log)
    if not pilots:
        return "ar", None
    best = choose(pilots)
    log(explain(best, pilots + skipped))
    return best.method, {"chosen": best.method, "pilot_s": round(time.perf_counter() - t0, 2),
                         "pilots": [p.to_json() for p in pilots + skipped]}
