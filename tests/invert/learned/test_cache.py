import dataclasses
import types

import pytest
import torch

from sipit.invert import InvertConfig
from sipit.invert.learned import Calibration, LearnedConfig, cache_path, calibrate, learned_config, load_or_calibrate
from sipit.invert.learned import cache as cache_module
from sipit.models import LayerTap, load_model

from .conftest import FAST


def test_save_load_round_trip(lm, tmp_path):
    cal = calibrate(LayerTap(lm, lm.n_layers), FAST)
    back = Calibration.load(cal.save(tmp_path / "c.safetensors"))
    for f in dataclasses.fields(Calibration):
        a, b = getattr(cal, f.name), getattr(back, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == pytest.approx(b)


def test_other_version_is_refitted_not_migrated(lm, cache, monkeypatch):
    tap = LayerTap(lm, 1)
    _, first = load_or_calibrate(tap, FAST)
    assert first > 0 and load_or_calibrate(tap, FAST)[1] == 0.0
    [old] = cache.rglob("*.safetensors")
    monkeypatch.setattr(cache_module, "VERSION", cache_module.VERSION + 1)
    with pytest.raises(ValueError, match="version"):
        Calibration.load(old)
    assert load_or_calibrate(tap, FAST)[1] > 0  # another key: fitted again, the old file left alone


def test_same_weights_under_another_name_reuse_the_calibration(cache):
    """One GGUF by name and by path is one model: the key is the weights' content, not the name."""
    a, b = load_model("tiny-llama"), load_model("tiny-llama")
    b.name = "/some/path/SmolLM2-135M.Q8_0.gguf"
    _, seconds_a = load_or_calibrate(LayerTap(a, 2), FAST)
    _, seconds_b = load_or_calibrate(LayerTap(b, 2), FAST)
    assert seconds_a > 0 and seconds_b == 0.0
    assert len(list(cache.rglob("*.safetensors"))) == 1


def test_key_changes_with_what_is_observed_and_with_settings(cache):
    lm = load_model("tiny-gpt2")
    keys = {cache_path(LayerTap(lm, 2), FAST), cache_path(LayerTap(lm, 3), FAST),
            cache_path(LayerTap(lm, 2, final_norm=True), FAST),
            cache_path(LayerTap(lm, 2), dataclasses.replace(FAST, calibration_tokens=2048)),
            cache_path(LayerTap(load_model("tiny-gpt2", precision="fp16"), 2), FAST)}
    assert len(keys) == 5
    assert cache_path(LayerTap(lm, 2), dataclasses.replace(FAST, max_anchors=7)) == cache_path(LayerTap(lm, 2), FAST)


def test_invert_config_calibration_tokens_reaches_the_learned_config():
    assert learned_config(InvertConfig(calibration_tokens=2048)).calibration_tokens == 2048
    nested = LearnedConfig(calibration_tokens=1024)
    assert learned_config(types.SimpleNamespace(learned=nested, calibration_tokens=5)) is nested
