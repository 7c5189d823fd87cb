import torch

from sipit.invert.learned.data import calibration_ids, stdlib_files
from sipit.models import load_model


def test_stdlib_halves_are_disjoint_and_cover_the_library():
    a, b = stdlib_files(calibration_half=True), stdlib_files(calibration_half=False)
    assert a and b and not set(a) & set(b)


def test_calibration_ids_are_text_rows_then_random_rows():
    lm = load_model("tiny-gpt2")
    ids = calibration_ids(lm, 64 * 10, seq_len=64, random_fraction=0.2)
    assert ids.shape == (10, 64) and ids.dtype == torch.long and int(ids.max()) < lm.vocab_size
    text = lm.encode(lm.decode(ids[0].tolist()))  # text rows decode to bytes the tokenizer maps back
    assert text[:64] == ids[0].tolist()
    assert not torch.equal(ids[-1], calibration_ids(lm, 64 * 10, seed=1)[-1])  # the seed picks the random rows
