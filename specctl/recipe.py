"""Recipes: one TOML file per model with the settings every method needs and where they came from.

    [recipe]                      name, model (alias, local folder or hub id), description
    [generate]                    defaults of `specctl generate --recipe` (method, batch_size ..)
    [draft-verify]                generate options (max_draft, alpha ..)
    [draft-verify.search]         `specctl search-skip` settings for `specctl prepare`
    [kangaroo]                    generate options (eta, gamma, adapter)
    [kangaroo.train]              `specctl train-adapter` settings
    [self-draft]                  generate options (branches, branch_len, gram ..)
    [self-draft.build-cache]      `specctl build-cache` settings (corpus paths ..)
    [prepare]                     steps = ["build-cache", "search-skip", "train-adapter"]
    [sources]                     free text per section: where its numbers come from

Every key is checked: an unknown key, a wrong type or a missing corpus path is a one-line error
naming the file and the key. Options given on the command line win over the recipe.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from specctl.errors import SpecctlError

STEPS = ("build-cache", "search-skip", "train-adapter")

# section -> key -> (type(s), GenerateConfig field or None for a preparation setting)
_num = (int, float)
SCHEMA: dict[str, dict[str, tuple]] = {
    "recipe": {"name": (str,), "model": (str,), "description": (str,)},
    "generate": {"method": (str,), "batch_size": (int,), "max_tokens": (int,),
                 "temperature": _num, "top_p": _num, "top_k": (int,), "seed": (int,),
                 "chat": (bool,), "stop": (list,), "device": (str,), "dtype": (str,),
                 "prefill_chunk": (int,), "attention": (str,), "cuda_graphs": (bool,),
                 "cudnn_attention": (bool,), "exact": (bool,)},
    "draft-verify": {"skip_set": (str,), "max_draft": (int,), "gamma0": _num, "alpha": _num,
                     "eps": _num, "beta1": _num, "beta2": _num},
    "draft-verify.search": {"iters": (int,), "init_points": (int,), "objective": (str,),
                            "prompts": (int,), "max_new": (int,), "seed": (int,), "dev": (str,)},
    "kangaroo": {"adapter": (str,), "eta": _num, "gamma": (int,)},
    "kangaroo.train": {"data": (str,), "exit_layer": (int,), "epochs": (int,), "lr": _num,
                       "max_len": (int,), "batch_tokens": (int,), "limit": (int,),
                       "heldout": _num, "seed": (int,)},
    "self-draft": {"corpus_cache": (str,), "branches": (int,), "branch_len": (int,),
                   "gram": (int,), "context_cands": (int,), "corpus_cands": (int,),
                   "context_cache": (bool,), "prompt_grams": (bool,)},
    "self-draft.build-cache": {"corpus": (list,), "max_key_len": (int,), "gram_len": (int,),
                               "top": (int,), "min_count": (int,), "workers": (int,),
                               "name": (str,)},
    "prepare": {"steps": (list,)},
    "sources": None,   # free text keys
}
# recipe keys whose GenerateConfig field has another name
_GEN_NAME = {("kangaroo", "gamma"): "kangaroo_gamma"}


@dataclass
class Recipe:
    path: Path
    data: dict = field(default_factory=dict)   # "section" or "section.sub" -> {key: value}

    @property
    def name(self) -> str:
        return self.data.get("recipe", {}).get("name", self.path.stem)

    @property
    def model(self) -> str | None:
        return self.data.get("recipe", {}).get("model")

    def section(self, name: str) -> dict:
        return dict(self.data.get(name, {}))

    @property
    def steps(self) -> list[str]:
        return list(self.data.get("prepare", {}).get("steps", []))

    def generate_options(self) -> dict:
        """GenerateConfig field -> value, from [recipe] model, [generate] and each method's
        own section (not the preparation subsections)."""
        return {name: v for name, (v, _) in self.generate_sources().items()}

    def generate_sources(self) -> dict:
        """generate_options' field -> (value, where the recipe gives it: "[section] key")."""
        out = {}
        if self.model:
            out["model"] = (self.model, "[recipe] model")
        for sec in ("generate", "draft-verify", "kangaroo", "self-draft"):
            for k, v in self.data.get(sec, {}).items():
                out[_GEN_NAME.get((sec, k), k)] = (tuple(v) if isinstance(v, list) else v,
                                                   f"[{sec}] {k}")
        return out


def _flatten(raw: dict, where: str) -> dict:
    """TOML tables -> {"section": {...}, "section.sub": {...}} checked against SCHEMA."""
    out: dict[str, dict] = {}
    for sec, body in raw.items():
        if sec not in SCHEMA or "." in sec:
            known = ", ".join(f"[{s}]" for s in SCHEMA if "." not in s)
            if not isinstance(body, dict):   # (`batch_size = 8` above every [section])
                raise SpecctlError(f"{where}: {sec} = ... is outside any section: settings go "
                                   f"in one (known: {known})")
            raise SpecctlError(f"{where}: unknown section [{sec}] (known: {known})")
        if not isinstance(body, dict):
            raise SpecctlError(f"{where}: [{sec}] must be a table")
        if SCHEMA[sec] is None:   # [sources]: free text
            bad = [k for k, v in body.items() if not isinstance(v, str)]
            if bad:
                raise SpecctlError(f"{where}: [sources] {bad[0]} must be a string")
            out[sec] = dict(body)
            continue
        out[sec] = {}
        for key, val in body.items():
            sub = f"{sec}.{key}"
            if isinstance(val, dict):
                if sub not in SCHEMA:
                    known = ", ".join(f"[{k}]" for k in SCHEMA if k.startswith(sec + "."))
                    raise SpecctlError(f"{where}: unknown section [{sub}]"
                                       + (f" (known: {known})" if known else ""))
                out[sub] = {}
                for k2, v2 in val.items():
                    out[sub][k2] = _check(where, sub, k2, v2)
            else:
                out[sec][key] = _check(where, sec, key, val)
    return out


def _check(where: str, sec: str, key: str, val):
    spec = SCHEMA[sec]
    if key not in spec:
        raise SpecctlError(f"{where}: unknown key {key!r} in [{sec}] (known: "
                           f"{', '.join(sorted(spec))})")
    types = spec[key]
    # bool is an int in Python: an int field must not take true/false, nor a float field
    ok = isinstance(val, types) and not (isinstance(val, bool) and bool not in types)
    if not ok:
        want = " or ".join(t.__name__ for t in types)
        raise SpecctlError(f"{where}: [{sec}] {key} must be {want}, got {type(val).__name__} "
                           f"{val!r}")
    if isinstance(val, list) and not all(isinstance(x, str) for x in val):
        raise SpecctlError(f"{where}: [{sec}] {key} must be a list of strings")
    return val


def load_recipe(path: Path | str) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise SpecctlError(f"recipe {path}: no such file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SpecctlError(f"recipe {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecctlError(f"recipe {path}: not valid TOML ({e})") from None
    data = _flatten(raw, f"recipe {path}")
    r = Recipe(path, data)
    where = f"recipe {path}"
    bad = [s for s in r.steps if s not in STEPS]
    if bad:
        raise SpecctlError(f"{where}: [prepare] steps: unknown step {bad[0]!r} "
                           f"(known: {', '.join(STEPS)})")
    m = r.data.get("generate", {}).get("method")
    if m is not None:
        from specctl.runtime.jobs.config import METHODS
        if m not in METHODS:
            raise SpecctlError(f"{where}: [generate] method {m!r} is not one of "
                               f"{', '.join(METHODS)}")
    # paths are relative to the recipe file; they must exist when given
    for sec, key in (("self-draft.build-cache", "corpus"), ("draft-verify.search", "dev"),
                     ("kangaroo.train", "data")):
        val = r.data.get(sec, {}).get(key)
        if val is None:
            continue
        vals = val if isinstance(val, list) else [val]
        fixed = []
        for v in vals:
            if key == "corpus" and v == "demo":   # build-cache's fetched demo corpus
                fixed.append(v)
                continue
            p = Path(v).expanduser()
            if not p.is_absolute():
                p = path.parent / p
            if not p.exists():
                if key == "data" and "/" in v and not Path(v).suffix:   # a hub dataset id
                    fixed.append(v)
                    continue
                raise SpecctlError(f"{where}: [{sec}] {key}: {v} does not exist")
            fixed.append(str(p))
        r.data[sec][key] = fixed if isinstance(val, list) else fixed[0]
    # a path or a name (a model alias, a store id, "none"): a path where the recipe's folder
    # has it (they were read from the current directory: another folder's model, say)
    for sec, key in (("recipe", "model"), ("draft-verify", "skip_set"), ("kangaroo", "adapter"),
                     ("self-draft", "corpus_cache")):
        v = r.data.get(sec, {}).get(key)
        if v is not None and not Path(v).expanduser().is_absolute() and \
                os.path.lexists(path.parent / v):
            r.data[sec][key] = str(path.parent / v)
    return r
