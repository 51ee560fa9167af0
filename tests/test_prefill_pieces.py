"""Prefill in pieces (runtime/step/prefill.py): prompts as replays of a captured shape, PIECE
tokens of each a forward, where the device measured that cheaper than eager forwards. On the
CPU through the graph path's eager stand-in (engine/graphs.py, capture=False) with a price
that says so; what the GPU measures, and the speed, are test_gpu.py's."""

from __future__ import annotations

import random

import pytest

from helpers import method_drafters, run_ids
from specctl.engine.graphs import PIECE, CudaGraphs
from specctl.engine.loader import load_model
from specctl.engine.model import Model
from specctl.runtime.step.prefill import PiecePrice

# replays for nothing, eager forwards dear: every prefill forward goes in pieces
CHEAP = PiecePrice(4, eager=(1e6, 1e6), replay=(1.0, 1.0))
DEAR = PiecePrice(4, eager=(1.0, 1.0), replay=(1e6, 1e6))


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    """Prompts of 3 to 3 x PIECE tokens: one piece, two, three."""
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 300) for _ in range(rnd.choice((3, 40, PIECE, PIECE + 9,
                                                             2 * PIECE + 30)))]
            for _ in range(n)]


@pytest.fixture(scope="module")
def eager(tiny_llama):
    return load_model(tiny_llama, "cpu", "fp32")


@pytest.fixture(scope="module")
def graphs(tiny_llama):
    m = load_model(tiny_llama, "cpu", "fp32")
    m.graphs = CudaGraphs(m, capture=False)
    return m


@pytest.fixture(scope="module")
def reference(eager):
    prompts = _prompts(10)
    ref, st = run_ids(eager, prompts, batch_size=1, max_tokens=12, max_len=512)
    assert st.prefill_replays == 0
    return prompts, ref


@pytest.mark.parametrize("batch_size", [1, 4])
def test_prefill_in_pieces_is_lossless(eager, graphs, reference, batch_size):
    """Every method, its prompts prefilled in pieces (1 to 3 a prompt, grouped with others
    that end sooner), answers as ar's with eager prefill; the same drafts accepted as with
    eager prefill (Kangaroo's adapter rows come from the pieces' captured exit-layer states:
    wrong ones would draft otherwise); and every prefill forward a replay."""
    prompts, ref = reference
    plain = method_drafters(eager, prompts, ref)
    for name, dr in method_drafters(graphs, prompts, ref).items():
        got, st = run_ids(graphs, prompts, batch_size=batch_size, max_tokens=12, drafter=dr,
                          max_len=512, prefill_price=CHEAP)
        assert got == ref, name
        assert st.prefill_replays == st.prefill_forwards > 0, name
        # (more forwards than prompts: the long ones took several pieces)
        assert st.prefill_forwards > -(-len(prompts) // batch_size), name
        if dr is not None:
            _, want = run_ids(eager, prompts, batch_size=batch_size, max_tokens=12,
                              drafter=plain[name], max_len=512)
            assert st.accept_hist == want.accept_hist, name
            assert sum(k * n for k, n in st.accept_hist.items()) > 0, name


def test_pieces_replace_the_eager_prefill_forward(graphs, reference, monkeypatch):
    """In pieces no prefill forward runs eagerly (Model.forward: the stand-in's replays call
    the layers, not it); where the price says eager, prefill is as before: eager forwards,
    no replay."""
    prompts, ref = reference
    calls = [0]
    forward = Model.forward

    def counted(self, *a, **kw):
        calls[0] += 1
        return forward(self, *a, **kw)
    monkeypatch.setattr(Model, "forward", counted)
    got, st = run_ids(graphs, prompts, batch_size=4, max_tokens=12, max_len=512,
                      prefill_price=CHEAP)
    assert got == ref and calls[0] == 0 and st.prefill_replays == st.prefill_forwards
    got, st = run_ids(graphs, prompts, batch_size=4, max_tokens=12, max_len=512,
                      prefill_price=DEAR)
    assert got == ref and calls[0] == st.prefill_forwards > 0 and st.prefill_replays == 0


def test_a_replay_takes_no_more_prompts_than_the_price_measured(graphs, reference):
    """A piece forward takes at most PiecePrice.most prompts (what the chunk's working
    memory holds): 4 waiting prompts of one piece each at most 2 a forward."""
    prompts, ref = reference
    short = [p[:PIECE] for p in prompts[:4]]
    want, _ = run_ids(graphs, short, batch_size=4, max_tokens=6, max_len=512)
    two = PiecePrice(2, eager=(1e6, 1e6), replay=(1.0, 1.0))
    got, st = run_ids(graphs, short, batch_size=4, max_tokens=6, max_len=512,
                      prefill_price=two)
    assert got == want and st.prefill_forwards == st.prefill_replays == 2


def test_the_price_takes_pieces_only_where_they_cost_less():
    """Rounds of replays against eager forwards, each priced linearly in its prompts."""
    p = PiecePrice(8, eager=(10.0, 20.0), replay=(2.0, 8.0))
    # 4 prompts of one piece: a replay of 4 (4.6 ms) against an eager forward (14.3)
    assert p.pieces([30] * 4, 4096, 64)
    # 8 prompts of 600 tokens: 10 rounds of 8 ms against 2 eager forwards of 20
    assert not p.pieces([600] * 8, 4096, 64)
    # a long prompt among short ones makes the rounds: 2 x 3.7 (3 prompts, bucket 4: 4.6)
    # against 12.9, and 5 x 4.6 against 14.3
    assert p.pieces([64, 64, 128], 4096, 64)
    assert not p.pieces([10, 10, 10, 300], 4096, 64)
    # past the most a replay takes, more rounds, and an eager forward priced as the most's:
    # 2 x 8 against 20, and 3 x 8 (24 prompts) against 20
    assert p.pieces([30] * 16, 4096, 64)
    assert not p.pieces([30] * 24, 4096, 64)
    # a small chunk makes eager forwards many: pieces win where they would not
    assert PiecePrice(8, eager=(10.0, 10.0), replay=(6.0, 6.0)).pieces([100], 50, 64)
    assert not PiecePrice(8, eager=(10.0, 10.0), replay=(6.0, 6.0)).pieces([100], 4096, 64)


def test_the_price_is_measured_on_idle_slots_and_its_shapes_captured_ahead(graphs):
    """What a GPU's runner does as it starts, here on the stand-in: prefill's piece shapes
    captured for the buckets a replay takes (n = PIECE alone), then both forwards timed
    (price_of) at 1 and at the most prompts, the replays replaying those shapes; and a
    runner without real graphs measures nothing (measure_pieces: None)."""
    from specctl.engine.batch import FULL
    from specctl.runtime.step.prefill import measure_pieces, piece_prompts, price_of
    kv = graphs.new_kv_cache(8, 256 + graphs.graphs.max_n)
    most = piece_prompts(kv, 4 * PIECE)
    assert most == 4 and piece_prompts(kv, 4096) == 8
    g = graphs.graphs
    g.warm(kv, [], [(FULL, most)])
    keys = [k for k in g.cache if k[2] == FULL and k[3] is None]
    assert {k[1] for k in keys} == {PIECE} and {k[0] for k in keys} == {1, 2, 4}
    captured, replays = g.captures, g.replays
    price = price_of(graphs, kv, FULL, most, repeats=1)
    assert price.most == most and min(price.eager + price.replay) > 0
    assert g.replays - replays == 2 * 3 and g.captures == captured
    assert measure_pieces(graphs, kv, FULL, 4096) is None   # (capture=False: no real graphs)


def test_the_run_reports_the_price_its_pieces_followed(graphs, reference):
    """A grouped run's RunStats, time_split and the bench's time table carry the prefill price
    it followed (the most prompts of a piece, eager and replayed ms there): on the H200 a run
    prefilled eagerly where ar's went in pieces and nothing said why. Settings, not counts:
    summed over ranks, the largest stays. A run without a price has none."""
    from specctl.bench.report import time_rows
    from specctl.runtime.jobs.metrics import time_split
    from specctl.runtime.step.stats import sum_stats
    from dataclasses import asdict
    prompts, ref = reference
    price = PiecePrice(4, eager=(3.0, 7.5), replay=(1.0, 2.25))
    got, st = run_ids(graphs, prompts, batch_size=4, max_tokens=12, max_len=512,
                      prefill_price=price)
    assert got == ref
    assert (st.piece_prompts, st.piece_eager_ms, st.piece_replay_ms) == (4, 7.5, 2.25)
    ts = time_split(st)
    assert ts["piece_ms"] == {"prompts": 4, "eager": 7.5, "replay": 2.25}
    both = sum_stats([asdict(st), asdict(st)])
    assert (both.piece_prompts, both.piece_eager_ms) == (4, 7.5) and \
        both.prefill_forwards == 2 * st.prefill_forwards
    row = {"method": "ar", "batch_size": 4, "wall_s": {"runs": [1.0]}, "time_split": ts}
    assert "4 prompts a piece: 7.5 ms eager, 2.2 replayed" in time_rows({"rows": [row]})[0][5]
    _, plain = run_ids(graphs, prompts, batch_size=4, max_tokens=12, max_len=512)
    assert plain.piece_prompts == 0 and time_split(plain)["piece_ms"] is None
