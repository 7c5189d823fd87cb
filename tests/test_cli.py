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


def test_threads_before_or_after_the_command_and_the_makefile_commands_parse():
    import re
    import shlex
    from pathlib import Path

    from sipit.cli import build_parser

    p = build_parser()
    assert p.parse_args(["--threads", "1", "models"]).threads == 1
    assert p.parse_args(["models", "--threads", "1"]).threads == 1
    assert p.parse_args(["lab", "exhaustive", "--threads", "1"]).threads == 1
    args, rest = p.parse_known_args(["bench", "tap", "--threads", "1", "--repeats", "2"])
    assert args.threads == 1 and rest == ["--repeats", "2"]  # the benchmark gets its threads once
    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    commands = re.findall(r"\$\(VENV\)/bin/sipit (.+)", makefile)  # `make demo`, `make bench`
    assert len(commands) == 2
    for cmd in commands:
        args, rest = p.parse_known_args(shlex.split(cmd.replace("$(THREADS)", "3")))
        assert args.threads == 3 and "--threads" not in rest, cmd


def test_demo_inverts_its_prompt_with_the_calibration_it_names(tmp_path, capsys):
    assert main(["demo", "--model", "tiny-llama", "--text", "a short demo", "--out", str(tmp_path),
                 "--threads", "1"]) == 0  # default --calibration fast
    out = capsys.readouterr().out
    assert "recovered: 'a short demo'  [ok; exact]" in out and "one-time fast calibration" in out
    assert (tmp_path / "demo_states.safetensors").exists()
    assert main(["demo", "--model", "tiny-llama", "--text", "xy", "--out", str(tmp_path), "--calibration", "full"]) == 0
    assert "one-time full calibration" in capsys.readouterr().out
