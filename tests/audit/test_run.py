import json

import pytest
import torch

from sipit.audit import measure
from sipit.audit.defenses import Defense, quant_error_bound, quantize_rows
from sipit.audit.run import AuditConfig, load_prompts, run
from sipit.cli import main
from sipit.invert import InvertConfig, invert
from sipit.invert.eps import tolerance_for
from sipit.invert.robust import RobustConfig
from sipit.invert.robust import run as robust_run
from sipit.io import SipitError
from sipit.models import LayerTap, load_model

CFG = dict(model="tiny-llama", layers="2", defenses="none,noise:0.5,3,quant:int4", prompts="prose:3", length=8,
           geometry_prompts=20, utility_text="tech:2", utility_length=16)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    lm = load_model("tiny-llama")
    out = tmp_path_factory.mktemp("audit")
    cfg = AuditConfig(**CFG)
    return lm, cfg, out, run(lm, cfg, out, progress=False)


def test_report_agrees_with_separate_invert_and_robustness_runs(audited):
    lm, cfg, out, report = audited
    prompts = load_prompts(lm, cfg)
    cells = {c["defense"]: c for c in report["cells"]}
    assert set(cells) == {"none", "noise:0.5", "noise:3", "quant:int4"}
    states = [LayerTap(lm, 2).states(torch.tensor(p)) for p in prompts]

    s = invert(lm, states, 2, InvertConfig(policy="learned"), progress=False, true_ids=prompts).summary()
    assert cells["none"]["attack"]["exact_rate"] == s["exact_match_rate"] == 1.0
    assert cells["none"]["attack"]["token_accuracy"] == s["token_accuracy"]

    stored = [quantize_rows(h, "int4") for h in states]
    eps = max(float(quant_error_bound(h, "int4").max()) for h in stored) * 1.01 + tolerance_for(LayerTap(lm, 2), {torch.float32}).eps
    s = invert(lm, stored, 2, InvertConfig(policy="learned", eps=eps), progress=False, true_ids=prompts).summary()
    assert cells["quant:int4"]["attack"]["eps"] == pytest.approx(eps)
    assert cells["quant:int4"]["attack"]["exact_rate"] == s["exact_match_rate"]
    assert cells["quant:int4"]["attack"]["token_accuracy"] == s["token_accuracy"]

    rob = robust_run(lm, prompts, 2, RobustConfig(sigmas=(0.0, 0.5, 3.0), trials=4, candidates=None))
    curve = {r["sigma"]: r for r in rob.curve()}
    for sigma in (0.5, 3.0):
        assert cells[f"noise:{sigma:g}"]["attack"]["exact_rate"] == curve[sigma]["exact_rate"]
        assert cells[f"noise:{sigma:g}"]["attack"]["certified_share"] == curve[sigma]["certified_rate"]
    assert curve[3.0]["exact_rate"] < 1  # the sweep reaches a level that breaks recovery on this model
    m = report["layers"]["2"]["margins"]
    assert m["radius_rel_min"] == pytest.approx(rob.summary()["radius_rel_min"]) and m["exhaustive"]
    assert report["layers"]["2"]["geometry"]["min_distance"] > 0


def test_utility_matches_a_hand_made_edit(audited):
    lm, cfg, out, report = audited
    from sipit.corpora import sample

    held = torch.tensor([p.ids for p in sample("tech:2", lm.tokenizer, 16, seed=2)])
    clean = lm.logits(held)
    noisy = Defense("noise", 3.0)
    h = LayerTap(lm, 2).states(held)
    # continue the forward from the edited state by hand: blocks 3.. via the edit hook on an identity
    from sipit.models.edit import edit_layer

    with edit_layer(lm, 2, lambda x: noisy.residual(h, 0)):
        edited = lm.logits(held)
    ce = lambda lg: float(torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]),  # noqa: E731
                                                            held[:, 1:].reshape(-1)))
    u = next(c for c in report["cells"] if c["defense"] == "noise:3")["utility"]
    assert u["delta_ce"] == pytest.approx(ce(edited) - ce(clean), abs=1e-5)
    agree = float((edited[:, :-1].argmax(-1) == clean[:, :-1].argmax(-1)).double().mean())
    assert u["top1_agreement"] == pytest.approx(agree) and u["top1_agreement"] < 1


def test_page_is_self_contained_and_rerun_skips_done_cells(audited, monkeypatch):
    lm, cfg, out, report = audited
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "http" not in page.replace("http-equiv", "")
    assert report["layers"]["2"]["verdict"] in page
    assert json.loads((out / "report.json").read_text())["cells"] == report["cells"]

    def boom(*a, **k):
        raise AssertionError("a finished cell was recomputed")

    for name in ("attack_invert", "robustness", "utility", "collisions"):
        monkeypatch.setattr(measure, name, boom)
    assert run(lm, cfg, out, progress=False)["cells"] == report["cells"]
    with pytest.raises(SipitError, match="different config"):
        run(lm, AuditConfig(**{**CFG, "trials": 2}), out, progress=False)


@pytest.mark.parametrize("args, message", [
    (["--defenses", "none,blur:2"], "unknown defence 'blur:2'"),
    (["--layers", "9"], "layer 9 out of range"),
    (["--surface", "kv"], "not supported by `sipit audit` yet"),
    (["--surface", "attention"], "unknown surface"),
    (["--defenses", "project:65"], "exceeds the model's d_model=64"),
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--trials", "0"], "--trials must be at least 1"),
])
def test_bad_options_one_clear_error(tmp_path, capsys, args, message):
    code = main(["audit", "--model", "tiny-llama", "-o", str(tmp_path / "a"), "-q", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()  # nothing written


def test_projection_attack_exact_from_one_dimension_and_blind_without_information(monkeypatch):
    lm = load_model("tiny-llama")
    cfg = AuditConfig(**CFG)
    prompts = load_prompts(lm, cfg)
    # noise-free, one random direction already separates the 256 tokens: projection alone is no defence
    for k in (64, 1):
        a = measure.attack_projection(lm, LayerTap(lm, 2), Defense("project", k), prompts)
        assert a["exact_rate"] == 1.0 and a["certified_share"] == 1.0 and a["candidates_per_position"] == 256
    monkeypatch.setattr(measure, "projection", lambda d, k, seed, device=None: torch.zeros(k, d))
    blind = measure.attack_projection(lm, LayerTap(lm, 2), Defense("project", 1), prompts)  # observes nothing
    assert blind["exact_rate"] == 0.0 and blind["certified_share"] == 0.0
    with pytest.raises(SipitError, match="too slow for a vocabulary of 256"):
        run(lm, AuditConfig(**{**CFG, "defenses": "project:8", "exhaustive_below": 100}), "/nonexistent/x")


def test_certified_share_reads_the_engine_summary():
    assert measure.certified_share({"certified_positions_pct": 25.0}) == 0.25
    assert measure.certified_share({"ok": 3}) is None  # an engine without certificates


def test_cli_writes_the_page_and_prints_verdicts(tmp_path, capsys):
    out = tmp_path / "a"
    code = main(["audit", "--model", "tiny-llama", "--layers", "1", "--defenses", "none,quant:int8", "--prompts",
                 "prose:2", "--length", "6", "--geometry-prompts", "8", "--utility-text", "tech:1", "-q", "-o", str(out)])
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert code == 0 and report["layers"]["1"]["verdict"] in printed
    assert [c["defense"] for c in report["cells"]] == ["none", "quant:int8"]
    assert {p.name for p in out.glob("*.png")} == {"margins.png", "tradeoff_L001.png"}


def test_verdict_names_the_weakest_stopping_defence_and_its_cost():
    from sipit.audit.run import verdict

    def cell(name, family, strength, exact, tokens, dce, top1):
        return dict(defense=name, family=family, strength=strength, attack=dict(exact_rate=exact, token_accuracy=tokens),
                    utility=dict(delta_ce=dce, top1_agreement=top1))

    cells = [cell("none", "none", 0, 1.0, 1.0, 0, 1), cell("noise:3", "noise", 3, 0.0, 0.2, 2.5, 0.1),
             cell("noise:1", "noise", 1, 0.0, 0.6, 0.5, 0.7), cell("noise:0.1", "noise", 0.1, 0.4, 0.9, 0.01, 0.99),
             cell("quant:int8", "quant", 0.125, 1.0, 1.0, 0.0, 1.0)]
    v = verdict(7, cells, dict(exhaustive=True, radius_rel_min=0.05))
    assert v.startswith("Layer 7: undefended, SipIt recovers 100% of prompts exactly")
    assert "noise stops exact recovery by these attacks from noise:1 (tokens still recovered: 60%) at a cost of " \
           "+0.5 nats/token (top-1 agreement 70%)" in v
    assert "no quantization tried stops it (quant:int8)" in v and "rho = 0.05" in v and "provably" in v
