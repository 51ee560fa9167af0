"""Every family the engine runs against transformers' own model of it (tests/families.py: tiny,
random, every feature of the family on, saved in shards), in fp32: the logits of a packed batch
of prompts of different lengths, some longer than the sliding window, within 1e-4; and 48
greedy tokens equal to transformers' generate for every method at batch 1 and 4."""

from __future__ import annotations

import pytest
import torch

from families import FAMILIES, LOGITS_ONLY, WINDOW, build_family_model
from helpers import method_drafters, run_ids
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.loader import load_model

PROMPTS = [[5 + (7 * i + 3 * j) % 290 for j in range(n)] for i, n in enumerate((6, 11, 17, 26))]
TOKENS = 48
METHODS = ("ar", "draft-verify", "kangaroo", "self-draft")
# the default suite's share of the greedy matrix (each family once, each method at batch 4);
# the whole of it under -m slow
DEFAULT = {("qwen3", "draft-verify"), ("gemma2", "kangaroo"), ("gemma3", "self-draft"),
           ("phi3", "kangaroo"), ("olmo2", "draft-verify"), ("granite", "self-draft"),
           ("llama-yarn", "kangaroo")}
_REF: dict = {}


def reference(family: str, tmp_path_factory) -> dict:
    """{path, hf (transformers' model that was saved there), logits (of each prompt)}, made
    once per session; greedy (its continuations) added by greedy_reference."""
    if family not in _REF:
        path, m = build_family_model(tmp_path_factory.mktemp(family), family)
        with torch.no_grad():
            _REF[family] = {"path": path, "hf": m,
                            "logits": [m(torch.tensor([ids])).logits[0] for ids in PROMPTS]}
    return _REF[family]


def greedy_reference(family: str, tmp_path_factory) -> tuple:
    ref = reference(family, tmp_path_factory)
    if "greedy" not in ref:
        with torch.no_grad():
            ref["greedy"] = _greedy(ref["hf"], PROMPTS, TOKENS)
    return ref["path"], ref["greedy"]


def _greedy(m, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """transformers' generate, greedy, the prompts left-padded into one batch (the same tokens
    as one at a time: checked for every family here when this was written)."""
    L = max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    out = m.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                     eos_token_id=None, pad_token_id=0, min_new_tokens=tokens)
    return [row[L:].tolist() for row in out]


@pytest.mark.parametrize("family", FAMILIES + LOGITS_ONLY)
def test_logits_match_transformers(family, tmp_path_factory):
    """One packed prefill of every prompt (two of them over twice the window): each prompt's
    logits are transformers' within 1e-4."""
    ref = reference(family, tmp_path_factory)
    path, refs = ref["path"], ref["logits"]
    assert len(list(path.glob("*.safetensors"))) > 1   # (loaded from shards)
    assert max(map(len, PROMPTS)) > 2 * WINDOW
    model = load_model(path, "cpu", "fp32")
    kv = model.new_kv_cache(len(PROMPTS), 64)
    for s in range(len(PROMPTS)):
        kv.reserve(s, 64)
    out = model.logits(model.forward(ForwardBatch(
        [SeqInput(s, ids, 0) for s, ids in enumerate(PROMPTS)]), kv))
    at = 0
    for ids, ref in zip(PROMPTS, refs):
        ours = out[at:at + len(ids)]
        at += len(ids)
        assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4), (len(ids),
                                                                 (ours - ref).abs().max())


@pytest.mark.parametrize("family,method,bs", [
    pytest.param(f, m, bs, marks=() if (f, m) in DEFAULT and bs == 4 else pytest.mark.slow)
    for f in FAMILIES for m in METHODS for bs in (1, 4)])
def test_greedy_matches_transformers(family, method, bs, tmp_path_factory):
    """48 greedy tokens of each prompt are transformers' generate, for every method at batch 1
    and 4 (well past the window)."""
    path, ref = greedy_reference(family, tmp_path_factory)
    model = load_model(path, "cpu", "fp32")
    drafter = method_drafters(model, PROMPTS, ref)[method]
    got, _ = run_ids(model, PROMPTS, batch_size=bs, max_tokens=TOKENS, drafter=drafter)
    assert got == ref


@pytest.mark.parametrize("mtype, arch", [("qwen3_moe", "Qwen3MoeForCausalLM"),
                                         ("mixtral", "MixtralForCausalLM"),
                                         ("gemma3", "Gemma3ForConditionalGeneration")])
def test_what_the_engine_cannot_run_is_refused_in_one_line(tmp_path, mtype, arch):
    """A mixture of experts or a vision-language model: one line naming the supported
    families, before anything is loaded."""
    import json
    from specctl.errors import SpecctlError
    from specctl.models.checkpoint import SUPPORTED_TYPES, validate_hf_folder
    (tmp_path / "config.json").write_text(json.dumps({"model_type": mtype,
                                                      "architectures": [arch]}))
    with pytest.raises(SpecctlError) as e:
        validate_hf_folder(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and f"{mtype!r} ({arch}) is not supported" in msg
    assert all(t in msg for t in SUPPORTED_TYPES) and "mixture of experts" in msg


def test_what_a_family_config_cannot_say_is_refused():
    """Options the decoder does not run are refused by name, not run wrongly."""
    from specctl.engine.config import ConfigError, ModelConfig
    base = {"model_type": "phi3", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4}
    for extra, needle in (({"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
                          ({"hidden_act": "relu"}, "hidden_act 'relu'"),
                          ({"rope_scaling": {"rope_type": "mrope"}}, "'mrope'")):
        with pytest.raises(ConfigError, match=needle):
            ModelConfig.from_hf({**base, **extra})
