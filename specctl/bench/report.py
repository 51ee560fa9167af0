"""Stored bench runs: loading them, their tables (markdown and rows for the CLI) and plots."""

from __future__ import annotations

import io
from pathlib import Path

from specctl.bench.analysis import NEAR_TIE_STEPS
from specctl.bench.conditions import DRAIN_FACTOR
from specctl.bench.config import CTAR_W
from specctl.errors import SpecctlError
from specctl.store import Store, atomic_write_bytes, read_json


def load_benches(store: Store, idents: list[str], all_runs: bool = False) -> list[dict]:
    if idents:
        entries = []
        for i in idents:
            e = store.find(i)
            if e.kind != "benches":
                raise SpecctlError(f"{i!r} is a {e.kind} artifact, not a bench run")
            entries.append(e)
    else:
        entries = sorted(store.entries("benches"), key=lambda e: e.manifest.get("created", ""))
        if not entries:
            raise SpecctlError(f"no bench runs in the store at {store.root}: run `specctl bench` first")
        if not all_runs:
            entries = entries[-1:]
    out = []
    for e in entries:
        res = read_json(e.path / "results.json")
        if not isinstance(res, dict) or "rows" not in res:
            raise SpecctlError(f"{e.path / 'results.json'}: not a bench result")
        res["path"] = str(e.path)
        out.append(res)
    return out


def _f(x, nd=2, pct=False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:.{nd}f}"


def _match(r: dict) -> str:
    if r["matches_ar"] is None:
        return "-"
    if r["matches_ar"] and r["matches_ar_b1"] and r["repeats_identical"]:
        return "yes"
    d = r.get("divergence")
    gap = ""
    if d:   # how close to a tie the first divergences were (divergence_gaps)
        tie = d.get("near_ties", d["max_steps"] <= NEAR_TIE_STEPS)   # (results before it)
        gap = f"near-ties, gap ≤ {d['max_gap']:.3g}" if tie else f"gap up to {d['max_gap']:.3g}"
        if d["analyzed"] < d.get("differing", d["analyzed"]):
            gap += f" ({d['analyzed']} of {d['differing']} read)"
        gap = "; " + gap
    if not r["repeats_identical"]:
        if d and d["vs"] != "its first repeat":
            gap = f"; vs {d['vs']}:{gap[1:]}"
        return f"NO (repeats differ{gap})"
    mm = r["mismatch"]
    return f"NO ({mm['prompts']}/{mm['of']} vs {mm['vs']}{gap})"


def _speedup(r: dict) -> str:
    """The paired speedup, with the range of its rounds when there are several."""
    if r["speedup_vs_ar"] is None:
        return "-"
    runs = r.get("speedup_runs") or []
    rng = f" ({min(runs):.2f}–{max(runs):.2f})" if len(runs) > 1 and r["method"] != "ar" else ""
    return f"{r['speedup_vs_ar']:.2f}x{rng}" + (" ~" if _noisy(r) else "")


NOISY = 1.25   # a speedup whose paired rounds differ by more (max / min) is marked ~


def _noisy(r: dict) -> bool:
    """Whether the row's paired rounds disagree past NOISY: a median of such rounds says
    little (a 2-core CPU's neighbour once gave rounds of 2.37x and 0.93x, median 1.65x)."""
    runs = [x for x in (r.get("speedup_runs") or []) if x and x > 0]
    return r["method"] != "ar" and len(runs) > 1 and max(runs) / min(runs) > NOISY


TABLE_COLUMNS = ("method", "batch", "tokens/s", "min–max", "speedup", "mean acc.",
                 "CTAR 1..6", "zero acc.", "padding", "peak MB", "captures", "= ar")

# what carries from one run of a method to the next (bench/peers.py): stated with every table
CARRIED = ("Each run, warm-up or timed, starts from a fresh drafter and controller (acceptance "
           "and learnt step costs at their priors, as one `generate` run does); only the loaded "
           "model, its captured CUDA graphs and KV cache, and the step-cost table carry over; "
           "warm-up runs are untimed.")


def _batch(r: dict) -> str:
    """The batch size, with the one it really ran at where the prompts were fewer, and † where
    the row is drain-bound (results stored before these fields say neither). († not *: a note
    starting with * is a nested list in markdown.)"""
    bs, eff = r["batch_size"], r.get("effective_batch", r["batch_size"])
    return f"{bs}" + (f" (ran {eff})" if eff < bs else "") + ("†" if r.get("drain_bound") else "")


def _captures(r: dict) -> str:
    """CUDA graph shapes captured inside the timed repeats; ! where any were."""
    n = r.get("captures")
    return "-" if n is None else f"{n} !" if n else "0"


def table_rows(res: dict) -> list[list[str]]:
    out = []
    for r in res["rows"]:
        t = r["tokens_per_s"]
        ctar = "/".join(f"{r['ctar'][str(w)]:.2f}" for w in CTAR_W) if r["ctar"] else "-"
        out.append([r["method"], _batch(r), f"{t['median']:.1f}",
                    f"{t['min']:.1f}–{t['max']:.1f}", _speedup(r), _f(r["mean_accepted_tokens"]), ctar,
                    _f(r["zero_accept_share"], pct=True), _f(r["padding_ratio"], pct=True),
                    f"{r['peak_memory_mb']:.0f}", _captures(r), _match(r)])
    return out


CATEGORY_COLUMNS = ("category", "method", "batch", "tokens/s", "min–max", "speedup",
                    "mean acc.", "zero acc.")


def category_rows(res: dict) -> list[list[str]]:
    out = []
    for r in sorted(res.get("category_rows", []),
                    key=lambda r: (r["category"], r["batch_size"])):
        t = r["tokens_per_s"]
        out.append([r["category"], r["method"], str(r["batch_size"]), f"{t['median']:.1f}",
                    f"{t['min']:.1f}–{t['max']:.1f}",
                    _f(r["speedup_vs_ar"]) + ("x" if r["speedup_vs_ar"] is not None else ""),
                    _f(r["mean_accepted_tokens"]), _f(r["zero_accept_share"], pct=True)])
    return out


TIME_COLUMNS = ("method", "batch", "wall s", "decode steps s", "decode x ar",
                "prefill s (forwards of <= chunk)", "search s", "learning s", "rest s",
                "lean / drafting ms a step")


def time_rows(res: dict) -> list[list[str]]:
    """Where each specctl row's first repeat spent its wall time (its `time_split`): decode
    steps, prefill, the controller's search and the learning run under a forward (CUDA's
    schedule; rows stored before it was kept show -) within the steps, and the rest (admission,
    retiring, output); under auto, its lean and drafting steps' mean ms. decode x ar: `ar`'s
    decode-step seconds at the same batch over the row's (the same prompts and tokens): the
    speedup of the steps alone, which a schedule that prefills its prompts in fewer forwards
    does not move (on the H200 at 74f1c5f the batch-8 rows were 1.31-1.60x `ar` on the wall
    while drafting nothing: `auto` admits a few prompts a forward, `ar` one)."""
    ar = {r["batch_size"]: r["time_split"]["steps_s"] for r in res["rows"]
          if r["method"] == "ar" and r.get("time_split")}
    out = []
    for r in res["rows"]:
        ts = r.get("time_split")
        if not ts:
            continue
        wall = r["wall_s"]["runs"][0]
        spec = r.get("speculation") or {}
        lean, drafting = spec.get("lean_step_ms"), spec.get("drafting_step_ms")
        base = ar.get(r["batch_size"])
        vs = f"{base / ts['steps_s']:.2f}x" if base and ts["steps_s"] > 0 else "-"
        out.append([r["method"], str(r["batch_size"]), f"{wall:.2f}", f"{ts['steps_s']:.2f}",
                    vs, f"{ts['prefill_s']:.2f} ({ts['prefill_forwards']}"
                    + (f" of <= {ts['prefill_chunk']}" if ts.get("prefill_chunk") else "")
                    + (f", {ts['prefill_replays']} replayed" if ts.get("prefill_replays")
                       else "") + _pieces(ts.get("piece_ms")) + ")",
                    f"{ts['search_s']:.2f}", _f(ts.get("learn_s")),
                    f"{max(0.0, wall - ts['steps_s'] - ts['prefill_s']):.2f}",
                    f"{_f(lean)} / {_f(drafting)}" if lean is not None else "-"])
    return out


def _pieces(price: dict | None) -> str:
    """A prefill forward's measured price, where the run priced its pieces (time_split's
    piece_ms): what chose between eager forwards and replays."""
    if not price:
        return ""
    return (f"; {price['prompts']} prompts a piece: {price['eager']:.1f} ms eager, "
            f"{price['replay']:.1f} replayed")


SOURCE_COLUMNS = ("method", "batch", "accepted drafts", "job cache", "context cache",
                  "corpus cache")


def source_rows(res: dict) -> list[list[str]]:
    """Self-Draft rows: the share of the accepted drafts each cache's candidates made (the
    first repeat's; rows stored before the field was kept have none)."""
    out = []
    for r in res["rows"]:
        a = r.get("accepted_from")
        if a:
            out.append([r["method"], str(r["batch_size"]), str(a["tokens"])]
                       + [_f(a.get(k), pct=True) for k in ("job", "context", "corpus")])
    return out


def title(res: dict) -> str:
    c = res["config"]
    model = Path(res["model"]).name
    engine = ""
    if res["device"].startswith("cuda"):
        att = res.get("attention") or c.get("attention", "sdpa")
        if att == "sdpa":   # (runs stored before the option had cuDNN allowed: torch's default)
            att += " (cuDNN allowed)" if c.get("cudnn_attention", True) else " (no cuDNN)"
        engine = (" " + att + " attention"
                  + (", CUDA graphs" if c.get("cuda_graphs", True) else ", no CUDA graphs"))
        n = res.get("launches")
        if n:
            engine += f" ({n['step']} launches an ar step, {n['layer']} a layer)"
    return (f"{res['id']}: {model}, {res['device']} {res['dtype']}{engine}, "
            f"{res['prompts']} prompts, "
            f"max {c['max_tokens']} new tokens, greedy, "
            + (f"median of {c['repeats']} repeats" if c["repeats"] > 1 else "1 repeat"))


def notes(res: dict) -> list[str]:
    out = []
    for s in res["skipped"]:
        where = f" at batch size {s['batch_size']}" if s["batch_size"] is not None else ""
        out.append(f"skipped {s['method']}{where}: {s['reason']}")
    out += _row_marks(res)
    mem = ("peak MB: torch.cuda.max_memory_allocated per config (all resident models)"
           if res["peak_memory_kind"] == "cuda_max_allocated"
           else "peak MB: process RSS high-water mark (process-wide, includes earlier rows)")
    out.append(mem + "; tokens/s: median of the repeats, min–max their spread; "
               "CTAR w = share of steps accepting more than w drafts")
    return out


def _row_marks(res: dict) -> list[str]:
    """The footnotes of the marks _batch and _captures put in rows."""
    rows, n = res["rows"], res["prompts"]
    out = []
    if any(r.get("drain_bound") for r in rows):
        out.append(f"† drain-bound: {n} prompts < {DRAIN_FACTOR} x batch: much of each run is "
                   "the batch draining, not its steady state")
    if any(r.get("effective_batch", r["batch_size"]) < r["batch_size"] for r in rows):
        out.append(f"(ran {n}): the batch size is more than the {n} prompt{'s' * (n != 1)}, "
                   f"so the row ran {n} sequence{'s' * (n != 1)} at once")
    noisy = [f"{r['method']} b{r['batch_size']}" for r in rows if _noisy(r)]
    if noisy:
        out.append(f"~ noisy: the paired rounds of {', '.join(noisy)} differ by more than "
                   f"{NOISY - 1:.0%} (max / min): the machine was busy, or the rows are too "
                   "short; their median says little (more --repeats, a quieter machine)")
    if any(r.get("captures") for r in rows):
        out.append("captures !: CUDA graph shapes captured inside the row's timed repeats "
                   "(the capture time is in its tokens/s)")
    return out


def _md_table(cols, rows) -> str:
    esc = lambda s: str(s).replace("|", "\\|")   # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(esc(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(results: list[dict]) -> str:
    parts = []
    for res in results:
        parts.append(f"### {title(res)}\n")
        parts.append(CARRIED + "\n")
        parts.append(_md_table(TABLE_COLUMNS, table_rows(res)) + "\n")
        if res.get("category_rows"):
            parts.append("Per category:\n")
            parts.append(_md_table(CATEGORY_COLUMNS, category_rows(res)) + "\n")
        parts.append("\n".join(f"- {n}" for n in notes(res)) + "\n")
        times = time_rows(res)
        if times:
            parts.append("Where the time went (each row's first repeat):\n")
            parts.append(_md_table(TIME_COLUMNS, times) + "\n")
        sources = source_rows(res)
        if sources:
            parts.append("Where the accepted drafts came from (each row's first repeat):\n")
            parts.append(_md_table(SOURCE_COLUMNS, sources) + "\n")
    return "\n".join(parts)


def write_plots(res: dict, out_dir: Path, prefix: str = "") -> list[Path]:
    """speedup vs batch size per method; tokens/s per category (if any). Needs matplotlib."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        p = out_dir / f"{prefix}{name}"
        atomic_write_bytes(p, buf.getvalue())
        written.append(p)

    rows = res["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for m in methods:
        pts = sorted((r["batch_size"], r["speedup_vs_ar"]) for r in rows
                     if r["method"] == m and r["speedup_vs_ar"] is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m,
                    linestyle="--" if m == "ar" else "-")
    ax.set_xscale("log", base=2)
    bs = sorted({r["batch_size"] for r in rows})
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over ar (median of paired rounds)")
    ax.set_title(f"{Path(res['model']).name}, {res['device']} {res['dtype']}")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "speedup.png")

    crows = res.get("category_rows") or []
    if crows:
        cats = sorted({r["category"] for r in crows})
        sizes = sorted({r["batch_size"] for r in crows})
        fig = Figure(figsize=(max(6, 1.2 * len(cats)) , 3.5 * len(sizes)))
        for k, b in enumerate(sizes):
            ax = fig.add_subplot(len(sizes), 1, k + 1)
            ms = list(dict.fromkeys(r["method"] for r in crows if r["batch_size"] == b))
            width = 0.8 / max(len(ms), 1)
            for j, m in enumerate(ms):
                by = {r["category"]: r["tokens_per_s"]["median"] for r in crows
                      if r["batch_size"] == b and r["method"] == m}
                ax.bar([i + j * width for i in range(len(cats))], [by.get(c, 0) for c in cats],
                       width, label=m)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))], cats, rotation=30,
                          ha="right")
            ax.set_ylabel("tokens/s")
            ax.set_title(f"batch size {b}")
            ax.legend(fontsize="small")
        fig.tight_layout()
        save(fig, "category_tokens_per_s.png")
    return written
