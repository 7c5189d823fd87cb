import json

from sipit.cli import main


def test_calibrate_fits_missing_layers_in_one_pass_then_reuses_them(cache, capsys):
    assert main(["calibrate", "--model", "tiny-llama", "--layers", "1,-1", "--tokens", "2048", "--threads", "1"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["layers"] == [1, 4] and first["fitted"] == [1, 4]
    assert main(["calibrate", "--model", "tiny-llama", "--layers", "all", "--tokens", "2048"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["layers"] == [0, 1, 2, 3, 4] and second["fitted"] == [0, 2, 3]
    assert len(list(cache.rglob("*.safetensors"))) == 5


def test_calibrate_bad_input_is_one_clear_error(cache, capsys):
    assert main(["calibrate", "--model", "tiny-llama", "--layers", "9"]) == 2
    assert "layer 9" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny-llama", "--tokens", "10"]) == 2
    assert not list(cache.rglob("*.safetensors"))
