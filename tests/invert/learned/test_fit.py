from dataclasses import replace

import pytest
import torch

from sipit.invert.learned import Calibration, calibrate, calibrate_layers, data
from sipit.invert.learned.fit import VALIDATION_LEN, Moments, TokenMoments, _smallest_as_good, fit_calibrations
from sipit.models import LayerTap

from .conftest import FAST, SAMPLED


def test_streaming_moments_equal_the_batch_ridge():
    """Batches of float32 rows give the same fit as one float64 solve on standardised features
    (residuals 1e-3 of the signal's variance: float32 products lose ~1e-7 × var(y) / var(residual))."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3000, 12, generator=g, dtype=torch.float64) * torch.logspace(-1, 2, 12, dtype=torch.float64) + 5
    Y = X[:, :5] @ torch.randn(5, 4, generator=g, dtype=torch.float64) + 0.1 * torch.randn(3000, 4, generator=g, dtype=torch.float64)
    m = Moments()
    for xb, yb in zip(X.split(700), Y.split(700)):
        m.add(xb.float(), yb.float())
    Ws, mx, my, resid = m.ridge(1e-3)
    mu, sd, ym = X.mean(0), X.std(0), Y.mean(0)
    Xs = (X - mu) / sd
    W = torch.linalg.solve(Xs.T @ Xs + 1e-3 * len(X) * torch.eye(12, dtype=torch.float64), Xs.T @ (Y - ym))
    R = Y - ym - Xs @ W
    assert torch.allclose(Ws, W / sd[:, None], rtol=1e-3, atol=1e-6)
    assert torch.allclose(mx, mu, rtol=1e-6) and torch.allclose(my, ym, rtol=1e-6, atol=1e-6)
    assert torch.allclose(resid, R.T @ R / len(R), rtol=1e-3, atol=1e-6)


def test_token_moments_equal_the_batch_ridge():
    """Summing the token features' block per distinct token (TokenMoments) fits what one float64 solve
    on the whole rows [E_v, table_v, c] does, as well as Moments does."""
    g = torch.Generator().manual_seed(0)
    E, table = torch.randn(50, 6, generator=g) + 3, torch.randn(50, 4, generator=g) * 10
    v = torch.randint(0, 50, (2000,), generator=g)
    C = torch.randn(2000, 5, generator=g) + E[v, :5] - 2
    X = torch.cat([E[v], table[v], C], 1).double()
    Y = X @ (0.1 * torch.randn(15, 3, generator=g, dtype=torch.float64)) + 0.1 * torch.randn(2000, 3, generator=g, dtype=torch.float64)
    m = TokenMoments(E, table)
    for vb, cb, yb in zip(v.split(300), C.split(300), Y.split(300)):
        m.add_tokens(vb, cb, yb.float())
    Ws, mx, my, resid = m.ridge(1e-3)
    mu, sd, ym = X.mean(0), X.std(0), Y.mean(0)
    Xs = (X - mu) / sd
    W = torch.linalg.solve(Xs.T @ Xs + 1e-3 * len(X) * torch.eye(15, dtype=torch.float64), Xs.T @ (Y - ym))
    R = Y - ym - Xs @ W
    assert torch.allclose(Ws, W / sd[:, None], rtol=1e-3, atol=1e-6)
    assert torch.allclose(mx, mu, rtol=1e-6) and torch.allclose(my, ym, rtol=1e-6, atol=1e-6)
    assert torch.allclose(resid, R.T @ R / len(R), rtol=1e-3, atol=1e-6)


def test_one_pass_over_layers_equals_one_calibration_per_layer(lm):
    single = calibrate(LayerTap(lm, 2), FAST)
    both = calibrate_layers(lm, [1, 2], FAST)
    assert both[1].key == single.key != both[0].key
    assert torch.equal(both[1].table, single.table)
    assert torch.allclose(both[1].P, single.P, rtol=1e-4, atol=1e-4 * float(single.P.abs().max()))
    assert both[1].gain == single.gain


def test_lm_prior_only_at_the_last_layer_of_plain_states(lm):
    assert not calibrate(LayerTap(lm, 2), FAST).has_prior
    last = calibrate(LayerTap(lm, lm.n_layers), FAST)
    assert last.has_prior and last.lm_weight == FAST.lm_weight and last.lm_gate is not None



def test_the_gate_rows_are_observed_whole_only_where_a_lens_or_the_lm_prior_reads_them(lm):
    """The random-id gate rows place the LM prior's or the lens's gate, which read all their positions; without
    either only their position 0 is read (fast mode's position-0 gain and screen), so only it is observed."""
    def gate_lengths(tap, config, to_last=None):  # the lengths of the gate rows observed ([gate_rows, S])
        lengths = []

        def observe(ids):
            if ids.shape[0] == config.gate_rows and ids.shape[1] != config.seq_len:  # (not a text batch)
                lengths.append(ids.shape[1])
            return [tap.states(ids)]
        with_last = (lambda ids: [*observe(ids), to_last(ids)]) if to_last else None  # (the lens's rows)
        cal = next(fit_calibrations([tap], observe, config, with_last))
        return lengths, cal

    last = LayerTap(lm, lm.n_layers)
    plain, cal = gate_lengths(LayerTap(lm, 2), replace(SAMPLED, lens_rows=0))
    assert plain == [1] and cal.lens_w is None and not cal.has_prior
    prior, cal = gate_lengths(last, SAMPLED)
    assert prior == [VALIDATION_LEN] and cal.has_prior
    lensed, cal = gate_lengths(LayerTap(lm, 1), replace(SAMPLED, lens_rows=2), last.states)
    assert lensed == [VALIDATION_LEN] and cal.lens_w is not None and cal.lens_gate is not None


def test_the_head_screen_takes_the_smallest_rank_that_guesses_as_well_as_the_whole_head(lm):
    """The LM prior's screen reads the head in a subspace of head_rank, doubled until its guesses on the validation
    text rows are wrong no more often than the whole head's; at full rank the screen is the head's own rows."""
    from sipit.invert.learned.ranker import LinearRanker

    assert _smallest_as_good({2: 9, 4: 6, 8: 6, 16: 5, 32: 4, 64: 5}.get, 2, 64) == 16
    assert _smallest_as_good({2: 5, 64: 5}.get, 2, 64) == 2
    asked = []
    assert _smallest_as_good(lambda k: asked.append(k) or {64: 3}.get(k, 9), 2, 64) == 64
    assert asked == [64, 2, 4, 8, 16, 32]  # (the whole head once)
    tap, d = LayerTap(lm, lm.n_layers), lm.d_model
    unweighted = calibrate(tap, replace(FAST, head_rank=2, lm_weight=0.0))  # (the prior changes no guess)
    assert unweighted.u_basis.shape == (d, 2) and unweighted.u_proj.shape == (lm.vocab_size, 2)
    whole = calibrate(tap, replace(FAST, head_rank=d))
    assert whole.u_proj is None and torch.equal(whole.u_basis, torch.eye(d))
    ranker = LinearRanker(whole, tap)
    assert torch.equal(ranker.head_low, lm.unembedding_rows().float().to(ranker.low))
    assert whole.lm_gate is not None



@pytest.mark.parametrize("final_norm", [False, True])
def test_the_gate_is_placed_on_what_the_ranker_reads(lm, final_norm):
    """The LM prior's gate sits gate_margin above the 99th percentile of the random-id rows' mean log-probs as the
    ranker computes them at run time, states normed once: already normed ones (final_norm) are not normed again."""
    from sipit.invert.learned.fit import _above_random, _ranker

    tap = LayerTap(lm, lm.n_layers, final_norm=final_norm)
    cal = calibrate(tap, FAST)
    H = tap.states(data.random_ids(lm.vocab_size, FAST.gate_rows, VALIDATION_LEN, seed=2)).float()  # the fit's rows
    ranker = _ranker(cal, tap, FAST)
    logp = ranker.prior_screens(ranker.context_residuals(*H), ranker.normed(H[:, :-1]).reshape(-1, lm.d_model))[1]
    assert cal.lm_gate == pytest.approx(_above_random([float(x.mean()) for x in logp.split(VALIDATION_LEN - 1)], FAST),
                                        abs=1e-4)

class ProjectedTap:
    """A tap of another surface (LayerTap's interface): a fixed projection of layer-2 states to 24
    dimensions, so `dim` differs from d_model and the LM prior does not apply."""

    def __init__(self, lm):
        self.inner = LayerTap(lm, lm.n_layers)
        self.lm, self.layer, self.final_norm = lm, self.inner.layer, False
        self.proj = torch.randn(lm.d_model, 24, generator=torch.Generator().manual_seed(0))
        self.dim, self.key, self.blocks_read = 24, f"proj24-L{self.layer}", self.layer

    def states(self, ids):
        return self.inner.states(ids) @ self.proj


def test_any_tap_with_dim_key_and_blocks_read_calibrates(lm):
    tap = ProjectedTap(lm)
    cal = calibrate(tap, FAST)
    assert cal.P.shape == (lm.vocab_size, 24) and cal.table.shape == (lm.vocab_size, 24)
    assert not cal.has_prior and "proj24" in cal.key
    assert isinstance(cal, Calibration)


def test_one_pass_over_surfaces_equals_one_calibration_per_tap(lm, cache):
    """calibrate_cached_taps fits a KV tap and a projection at two layers in one pass, as each alone,
    and a second call finds both cached."""
    from sipit.invert.learned.fit import calibrate_cached_taps, load_cached
    from sipit.models.surfaces import KVTap, ProjectedTap as Projected, random_projection

    taps = [KVTap(lm, 1, "values"), Projected(lm, 2, random_projection(lm.d_model, 8, seed=1))]
    seconds = calibrate_cached_taps(lm, taps + taps[:1], FAST)  # a tap given twice is fitted once
    assert set(seconds) == {t.key for t in taps} and all(s > 0 for s in seconds.values())
    for tap in taps:
        alone, shared = calibrate(tap, FAST), load_cached(tap, FAST)
        assert shared.key == alone.key and torch.allclose(shared.table.float(), alone.table.float(), rtol=1e-3, atol=1e-5)
        assert torch.allclose(shared.P, alone.P, rtol=1e-3, atol=1e-3 * float(alone.P.abs().max()))
    assert calibrate_cached_taps(lm, taps, FAST) == {t.key: 0.0 for t in taps}


def test_taps_that_do_not_fit_in_memory_are_fitted_in_several_passes_alike(lm, cache, monkeypatch, capsys):
    """With memory for about two taps' sums at a time, four layers are fitted in passes of consecutive
    layers (each saved as it comes), and every calibration equals the one-pass fit's."""
    from sipit.invert.learned import fit
    from sipit.invert.learned.fit import _held_bytes, _made_bytes, _passes, calibrate_cached_layers, load_cached

    layers = [1, 2, 3, 4]
    taps = [LayerTap(lm, layer) for layer in layers]
    two = 2.5 * _held_bytes(lm, taps[0], FAST) + _made_bytes(lm, taps[0])
    monkeypatch.setattr(fit, "memory_left", lambda device, keep=(): two / fit.FIT_MEMORY)
    assert [[t.layer for t in p] for p in _passes(lm, taps, FAST)] == [[1, 2], [3, 4]]
    monkeypatch.setattr(fit, "memory_left", lambda device, keep=(): None)  # unknown: one pass
    assert _passes(lm, taps[::-1], FAST) == [taps]

    monkeypatch.setattr(fit, "memory_left", lambda device, keep=(): two / fit.FIT_MEMORY)
    seconds = calibrate_cached_layers(lm, layers, FAST)
    assert "in 2 passes (to fit in memory)" in capsys.readouterr().err and all(s > 0 for s in seconds.values())
    for layer, one_pass in zip(layers, calibrate_layers(lm, layers, FAST)):
        cached = load_cached(LayerTap(lm, layer), FAST)
        assert cached.key == one_pass.key and cached.gain == one_pass.gain
        assert torch.allclose(cached.P, one_pass.P, rtol=1e-4, atol=1e-4 * float(one_pass.P.abs().max()))


def test_passes_count_the_model_weights_taken_only_where_the_pass_runs_them(lm, monkeypatch):
    """A pass through the model itself needs its (possibly memory-mapped) weights in memory; a pass through a
    lower-precision copy does not."""
    from sipit.invert.learned import fit

    kept = []

    def memory_left(device, keep=()):
        kept[:] = list(keep)
        return None

    monkeypatch.setattr(fit, "memory_left", memory_left)
    for config in (FAST, SAMPLED):
        fit._passes(lm, [LayerTap(lm, 1)], config)
        runs_model = fit._runner_dtype(lm, config) == lm.dtype
        assert len(kept) == (len(list(lm.model.parameters())) if runs_model else 0)


def test_fast_mode_observes_only_the_sampled_tokens_at_position_0(lm):
    """A fast calibration never computes the table: of the position-0-only rows observed (ids [B, 1]),
    there are exactly table_tokens, the first tokens it keeps and the gate's random-id rows (read at position 0
    only: no lens, no LM prior), and what it stores is a model of every token, not a table."""
    tap = LayerTap(lm, 2)
    first_only = []

    def observe(ids):
        if ids.shape[1] == 1:
            first_only.append(len(ids))
        return [tap.states(ids)]

    cal = next(fit_calibrations([tap], observe, replace(SAMPLED, first_tokens=16)))
    assert 16 <= len(cal.first_ids) < 32
    assert sum(first_only) == SAMPLED.table_tokens + len(cal.first_ids) + SAMPLED.gate_rows < lm.vocab_size
    assert cal.table is None and cal.t_proj is None and cal.gain0 in SAMPLED.gains
    assert cal.p0_sq.shape == (lm.vocab_size,) and cal.P.shape == (lm.vocab_size, lm.d_model)
    assert cal.key != calibrate(tap, FAST).key


def test_low_precision_states_feed_fast_mode_never_a_table(lm, monkeypatch):
    """low_precision_states: fast mode fits on a copy of the model in the screening dtype (where that
    is lower than the model's); a table, whose lower bounds certify, always comes from the model itself.
    The copy's fit ranks like the model's own (top-1 of the guesses on fresh prompts)."""
    from sipit.models.device import screen_dtype
    from sipit.models.lm import LM

    copies, real = [], LM.copy_in
    monkeypatch.setattr(LM, "copy_in", lambda self, dtype: copies.append(dtype) or real(self, dtype))
    tap = LayerTap(lm, 2)
    calibrate(tap, replace(FAST, low_precision_states=True))  # V ≤ table_tokens: a table, no copy
    assert copies == []
    low = calibrate(tap, SAMPLED)
    native = screen_dtype(lm.device).itemsize < 4
    assert copies == ([screen_dtype(lm.device)] if native else [])
    own = calibrate(tap, replace(SAMPLED, low_precision_states=False))
    assert low.key != own.key
    from sipit.invert.learned.ranker import LinearRanker

    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, lm.vocab_size, (8, 16), generator=g)
    H = tap.states(ids).float()
    right = {name: sum(int((g == row[1:]).sum()) for (g, _), row in zip(LinearRanker(cal, tap).guesses(list(H)), ids))
             for name, cal in (("low", low), ("own", own))}
    assert right["low"] >= 0.9 * right["own"] > 0


def test_a_model_that_can_sample_fits_on_its_own_samples(sampling_lm, monkeypatch, tmp_path):
    """A third of the rows are the model's samples (cached: made once for both layers' fits), the rest as without."""
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    made = []
    real = data.model_samples
    monkeypatch.setattr(data, "model_samples", lambda *a, **k: made.append(a[1]) or real(*a, **k))
    plain = replace(FAST, lens_rows=0)
    with_samples = calibrate(LayerTap(sampling_lm, 2), plain)
    assert made == [4096 // 3 // 64] and calibrate(LayerTap(sampling_lm, 3), plain) is not None and len(made) == 1
    without = calibrate(LayerTap(sampling_lm, 2), replace(plain, sampled_fraction=0.0))
    assert not torch.allclose(with_samples.P, without.P)


def test_the_gain_is_the_one_whose_top_1_is_right_most_often_and_its_top_1_comes_with_it():
    """_best_gain over blocks of 64 rows (one reused block for every product): the gain whose scores S − g·P_sq rank
    the truth first most often (ties: the largest), with those scores' top-1 ids."""
    from sipit.invert.learned.fit import _best_gain

    g = torch.Generator().manual_seed(0)
    S, P_sq = torch.randn(150, 300, generator=g), torch.rand(300, generator=g)
    gains = (0.4, 0.7, 1.0)
    top = {x: (S - x * P_sq).argmax(1) for x in gains}
    truth = top[0.7].clone()
    truth[:5] = top[1.0][:5]  # 0.7 right on all but the rows where it differs from 1.0's
    best, ids = _best_gain(S, P_sq, truth, gains)
    assert best == 0.7 and torch.equal(ids, top[0.7])
    assert _best_gain(S, P_sq, top[0.4], (0.4, 0.4 + 1e-9))[0] == 0.4 + 1e-9  # (a tie: the least shrinkage)


def test_a_screen_is_judged_only_where_full_scoring_is_right():
    """The rank search counts against a screen the positions where full scoring picks the truth and the screen's
    pick scores lower; where full scoring is wrong the position costs a pass whatever the screen picks (SmolLM2's
    fast layer 15: one such position made the fit take rank 256 where 32 lost no right guess)."""
    from sipit.invert.learned.fit import _agreement

    score = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])  # each token's exact score (the same at every position here)
    scores = lambda ids: score[ids]
    truth, full = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 0, 2, 3])  # full scoring wrong at position 1 only
    assert _agreement(torch.tensor([0, 4, 2, 3]), full, truth, scores) == 1  # worse there: no matter
    assert _agreement(torch.tensor([0, 1, 2, 3]), full, truth, scores) == 1  # the truth there, scoring lower
    assert _agreement(torch.tensor([0, 0, 4, 3]), full, truth, scores) == 0.75  # worse where full scoring is right
    assert _agreement(torch.tensor([1, 0, 2, 3]), full, truth, scores) == 0.75


def test_a_screen_agrees_where_its_pick_ties_with_full_scorings(lm, monkeypatch):
    """Tokens with equal embedding rows get equal predictions and scores, and a screen need not rank them in full
    scoring's order: the fit's rank search counts a tie as agreement. Here every token after the first 16 shares
    the row of one of them, and every pick is turned into another token of its class: each still scores as well as
    full scoring's, so the smallest rank tried is kept, at position 0 (fast mode) and after it."""
    from sipit.invert.learned import fit as fit_module
    from sipit.invert.learned.ranker import LinearRanker

    model = lm.copy_in(lm.dtype)
    E = model.embed.weight.data
    E[16:] = E[torch.arange(16, lm.vocab_size) % 16]
    other = lambda ids: ids % 16 + 16 * (1 + (ids // 16) % 2)  # another token of the same row: never itself
    screen, scores = LinearRanker.screen, fit_module.position0_scores

    def swapped_position0(*args):
        ids, *rest = scores(*args)
        return (other(ids), *rest)

    monkeypatch.setattr(LinearRanker, "screen", lambda self, r: other(screen(self, r)))
    monkeypatch.setattr(fit_module, "position0_scores", swapped_position0)
    cal = calibrate(LayerTap(model, 1), replace(SAMPLED, screen_rank=4))
    assert cal.p_basis.shape[1] == 4 and cal.p0_basis is not None and cal.p0_basis.shape[1] == 4
