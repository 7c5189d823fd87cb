"""`sipit identify`: the model, layer and final norm of states files that do not say (identify.py)."""
import json

import pytest
import torch
from safetensors.torch import save_file

from sipit.capture import capture
from sipit.cli import main
from sipit.identify import Screens, identify, scaled_distance
from sipit.models import load_model

PROMPTS = [[5, 17, 200, 3, 99], [9, 10, 11], [250, 1, 2, 3]]


@pytest.fixture(scope="module")
def screens():
    """Screens fitted on 64 of the 256 tokens, so that the shortlists, not the probe, must find the first tokens."""
    return {name: Screens.fit(load_model(name), probe=64) for name in ("tiny-gpt2", "tiny-llama")}


def first_positions(lm, layer, final_norm, dtype=torch.float32):
    return torch.stack([s[0] for s in capture(lm, PROMPTS, layer, final_norm)]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_layer_with_and_without_the_final_norm_is_identified(tiny_lm, screens, dtype):
    for layer in range(tiny_lm.n_layers + 1):
        for final_norm in (False, True):
            ident = identify(tiny_lm, first_positions(tiny_lm, layer, final_norm, dtype), screens=screens[tiny_lm.name])
            assert ident.best is not None, (layer, final_norm, ident.hypotheses[:3])
            assert (ident.best.layer, ident.best.final_norm) == (layer, final_norm)
            assert ident.best.matched == len(PROMPTS) and ident.best.tokens == [p[0] for p in PROMPTS]
            runner = ident.hypotheses[1]
            assert runner.matched == 0 and runner.distance > 10 * ident.tolerance


def test_another_models_states_match_no_layer(screens):
    llama, gpt2 = load_model("tiny-llama"), load_model("tiny-gpt2")
    ident = identify(llama, first_positions(gpt2, 2, False), screens=screens["tiny-llama"])
    assert ident.best is None and ident.matching == [] and ident.shortlist == 64  # widened once, then gave up


def test_the_scaled_distance_sees_past_massive_coordinates():
    """A state held by one massive coordinate (SmolLM2's position 0 from layer 12 on): a change of every other
    coordinate by 5% moves the relative distance by 1e-4, under bfloat16's rounding; the scaled distance by ≥ 1e-2,
    while bfloat16's rounding stays under its unit 2^-8."""
    h = torch.randn(576, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    h[7] = 24_000.0
    moved = h * 1.05
    moved[7] = h[7]
    assert float((moved - h).norm() / h.norm()) < 2e-4
    assert float(scaled_distance(moved, h)) > 1e-2
    assert float(scaled_distance(h.bfloat16().double(), h)) < 2.0 ** -8


def test_cli_names_the_layer_and_the_invert_command(tmp_path, capsys):
    lm = load_model("tiny-llama")
    states = capture(lm, PROMPTS[:1], 3, False)[0]
    torch.save(states[None], tmp_path / "nn.pt")  # nnsight's saved output: a bare tensor, no metadata
    code = main(["--threads", "1", "identify", str(tmp_path / "nn.pt"), "--model", "tiny-llama", "--model", "tiny-gpt2",
                 "--json", str(tmp_path / "id.json")])
    out = capsys.readouterr().out
    assert code == 0 and "layer 3 of tiny-llama" in out and "no layer matches" in out  # (tiny-gpt2: none)
    assert f"invert with: sipit invert {tmp_path / 'nn.pt'} --model tiny-llama --layer 3\n" in out
    rows = {r["model"]: r for r in json.loads((tmp_path / "id.json").read_text())}
    llama = rows["tiny-llama"]
    assert llama["identified"] and (llama["layer"], llama["final_norm"]) == (3, False)
    assert not rows["tiny-gpt2"]["identified"]
    assert main(["--threads", "1", "identify", str(tmp_path / "nn.pt"), "--model", "tiny-gpt2"]) == 1


def test_a_bfloat16_models_file_is_identified_by_the_model_in_bfloat16(tmp_path, capsys):
    """A file of a bfloat16 model's states with the tokenizer's output and no precision: its candidates run in bf16,
    as invert's model does, and its ids decide the layer; run in float32 they reproduce no layer."""
    lm = load_model("tiny-llama", precision="bf16")
    ids = torch.tensor(PROMPTS[:1])
    h = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[3]  # [1, T, d] bfloat16
    torch.save({"hidden_states": h, "input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path / "bf16.pt")
    assert main(["--threads", "1", "identify", str(tmp_path / "bf16.pt"), "--model", "tiny-llama"]) == 0
    printed = capsys.readouterr()
    assert "loading tiny-llama in bf16" in printed.err
    assert "layer 3 of tiny-llama: every position of the file's own ids" in printed.out
    assert main(["--threads", "1", "identify", str(tmp_path / "bf16.pt"), "--model", "tiny-llama", "--precision",
                 "fp32"]) == 1
    assert "tiny-llama: no layer matches" in capsys.readouterr().out


def test_a_left_padded_batch_is_identified_from_its_prompts_first_tokens(tmp_path, capsys):
    """A raw dump of a left-padded batch's layer (the padding at position 0) with its attention_mask given apart: each
    row's first token is where its mask starts, and the invert line passes the mask on."""
    lm = load_model("tiny-llama")
    T = max(map(len, PROMPTS))
    ids, mask = torch.zeros(len(PROMPTS), T, dtype=torch.long), torch.zeros(len(PROMPTS), T, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        ids[i, T - len(p):], mask[i, T - len(p):] = torch.tensor(p), 1
    torch.save(lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[3], tmp_path / "nn.pt")
    torch.save(mask, tmp_path / "mask.pt")
    nn, m = tmp_path / "nn.pt", tmp_path / "mask.pt"
    assert main(["--threads", "1", "identify", str(nn), "--model", "tiny-llama", "--attention-mask", str(m)]) == 0
    out = capsys.readouterr().out
    assert "layer 3 of tiny-llama: position 0 of 3/3 prompt(s)" in out
    assert f"invert with: sipit invert {nn} --attention-mask {m} --model tiny-llama --layer 3\n" in out
    assert main(["--threads", "1", "invert", str(nn), "--attention-mask", str(m), "--model", "tiny-llama", "--layer",
                 "3", "--policy", "exhaustive", "-q"]) == 0
    assert [json.loads(line)["ids"] for line in (tmp_path / "nn.results.jsonl").read_text().splitlines()] == PROMPTS
    # without the mask: each row's first state after its run of the padding's one state
    assert main(["--threads", "1", "identify", str(nn), "--model", "tiny-llama"]) == 0
    assert "layer 3 of tiny-llama: position 0 of 3/3 prompt(s)" in capsys.readouterr().out


def test_a_vllm_exports_slots_are_identified_from_its_ids(tmp_path, capsys):
    lm = load_model("tiny-gpt2")
    ids = torch.tensor([PROMPTS[0]])
    hs = lm.model(input_ids=ids, output_hidden_states=True).hidden_states
    save_file({"hidden_states": torch.stack([hs[1][0], hs[3][0]], 1).contiguous(), "token_ids": ids[0]},
              tmp_path / "req.safetensors")
    assert main(["--threads", "1", "identify", str(tmp_path / "req.safetensors"), "--model", "tiny-gpt2"]) == 0
    out = capsys.readouterr().out
    assert "slot 0: layer 1 of tiny-gpt2: every position" in out and "slot 1: layer 3 of tiny-gpt2" in out
    command = f"invert with: sipit invert {tmp_path / 'req.safetensors'} --model tiny-gpt2 --file-layers 1,3 --layer 3"
    assert command in out


def test_invert_identifies_a_missing_layer(tmp_path, capsys):
    lm = load_model("tiny-llama")
    torch.save(capture(lm, PROMPTS[:2], 2, True)[1][None], tmp_path / "nn.pt")
    code = main(["--threads", "1", "invert", str(tmp_path / "nn.pt"), "--model", "tiny-llama", "--policy",
                 "exhaustive", "-q"])
    io = capsys.readouterr()
    results = [json.loads(line) for line in (tmp_path / "nn.results.jsonl").read_text().splitlines()]
    assert code == 0 and [r["ids"] for r in results] == [PROMPTS[1]], io
    assert "layer 2 with the final norm of tiny-llama" in io.err
    code = main(["--threads", "1", "invert", str(tmp_path / "nn.pt"), "--model", "tiny-gpt2", "--policy", "exhaustive"])
    assert code == 2 and "could not be identified" in capsys.readouterr().err
    many = tmp_path / "many"  # a directory of such files: each identified (the screens fitted once)
    many.mkdir()
    for layer in (1, 3):
        torch.save(capture(lm, PROMPTS[:1], layer, False)[0][None], many / f"l{layer}.pt")
    code = main(["--threads", "1", "invert", str(many), "--model", "tiny-llama", "--policy", "exhaustive", "-q"])
    err = capsys.readouterr().err
    assert code == 0 and "l1.pt: layer 1 of tiny-llama" in err and "l3.pt: layer 3 of tiny-llama" in err


def test_unsuitable_files_are_one_clear_error(tmp_path, capsys):
    lm = load_model("tiny-llama")
    torch.save(capture(lm, PROMPTS[:1], 2, False)[0][None, :, :32], tmp_path / "narrow.pt")
    assert main(["identify", str(tmp_path / "narrow.pt"), "--model", "tiny-llama"]) == 2
    assert "states of width 32; no candidate model is that wide (tiny-llama 64)" in capsys.readouterr().err
    assert main(["identify", str(tmp_path / "missing.pt"), "--model", "tiny-llama"]) == 2
    assert "not found" in capsys.readouterr().err


def test_exhaustive_checks_every_token_where_no_shortlist_holds_the_first_one():
    """Screens blind to what they see (both maps zero) shortlist the same few tokens, none of them the first one:
    nothing matches; every token at every hypothesis finds it."""
    from dataclasses import replace

    lm = load_model("tiny-llama")
    first = first_positions(lm, 4, True)
    fitted = Screens.fit(lm, probe=64)
    blind = replace(fitted, maps=[(mx, sd, b * 0, f * 0, quad) for mx, sd, b, f, quad in fitted.maps])
    assert not set(blind.shortlists(first.double(), 8).flatten().tolist()) & {p[0] for p in PROMPTS}
    missed = identify(lm, first, screens=blind, top=1)
    assert missed.best is None and not missed.exhaustive
    found = identify(lm, first, screens=blind, top=1, exhaustive=True)
    assert found.exhaustive and (found.best.layer, found.best.final_norm) == (4, True)
    assert found.best.tokens == [p[0] for p in PROMPTS]


@pytest.mark.smollm2
def test_smollm2s_layers_are_told_apart_where_massive_activations_hold_the_norm(smollm2):
    """SmolLM2's position 0 from layer 12 on: a block moves its norm by ~0.1%, under bfloat16's rounding. Layers 13
    and 14 are still told apart, stored in float32 and in bfloat16, with the final norm or without."""
    screens = Screens.fit(smollm2)
    ids = [smollm2.encode(t) for t in ("The river rose overnight.", "for i in range(3):", "Thanks, see you soon!")]
    for layer, final_norm in ((13, False), (14, False), (14, True), (30, True)):
        states = capture(smollm2, ids, layer, final_norm)
        for dtype in (torch.float32, torch.bfloat16):
            ident = identify(smollm2, torch.stack([s[0] for s in states]).to(dtype), screens=screens)
            assert ident.best is not None and (ident.best.layer, ident.best.final_norm) == (layer, final_norm)
            assert ident.best.tokens == [i[0] for i in ids]


def test_invert_tells_a_wrong_final_norm_from_the_files_own_ids(tmp_path, capsys):
    """A capture (with its ids) of layer 2's raw stream, inverted as if normed: one clear error naming the layer."""
    ids = tmp_path / "ids.txt"
    ids.write_text("5 17 200 3\n")
    out = tmp_path / "s.safetensors"
    assert main(["capture", "--model", "tiny-llama", "--layer", "2", "--ids", str(ids), "-o", str(out)]) == 0
    assert main(["invert", str(out), "--final-norm", "--policy", "exhaustive", "-q"]) == 2
    err = capsys.readouterr().err
    assert "these states are layer 2 of tiny-llama" in err and "not layer 2 with the final norm" in err
    assert err.rstrip().endswith("give --layer 2")
