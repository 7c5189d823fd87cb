import pytest
import torch

from sipit.audit.defenses import Defense, DefenseError, parse_defenses, projection, quant_error_bound, quantize_rows


def test_parse_continues_families_and_rejects_bad_items():
    got = [d.name for d in parse_defenses("none,noise:0.01,0.1,quant:int8,fp8,project:8", d_model=64)]
    assert got == ["none", "noise:0.01", "noise:0.1", "quant:int8", "quant:fp8", "project:8"]
    assert parse_defenses("noise:0") == [Defense("none")]
    for bad in ("blur:3", "noise:-1", "noise:x", "quant:int3", "project:0", ""):
        with pytest.raises(DefenseError):
            parse_defenses(bad, d_model=64)
    with pytest.raises(DefenseError, match="exceeds"):
        parse_defenses("project:65", d_model=64)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_quant_error_bound_holds_and_is_not_loose(fmt):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 64, generator=g) * torch.logspace(-3, 3, 50)[:, None]
    h[0, 3] = 1e4  # a massive activation in one row
    stored = quantize_rows(h, fmt)
    err = (h - stored).double().norm(dim=-1) / stored.double().norm(dim=-1)
    bound = quant_error_bound(stored, fmt)
    assert (err > 0).all() and (err <= bound).all()
    assert (bound[1:] < 20 * err[1:]).all()  # says something (row 0: most entries round to 0, the bound is loose)
    assert len(set(stored[1].tolist())) <= {"int8": 255, "int4": 15, "fp8": 256}[fmt]


def test_noise_and_projection_shapes():
    h = torch.randn(3, 10, 32)
    noisy = Defense("noise", 0.1).observe(h, seed=1)
    rel = (noisy - h).norm(dim=-1) / h.norm(dim=-1)
    assert torch.allclose(rel, torch.full_like(rel, 0.1), atol=1e-5)
    assert torch.equal(noisy, Defense("noise", 0.1).observe(h, seed=1))
    P = projection(32, 8, seed=0)
    assert torch.allclose(P @ P.T, torch.eye(8), atol=1e-5)
    d = Defense("project", 8)
    assert d.observe(h).shape == (3, 10, 8)
    r = d.residual(h)  # the part of h in the kept subspace: projecting it again changes nothing
    assert torch.allclose(d.residual(r), r, atol=1e-4) and not torch.allclose(r, h, atol=1e-2)
