"""The CLI: a thin layer that writes results and turns bad input into one message + exit code."""
import pytest

from sipit.cli import main
from sipit.states import load_states


def test_capture_text_and_file(tmp_path, capsys):
    out = tmp_path / "s.safetensors"
    assert main(["--threads", "1", "capture", "--model", "tiny-llama", "--layer", "-1", "--text", "abc", "-o", str(out)]) == 0
    s = load_states(out)
    assert s.layer == 4 and s.ids == [[97, 98, 99]] and s.precision == "fp32"
    f = tmp_path / "p.txt"
    f.write_text("first line\n\nsecond\n")
    assert main(["capture", "--model", "tiny-gpt2", "--layer", "2", "--final-norm", "--file", str(f), "-o", str(out)]) == 0
    s = load_states(out)
    assert len(s.prompts) == 2 and s.final_norm


@pytest.mark.parametrize("args,msg", [
    (["--model", "nope", "--layer", "1", "--text", "x"], "unknown model spec"),
    (["--model", "tiny-gpt2", "--layer", "7", "--text", "x"], "out of range"),
    (["--model", "tiny-gpt2", "--layer", "1", "--text", ""], "no prompt"),
    (["--model", "tiny-gpt2", "--layer", "1", "--file", "/no/such/file"], "not found"),
])
def test_capture_errors(tmp_path, capsys, args, msg):
    out = tmp_path / "s.safetensors"
    assert main(["capture", *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert not out.exists()


def test_models_lists_embedded(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2" in out and "gemma3-270m" in out and "tiny-gpt2" in out


def test_capture_records_precision(tmp_path):
    out = tmp_path / "s.safetensors"
    assert main(["capture", "--model", "tiny-gpt2", "--layer", "1", "--precision", "bf16", "--text", "ab", "-o", str(out)]) == 0
    s = load_states(out)
    assert s.precision == "bf16" and s.prompts[0].dtype.is_floating_point and s.meta["dtype"] == "bfloat16"
