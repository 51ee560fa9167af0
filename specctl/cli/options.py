"""Command-line options derived from GenerateConfig's fields (runtime/jobs/config.py `option`): an
option is declared once, as a field with its help, and `generate` and `bench` take it from
there, with the method it belongs to as its help panel.

    @app.command()
    @friendly
    @config_options(GENERATE)         # the fields as keyword options of the command
    def generate(ctx, input, ..., options: dict): ...   # options: {field: value}
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import fields
from typing import Optional

import typer
from rich.markup import escape

from specctl.runtime.jobs.config import GenerateConfig

_FIELDS = {f.name: f for f in fields(GenerateConfig) if f.metadata.get("option")}
GENERATE = tuple(_FIELDS)                                             # every option
BENCH = tuple(n for n, f in _FIELDS.items() if f.metadata["bench"])   # what bench takes too
# each method's options: a warning when given for another method
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {}
for _n, _f in _FIELDS.items():
    if _f.metadata["method"]:
        METHOD_OPTIONS.setdefault(_f.metadata["method"], ())
        METHOD_OPTIONS[_f.metadata["method"]] += (_n,)

# `--no-corpus-cache`: Self-Draft's ablation, the same as --corpus-cache none
NO_CORPUS = inspect.Parameter(
    "no_corpus_cache", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
    default=typer.Option(False, "--no-corpus-cache", help="Ablation: no corpus-cache "
                         "candidates (as --corpus-cache none).", rich_help_panel="self-draft"))
METHOD_OPTIONS["self-draft"] += (NO_CORPUS.name,)


def flag_of(name: str, value=True) -> str:
    """The option's long flag as a user types it (--no-context-cache's field is context_cache):
    of an on/off pair, the one that gives `value` (False: --no-grid's)."""
    flag = _FIELDS[name].metadata["flag"] if name in _FIELDS else None
    pair = (flag or "--" + name.replace("_", "-")).split(",")[0].split("/")
    return pair[1] if len(pair) > 1 and value is False else pair[0]


def _parameter(name: str, hints: dict) -> inspect.Parameter:
    f = _FIELDS[name]
    md = f.metadata
    ann, default = hints[name], f.default
    if ann == tuple[str, ...]:   # a repeatable option
        ann, default = list[str], []
    elif type(None) in typing.get_args(ann):
        ann = Optional[next(a for a in typing.get_args(ann) if a is not type(None))]
    decls = (md["flag"] or "--" + name.replace("_", "-")).split(",")
    # (help is plain text: rich would read "[ray]" in "specctl[ray]" as markup and drop it)
    opt = typer.Option(default, *decls, help=escape(md["help"]) or None,
                       rich_help_panel=md["method"])
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)


def config_options(names: tuple[str, ...], extra: tuple[inspect.Parameter, ...] = ()):
    """A decorator: the command takes GenerateConfig's fields `names` (and the `extra`
    parameters) as options, and receives them as one dict, `options`, in the fields' types
    (a repeatable option as a tuple)."""
    hints = typing.get_type_hints(GenerateConfig)
    params = [_parameter(n, hints) for n in names] + list(extra)
    taken = {p.name for p in params}

    def wrap(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "options"]

        @functools.wraps(fn)
        def command(*args, **kw):
            opts = {n: kw.pop(n) for n in list(kw) if n in taken}
            if "stop" in opts:
                opts["stop"] = tuple(opts["stop"])
            return fn(*args, options=opts, **kw)
        command.__signature__ = sig.replace(parameters=own + params)
        command.__annotations__ = {p.name: p.annotation for p in own + params}
        return command
    return wrap
