"""Precisions: float casts and group-wise weight quantization with real rounding."""
import pytest
import torch

from sipit.models import LayerTap, ModelError, load_model
from sipit.models.precision import CODEBOOKS, GROUP, quantize


@pytest.mark.parametrize("name,levels", [("int8", 255), ("int4", 15), ("nf4", 16), ("fp4", 15)])
def test_quantize_uses_the_codebook(name, levels):
    w = torch.randn(8, 3 * GROUP + 5)
    q = quantize(w, CODEBOOKS[name])
    assert q.shape == w.shape
    # every group holds at most `levels` distinct values, all codebook values times the group's absmax
    g = q[0, :GROUP]
    assert len(torch.unique(g)) <= levels
    ratios = g / w[0, :GROUP].abs().max()
    assert torch.all((ratios[:, None] - CODEBOOKS[name]).abs().min(1).values < 1e-6)
    assert torch.equal(quantize(q, CODEBOOKS[name]), q)  # idempotent
    err = ((q - w).norm() / w.norm()).item()
    assert err < {"int8": 0.01, "int4": 0.2, "nf4": 0.15, "fp4": 0.2}[name]


@pytest.mark.parametrize("precision", ["fp32", "fp64", "bf16", "fp16", "int8", "int4", "nf4", "fp4"])
def test_every_precision_runs_and_is_recorded(precision):
    ref = LayerTap(load_model("tiny-llama"), -1).states(torch.tensor([1, 2, 3, 4]))
    lm = load_model("tiny-llama", precision=precision)
    assert lm.precision == precision
    h = LayerTap(lm, -1).states(torch.tensor([1, 2, 3, 4])).float()
    err = ((h - ref).norm() / ref.norm()).item()
    assert torch.isfinite(h).all()
    assert (err == 0) == (precision == "fp32")
    assert err < 0.5


def test_unknown_precision():
    with pytest.raises(ModelError, match="unknown precision"):
        load_model("tiny-gpt2", precision="int3")
