import pytest
import torch

from sipit.models import load_model

torch.set_num_threads(1)


@pytest.fixture(scope="session", params=["tiny-gpt2", "tiny-llama"])
def tiny_lm(request):
    return load_model(request.param)


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2")


def pytest_collection_modifyitems(config, items):
    """GPU-only tests (@pytest.mark.cuda) are skipped where torch sees no CUDA device; Qwen tests
    (@pytest.mark.qwen, minutes each) run only when asked for: `pytest -m qwen` (`make test-qwen`)."""
    skips = {}
    if not torch.cuda.is_available():
        skips["cuda"] = pytest.mark.skip(reason="needs a CUDA device")
    if "qwen" not in (config.getoption("markexpr") or ""):
        skips["qwen"] = pytest.mark.skip(reason="slow: run with -m qwen (make test-qwen)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
