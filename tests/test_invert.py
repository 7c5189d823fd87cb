"""SipIt inversion: exact recovery per policy, certificates, duplicate classes, failure reports.

States are always captured by one ordinary full forward pass (LayerTap.states on the whole prompt),
never by the incremental path the inversion itself uses.
"""
import math

import pytest
import torch

from sipit.invert import InversionError, InvertConfig, invert, rel_distance, tolerance
from sipit.invert.policies import Exhaustive
from sipit.invert.verify import DuplicateClasses
from sipit.models import LayerTap, load_model
from sipit.models import tiny_model

torch.set_num_threads(1)

TEXT = ["def f(x):\n    return x", "The cat sat on the mat."]
FAST = dict(calibration_tokens=8192, grad_steps=40)


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-llama"])
def lm(request):
    return load_model(request.param)


def capture(lm, texts, layer, final_norm=False, n=12):
    ids = torch.tensor([lm.encode(t)[:n] for t in texts])
    return ids, LayerTap(lm, layer, final_norm=final_norm).states(ids)


@pytest.mark.parametrize("policy", ["exhaustive", "random", "gradient", "learned"])
@pytest.mark.parametrize("layer,final_norm", [(0, False), (2, False), (4, False), (4, True), (2, True)])
def test_exact_recovery(lm, policy, layer, final_norm):
    ids, states = capture(lm, TEXT, layer, final_norm)
    r = invert(lm, states, layer, InvertConfig(policy=policy, **FAST), final_norm=final_norm,
               progress=False, true_ids=ids.tolist())
    assert [p.ids for p in r.prompts] == ids.tolist()
    assert r.summary()["exact_match_rate"] == 1.0 and r.ok
    assert r.prompts[0].text == TEXT[0][:12]
    for p in r.prompts:
        assert p.status == "ok" and p.exact
        for q in p.positions:
            assert q.distance <= r.eps and q.tried >= 1
            assert q.margin is None or q.margin > 100 * r.eps  # a real gap, not noise


def test_learned_speculates_whole_prompt(lm):
    ids, states = capture(lm, TEXT, 3)
    r = invert(lm, states, 3, InvertConfig(**FAST), progress=False, true_ids=ids.tolist())
    s = r.summary()
    assert s["exact_match_rate"] == 1.0
    assert s["forward_equivalents_per_prompt"] <= 1.5  # random tiny models are easy to predict
    p0 = r.prompts[0].positions[0]
    assert p0.margin_over == lm.vocab_size - 1  # the position-0 table certifies the whole vocabulary


class WrongGuesses(Exhaustive):
    """Speculates with every third guess wrong: exercises lookahead and search after mismatches."""

    name = "wrong-guesses"
    truth = None

    def guesses(self, t, ids):
        g = self.truth[t:].clone()
        g[(torch.arange(t, len(self.truth)) % 3) == 1] = 0
        return g


def test_search_and_lookahead_after_mismatches(lm):
    ids, states = capture(lm, TEXT[:1], 2)
    WrongGuesses.truth = ids[0]
    r = invert(lm, states, 2, InvertConfig(policy=WrongGuesses, batch_size=64), progress=False, true_ids=ids.tolist())
    p = r.prompts[0]
    assert p.exact, p
    vias = {q.via for q in p.positions}
    assert {"speculation", "lookahead"} <= vias or "search" in vias
    assert all(q.token == int(v) for q, v in zip(p.positions, ids[0]))


def test_float16_states_and_batch_list(lm):
    ids, states = capture(lm, TEXT, 2)
    half = [states[0].half(), states[1, :7].half()]  # a list of prompts of different lengths
    r = invert(lm, half, 2, InvertConfig(**FAST), progress=False)
    assert r.eps == pytest.approx(tolerance(torch.float16))
    assert r.prompts[0].ids == ids[0].tolist() and r.prompts[1].ids == ids[1, :7].tolist()


def test_duplicate_embedding_rows_are_reported_as_a_class():
    lm = tiny_model("llama")
    a, b = lm.encode("a")[0], lm.encode("b")[0]
    with torch.no_grad():
        lm.embed.weight[b] = lm.embed.weight[a]  # plant an exact duplicate row
    assert DuplicateClasses(lm.embedding_rows()).members(b) == [a, b]
    ids, states = capture(lm, ["a cab, bad"], 2)
    for policy in ("exhaustive", "learned"):
        r = invert(lm, states, 2, InvertConfig(policy=policy, **FAST), progress=False, true_ids=ids.tolist())
        p = r.prompts[0]
        assert p.status == "ambiguous" and p.exact  # not a failure
        for q, v in zip(p.positions, ids[0].tolist()):
            assert (q.duplicates == [a, b]) == (v in (a, b))
            assert q.token == v or q.duplicates == [a, b]


@pytest.mark.parametrize("policy", ["learned", "exhaustive"])
def test_wrong_layer_fails_at_position_0_without_scanning_every_position(lm, policy):
    ids, states = capture(lm, TEXT, 2)
    r = invert(lm, states, 3, InvertConfig(policy=policy, **FAST), progress=False, true_ids=ids.tolist())
    assert not r.ok and r.summary()["failed"] == 2
    for p in r.prompts:
        assert p.status == "failed" and p.ids == [] and p.text == "" and not p.exact
        assert len(p.positions) == 1 and p.positions[0].token is None
        assert p.positions[0].distance > 100 * r.eps and "position 0" in p.message
        assert p.tap_calls <= (0 if policy == "learned" else 4)  # learned: certified by the table


def test_wrong_model_fails():
    gpt2, llama = load_model("tiny-gpt2"), load_model("tiny-llama")
    _, states = capture(gpt2, TEXT, 2)
    r = invert(llama, states, 2, InvertConfig(**FAST), progress=False)
    assert not r.ok and all(p.status == "failed" and p.ids == [] for p in r.prompts)


def test_non_finite_states_fail_without_search(lm):
    ids, states = capture(lm, TEXT, 2)
    states[1, 3, 5] = float("nan")
    r = invert(lm, states, 2, InvertConfig(**FAST), progress=False, true_ids=ids.tolist())
    assert r.prompts[0].exact and r.prompts[1].status == "failed"
    assert "non-finite" in r.prompts[1].message and r.prompts[1].tap_calls == 0


def test_bad_input_raises_clear_errors(lm):
    _, states = capture(lm, TEXT, 2)
    with pytest.raises(InversionError, match="hidden size"):
        invert(lm, torch.randn(5, lm.d_model + 1), 2, progress=False)
    with pytest.raises(InversionError, match="empty"):
        invert(lm, torch.zeros(0, lm.d_model), 2, progress=False)
    with pytest.raises(InversionError, match="empty"):
        invert(lm, [], 2, progress=False)
    with pytest.raises(Exception, match="out of range"):
        invert(lm, states, 9, progress=False)


def test_rel_distance_and_tolerance():
    x = torch.randn(4, 8) * 1e3
    assert torch.allclose(rel_distance(x, x[0]), (x - x[0]).norm(dim=1).double() / x[0].norm().double())
    assert tolerance(torch.float32) < tolerance(torch.float16) < tolerance(torch.bfloat16) < 0.01
    assert math.isclose(rel_distance(x[0], x[0]).item(), 0.0)


def test_jsonl_and_summary(lm):
    import json

    ids, states = capture(lm, TEXT, 2)
    r = invert(lm, states, 2, InvertConfig(**FAST), progress=False, true_ids=ids.tolist())
    lines = [json.loads(s) for s in r.to_jsonl().splitlines()]
    assert len(lines) == 2 and lines[0]["ids"] == ids[0].tolist() and lines[0]["exact"] is True
    s = r.summary()
    json.dumps(s)
    assert s["token_accuracy"] == 1.0 and s["vocab_explored_pct"] <= 100


@pytest.mark.smollm2
def test_smollm2_default_policy_layer_15():
    lm = load_model("smollm2")
    prompts = ["The committee will publish its findings next spring.",
               "for i, row in enumerate(rows):\n    total += row",
               ]
    ids = [lm.encode(p)[:12] for p in prompts]
    ids.append(torch.randint(0, lm.vocab_size, (10,), generator=torch.Generator().manual_seed(7)).tolist())
    tap = LayerTap(lm, 15)
    states = [tap.states(torch.tensor(i)) for i in ids]
    r = invert(lm, states, 15, progress=False, true_ids=ids)
    assert [p.ids for p in r.prompts] == ids, r.summary()
    assert all(p.exact for p in r.prompts)
    assert r.summary()["vocab_explored_pct"] < 0.1


# ---------------------------------------------------------------------------------------- CLI


def test_cli_invert_roundtrip_and_failures(tmp_path, capsys):
    import json

    import numpy as np

    from sipit.cli import main

    states = tmp_path / "s.safetensors"
    assert main(["capture", "--model", "tiny-llama", "--layer", "2", "--text", "hello world", "-o", str(states)]) == 0
    out = tmp_path / "r.jsonl"
    assert main(["invert", str(states), "-q", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recovered: 'hello world'" in text and "exact" in text
    row = json.loads(out.read_text())
    assert row["exact"] and row["text"] == "hello world"
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["exact_match_rate"] == 1.0 and summary["layer"] == 2

    # wrong layer: a failure report, exit 1, nothing printed as recovered
    assert main(["invert", str(states), "-q", "--layer", "3", "-o", str(out)]) == 1
    text = capsys.readouterr().out
    assert "FAILED" in text and "recovered" not in text.split("\n")[0]
    # wrong model (same hidden size)
    assert main(["invert", str(states), "-q", "--model", "tiny-gpt2", "-o", str(out)]) == 1
    # wrong hidden size, no metadata
    npy = tmp_path / "x.npy"
    np.save(npy, np.random.randn(4, 65).astype("float32"))
    assert main(["invert", str(npy), "-q", "--model", "tiny-gpt2", "--layer", "1"]) == 2
    assert "hidden size" in capsys.readouterr().err
    # no metadata and no --model/--layer
    assert main(["invert", str(npy), "-q"]) == 2
    assert "--model and --layer" in capsys.readouterr().err
    # NaN
    np.save(npy, np.full((4, 64), np.nan, dtype="float32"))
    assert main(["invert", str(npy), "-q", "--model", "tiny-gpt2", "--layer", "1"]) == 2


def test_certify_gives_every_position_a_margin(lm):
    ids, states = capture(lm, TEXT[:1], 2)
    r = invert(lm, states, 2, InvertConfig(certify=40, **FAST), progress=False, true_ids=ids.tolist())
    p = r.prompts[0]
    assert p.exact
    for q in p.positions:  # 40 > the learned policy's first ranking batch (16)
        assert q.margin is not None and q.margin > 100 * r.eps and q.margin_over >= 40


@pytest.mark.gemma
def test_gemma_default_policy_low_layer_with_bos():
    lm = load_model("gemma3-270m")
    ids = [lm.encode("Paris is the capital of France.")[:8]]  # starts with BOS, inverted like any token
    assert ids[0][0] == lm.tokenizer.bos_token_id
    states = [LayerTap(lm, 2).states(torch.tensor(i)) for i in ids]
    r = invert(lm, states, 2, progress=False, true_ids=ids)
    assert r.prompts[0].ids == ids[0] and r.prompts[0].exact


def test_learned_reranking_fits_offset_and_gain_from_evaluated_candidates(lm):
    """Anchors u with exact states W h(u) = b + s·P_u: the fit recovers (b, s), so the token whose
    state is b + s·P_v ranks first; one anchor g is the plain shift r = W(ĥ − h(g)) + gain·P_g."""
    from sipit.invert.policies import make_policy

    fm = make_policy("learned", LayerTap(lm, 2), InvertConfig(**FAST)).model
    W, P = fm.c["white"].double(), fm.c["P"].double()
    g = torch.Generator().manual_seed(0)
    b, s, v = torch.randn(P.shape[1], generator=g, dtype=torch.float64), 0.37, 5
    u = torch.tensor([1, 2, 3, 7, 11, 13])
    unwhite = lambda y: torch.linalg.solve(W, y.T).T  # y [n, d] = h @ W with W symmetric  <=>  h = W^{-1} y
    states = unwhite(b + s * P[u]).float()
    target = torch.stack([states[0], unwhite((b + s * P[v])[None])[0].float()])  # position 1 holds token v
    y, gain = fm.residual(target, 1, (u, states))
    assert gain == pytest.approx(s, rel=1e-3)
    assert torch.allclose(y.double(), s * P[v], atol=1e-2 * float(P[v].norm()))
    assert int(fm.scores(target, 1, False, (u, states)).argmax()) == v
    y1, gain1 = fm.residual(target, 1, (u[:1], states[:1]))
    assert gain1 == fm.gain and 0 < fm.gain <= 1
    assert torch.allclose(y1, (target[1] - states[0]) @ fm.c["white"] + fm.gain * fm.c["P"][1], atol=1e-4)
