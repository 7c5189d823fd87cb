"""`sipit invert` of many files (local engine): results per file, reruns skip finished files."""
import json

import pytest

from sipit.cli import main
import importlib


@pytest.fixture
def two_files(tmp_path, capture):
    """a: tiny-gpt2 layer 1; b: tiny-llama layer 2 (several models in one run)."""
    capture(tmp_path / "a.safetensors", "tiny-gpt2", 1, ["hello there", "the cat"])
    capture(tmp_path / "b.safetensors", "tiny-llama", 2, ["one two three"])
    return tmp_path


def invert(*args):
    return main(["--threads", "1", "invert", "--policy", "random", "-q", *map(str, args)])


def test_results_next_to_each_file_and_a_rerun_skips_them(two_files, capsys, monkeypatch):
    a, b = two_files / "a.safetensors", two_files / "b.safetensors"
    assert invert(a, b) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("2 files (0 done before): 3/3 prompts recovered (0 failed)") and len(lines) == 3
    assert "layer 1 of tiny-gpt2" in lines[0] and "layer 2 of tiny-llama" in lines[1]
    for name, n in (("a", 2), ("b", 1)):
        rows = [json.loads(s) for s in (two_files / f"{name}.results.jsonl").read_text().splitlines()]
        assert len(rows) == n and all(r["exact"] for r in rows)
        assert json.loads((two_files / f"{name}.results.summary.json").read_text())["prompts"] == n
    # a rerun (here: the directory) inverts nothing; b's results missing (a crash): only b runs
    calls = []
    package = importlib.import_module("sipit.invert")  # (sipit.invert is also a function)
    real = package.run
    monkeypatch.setattr(package, "run", lambda *a, **k: (calls.append(k["tap"].lm.name), real(*a, **k))[1])
    (two_files / "b.results.jsonl").unlink()
    assert invert(two_files) == 0
    assert calls == ["tiny-llama"] and "1 done before" in capsys.readouterr().out
    assert invert(two_files, "--batch-size", "64") == 0  # other options: other results, nothing skipped
    assert calls == ["tiny-llama", "tiny-gpt2", "tiny-llama"]


def test_output_directory_and_one_file_unchanged(two_files, tmp_path, capsys):
    out = tmp_path / "results"
    assert invert(two_files, "-o", out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.results.jsonl", "a.results.summary.json",
                                                      "b.results.jsonl", "b.results.summary.json"]
    capsys.readouterr()
    assert invert(two_files / "a.safetensors", "-o", tmp_path / "one.jsonl") == 0  # one file: -o is the JSONL
    out = capsys.readouterr().out
    assert "[1] recovered: 'the cat'" in out
    # the per-prompt seconds say they are a median, next to the whole inversion's and the one-time costs
    assert "s per prompt (median; " in out and "s in all, +" in out and "s one-time calibration, +" in out
    assert "s measuring eps)" in out
    assert (tmp_path / "one.jsonl").exists() and (tmp_path / "one.summary.json").exists()


def test_bad_inputs_one_clear_error_nothing_written(two_files, tmp_path, capsys):
    (two_files / "other").mkdir()
    (two_files / "other" / "a.npy").write_bytes((two_files / "a.safetensors").read_bytes())
    (tmp_path / "empty").mkdir()
    for args, message in (([two_files, two_files / "other" / "a.npy", "-o", tmp_path / "r"], "would both write"),
                          ([tmp_path / "empty"], "holds no states files"),
                          ([two_files / "a.safetensors", tmp_path / "missing.safetensors"], "states file not found")):
        assert invert(*args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert not list(two_files.glob("*.results.*")) and not (tmp_path / "r").exists()
