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

