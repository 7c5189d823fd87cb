"""The paper's baselines: BruteForce (the engine, random order, batch 1) and HardPrompts (PEZ)."""
import logging

import pytest
import torch

from sipit.invert import METHODS, HardPromptsResult, InversionError, InversionResult, PromptResult, run
from sipit.invert.baselines import HardPromptsConfig, bruteforce, hardprompts
from sipit.invert.driver import bruteforce_config
from sipit.models import LayerTap, load_model

TEXT = ["The cat sat on the mat.", "def f(x): return x"]


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-llama"])
def lm(request):
    return load_model(request.param)


def capture(lm, layer, n=6):
    ids = torch.tensor([lm.encode(t)[:n] for t in TEXT])
    return ids, LayerTap(lm, layer).states(ids)


def test_bruteforce_is_the_engine_one_candidate_per_pass(lm):
    ids, states = capture(lm, 2)
    r = bruteforce(lm, states, 2, progress=False, true_ids=ids.tolist())
    assert isinstance(r, InversionResult) and r.policy == "bruteforce"
    assert [p.ids for p in r.prompts] == ids.tolist()
    s = r.summary()
    assert s["exact_match_rate"] == 1.0 and s["token_accuracy"] == 1.0 and s["speculated_positions_pct"] == 0
    for p in r.prompts:
        assert isinstance(p, PromptResult) and p.exact and p.status == "ok"
        assert p.tap_calls == sum(q.tried for q in p.positions)  # one candidate per forward pass
        assert p.forward_tokens == p.tap_calls
    cfg = bruteforce_config()
    assert (cfg.policy, cfg.batch_size, cfg.speculate) == ("random", 1, False)


def test_bruteforce_time_cap_reports_finished_positions(lm):
    ids, states = capture(lm, 2)
    r = bruteforce(lm, states[:1], 2, max_seconds=0.0, progress=False, true_ids=ids[:1].tolist())
    p = r.prompts[0]
    assert p.status == "failed" and "time cap" in p.message and not p.exact
    assert p.ids == ids[0, :len(p.ids)].tolist()  # whatever was finished is verified


def test_hardprompts_loss_decreases_and_standard_format(lm, caplog):
    ids, states = capture(lm, 3)
    with caplog.at_level(logging.INFO, logger="sipit.hardprompts"):
        r = hardprompts(lm, states, 3, HardPromptsConfig(steps=60, log_every=10, max_seconds=30), progress=False,
                        true_ids=ids.tolist())
    assert r.policy == "hardprompts" and len(r.prompts) == 2
    assert any("loss" in m for m in caplog.messages)
    for p, true in zip(r.prompts, ids.tolist()):
        assert isinstance(p, HardPromptsResult)
        curve = p.loss_curve
        assert 1 <= len(curve) <= 60 and min(curve) < curve[0]  # the optimisation makes progress
        assert len(p.ids) == len(true) == len(p.positions)
        assert all(q.token is not None and q.via == "hardprompts" for q in p.positions)
        verified = all(q.distance <= r.eps for q in p.positions)
        assert p.status == ("ok" if verified else "failed")  # ok exactly when every position verifies
        assert p.exact == (p.ids == true and verified)
        assert "loss_curve" in p.to_json()
    s = r.summary()
    correct = sum(a == b for p, t in zip(r.prompts, ids.tolist()) for a, b in zip(p.ids, t))
    assert s["token_accuracy"] == correct / ids.numel() and s["prompts"] == 2


def test_one_dispatch_for_every_method(lm):
    ids, states = capture(lm, 1, n=4)
    for method in METHODS:
        r = run(method, lm, states[:1], 1, max_seconds=20, progress=False, true_ids=ids[:1].tolist())
        assert r.prompts[0].length == 4 and r.policy == ("learned" if method == "sipit" else method)
        assert r.prompts[0].seconds <= 25  # the cap reached every engine
    with pytest.raises(InversionError, match="unknown method"):
        run("nope", lm, states, 1)


@pytest.mark.parametrize("policy", ["bruteforce", "hardprompts"])
def test_cli_invert_baselines(tmp_path, policy):
    import json

    from sipit.cli import main

    st = tmp_path / "s.safetensors"
    assert main(["capture", "--model", "tiny-gpt2", "--layer", "2", "--text", "The cat", "-o", str(st)]) == 0
    out = tmp_path / "r.jsonl"
    cap = ["--steps", "50", "--max-seconds", "20"] if policy == "hardprompts" else []  # bruteforce: must finish
    code = main(["invert", str(st), "--policy", policy, *cap, "-q", "-o", str(out)])
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["policy"] == policy and summary["prompts"] == 1
    assert code == (1 if summary["failed"] else 0) and summary["failed"] + summary["ok"] + summary["ambiguous"] == 1
    if policy == "bruteforce":  # 7 byte tokens of a 256-token vocabulary, no cap
        assert code == 0 and summary["exact_match_rate"] == 1.0


def test_cli_hardprompts_failure_never_claims_unverified_tokens(tmp_path, capsys):
    from sipit.cli import main

    st = tmp_path / "s.safetensors"
    assert main(["capture", "--model", "tiny-gpt2", "--layer", "2", "--text", "The cat sat", "-o", str(st)]) == 0
    capsys.readouterr()
    assert main(["invert", str(st), "--policy", "hardprompts", "--steps", "1", "-q", "-o", str(tmp_path / "r.jsonl")]) == 1
    line = capsys.readouterr().out.split("\n")[0]
    assert line.startswith("[0] FAILED") and "best sequence found, unverified" in line
    assert "the first 3 token(s) were verified" not in line
