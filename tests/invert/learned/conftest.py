import copy
from dataclasses import replace

import pytest

from sipit.invert.learned import LearnedConfig
from sipit.models import load_model

FAST = LearnedConfig(calibration_tokens=4096, validation_rows=8, gate_rows=16, lens_rows=8)
# (a lens of 8 rows: the default's 64 rows of 64 are all 4,096 tokens, more than LENS_SHARE of a tiny calibration)
# fast mode on a 256-token vocabulary: half the position-0 states, states from a low-precision copy (as `fast()`)
SAMPLED = replace(FAST, table_tokens=128, low_precision_states=True)


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-llama"])
def lm(request):
    return load_model(request.param)


@pytest.fixture(scope="module")
def sampling_lm():
    """tiny-llama with a start token (id 0) in its tokenizer, so that it can sample text (data.model_samples)."""
    lm = load_model("tiny-llama")
    lm.tokenizer = copy.deepcopy(lm.tokenizer)
    lm.tokenizer.bos_token = lm.tokenizer.convert_ids_to_tokens(0)
    return lm


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty calibration cache for this test."""
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    return tmp_path
