"""Files other tools write, read back and inverted exactly (real transformers / TransformerLens / nnsight)."""
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
