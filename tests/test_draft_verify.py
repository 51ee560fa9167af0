"""Draft & Verify: lossless greedy at any batch size, lossless sampling, the gamma rule."""

from __future__ import annotations

import pytest

from helpers import check_three_token_sampling, random_prompts, run_ids
from specctl.speculative.draft_verify import (ExitParams, ExitState, LayerSkipDrafter, SkipSet,
                                       update_threshold)
from specctl.speculative.sampling import SamplingParams



SKIPS = {
    "empty": SkipSet(4),
    "light": SkipSet(4, frozenset({2}), frozenset()),
    "heavy": SkipSet(4, frozenset({0, 1, 3}), frozenset({1, 2})),
}


@pytest.mark.parametrize("skip", list(SKIPS))
@pytest.mark.parametrize("batch_size", [1, 8])
def test_greedy_equals_ar(model, skip, batch_size):
    prompts = random_prompts(10, seed=1)
    ref, _ = run_ids(model, prompts, batch_size=batch_size, max_tokens=20)
    # gamma0 = 0 so drafting is never cut short by the threshold: the verifier gets long chains
    drafter = LayerSkipDrafter(model, SKIPS[skip], SamplingParams(), ExitParams(K=5, gamma0=0.0))
    got, stats = run_ids(model, prompts, batch_size=batch_size, max_tokens=20, drafter=drafter)
    assert got == ref
    assert drafter.draft_forwards > 0
    if skip == "empty":   # the drafter is the target itself: every draft is accepted
        assert stats.steps < sum(len(o) for o in got) / 3


def test_sequences_draft_different_lengths_in_one_step(model):
    prompts = random_prompts(6, seed=2)
    drafter = LayerSkipDrafter(model, SKIPS["light"], SamplingParams(), ExitParams(K=6))
    seen = []
    orig = drafter.observe

    def spy(seqs, proposals, verdicts, probe_out):
        seen.append(sorted(len(p.draft) for p in proposals))
        orig(seqs, proposals, verdicts, probe_out)
    drafter.observe = spy
    ref, _ = run_ids(model, prompts, batch_size=6, max_tokens=24)
    got, _ = run_ids(model, prompts, batch_size=6, max_tokens=24, drafter=drafter)
    assert got == ref
    assert any(len(set(lens)) > 1 for lens in seen)


def test_gamma_rule_hand_computed():
    prm = ExitParams()   # gamma0 .6, eps .01, beta1 .5, beta2 .9, alpha .9
    st = ExitState(0.6)
    # step 1: 2 of 4 accepted -> AR = 0.5 (first step) <= alpha -> gamma~ = 0.61
    st = update_threshold(st, 2, 4, False, prm)
    assert st.ar == pytest.approx(0.5)
    assert st.gamma == pytest.approx(0.9 * 0.6 + 0.1 * 0.61)        # 0.601
    # step 2: 4 of 4 -> AR = 0.5 * 0.5 + 0.5 * 1.0 = 0.75 <= 0.9 -> up again
    st = update_threshold(st, 4, 4, False, prm)
    assert st.ar == pytest.approx(0.75)
    assert st.gamma == pytest.approx(0.9 * 0.601 + 0.1 * 0.611)     # 0.602
    # step 3: 6 of 6 -> AR = 0.875 -> still <= alpha -> up
    st = update_threshold(st, 6, 6, False, prm)
    g3 = 0.9 * 0.602 + 0.1 * 0.612
    assert st.ar == pytest.approx(0.875) and st.gamma == pytest.approx(g3)
    # step 4: 3 of 3 -> AR = 0.9375 > alpha -> gamma~ = gamma - eps
    st = update_threshold(st, 3, 3, False, prm)
    assert st.ar == pytest.approx(0.9375)
    assert st.gamma == pytest.approx(0.9 * g3 + 0.1 * (g3 - 0.01))
    # (code) high acceptance with the full K drafted keeps gamma
    g4 = st.gamma
    st = update_threshold(st, 12, 12, True, prm)
    assert st.gamma == pytest.approx(g4) and st.ar == pytest.approx(0.96875)
    # nothing drafted: nothing learned
    assert update_threshold(st, 0, 0, False, prm) == st


def test_skipset_bits_roundtrip():
    s = SkipSet.from_bits([1, 0, 0, 1, 0, 1, 0, 0])
    assert s.attn == {0, 3} and s.mlp == {1} and s.bits() == [1, 0, 0, 1, 0, 1, 0, 0]
    assert SkipSet.from_json(s.to_json()) == s
    with pytest.raises(ValueError):
        SkipSet(4, frozenset({4}))


def test_sampling_is_lossless(model):
    """The first three sampled tokens follow the target's joint distribution with a drafter
    that disagrees with the target (a deliberately biased verifier fails this)."""
    sp = SamplingParams(temperature=1.0, top_k=3, seed=11)
    drafter = LayerSkipDrafter(model, SKIPS["heavy"], sp, ExitParams(K=3, gamma0=0.0))
    stats = check_three_token_sampling(model, random_prompts(1, seed=5)[0], sp, drafter)
    assert stats.accept_hist.get(1, 0) + stats.accept_hist.get(2, 0) > 100   # drafts accepted
    assert stats.accept_hist.get(0, 0) > 100                                 # and rejected


def test_backoff_stops_paying_for_fruitless_drafts(model):
    """A drafter that never clears the threshold backs off towards ar's cost; still lossless."""
    prompts = random_prompts(4, seed=3)
    ref, _ = run_ids(model, prompts, batch_size=4, max_tokens=40)
    hopeless = ExitParams(K=4, gamma0=1.0, eps=0.0)   # no draft is ever confident enough
    stuck = LayerSkipDrafter(model, SKIPS["heavy"], SamplingParams(), hopeless)
    got, stats = run_ids(model, prompts, batch_size=4, max_tokens=40, drafter=stuck)
    assert got == ref
    never = LayerSkipDrafter(model, SKIPS["heavy"], SamplingParams(),
                             ExitParams(K=4, gamma0=1.0, eps=0.0, max_backoff=0))
    run_ids(model, prompts, batch_size=4, max_tokens=40, drafter=never)
    assert never.draft_forwards >= stats.steps - 1        # a wasted forward every step (the
                                                          # last has no room to draft)
    assert stuck.draft_forwards < stats.steps / 3         # mostly plain ar steps
