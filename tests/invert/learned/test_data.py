import copy

import pytest
import torch

from sipit.invert.learned import data
from sipit.invert.learned.data import calibration_ids, draw, model_samples, samples_possible, stdlib_files
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


def test_draw_follows_the_softmax_and_never_draws_excluded_ids():
    """Inverse-CDF draws: 20,000 rows of logits log [0.6, 0.3, 0.1, 0.5 (excluded)] give each id its
    probability among the allowed ones, to within 1.5% (a draw that ignored the exclusion, or the softmax, fails)."""
    logits = torch.tensor([0.6, 0.3, 0.1, 0.5]).log().expand(20_000, -1)
    x = draw(logits, torch.tensor([3]), torch.Generator().manual_seed(0))
    assert x.shape == (20_000, 1)
    freq = torch.bincount(x[:, 0], minlength=4).float() / len(x)
    assert freq[3] == 0 and torch.allclose(freq[:3], torch.tensor([0.6, 0.3, 0.1]), atol=0.015)


def test_model_samples_are_seeded_rows_without_special_tokens(sampling_lm):
    lm = sampling_lm
    assert samples_possible(lm) and not samples_possible(load_model("tiny-llama"))  # (no start token)
    x = model_samples(lm, 5, 12, seed=3, batch=2)
    assert x.shape == (5, 12) and x.dtype == torch.long and int(x.min()) >= 1 and int(x.max()) < lm.vocab_size
    assert torch.equal(x, model_samples(lm, 5, 12, seed=3, batch=2))
    assert not torch.equal(x, model_samples(lm, 5, 12, seed=4, batch=2))
    lm = copy.copy(lm)  # a special token the tokenizer adds past the model's rows: not the model's to exclude
    lm.tokenizer = copy.deepcopy(lm.tokenizer)
    lm.tokenizer.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    assert max(lm.tokenizer.all_special_ids) >= lm.vocab_size
    assert torch.equal(model_samples(lm, 5, 12, seed=3, batch=2), x)


def test_calibration_ids_begin_with_the_models_samples_made_once(sampling_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    lm = sampling_lm
    ids = calibration_ids(lm, 64 * 12, seq_len=64, random_fraction=0.25, sampled_fraction=0.25)
    assert ids.shape == (12, 64)
    assert torch.equal(ids[:3], model_samples(lm, 3, 64))  # 3 sampled rows, then 6 of text, 3 random
    assert torch.equal(ids[3:9], calibration_ids(lm, 64 * 8, seq_len=64, random_fraction=0.25)[:6])
    assert len(list((tmp_path / "samples").glob("*.pt"))) == 1
    monkeypatch.setattr(data, "model_samples", None)  # the second time they come from the cache
    assert torch.equal(calibration_ids(lm, 64 * 12, seq_len=64, random_fraction=0.25, sampled_fraction=0.25), ids)


@pytest.mark.cuda
def test_cuda_samples_and_a_calibration_on_them(sampling_lm, tmp_path, monkeypatch):
    """On a GPU: the model's samples are drawn there (uniforms from the CPU generator, so the same rows as on the
    CPU but where float error moves a draw across a boundary: 15 of 16 rows at least), and a full calibration
    that fits on them inverts two prompts in lock-step exactly."""
    from sipit.invert import InvertConfig, invert
    from sipit.models import LayerTap

    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    gpu = copy.copy(load_model("tiny-llama", device="cuda"))
    gpu.tokenizer = sampling_lm.tokenizer
    x = model_samples(gpu, 16, 32, seed=5, batch=8)
    assert x.device.type == "cpu" and int(x.min()) >= 1
    assert sum(torch.equal(a, b) for a, b in zip(x, model_samples(sampling_lm, 16, 32, seed=5, batch=8))) >= 15
    ids = torch.tensor([[5, 17, 3, 99, 42, 7], [250, 17, 203, 99, 242, 7]])
    r = invert(gpu, LayerTap(gpu, 2).states(ids), 2, InvertConfig(policy="learned"), progress=False)
    assert [p.ids for p in r.prompts] == ids.tolist() and {p.status for p in r.prompts} == {"ok"}
    assert list((tmp_path / "samples").glob("*.pt"))  # (the calibration fitted on samples)
