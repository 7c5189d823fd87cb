"""Inversion under perturbation: certified radius (Theorem 3.2) holds, recovery degrades beyond it."""
import json

import torch

from sipit.cli import main
from sipit.invert.robust import RobustConfig, add_noise, run

TEXT = ["The cat sat on the mat.", "def f(x):\n    return x", "Hello world, how are you?"]


def test_add_noise_norm():
    h = torch.randn(3, 5, 16) * torch.arange(1, 6)[:, None]
    e = add_noise(h, 0.1, torch.Generator().manual_seed(0)) - h
    torch.testing.assert_close(e.norm(dim=-1), 0.1 * h.norm(dim=-1))


def test_certified_radius_and_degradation(tiny_lm):
    ids = [tiny_lm.encode(t)[:10] for t in TEXT]
    sigmas = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 4.0)
    res = run(tiny_lm, ids, 2, RobustConfig(sigmas=sigmas, trials=3))
    assert res.exhaustive
    for p in res.prompts:
        assert len(p.delta) == len(p.ids) and p.radius > 0 and 0 < p.radius_rel < 4.0
        assert max(p.recompute) < 1e-3 * min(p.delta)  # recomputation error is tiny next to the margin
        for s, rate in zip(sigmas, p.exact):
            if s < p.radius_rel:  # certified: no noisy copy may fail
                assert rate == 1.0, (s, p.radius_rel, p.first_error)
    curve = res.curve()
    assert curve[0]["exact_rate"] == 1.0 and curve[-1]["exact_rate"] < 0.5
    assert all(c["exact_rate"] >= c["certified_rate"] for c in curve)


def test_candidate_subset_is_an_upper_bound(tiny_lm):
    ids = [tiny_lm.encode(TEXT[0])[:8]]
    full = run(tiny_lm, ids, 2, RobustConfig(sigmas=(0.0,), trials=1)).prompts[0]
    sub = run(tiny_lm, ids, 2, RobustConfig(sigmas=(0.0,), trials=1, candidates=8, policy="random"))
    assert not sub.exhaustive
    p = sub.prompts[0]
    assert p.candidates_per_position <= 17 and p.exact == [1.0]
    # (the full run's wide batches may go flat and the subset's padded: float32 rounding apart, ~1e-6)
    assert all(a >= b * (1 - 1e-5) for a, b in zip(p.delta, full.delta))


def test_cli_robustness_and_noisy_invert(tmp_path, capsys):
    out = tmp_path / "rob"
    assert main(["--threads", "1", "robustness", "--model", "tiny-llama", "--layer", "2", "--corpus", "random:3",
                 "--length", "6", "--sigmas", "0,0.01,3", "--trials", "2", "-q", "-o", str(out)]) == 0
    d = json.loads((out / "results.json").read_text())
    assert d["summary"]["curve"][0]["exact_rate"] == 1.0 and (out / "recovery_vs_noise.png").is_file()
    states = tmp_path / "s.safetensors"
    assert main(["capture", "--model", "tiny-llama", "--layer", "2", "--text", "The cat sat.", "-o", str(states)]) == 0
    res = tmp_path / "r.jsonl"
    assert main(["invert", str(states), "--policy", "exhaustive", "--noise", "0.01", "-q", "-o", str(res)]) == 0
    summary = json.loads(res.with_suffix(".summary.json").read_text())
    assert summary["noise"] == 0.01 and summary["exact_match_rate"] == 1.0
