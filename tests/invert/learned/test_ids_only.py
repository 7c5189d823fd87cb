"""A model without a tokenizer (random:<arch>) calibrates on random ids only and inverts ids exactly."""
import torch

from sipit.invert import InvertConfig, invert
from sipit.invert.learned.data import calibration_ids
from sipit.models import LayerTap, tiny_model


def test_ids_only_model_calibrates_on_random_ids_and_inverts_exactly():
    lm = tiny_model("llama", name="ids-only")
    lm.tokenizer = None  # as random:<arch> models have it
    ids = calibration_ids(lm, 2048, seq_len=32)
    assert ids.shape == (64, 32)  # every row random: no text without a tokenizer
    prompt = torch.randint(0, lm.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    states = LayerTap(lm, 3).states(prompt)
    p = invert(lm, states, 3, InvertConfig(policy="learned", calibration_tokens=4096), progress=False,
               true_ids=[prompt.tolist()]).prompts[0]
    assert p.exact and p.ids == prompt.tolist()
    assert p.text.endswith("(no tokenizer: ids only)")


def test_ids_only_fast_calibration_keeps_no_first_tokens():
    """Fast mode keeps the exact first-token states of the calibration text's most frequent tokens; a model without a
    tokenizer has no text (its rows and prompts are uniform random ids), so it keeps none and still inverts exactly."""
    from sipit.invert.learned import calibrate
    from sipit.invert.learned.fit import first_tokens

    from .conftest import SAMPLED

    lm = tiny_model("llama", name="ids-only")
    lm.tokenizer = None
    assert len(first_tokens(lm, calibration_ids(lm, 2048, seq_len=32), 1024)) == 0
    cal = calibrate(LayerTap(lm, 3), SAMPLED)
    assert cal.table is None and cal.first_ids is None and cal.first_rows is None
    prompt = torch.randint(0, lm.vocab_size, (12,), generator=torch.Generator().manual_seed(4))
    p = invert(lm, LayerTap(lm, 3).states(prompt), 3, InvertConfig(policy="learned", learned=SAMPLED), progress=False,
               true_ids=[prompt.tolist()]).prompts[0]
    assert p.exact and p.ids == prompt.tolist()
