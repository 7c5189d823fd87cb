"""`sipit capture` for every surface and prompt source, `sipit invert` on its files, one clear error per bad input."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sipit.capture import SurfaceSpec
from sipit.cli import main
from sipit.io import SipitError
from sipit.states import load_states

IDS = "5 17 200 3 99 42 7 1\n9,10, 11,12,13\n"


def capture(tmp_path, *args, model="tiny-llama", name="s.safetensors"):
    ids = tmp_path / "ids.txt"
    ids.write_text(IDS)
    out = tmp_path / name
    assert main(["--threads", "1", "capture", "--model", model, "--ids", str(ids), "-o", str(out), *args]) == 0
    return out


def invert(path, capsys, *args):
    code = main(["--threads", "1", "invert", str(path), "--policy", "exhaustive", "-q", *args])
    return code, capsys.readouterr()


@pytest.mark.parametrize("surface,layer,storage", [
    ("kv:keys", "1", "fp32"), ("kv:values", "-1", "fp32"), ("kv", "2", "int8-row"), ("logits", None, "fp32"),
    ("logprobs", None, "fp32"), ("projection:8", "2", "fp32"), ("projection:6:coords", "1", "fp32"),
    ("projection:10:pca", "-1", "fp16"), ("states", "2", "fp8"), ("states", "3", "int8"), ("states", "2", "bf16"),
    ("permuted", "2", "fp32"), ("permuted", "-1", "int8-row"),
])
def test_every_surface_round_trips_exactly(tmp_path, capsys, surface, layer, storage):
    out = capture(tmp_path, "--surface", surface, "--storage", storage, *(["--layer", layer] if layer else []))
    st = load_states(out)
    assert st.surface == surface.split(":")[0] and st.ids == [[5, 17, 200, 3, 99, 42, 7, 1], [9, 10, 11, 12, 13]]
    assert (st.error is not None) == (storage != "fp32")
    code, io = invert(out, capsys)
    assert code == 0 and io.out.count("-> exact") == 2, io.out
    if surface == "permuted":  # fp32: both prompts' first positions pin π; int8 rounding leaves pairs open (sorted)
        assert ("permutation is pinned" in io.err) == (storage == "fp32"), io.err
    tol = json.loads(out.with_suffix(".results.summary.json").read_text())["tolerance"]
    assert tol["source"] == "measured" and tol["eps"] > tol["observation_error"]  # measured noise + the file's error
    assert (tol["observation_error"] > 0) == (storage != "fp32" or surface in ("logits", "logprobs"))


def test_corpus_and_ids_sources(tmp_path):
    out = tmp_path / "c.safetensors"
    assert main(["capture", "--model", "tiny-gpt2", "--layer", "1", "--corpus", "random:3", "--length", "6", "-o", str(out)]) == 0
    st = load_states(out)
    assert len(st.ids) == 3 and all(len(i) == 6 for i in st.ids)
    out = capture(tmp_path, "--layer", "1")
    assert load_states(out).ids[1] == [9, 10, 11, 12, 13]


@pytest.mark.parametrize("text,msg", [("1 2 x\n", "expected token ids"), ("1 2 999\n", "expected token ids"),
                                      ("\n\n", "no id lists")])
def test_bad_ids_file(tmp_path, capsys, text, msg):
    f = tmp_path / "ids.txt"
    f.write_text(text)
    assert main(["capture", "--model", "tiny-llama", "--layer", "1", "--ids", str(f), "-o", str(tmp_path / "o.safetensors")]) == 2
    assert msg in capsys.readouterr().err and not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("spec", ["kv:queries", "projection", "projection:x", "projection:4:svd", "hidden"])
def test_bad_surface_spec(spec):
    with pytest.raises(SipitError, match="bad --surface"):
        SurfaceSpec.parse(spec)


def test_capture_errors(tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    for args, msg in [(["--surface", "kv", "--layer", "0"], "layer ℓ ≥ 1"), (["--surface", "kv"], "needs --layer"),
                      (["--surface", "projection:999", "--layer", "1"], "projection size")]:
        assert main(["capture", "--model", "tiny-llama", "--text", "ab", "-o", str(out), *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1 and not out.exists()


def rewrite(path, drop=(), **tensors):
    """Rewrite a captured file with some tensors replaced or dropped, keeping the metadata."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    data = {k: v for k, v in load_file(path).items() if k not in drop}
    save_file({**data, **tensors}, path, metadata=meta)


def test_bad_surface_files_fail_clearly(tmp_path, capsys):
    kv = capture(tmp_path, "--surface", "kv:keys", "--layer", "2", name="kv.safetensors")
    keys = load_file(kv)["keys"]  # [B, H, T, hd]
    B, H, T, hd = keys.shape
    rewrite(kv, keys=keys.reshape(B, 2 * H, T, hd // 2))  # heads of another model
    kv_t = capture(tmp_path, "--surface", "kv:keys", "--layer", "2", name="kvt.safetensors")
    rewrite(kv_t, keys=keys.transpose(1, 2).contiguous())  # [B, T, H, hd]: not HF's layout
    proj = capture(tmp_path, "--surface", "projection:8", "--layer", "2", name="p.safetensors")
    rewrite(proj, drop=("projection",))
    logits = capture(tmp_path, "--surface", "logits", name="l.safetensors")
    rewrite(logits, logits=load_file(logits)["logits"][..., :200].contiguous())  # truncated vocabulary
    perm = capture(tmp_path, "--surface", "permuted", "--layer", "2", name="perm.safetensors")
    rewrite(perm, hidden_states=load_file(perm)["hidden_states"][..., :-1].contiguous())  # another model's width
    for path, msg in [(kv, "wrong model or layout"), (kv_t, "HF's layout"), (proj, "without the projection matrix"),
                      (logits, "truncated vocabulary"), (perm, "dimensions per position")]:
        code, io = invert(path, capsys)
        assert code == 2 and msg in io.err and io.err.count("\n") == 1 and "recovered" not in io.out


def test_wrong_layer_is_an_honest_failure(tmp_path, capsys):
    kv = capture(tmp_path, "--surface", "kv:values", "--layer", "2")
    code, io = invert(kv, capsys, "--layer", "3")
    assert code == 1 and "[0] recovered" not in io.out and "[0] FAILED" in io.out
    summary = json.loads(kv.with_suffix(".results.summary.json").read_text())
    assert summary["failed"] == 2


def test_baselines_refuse_non_state_surfaces(tmp_path, capsys):
    kv = capture(tmp_path, "--surface", "kv:keys", "--layer", "1")
    code, io = invert(kv, capsys, "--policy", "bruteforce")
    assert code == 2 and "inverts states only" in io.err and "recovered" not in io.out


def test_sae_latents_round_trip_and_a_wrong_sae_fails_clearly(tmp_path, capsys, random_sae):
    """`--surface sae:DIR` stores a SAELens SAE's latents at the layer its hook reads, sparse (each position's active
    latents: sae_values, sae_indices; metadata: the SAE's directory and fingerprint), and `sipit invert` recovers the
    prompts through its reconstruction, also from values stored in bfloat16 (ε grows by the rounding through W_dec)
    and from the dense latents [B, T, n]; another SAE, no SAE, another layer, width or ids beyond the SAE's latents
    are one clear error."""
    sae_dir = random_sae(64, "topk", hook="blocks.1.hook_resid_post").save(tmp_path / "sae")
    for storage in ("fp32", "bf16"):
        out = capture(tmp_path, "--surface", f"sae:{sae_dir}", "--storage", storage, name=f"sae-{storage}.safetensors")
        st = load_states(out)
        assert st.surface == "sae" and st.layer == 2 and st.prompts[0].shape[0] == 8 and st.prompts[0].shape[1] <= 6
        assert [i.shape for i in st.sae_indices] == [p.shape for p in st.prompts]
        code, io = invert(out, capsys)
        assert code == 0 and io.out.count("-> exact") == 2, io.out
        tol = json.loads(out.with_suffix(".results.summary.json").read_text())["tolerance"]
        assert (tol["observation_error"] > 0) == (storage == "bf16")
    sparse = tmp_path / "sae-fp32.safetensors"
    values, ids = load_file(sparse)["sae_values"], load_file(sparse)["sae_indices"].long()
    dense = torch.zeros(*values.shape[:2], 256).scatter_add_(2, ids, values)
    out = capture(tmp_path, "--surface", f"sae:{sae_dir}", name="dense.safetensors")
    rewrite(out, drop=("sae_values", "sae_indices"), sae_features=dense)
    code, io = invert(out, capsys)
    assert code == 0 and io.out.count("-> exact") == 2, io.out
    other = random_sae(64, "topk", seed=1, hook="blocks.1.hook_resid_post").save(tmp_path / "other")
    lower = random_sae(64, "topk", hook="blocks.0.hook_resid_post").save(tmp_path / "lower")
    wide = capture(tmp_path, "--surface", f"sae:{sae_dir}", name="wide.safetensors")
    rewrite(wide, sae_indices=(ids + 250).int())
    narrow = capture(tmp_path, "--surface", f"sae:{sae_dir}", name="narrow.safetensors")
    rewrite(narrow, drop=("sae_values", "sae_indices"), sae_features=dense[..., :-1].contiguous())
    for path, args, msg in [(sparse, ["--sae", str(other)], "another SAE"), (sparse, ["--sae", str(lower)], "reads layer 1"),
                            (sparse, ["--sae", str(tmp_path)], "not an SAE directory"), (wide, [], "latent ids reach"),
                            (narrow, [], "latents per position")]:
        code, io = invert(path, capsys, *args)
        assert code == 2 and msg in io.err and io.err.count("\n") == 1 and "recovered" not in io.out
    assert main(["capture", "--model", "tiny-llama", "--text", "ab", "--surface", f"sae:{sae_dir}", "--layer", "3",
                 "-o", str(tmp_path / "o.safetensors")]) == 2
    assert "reads layer 2" in capsys.readouterr().err and not (tmp_path / "o.safetensors").exists()
