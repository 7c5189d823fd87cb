"""Files other tools write, read back and inverted exactly (real transformers / TransformerLens / nnsight)."""
import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from sipit.cli import main
from sipit.models import load_model
from sipit.readers import ReaderError
from sipit.states import load_states


def ids_of(lm, T=8):
    return torch.randint(1, lm.vocab_size, (1, T), generator=torch.Generator().manual_seed(3))


def invert_file(path, model, capsys, *extra):
    """-> exit code, printed text, recovered ids per prompt (from the results JSONL)."""
    import json
    from pathlib import Path

    out = Path(path).with_suffix(".results.jsonl")
    code = main(["--threads", "1", "invert", str(path), "--model", model, "--policy", "exhaustive", "-q", "-o", str(out),
                 *extra])
    printed = capsys.readouterr().out
    return code, printed, [json.loads(line)["ids"] for line in out.read_text().splitlines()] if out.exists() else None


def test_hf_hidden_states_tuple(tiny_lm, tmp_path, capsys):
    ids = ids_of(tiny_lm)
    hs = tiny_lm.model(input_ids=ids, output_hidden_states=True).hidden_states
    torch.save(tuple(hs), tmp_path / "hs.pt")
    save_file({f"hidden_states.{i}": h for i, h in enumerate(hs)}, tmp_path / "hs.safetensors")
    for name in ("hs.pt", "hs.safetensors"):
        last = load_states(tmp_path / name, layer=-1)
        assert last.layer == tiny_lm.n_layers and last.final_norm  # HF normalises its last entry
        with pytest.raises(ReaderError, match="give --layer"):
            load_states(tmp_path / name)
    for layer in (2, tiny_lm.n_layers):
        code, _, recovered = invert_file(tmp_path / "hs.pt", tiny_lm.name, capsys, "--layer", str(layer))
        assert code == 0 and recovered == ids.tolist()


def test_a_bfloat16_models_states_are_inverted_by_the_model_in_bfloat16(tmp_path, capsys):
    """transformers keeps a bfloat16 model's dtype in its hidden_states, and a file of them does not say the model's
    precision: invert runs the model in bf16 (saying so), the tokenizer's output saved beside them its ground truth.
    Made to run in float32, the ids reproduce the states at no layer (a warning before anything is fitted) and nothing
    matches."""
    bf16 = load_model("tiny-llama", precision="bf16")
    ids = torch.randint(1, bf16.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    hs = bf16.model(input_ids=ids, output_hidden_states=True).hidden_states
    torch.save({"hidden_states": hs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path / "hs.pt")
    st = load_states(tmp_path / "hs.pt", layer=2)
    assert st.precision == "bf16" and st.ids == ids.tolist() and st.prompts[0].dtype == torch.bfloat16
    torch.save({"hidden_states": tuple(h.float() for h in hs)}, tmp_path / "fp32.pt")
    assert load_states(tmp_path / "fp32.pt", layer=2).precision is None  # (float32: the default, fp32)
    out = tmp_path / "out.jsonl"
    args = ["--threads", "1", "invert", str(tmp_path / "hs.pt"), "--model", "tiny-llama", "--layer", "2", "--policy",
            "exhaustive", "-q", "-o", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr()
    assert "tiny-llama runs in bf16" in printed.err and "2/2 prompts recovered" in printed.out
    assert [json.loads(line)["exact"] for line in out.read_text().splitlines()] == [True, True]
    assert main([*args, "--precision", "fp32"]) == 1
    printed = capsys.readouterr()
    assert "reproduce its states at no layer of tiny-llama in fp32" in printed.err and "runs in" not in printed.err
    assert "0/2 prompts recovered" in printed.out and "precision (--precision" in printed.out


@pytest.mark.parametrize("spec,centred", [("tiny-gpt2", True), ("tiny-llama", False)])
def test_transformer_lens_default_and_no_processing(spec, centred, tmp_path, capsys):
    from transformer_lens.model_bridge import TransformerBridge

    wrapped = load_model(spec)  # TransformerLens may process these weights; invert with a fresh copy
    bridge = TransformerBridge.boot_transformers(spec, hf_model=wrapped.model, tokenizer=wrapped.tokenizer, device="cpu")
    ids = ids_of(wrapped)
    for mode in ("no_processing", "default"):
        if mode == "default":
            bridge.enable_compatibility_mode(disable_warnings=True)
        _, cache = bridge.run_with_cache(ids)
        path = tmp_path / f"{mode}.pt"
        torch.save({k: v.detach() for k, v in cache.cache_dict.items() if "resid" in k}, path)
        st = load_states(path, layer=2)
        assert st.meta.get("centred") == ("true" if centred and mode == "default" else None)
        code, _, recovered = invert_file(path, spec, capsys, "--layer", "2")
        assert code == 0 and recovered == ids.tolist()
    save_file({"blocks.0.hook_resid_mid": torch.randn(1, 3, 64)}, tmp_path / "mid.safetensors")
    with pytest.raises(ReaderError, match="mid-block residual"):
        load_states(tmp_path / "mid.safetensors")


def test_nnsight_saved_block_output(tmp_path, capsys):
    import nnsight

    lm = load_model("tiny-llama")
    ids = ids_of(lm)
    if hasattr(nnsight, "TransformersModel"):  # nnsight ≥ 0.8 (LanguageModel deprecated there)
        model = nnsight.TransformersModel(lm.model, task="text-generation", tokenizer=lm.tokenizer)
    else:
        model = nnsight.LanguageModel(lm.model, tokenizer=lm.tokenizer)
    with model.trace(ids):
        out = model.model.layers[1].output.save()  # block index 1 = sipit layer 2
    torch.save(out.detach(), tmp_path / "nn.pt")
    code, _, recovered = invert_file(tmp_path / "nn.pt", "tiny-llama", capsys, "--layer", "2")
    assert code == 0 and recovered == ids.tolist()
    code, printed, _ = invert_file(tmp_path / "nn.pt", "tiny-llama", capsys, "--layer", "3")  # wrong layer: honest failure
    assert code == 1 and "[0] recovered" not in printed and "[0] FAILED" in printed


def test_nnsight_batch_is_left_padded_and_read_with_its_mask(tmp_path, capsys):
    """nnsight pads a batch of prompts on the left (and counts positions from the mask): the saved block output
    [B, T, d] and the tokenizer's attention_mask of the same batch give every prompt back."""
    import nnsight

    lm = load_model("tiny-llama")
    texts = ["a longer first prompt", "short", "middle one"]
    tokenizer = copy.deepcopy(lm.tokenizer)
    tokenizer.pad_token = "!"  # (the tiny byte tokenizer has no pad or eos token, which nnsight would pad with)
    if hasattr(nnsight, "TransformersModel"):
        model = nnsight.TransformersModel(lm.model, task="text-generation", tokenizer=tokenizer)
    else:
        model = nnsight.LanguageModel(lm.model, tokenizer=tokenizer)
    with model.trace(texts):
        out = model.model.layers[1].output.save()
    enc = model.tokenizer(texts, padding=True, return_tensors="pt")
    assert model.tokenizer.padding_side == "left" and not enc["attention_mask"].all()
    torch.save(out.detach(), tmp_path / "nn.pt")
    torch.save(enc["attention_mask"], tmp_path / "mask.pt")
    code, _, recovered = invert_file(tmp_path / "nn.pt", "tiny-llama", capsys, "--layer", "2", "--attention-mask",
                                     str(tmp_path / "mask.pt"))
    assert code == 0 and recovered == [lm.encode(t) for t in texts]


def test_vllm_export_layout(tiny_lm, tmp_path, capsys):
    """vLLM's extract_hidden_states connector: hidden_states [T, n_layers, d] (aux layer id i = input of
    block i) and token_ids [T], without the layer ids."""
    ids = ids_of(tiny_lm)
    hs = tiny_lm.model(input_ids=ids, output_hidden_states=True).hidden_states
    path = tmp_path / "req.safetensors"
    save_file({"hidden_states": torch.stack([hs[1][0], hs[2][0]], 1).contiguous(), "token_ids": ids[0]}, path)
    with pytest.raises(ReaderError, match="--file-layers"):
        load_states(path)
    st = load_states(path, layer=2, file_layers=[1, 2])
    assert st.ids == ids.tolist() and torch.equal(st.prompts[0], hs[2][0])
    code, printed, recovered = invert_file(path, tiny_lm.name, capsys, "--layer", "2", "--file-layers", "1,2")
    assert code == 0 and "-> exact" in printed and recovered == ids.tolist()
    assert main(["invert", str(path), "--model", tiny_lm.name, "--layer", "2", "--file-layers", "1,2,3"]) == 2


def padded_batch(lm, prompts, side, position_ids=True):
    """A tokenizer's padded batch of `prompts` (pad id 0) and transformers' hidden_states of it: (input_ids [B, T],
    attention_mask [B, T], hidden_states tuple). position_ids: from the mask, as generate() makes them; else a plain
    forward's (0..T-1 in every row)."""
    T = max(map(len, prompts))
    ids, mask = torch.zeros(len(prompts), T, dtype=torch.long), torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        at = slice(T - len(p), T) if side == "left" else slice(0, len(p))
        ids[i, at], mask[i, at] = torch.tensor(p), 1
    pos = (mask.cumsum(1) - 1).masked_fill(mask == 0, 0) if position_ids else None
    hs = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True).hidden_states
    return ids, mask, tuple(hs)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_is_read_with_its_attention_mask(tiny_lm, side, tmp_path, capsys):
    """transformers' states of a padded batch: each row's prompt is where its attention_mask is 1 (saved beside the
    states, or given apart); without it, left padding is found by its repeated state, right padding by the search
    (SipIt._right_padding: the tiny tokenizer pads with 0)."""
    prompts = [[5, 9, 14, 200, 33, 7, 81], [40, 41], [3, 90, 17, 4]]
    ids, mask, hs = padded_batch(tiny_lm, prompts, side)
    torch.save({"hidden_states": hs, "attention_mask": mask, "input_ids": ids}, tmp_path / "enc.pt")
    save_file({**{f"hidden_states.{i}": h for i, h in enumerate(hs)}, "attention_mask": mask},
              tmp_path / "hs.safetensors")
    torch.save(hs, tmp_path / "hs.pt")
    torch.save(mask, tmp_path / "mask.pt")
    st = load_states(tmp_path / "enc.pt", layer=2)
    assert st.ids == prompts and [len(p) for p in st.prompts] == [7, 2, 4] and st.left_padded == (side == "left")
    code, printed, recovered = invert_file(tmp_path / "enc.pt", tiny_lm.name, capsys, "--layer", "2")
    assert code == 0 and printed.count("-> exact") == 3 and recovered == prompts
    for name, extra in (("hs.safetensors", ()), ("hs.pt", ("--attention-mask", str(tmp_path / "mask.pt")))):
        code, _, recovered = invert_file(tmp_path / name, tiny_lm.name, capsys, "--layer", "2", *extra)
        assert code == 0 and recovered == prompts
    # without the mask: left padding computes one state at every position, and the rest of the row is its tokens'
    # alone, so it is skipped, shown so; right padding matches no token, and the row ends where it begins (the
    # batch's input_ids saved beside them without the mask are not read: they hold the padding)
    torch.save({"hidden_states": hs, "input_ids": ids}, tmp_path / "unmasked.pt")
    code = main(["--threads", "1", "invert", str(tmp_path / "unmasked.pt"), "--model", tiny_lm.name, "--layer", "2",
                 "--policy", "exhaustive", "-q"])
    io = capsys.readouterr()
    results = [json.loads(line) for line in (tmp_path / "unmasked.results.jsonl").read_text().splitlines()]
    assert code == 0 and [r["ids"] for r in results] == prompts and [r["length"] for r in results] == [7, 2, 4]
    assert [r[f"{side}_padding"] for r in results] == [0, 5, 3]
    if side == "left":
        assert "rows 1 (5), 2 (3) open with that many identical states" in io.err
        assert "[1] recovered after 5 positions of left padding" in io.out
    else:
        assert "[1] recovered before 5 positions of right padding" in io.out


def test_a_row_that_only_looks_left_padded_is_inverted_whole(tmp_path, capsys):
    """A row opening with a repeated state that is no padding: the rest is not its tokens' alone (it fails at its
    first position), so the row is inverted whole, and reported as that inversion left it."""
    lm = load_model("tiny-llama")
    ids = torch.tensor([[5, 9, 14, 200, 33], [40, 41, 42, 43, 44]])
    hs = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[2].clone()
    hs[0, 1] = hs[0, 0]  # (position 1 as "5 5" leaves it, under rotary positions: the whole row fails at position 2)
    torch.save(hs, tmp_path / "x.pt")
    code = main(["--threads", "1", "invert", str(tmp_path / "x.pt"), "--model", "tiny-llama", "--layer", "2", "-q"])
    io = capsys.readouterr()
    rows = [json.loads(line) for line in (tmp_path / "x.results.jsonl").read_text().splitlines()]
    assert code == 1 and "rows 0 (2) open with" in io.err
    assert rows[0]["status"] == "failed" and rows[0]["ids"] == [5, 5] and rows[0]["left_padding"] == 0
    assert rows[1]["ids"] == ids[1].tolist() and rows[1]["left_padding"] == 0


def test_padding_masks_that_do_not_fit_are_one_clear_error(tmp_path):
    from sipit.states import StatesError

    x = torch.randn(2, 4, 8)
    cases = {"holes": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]), "shape": torch.ones(2, 5), "empty": torch.tensor(
        [[0, 0, 0, 0], [1, 1, 1, 1]]), "values": torch.full((2, 4), 2)}
    errors = {"holes": "padding between its tokens", "shape": "does not fit", "empty": "all padding",
              "values": "only 0"}
    for name, mask in cases.items():
        torch.save({"hidden_states": x, "attention_mask": mask}, tmp_path / f"{name}.pt")
        with pytest.raises(StatesError, match=errors[name]):
            load_states(tmp_path / f"{name}.pt")
    torch.save(torch.ones(2, 4), tmp_path / "mask.pt")
    with pytest.raises(StatesError, match="holds its own attention_mask"):
        load_states(tmp_path / "holes.pt", mask=tmp_path / "mask.pt")
    assert main(["invert", str(tmp_path / "holes.pt"), "--model", "tiny-llama", "--layer", "1"]) == 2
    torch.save(x, tmp_path / "x.pt")
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    save_file({"mask": mask}, tmp_path / "mask.safetensors")  # a mask file's one tensor, whatever its name
    np.save(tmp_path / "mask.npy", mask.numpy())
    for name in ("mask.safetensors", "mask.npy"):
        st = load_states(tmp_path / "x.pt", mask=tmp_path / name)
        assert [len(p) for p in st.prompts] == [3, 4] and st.left_padded and torch.equal(st.prompts[0], x[0, 1:])
    save_file({"a": mask, "b": mask.clone()}, tmp_path / "two.safetensors")
    with pytest.raises(StatesError, match="one tensor or one named attention_mask"):
        load_states(tmp_path / "x.pt", mask=tmp_path / "two.safetensors")


@pytest.mark.parametrize("spec,surface", [("tiny-gpt2", "states"), ("tiny-llama", "kv")])
def test_left_padding_that_moves_positions_is_warned_about(spec, surface, tmp_path, capsys):
    """A plain forward of a left-padded batch places a prompt after its padding: GPT-2's learned positions and a
    rotary model's keys then differ from the prompt's own, and sipit says so; generate()'s position_ids do not."""
    lm = load_model(spec)
    assert lm.left_padding_moves == (spec == "tiny-gpt2")
    prompts = [[5, 9, 14, 200], [40, 41]]
    for position_ids, recovered_ok in ((False, False), (True, True)):
        ids, mask, _ = padded_batch(lm, prompts, "left")
        pos = (mask.cumsum(1) - 1).clamp_min(0) if position_ids else None
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, output_hidden_states=True)
        saved = ({"hidden_states": out.hidden_states} if surface == "states" else
                 {"keys": out.past_key_values.layers[1].keys, "values": out.past_key_values.layers[1].values})
        torch.save({**saved, "attention_mask": mask}, tmp_path / f"{position_ids}.pt")
        code, _, recovered = invert_file(tmp_path / f"{position_ids}.pt", spec, capsys, "--layer", "2")
        assert (code == 0 and recovered == prompts) == recovered_ok
    assert main(["invert", str(tmp_path / "False.pt"), "--model", spec, "--layer", "2", "-q"]) == 1
    assert "holds left-padded prompts" in capsys.readouterr().err
