"""Acceptance threshold, duplicate and near-duplicate tokens, measured recomputation noise."""
import math
import time

import pytest
import torch

from sipit.invert import InvertConfig, eps, invert, rel_distance, tolerance, verify
from sipit.invert.eps import FACTOR, measure_noise, noise_profile, tolerance_for
from sipit.invert.verify import NEAR_REL, DuplicateClasses, duplicate_classes, near_duplicates, near_neighbours
from sipit.models import LayerTap, load_model, tiny_model


def test_rel_distance_and_tolerance():
    x = torch.randn(4, 8) * 1e3
    assert torch.allclose(rel_distance(x, x[0]), (x - x[0]).norm(dim=1).double() / x[0].norm().double())
    assert tolerance(torch.float32, 1e-5) < tolerance(torch.float16, 1e-5) < tolerance(torch.bfloat16, 1e-5) < 0.01
    assert tolerance(torch.bfloat16, 0.0) > 2.0 ** -8  # the storage rounding alone
    assert math.isclose(rel_distance(x[0], x[0]).item(), 0.0)


def test_near_neighbours_finds_planted_rows_and_nothing_else():
    g = torch.Generator().manual_seed(0)
    E = torch.randn(300, 32, generator=g)
    E[7] = E[3] * (1 + 3e-3)  # relative distance 3e-3: near
    E[9] = E[3] + 0.5 * E[3].norm() / 32 ** 0.5  # relative distance 0.5: not near
    E[11] = E[5]  # bit-identical: a duplicate, not a near neighbour
    dups = DuplicateClasses(E)
    near = near_neighbours(E, dups)
    assert near == {3: [7], 7: [3]}
    brute = (torch.cdist(E.double(), E.double()) <= 1e-2 * E.double().norm(dim=1)[:, None]).sum() - 300 - 2
    assert brute == 2  # (5, 11) both ways: the duplicates, excluded above


def test_pruning_a_projections_survivors_keeps_every_near_pair(monkeypatch):
    """Rows of one norm (as Gemma-3's), pairs planted at relative distances about the radius: with the float32
    product pruning every block's survivors (_close_rows), the same lists as a brute-force float64 search; the
    product alone keeps few pairs besides each row's own."""
    g = torch.Generator().manual_seed(1)
    E = torch.nn.functional.normalize(torch.randn(1500, 64, generator=g, dtype=torch.float64), dim=1).float()

    def plant(k: int, d: float, edge: bool = False) -> None:  # row 700 + k at relative distance d from row k
        step = torch.randn(64, generator=g, dtype=torch.float64)
        step = d * step / step.norm() * E[k].double().norm()
        lo, hi = 0.99, 1.0
        for _ in range(60 if edge else 0):  # (edge: once rounded to float32, within 1e-6 of the radius, inside)
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (E[k].double() - (E[k].double() + mid * step).float().double()).norm() \
                <= NEAR_REL * E[k].double().norm() else (lo, mid)
        E[700 + k] = (E[k].double() + (lo if edge else 1) * step).float()

    for k, d in enumerate([0.002, 0.0099, 0.0101, 0.02]):
        plant(k, d)
    for k in range(4, 12):
        plant(k, NEAR_REL, edge=True)
    X = E.double()
    dist = torch.cdist(X, X)
    within = (dist <= NEAR_REL * X.norm(dim=1)[:, None]) & ~torch.eye(len(X), dtype=torch.bool)
    brute = {u: sorted(within[u].nonzero()[:, 0].tolist(), key=lambda v: float(dist[u, v]))
             for u in range(len(X)) if within[u].any()}
    assert [u for u in brute if u < 700] == [0, 1, *range(4, 12)] and all(brute[u] == [700 + u] for u in brute if u < 700)
    monkeypatch.setattr(verify, "PRUNE_ABOVE", -1)  # (prune every block)
    assert near_neighbours(E, DuplicateClasses(E)) == brute
    close = verify._close_rows(X - X.mean(0), NEAR_REL * X.norm(dim=1))(slice(0, len(X)), 0, len(X))
    assert len(X) + 20 <= int(close.sum()) <= len(X) + 40  # (the 10 near pairs both ways, and a few)


def test_caches_are_keyed_by_the_weights_fingerprint():
    a, b = tiny_model("llama"), tiny_model("llama")
    x, y = a.encode("x")[0], a.encode("y")[0]
    with torch.no_grad():
        b.embed.weight[y] = b.embed.weight[x]
    assert duplicate_classes(a).members(y) == [y] and duplicate_classes(b).members(y) == [x, y]
    assert duplicate_classes(tiny_model("llama")) is duplicate_classes(a)  # same content, same classes
    assert near_duplicates(b).get(y) is None  # identical rows are a class, not near neighbours


def test_a_load_with_max_layer_finds_the_whole_models_noise_and_near_duplicates(saved_tiny, tmp_path, monkeypatch):
    """ε's noise is keyed by the blocks the tap reads, near-duplicate tokens by the embedding alone: a load
    of blocks 1..2 reads both from the files the whole model wrote (a fresh process: no memo)."""
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    d = saved_tiny("tiny-llama")[1]
    whole, cut = load_model(d), load_model(d, max_layer=2)

    def fresh_process():  # earlier tests may have memoized these very weights
        monkeypatch.setattr(eps, "_MEMO", {})
        monkeypatch.setattr(verify, "_CACHE", {})

    fresh_process()
    noise, near = noise_profile(LayerTap(whole, 2), batch_size=64), near_duplicates(whole)
    fresh_process()
    monkeypatch.setattr(eps, "measure_noise", lambda *a: pytest.fail("noise measured again"))
    monkeypatch.setattr(verify, "near_neighbours", lambda *a: pytest.fail("near-duplicates searched again"))
    assert noise_profile(LayerTap(cut, 2), batch_size=64) == noise and near_duplicates(cut) == near


def test_tolerance_says_how_long_measuring_it_took(tmp_path, monkeypatch, capsys):
    """A first inversion's ε is measured (many small passes: seconds at deep layers), then cached: the run says so
    while it waits, and the Tolerance records the time it cost now, so a run's summary can say where its seconds went."""
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    monkeypatch.setattr(eps, "_MEMO", {})
    monkeypatch.setattr(eps, "measure_noise", lambda *a: time.sleep(0.2) or [1e-7] * eps.LENGTH)
    tap = LayerTap(tiny_model("llama"), 2)
    measured = tolerance_for(tap, {torch.float32})
    assert "measuring the recomputation noise that sets eps for tiny-llama L2 (one-time" in capsys.readouterr().err
    cached = tolerance_for(tap, {torch.float32})
    assert capsys.readouterr().err == ""  # (cached: nothing to say)
    assert measured.seconds >= 0.2 > cached.seconds and measured.eps == cached.eps
    assert tolerance_for(tap, {torch.float32}, eps=1e-3).seconds == 0.0  # given: nothing measured


def test_measured_noise_per_position_bounds_the_loops_recomputation():
    lm = tiny_model("llama")
    tap = LayerTap(lm, 3)
    noise = measure_noise(tap, batch_size=64)
    assert len(noise) == 24 and max(noise) < 1e-5
    tol = tolerance_for(tap, {torch.float32})
    assert tol.source == "measured" and tol.eps >= FACTOR * tol.noise and tol.noise >= max(noise)
    ids = torch.tensor(lm.encode("per position, not one norm")[:16])
    full = tap.states(ids)  # [T, d]
    h, _ = tap.extend(tap.prefill(ids[:5]), ids[5:][None], keep=True)  # KV cache + speculative pass
    per_position = rel_distance(h[0], full[5:])  # one distance per position, never one norm of [T, d]
    assert (per_position <= tol.eps).all()
    r = invert(lm, full, 3, InvertConfig(calibration_tokens=8192), progress=False, true_ids=[ids.tolist()])
    s = r.summary()
    assert s["tolerance"]["noise_per_position"] == tol.noise_per_position and s["eps"] == tol.eps
    worst = s["max_accepted_distance"]
    assert 0 <= worst <= tol.eps
    assert s["eps_headroom"] == (round(tol.eps / worst, 2) if worst else None)  # None: bit-exact recomputation


def test_measured_noise_of_a_sliding_window_model_is_recomputation_only(tiny_gemma3):
    """Its calibration prompts reach the window (8) and candidate batches are measured flat and padded: flat
    where the rows slide would ignore the window (noise ~1), so tap.extend pads them."""
    assert max(measure_noise(LayerTap(tiny_gemma3, 4), batch_size=64)) < 1e-5


def test_bf16_model_eps_comes_from_measured_noise_and_inversion_is_exact():
    """A bf16 model's ε is FACTOR × its measured noise, not FACTOR × 16 bf16 ulps (≈ 3, which would
    accept any token): the GPU run of random:llama-3.1-8b in bf16 found every prompt ambiguous that way."""
    lm = load_model("tiny-llama", precision="bf16")
    ids = torch.randint(0, lm.vocab_size, (10,), generator=torch.Generator().manual_seed(1))
    res = invert(lm, LayerTap(lm, 3).states(ids), 3, InvertConfig(policy="exhaustive"), progress=False,
                 true_ids=[ids.tolist()])
    assert res.eps < 0.5 and res.prompts[0].exact and res.prompts[0].status == "ok"


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_16_bit_models_noise_is_measured_on_prefixes_cut_from_a_pass_of_the_whole_prompt(precision, monkeypatch):
    """A 16-bit model's loop grows its prefixes from passes of whole prompts (its searches confirm a token by a full
    forward), and a prefix made alone, its keys computed in a shorter sequence, lay 28% off at Gemma-3-270M's layer 9
    in bfloat16: ε 1.13, within which 6 of 16 wrong prompts came back `ok`. So its noise is measured on prefixes cut
    from a pass of the whole calibration prompt: no prefix of its is made alone. A float32 model's are (its loop's
    searches grow prefixes from one-token rows)."""
    tap = LayerTap(load_model("tiny-llama", precision=precision), 2)
    alone = []
    prefill = tap.prefill
    monkeypatch.setattr(tap, "prefill", lambda ids, **kw: alone.append(len(ids)) or prefill(ids, **kw))
    noise = measure_noise(tap, batch_size=16)
    assert len(noise) == eps.LENGTH
    assert (max(alone) == 0) == (precision == "bf16")
