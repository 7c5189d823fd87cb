"""States files: round trip, and one clear error for each kind of bad file."""
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from sipit.capture import capture
from sipit.states import StatesError, load_states, save_states


def test_round_trip_ragged(tiny_lm, tmp_path):
    ids = [tiny_lm.encode("hello world"), tiny_lm.encode("hi")]
    states = capture(tiny_lm, ids, 2)
    path = save_states(tmp_path / "s.safetensors", states, model=tiny_lm.name, layer=2, final_norm=False,
                       tokenizer=tiny_lm.tokenizer_fingerprint, ids=ids)
    s = load_states(path)
    assert (s.model, s.layer, s.final_norm, s.tokenizer, s.ids) == (tiny_lm.name, 2, False, tiny_lm.tokenizer_fingerprint, ids)
    assert [p.shape[0] for p in s.prompts] == [len(i) for i in ids]
    for a, b in zip(s.prompts, states):
        assert torch.equal(a, b)


def test_capture_batch_equals_single(tiny_lm):
    ids = [tiny_lm.encode("a longer prompt here"), tiny_lm.encode("short")]
    batched = capture(tiny_lm, ids, -1)
    for p, s in zip(ids, batched):
        assert torch.allclose(capture(tiny_lm, [p], -1)[0], s, rtol=1e-5, atol=1e-5)


def test_plain_files_without_metadata(tmp_path):
    x = torch.randn(5, 8)
    np.save(tmp_path / "s.npy", x.numpy())
    torch.save({"hidden_states": x}, tmp_path / "s.pt")
    save_file({"hidden_states": x}, tmp_path / "s.safetensors")
    for name in ("s.npy", "s.pt", "s.safetensors"):
        s = load_states(tmp_path / name)
        assert s.model is None and s.layer is None and torch.equal(s.prompts[0], x)


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("make,msg", [
    (lambda p: p.with_suffix(".safetensors").write_bytes(b"\x00" * 20), "corrupt or truncated"),
    (lambda p: p.with_suffix(".npy").write_bytes(pickle.dumps(Evil())), "npy"),
    (lambda p: np.save(p.with_suffix(".npy"), np.array([Evil()], dtype=object), allow_pickle=True), "pickled"),
    (lambda p: torch.save(Evil(), p.with_suffix(".pt")), "weights_only"),
    (lambda p: save_file({"hidden_states": torch.randn(2, 3, 4, 5)}, p.with_suffix(".safetensors")), "shape"),
    (lambda p: save_file({"hidden_states": torch.zeros(0, 8)}, p.with_suffix(".safetensors")), "empty"),
    (lambda p: save_file({"other": torch.randn(2, 3)}, p.with_suffix(".safetensors")), "no tensor named"),
    (lambda p: save_file({"hidden_states": torch.ones(2, 3, dtype=torch.long)}, p.with_suffix(".safetensors")), "floating"),
    (lambda p: p.with_suffix(".txt").write_text("x"), "unknown states format"),
])
def test_bad_files(tmp_path, make, msg):
    make(tmp_path / "s")
    path = next(tmp_path.iterdir())
    with pytest.raises(StatesError, match=msg):
        load_states(path)


def test_truncated_safetensors(tiny_lm, tmp_path):
    path = save_states(tmp_path / "s.safetensors", capture(tiny_lm, [[1, 2, 3]], 1), model="m", layer=1,
                       final_norm=False, tokenizer="t")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(StatesError, match="corrupt or truncated"):
        load_states(path)
