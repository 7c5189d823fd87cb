"""Low-precision storage: the bound holds, and stored observations invert exactly with the format's ε."""
import pytest
import torch

from sipit.io import SipitError
from sipit.storage import STORAGE, dequantize, quantize, storage_error


@pytest.mark.parametrize("fmt", STORAGE)
def test_bound_holds(fmt):
    x = torch.randn(6, 40, 64) * torch.logspace(-3, 2, 64)  # rows of very different scales, tiny entries
    x[0, 0, 0] = 900.0  # a massive activation
    q = quantize(x, fmt)
    y, bound = dequantize(q["codes"], q.get("scale"), fmt)
    assert ((x - y).abs() <= bound * (1 + 1e-6) + 1e-30).all()
    assert 0 < storage_error(y, bound) < 1


def test_coarser_formats_give_larger_eps():
    x = torch.randn(20, 64)
    eps = {f: storage_error(*dequantize(q["codes"], q.get("scale"), f)) for f in STORAGE for q in [quantize(x, f)]}
    assert eps["fp32"] < eps["fp16"] < eps["bf16"] < eps["int8-row"] <= eps["int8"]


def test_bad_format_and_missing_scale():
    with pytest.raises(SipitError, match="unknown storage"):
        quantize(torch.randn(3), "fp4")
    with pytest.raises(SipitError, match="lacks"):
        dequantize(torch.zeros(3, dtype=torch.int8), None, "int8")
