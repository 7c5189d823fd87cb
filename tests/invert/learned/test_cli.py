import json

from sipit.cli import main


def test_calibrate_fits_missing_layers_in_one_pass_then_reuses_them(cache, capsys):
    assert main(["calibrate", "--model", "tiny-llama", "--layers", "1,-1", "--tokens", "2048", "--threads", "1"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["layers"] == [1, 4] and first["fitted"] == [1, 4]
    assert main(["calibrate", "--model", "tiny-llama", "--layers", "all", "--tokens", "2048"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["layers"] == [0, 1, 2, 3, 4] and second["fitted"] == [0, 2, 3]
    assert set(second["seconds_per_layer"]) == {"0", "2", "3"}  # (JSON keys)
    assert len(list(cache.rglob("*.safetensors"))) == 5


def test_calibrate_bad_input_is_one_clear_error(cache, capsys):
    assert main(["calibrate", "--model", "tiny-llama", "--layers", "9"]) == 2
    assert "layer 9" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny-llama", "--tokens", "10"]) == 2
    assert not list(cache.rglob("*.safetensors"))


def test_fast_calibration_from_calibrate_is_what_invert_fast_uses(cache, tmp_path, capture, capsys):
    """`sipit calibrate --calibration fast` caches what `sipit invert --calibration fast` then finds
    (0 s of calibration); the default mode is keyed apart and fits its own."""
    assert main(["--threads", "1", "calibrate", "--model", "tiny-llama", "--layers", "1", "--calibration", "fast"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fitted"] == [1] and out["table_tokens"] == 4096 and out["calibration_tokens"] == 16384
    states = tmp_path / "s.safetensors"
    capture(states, "tiny-llama", 1, ["hello there", "the cat"])
    for mode, cached in (("fast", True), ("full", False)):
        assert main(["--threads", "1", "invert", str(states), "-q", "--calibration", mode]) == 0
        summary = json.loads((tmp_path / "s.results.summary.json").read_text())
        assert summary["prompts"] == 2 and (summary["calibration_seconds"] == 0) == cached
    assert len(list((cache / "learned").glob("*.safetensors"))) == 2


def test_cache_lists_and_prunes_only_what_this_version_cannot_read(cache, capsys, monkeypatch):
    from sipit.invert.learned import cache as cache_module

    assert main(["calibrate", "--model", "tiny-llama", "--layers", "1", "--tokens", "2048"]) == 0
    capsys.readouterr()
    [current] = cache.rglob("*.safetensors")
    cal = cache_module.Calibration.load(current)
    with monkeypatch.context() as m:
        m.setattr(cache_module, "VERSION", cache_module.VERSION - 1)  # a file an older sipit wrote
        old = cal.save(current.with_name("old.safetensors"))
    killed = current.with_name("x.999999999.tmp")  # a save whose process is gone
    killed.write_bytes(b"partial")
    assert main(["cache"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stale_calibrations"]["files"] == 2 and out["kinds"]["learned"]["files"] == 3 and not out["pruned"]
    assert out["stale_dequantized"]["models"] == 0
    assert main(["cache", "--prune"]) == 0
    assert json.loads(capsys.readouterr().out)["pruned"]
    assert sorted(p.name for p in current.parent.iterdir()) == [current.name] and not old.exists()
