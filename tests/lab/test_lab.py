"""Theory lab on tiny models: enumeration, exhaustive collision counts, counterexamples, SipIt guarantee."""
import argparse
import json
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch

from sipit.lab import (CounterexampleConfig, EnumerationConfig, GuaranteeConfig, LabError, LabModel, PromptSet,
                       TrainConfig, build, run_counterexamples, run_enumeration, run_guarantee, run_train)
from sipit.lab.cli import add_lab_parser
from sipit.lab.guarantee import Inverted
from sipit.lab.models import last_token_states
from sipit.models.tap import run_layers

V, K = 4, 4  # 340 prompts, 57,630 pairs
SMALL = LabModel(vocab=V, context=K)


def pairs_within_groups(prompts: PromptSet, key) -> int:
    """Number of prompt pairs with equal key(prompt): the collisions a construction predicts."""
    return sum(math.comb(n, 2) for n in Counter(key(prompts[i]) for i in range(len(prompts))).values())


# ---------------------------------------------------------------------------------------------- enumeration


def test_prompt_set_counts_every_sequence_once():
    p = PromptSet(8, 5)
    assert len(p) == 8 * (8**5 - 1) // 7 == 37_448
    seen = {tuple(p[i]) for i in range(0, len(p), 97)} | {tuple(p[len(p) - 1])}
    assert all(tuple(p[p.index(list(s))]) == s for s in seen)
    small = PromptSet(3, 3)
    listed = [tuple(small[i]) for i in range(len(small))]
    assert len(set(listed)) == len(listed) == 3 + 9 + 27
    assert listed[:4] == [(0,), (1,), (2,), (0, 0)] and listed[-1] == (2, 2, 2)
    assert all(small.index(list(s)) == i for i, s in enumerate(listed))
    assert small.of_length(2).tolist() == [list(s) for s in listed[3:12]]


def test_last_token_states_match_single_forward():
    lm = build(SMALL)
    p = PromptSet(V, K)
    states = last_token_states(lm, p, [1, 2])  # [2, N, d]
    assert states.shape == (2, len(p), 32)
    for i in (0, 5, 100, len(p) - 1):
        ids = torch.tensor([p[i]])
        h1, h2 = run_layers(lm, [1, 2], ids=ids)
        assert torch.allclose(states[0, i], h1[0, -1], atol=1e-6) and torch.allclose(states[1, i], h2[0, -1], atol=1e-6)


def test_bad_configs_say_why():
    with pytest.raises(LabError, match=r"17,895,696 prompts.*GiB"):
        run_enumeration(EnumerationConfig(model=LabModel(vocab=16, context=6)))
    with pytest.raises(LabError, match="activation"):
        build(LabModel(activation="swish"))
    with pytest.raises(LabError, match="layers"):
        run_enumeration(EnumerationConfig(model=SMALL, layers=[3]))


# ---------------------------------------------------------------------------------------------- exhaustive


@pytest.mark.parametrize("model", [SMALL, LabModel(vocab=V, context=K, arch="llama", bos=True, activation="tanh"),
                                   LabModel(vocab=V, context=K, activation="relu", tied=False, depth=3)])
def test_exhaustive_default_models_have_no_collision(model, tmp_path):
    r = run_enumeration(EnumerationConfig(model=model), tmp_path)
    n = 4 + 16 + 64 + 256
    assert r.n_prompts == n and r.n_pairs == n * (n - 1) // 2
    assert [x.layer for x in r.layers] == list(range(1, model.depth + 1))
    assert all(x.n_pairs == r.n_pairs and x.collisions == 0 and x.min_relative > 1e-4 for x in r.layers)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["n_pairs"] == r.n_pairs and saved["collisions"] == 0
    assert (tmp_path / "exhaustive.png").stat().st_size > 0 and "Theorem 2.2" in (tmp_path / "report.md").read_text()


def test_longer_context_checks_the_same_model():
    short = run_enumeration(EnumerationConfig(model=LabModel(vocab=V, context=3)))
    long = run_enumeration(EnumerationConfig(model=SMALL))  # same weights (fixed positions), more prompts
    assert all(b.min_distance <= a.min_distance for a, b in zip(short.layers, long.layers))


def test_rotary_without_bos_collides_on_repeated_tokens():
    r = run_enumeration(EnumerationConfig(model=LabModel(vocab=V, context=K, arch="llama"), show=100))
    for layer in r.layers:  # a, aa, aaa, aaaa for each token a: V * C(K, 2) pairs
        assert layer.collisions == V * math.comb(K, 2)
        assert all(len(set(a + b)) == 1 for a, b, _ in layer.colliding)


# ---------------------------------------------------------------------------------------------- counterexamples


@pytest.fixture(scope="module")
def counterexamples():
    names = ["duplicate-embedding", "uniform-attention-no-positions", "zero-attention", "quantized-weights",
             "rotary-without-bos"]
    r = run_counterexamples(CounterexampleConfig(model=SMALL, names=names, sigmas=[1e-3]))
    return {item.name: item for item in r.items}


def test_counterexample_collision_counts_are_exactly_the_predicted_ones(counterexamples):
    p = PromptSet(V, K)
    dup = pairs_within_groups(p, lambda s: tuple(0 if t == 1 else t for t in s))
    assert [x.collisions for x in counterexamples["duplicate-embedding"].before] == [dup, dup]
    # uniform attention, no positions: block 1 sees the last token and the token frequencies
    freq = pairs_within_groups(p, lambda s: (s[-1], tuple(Fraction(s.count(v), len(s)) for v in range(V))))
    assert [x.collisions for x in counterexamples["uniform-attention-no-positions"].before] == [freq, V * math.comb(K, 2)]
    same = pairs_within_groups(p, lambda s: (len(s), s[-1]))  # zero attention: length and last token
    assert [x.collisions for x in counterexamples["zero-attention"].before] == [same, same]


def test_perturbation_removes_measure_zero_collisions_only(counterexamples, capsys):
    for name, item in counterexamples.items():
        assert item.found > 0 and item.example() is not None
        a, b, _ = item.example()
        assert a != b
        if item.measure_zero:
            assert item.removed_at == 1e-3, name
            assert all(x.collisions == 0 and x.min_relative > 1e-5 for x in item.after[0][1])
        else:
            assert item.removed_at is None, name


def test_quantized_states_collide_and_stay_collided(tmp_path):
    r = run_counterexamples(CounterexampleConfig(model=LabModel(vocab=V, context=K, arch="llama", bos=True),
                                                 names=["quantized-states"], sigmas=[1e-3]), tmp_path)
    item = r.items[0]
    assert item.found > 0 and item.removed_at is None and not item.measure_zero
    assert {"result.json", "report.md", "counterexamples.png"} <= {f.name for f in tmp_path.iterdir()}
    with pytest.raises(LabError, match="dtype"):
        run_counterexamples(CounterexampleConfig(model=SMALL, quant="int8"))
    with pytest.raises(LabError, match="grid"):
        run_counterexamples(CounterexampleConfig(model=SMALL, names=["quantized-weights"], grid=0))


# ---------------------------------------------------------------------------------------------- guarantee


@pytest.mark.parametrize("model", [LabModel(vocab=V, context=3), LabModel(vocab=V, context=3, arch="llama", bos=True)])
def test_sipit_recovers_every_prompt_within_t_times_v_steps(model, tmp_path):
    r = run_guarantee(GuaranteeConfig(model=model), tmp_path)
    assert r.holds and r.bound == 3 * (V + model.bos) and r.inverter.startswith("sipit.invert")
    for x in r.layers:
        assert x.recovered == x.accepted == x.n_prompts == 4 + 16 + 64
        assert x.max_steps <= r.bound and x.max_steps_ratio <= 1 and x.min_wrong_relative > 1e-3
        assert all(row["max_steps"] <= row["bound"] for row in x.by_length)
    assert (tmp_path / "guarantee.png").exists() and "Theorem 3.1" in (tmp_path / "report.md").read_text()


def test_guarantee_check_catches_a_wrong_inverter():
    def always_zero(lm, layer, states, prefix):
        B, T = len(states), states.shape[1] - len(prefix)
        return Inverted(torch.zeros(B, T, dtype=torch.long), torch.full((B,), T), torch.ones(B, dtype=torch.bool))

    r = run_guarantee(GuaranteeConfig(model=LabModel(vocab=V, context=2), layers=[1]), invert_fn=always_zero)
    assert not r.holds and r.layers[0].recovered == 1 + 1 and r.layers[0].failures


# ---------------------------------------------------------------------------------------------- train, CLI


def test_train_tracks_loss_and_separation(tmp_path):
    cfg = TrainConfig(model=LabModel(vocab=V, context=3), optimizer="gd", steps=30, eval_every=15)
    r = run_train(cfg, tmp_path)
    assert len(r.losses) == 30 and [c.step for c in r.checkpoints] == [0, 15, 30]
    assert r.checkpoints[-1].loss < r.checkpoints[0].loss
    assert all(len(c.min_distance) == 2 and min(c.min_distance) > 0 for c in r.checkpoints)
    assert not any(p.requires_grad for p in build(cfg.model).model.parameters())
    assert (tmp_path / "train.png").stat().st_size > 0


def test_cli_registers_lab_commands(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_lab_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lab", "exhaustive", "--vocab", "4", "--context", "3", "--arch", "llama", "--bos",
                              "-o", str(tmp_path)])
    args.fn(args)
    out = capsys.readouterr().out
    assert "84 prompts" in out and "3,486 pairs" in out and "no collision" in out
    for cmd in ("train", "counterexamples", "guarantee"):
        assert parser.parse_args(["lab", cmd]).lab_command == cmd
