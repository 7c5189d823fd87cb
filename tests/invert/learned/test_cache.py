import dataclasses
import types

import pytest
import torch
from safetensors import safe_open

from sipit.invert import InvertConfig
from sipit.invert.learned import (Calibration, LearnedConfig, cache_path, calibrate, calibration_key, learned_config,
                                  load_or_calibrate)
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned import cache as cache_module
from sipit.invert.learned.cache import LENS_SHARE, lens_fitted
from sipit.invert.learned.ranker import LinearRanker, position0_scores
from sipit.models import LayerTap, load_model

from .conftest import FAST, SAMPLED


def test_save_load_round_trip(lm, tmp_path):
    cal = calibrate(LayerTap(lm, lm.n_layers), FAST)
    back = Calibration.load(cal.save(tmp_path / "c.safetensors"))
    for f in dataclasses.fields(Calibration):
        a, b = getattr(cal, f.name), getattr(back, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == pytest.approx(b)


def test_other_version_is_refitted_not_migrated(lm, cache, monkeypatch):
    tap = LayerTap(lm, 1)
    _, first = load_or_calibrate(tap, FAST)
    assert first > 0 and load_or_calibrate(tap, FAST)[1] == 0.0
    [old] = cache.rglob("*.safetensors")
    monkeypatch.setattr(cache_module, "VERSION", cache_module.VERSION + 1)
    with pytest.raises(ValueError, match="version"):
        Calibration.load(old)
    assert load_or_calibrate(tap, FAST)[1] > 0  # another key: fitted again, the old file left alone


def test_same_weights_under_another_name_reuse_the_calibration(cache):
    """One GGUF by name and by path is one model: the key is the weights' content, not the name."""
    a, b = load_model("tiny-llama"), load_model("tiny-llama")
    b.name = "/some/path/SmolLM2-135M.Q8_0.gguf"
    _, seconds_a = load_or_calibrate(LayerTap(a, 2), FAST)
    _, seconds_b = load_or_calibrate(LayerTap(b, 2), FAST)
    assert seconds_a > 0 and seconds_b == 0.0
    assert len(list(cache.rglob("*.safetensors"))) == 1


def test_a_load_with_max_layer_shares_the_whole_models_calibrations(cache, saved_tiny):
    """Without a lens the key covers the blocks the tap reads, not those above: a load of blocks 1..2 finds
    the whole model's calibration at layer 1, and one it fits at layer 2 is the whole model's (no LM prior:
    layer 2 is the last one loaded, not the last layer). With one (the default), a calibration below the last
    layer reads every block: the whole model's has a lens, a cut load fits its own without."""
    d = saved_tiny("tiny-llama")[1]
    whole, cut = load_model(d), load_model(d, max_layer=2)
    plain = dataclasses.replace(FAST, lens_rows=0)
    assert load_or_calibrate(LayerTap(whole, 1), plain)[1] > 0 and load_or_calibrate(LayerTap(cut, 1), plain)[1] == 0.0
    cal, seconds = load_or_calibrate(LayerTap(cut, 2), plain)
    assert seconds > 0 and not cal.has_prior and cal.lens_w is None
    assert load_or_calibrate(LayerTap(whole, 2), plain)[1] == 0.0
    assert load_or_calibrate(LayerTap(whole, 4), plain)[0].has_prior  # the last layer has it
    lensed, cut_cal = load_or_calibrate(LayerTap(whole, 2), FAST)[0], load_or_calibrate(LayerTap(cut, 2), FAST)[0]
    assert lensed.lens_w is not None and lensed.lens_gate is not None and cut_cal.lens_w is None
    assert cache_path(LayerTap(whole, 2), FAST) != cache_path(LayerTap(cut, 2), FAST)
    assert load_or_calibrate(LayerTap(whole, 4), FAST)[0].lens_w is None  # the last layer reads the LM head itself


def test_a_lens_only_where_its_pass_costs_no_more_than_a_share_of_the_calibrations():
    """The lens runs its rows through the blocks above the tap, the calibration its tokens and position-0 states
    through those below. tiny-llama (4 blocks, V = 256), 4,096 calibration tokens: a lens of 64 rows of 64 (all
    of them) costs 4,096 × (4 − ℓ), more than LENS_SHARE of (4,096 + 256) × ℓ below the last layer; on 8 rows,
    512 × (4 − ℓ) ≤ 1,088 ℓ from layer 2 on; on 2 rows, 128 × 3 ≤ 1,088 at layer 1 too."""
    assert LENS_SHARE == 0.25
    lm = load_model("tiny-llama")
    for rows, layers in ((64, []), (8, [2, 3]), (2, [1, 2, 3]), (0, [])):
        config = dataclasses.replace(FAST, lens_rows=rows)
        assert [layer for layer in range(5) if lens_fitted(LayerTap(lm, layer), config)] == layers


def test_key_changes_with_what_is_observed_and_with_settings(cache):
    lm = load_model("tiny-gpt2")
    keys = {cache_path(LayerTap(lm, 2), FAST), cache_path(LayerTap(lm, 3), FAST),
            cache_path(LayerTap(lm, 2, final_norm=True), FAST),
            cache_path(LayerTap(lm, 2), dataclasses.replace(FAST, calibration_tokens=2048)),
            cache_path(LayerTap(load_model("tiny-gpt2", precision="fp16"), 2), FAST)}
    assert len(keys) == 5
    assert cache_path(LayerTap(lm, 2), dataclasses.replace(FAST, max_anchors=7)) == cache_path(LayerTap(lm, 2), FAST)


def test_invert_config_calibration_tokens_reaches_the_learned_config():
    assert learned_config(InvertConfig(calibration_tokens=2048)).calibration_tokens == 2048
    nested = LearnedConfig(calibration_tokens=1024)
    assert learned_config(types.SimpleNamespace(learned=nested, calibration_tokens=5)) is nested


def test_default_key_unchanged_and_fast_mode_keyed_apart():
    """The default settings' part of the key is pinned (as computed with VERSION 12; VERSION 7 made P's screen begin
    scoring projected distances; screen_rank 16 and table_rank 32 since 2026-11-26; 9: a refit; 10: the head's screen rank chosen; 11: ties agree; 12: judged where full scoring is right; sampled_fraction
    since 2026-11-26 too, a refit of the full calibrations only: fast mode has none, and 0 stays out of the key;
    lens_rows 64 since 2026-11-27, a refit of those with a lens):
    adding a setting must not orphan the cached calibrations; table_tokens (fast mode) gives another key."""
    default = ("{'calibration_tokens': 49152, 'seq_len': 64, 'random_fraction': 0.2, 'sampled_fraction': 0.3333333333333333, "
               "'ridge': 0.001, "
               "'screen_rank': 16, 'screen_top': 64, 'guess_top': 16, 'screen_agree': 0.999, 'table_rank': 32, "
               "'head_rank': 128, "
               "'gains': (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), 'validation_rows': 32, 'lm_weight': 5.0, 'gate_rows': 128, 'gate_margin': 1.0, "
               "'lens_rows': 64}")
    assert LearnedConfig().fit_key() == default and calibration_config("full") == LearnedConfig()
    lm = load_model("tiny-gpt2")
    assert calibration_key(LayerTap(lm, 2), LearnedConfig()).endswith("-L2-3da076ca45cb")
    fast = calibration_config("fast")
    assert fast.table_tokens == 4096 and fast.calibration_tokens == 16384 and "'first_tokens': 1024" in fast.fit_key()
    assert "'lens_rows': 0" in fast.fit_key()  # (no lens: a first inversion's calibration, LearnedConfig.fast)
    assert cache_path(LayerTap(lm, 2), fast) != cache_path(LayerTap(lm, 2), LearnedConfig())
    assert cache_path(LayerTap(lm, 2), SAMPLED) != cache_path(LayerTap(lm, 2), FAST)
    assert learned_config(InvertConfig(learned=fast)) is fast


def test_a_calibration_on_the_models_samples_is_keyed_by_the_whole_model(sampling_lm):
    """The samples come from every block and the LM head: such a calibration's key covers them all, at any layer,
    and differs from one without samples (which covers the blocks the tap reads)."""
    lm = sampling_lm
    plain = dataclasses.replace(FAST, lens_rows=0)
    tap = LayerTap(lm, 1)
    assert calibration_key(tap, plain).startswith(lm.fingerprint_through(lm.depth))
    without = dataclasses.replace(plain, sampled_fraction=0.0)
    assert calibration_key(tap, without).startswith(lm.fingerprint_through(1) + "-")
    assert calibration_config("fast").sampled_fraction == 0


def test_fast_calibration_round_trip(tmp_path):
    """A fast calibration's file holds its token models, not their [V, ·] predictions: loading makes the
    same ones again from the model's embedding rows, and refuses without them."""
    from sipit.invert.learned.cache import MADE_ON_LOAD

    lm = load_model("tiny-llama")
    cal = calibrate(LayerTap(lm, 1), SAMPLED)
    path = cal.save(tmp_path / "c.safetensors")
    with safe_open(str(path), "pt") as f:
        assert not set(MADE_ON_LOAD) & set(f.keys()) and {"A", "mx", "A0", "mx0"} <= set(f.keys())
    back = Calibration.load(path, embedding=lm.embedding_rows())
    assert back.table is None and back.t_basis is None and back.gain0 == cal.gain0
    for f in dataclasses.fields(Calibration):
        a, b = getattr(cal, f.name), getattr(back, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == pytest.approx(b), f.name
    with pytest.raises(ValueError, match="embedding rows"):
        Calibration.load(path)


def loaded_without(cal: Calibration, name: str, tmp_path, lm) -> Calibration:
    """cal saved as a file of before `name` was stored, and loaded again."""
    from safetensors.torch import load_file, save_file

    path = cal.save(tmp_path / "c.safetensors")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    del tensors[name]
    save_file(tensors, str(path), metadata=meta)
    return Calibration.load(path, embedding=lm.embedding_rows())


def test_fast_position0_is_screened_in_its_subspace(tmp_path):
    """A fast calibration keeps a principal subspace of position 0's predictions where its guesses agree with full
    scoring on the fit's rows: position 0 then reads [V, k0] instead of the embedding rows, guesses as full scoring
    does on other states too, and orders the screen's best first by their exact scores; a search there takes the full
    scores' order; a file saved before it (no p0_basis) loads and scores through
    the whole embedding, alike."""

    lm = load_model("tiny-llama")
    tap = LayerTap(lm, 2)
    cal = calibrate(tap, SAMPLED)
    assert cal.p0_basis is not None and cal.p0_basis.shape[1] < cal.A0.shape[1]
    E = lm.embedding_rows().float()
    ids = torch.randint(0, lm.vocab_size, (64, 6), generator=torch.Generator().manual_seed(1))
    r0 = tap.states(ids)[:, 0].float() @ cal.white0 - cal.c0w  # [64, d]
    m = 8
    guess, key = position0_scores(r0, cal, E, m)
    dense = dataclasses.replace(cal, p0_basis=None)
    full_guess, full_key = position0_scores(r0, dense, E, m)
    assert float((guess == full_guess).float().mean()) >= 0.95 and (guess == ids[:, 0]).float().mean() > 0.5
    first = key.argsort(1)[:, :m]  # the screen's m best, first
    assert torch.equal(first[:, 0], guess)
    exact = -full_key.gather(1, first)  # their full scores: best first
    assert (exact[:, :-1] >= exact[:, 1:] - 1e-4).all()
    ranker = LinearRanker(cal, tap)  # a search at position 0 takes the full scores' order
    states = tap.states(ids[:2])[:, 0]
    for i in range(2):
        assert torch.equal(ranker.position0_order(states[i], key[i]), full_key[i].argsort())
    back = loaded_without(cal, "p0_basis", tmp_path, lm)
    assert back.p0_basis is None and back.p0_proj is None
    assert torch.equal(position0_scores(r0, back, E, m)[0], full_guess)


def test_fast_calibration_keeps_the_frequent_first_tokens_exact_states(sampling_lm):
    """A fast calibration keeps the exact position-0 states of the calibration text's most frequent tokens and the
    special ones, from the model itself even where the fit ran a low-precision copy, each with half the distance to
    its nearest other: an observation within that radius of a kept state (and within the loop's eps of it, where
    given) guesses its token, before the linear model (planted: the kept state of one token relabelled as another is
    guessed as the other); one outside, or a calibration without them (a file of before), gets the linear model's
    guess."""
    from sipit.invert.learned.data import calibration_ids
    from sipit.invert.learned.fit import first_tokens

    lm = sampling_lm  # (a tokenizer with a special token: <bos> = id 0)
    tap = LayerTap(lm, 2)
    cfg = dataclasses.replace(SAMPLED, sampled_fraction=0.0, first_tokens=16)
    cal = calibrate(tap, cfg)
    ids = calibration_ids(lm, cfg.calibration_tokens, cfg.seq_len, cfg.random_fraction)
    assert torch.equal(cal.first_ids, first_tokens(lm, ids, cfg.first_tokens))
    assert len(lm.special_ids()) and torch.isin(lm.special_ids(), cal.first_ids).all()  # (<bos>, …: never predicted)
    exact = tap.states(cal.first_ids[:, None])[:, 0].float()  # the model's own, one token alone
    assert torch.allclose(cal.first_rows, exact, rtol=0, atol=1e-5 * float(exact.abs().max()))
    D = torch.cdist(exact.double(), exact.double()).fill_diagonal_(float("inf"))
    assert torch.allclose(cal.first_radius.double(), D.min(1).values / 2, rtol=1e-4)
    ranker = LinearRanker(cal, tap)
    linear = LinearRanker(dataclasses.replace(cal, first_ids=None), tap)
    a = 0
    b = 1 + int(linear.position0(exact[:1])[0][0] == cal.first_ids[1])  # a token the linear model does not guess there
    planted = dataclasses.replace(cal, first_ids=cal.first_ids.clone())
    planted.first_ids[a] = cal.first_ids[b]
    guess, key, _ = LinearRanker(planted, tap).position0(exact[a:a + 1])
    assert guess[0] == cal.first_ids[b] and key[0].argmin() == cal.first_ids[b]
    assert torch.equal(ranker.position0(exact)[0], cal.first_ids)  # every kept state guesses its own token
    direction = torch.randn(exact.shape[1], generator=torch.Generator().manual_seed(0))
    away = exact[a] + 3 * cal.first_radius[a] * direction / direction.norm()
    assert torch.equal(ranker.position0(away[None])[0], linear.position0(away[None])[0])
    # with the loop's eps, also within eps of it (relative): a kept token's own state still is, a state half its radius
    # away (another token's, as it may be) is not
    half = exact[a] + cal.first_radius[a] / 2 * direction / direction.norm()
    relabelled = LinearRanker(planted, tap)
    assert relabelled.position0(half[None])[0][0] == cal.first_ids[b]
    assert relabelled.position0(exact[a:a + 1], eps=1e-4)[0][0] == cal.first_ids[b]
    assert relabelled.position0(half[None], eps=1e-4)[0][0] == linear.position0(half[None])[0][0] != cal.first_ids[b]


def test_fast_calibration_without_position0_norms_loads(tmp_path):
    """A fast file saved before p0_sq was stored loads with the norms made from A0 and mx0, the ones stored now;
    position 0's dots from the embedding rows are those of the [V, d] predictions never made."""
    from sipit.invert.learned.cache import predictions
    from sipit.invert.learned.ranker import position0_dots

    lm = load_model("tiny-llama")
    cal = calibrate(LayerTap(lm, 1), SAMPLED)
    back = loaded_without(cal, "p0_sq", tmp_path, lm)
    assert torch.allclose(back.p0_sq, cal.p0_sq, rtol=1e-6)
    E = lm.embedding_rows().float()
    p0 = predictions(E, cal.mx0, cal.A0)[0]  # [V, d]
    r0 = torch.randn(3, p0.shape[1])
    assert torch.allclose(position0_dots(r0, cal.A0, cal.mx0, E), r0 @ p0.T, rtol=1e-4, atol=1e-3)


def test_wide_models_fit_on_more_tokens_than_configured():
    """LearnedConfig.sizes: SmolLM2 and Gemma-3-270M fit on the configured numbers (their keys unchanged);
    a 4096-wide model gets at least 12 fitted positions per ridge feature and 6 sampled position-0 states
    per dimension."""
    full, fast = LearnedConfig(), calibration_config("fast")
    for d, V in ((576, 49152), (640, 262144)):
        assert full.sizes(d, V) == (49152, None) and fast.sizes(d, V) == (16384, 4096)
    assert full.sizes(4096, 128256)[0] >= 12 * 3 * 4096
    tokens, sample = fast.sizes(4096, 128256)
    assert tokens >= 12 * 2 * 4096 and sample == 6 * 4096
    lm = load_model("tiny-gpt2")  # d = 64: 1,000 configured tokens are raised to 12 per feature
    few = LearnedConfig(calibration_tokens=1000)
    assert few.sizes(lm.d_model, lm.vocab_size)[0] == 2341


@pytest.mark.parametrize("with_table", [False, True])
def test_predictions_are_each_tokens_features_less_their_mean_times_A(with_table):
    """predictions: (token features − mx) A for every token, in blocks of 16,384 rows, and their squared norms."""
    from sipit.invert.learned.cache import predictions, token_rows

    g = torch.Generator().manual_seed(0)
    V, e, d = 40_000, 8, 6
    E, table = torch.randn(V, e, generator=g), torch.randn(V, d, generator=g) if with_table else None
    F = e + (d if with_table else 0)
    mx, A = torch.randn(F + d, generator=g, dtype=torch.float64), torch.randn(F, d, generator=g)
    P, P_sq = predictions(E, mx, A, table)
    expected = (token_rows(E, table, torch.arange(V)) - mx[:F].float()) @ A
    assert torch.allclose(P, expected, atol=1e-5) and torch.allclose(P_sq, (P.double() ** 2).sum(1).float())
