"""Collision tests on tiny models: end to end into a run dir, resuming after a kill, structural
collisions from duplicate embedding rows, and clear errors for bad input."""
import json

import pytest
import torch

from sipit.cli import main
from sipit.collisions import append_all as exhaustive, common, sampled
from sipit.collisions.append_all import ExhaustiveConfig
from sipit.collisions.sampled import SampledConfig
from sipit.io import SipitError, read_json
from sipit.models import load_model

CFG = SampledConfig(corpus="prose:40,code:30,random:30", length=6, batch_size=16)


def stable(result: dict) -> dict:
    """results.json without timings and load (the only fields a resumed run may change)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "states_seconds", "load")}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(result)


def brute_min(x: torch.Tensor, groups: torch.Tensor) -> float:
    """Minimum float64 distance over pairs in different structural classes."""
    d = torch.cdist(x.double(), x.double(), compute_mode="donot_use_mm_for_euclid_dist")
    d[groups[:, None] == groups[None, :]] = float("inf")
    return float(d.min())


def kill_after(monkeypatch, module, name, calls):
    """Make module.name raise KeyboardInterrupt on call number calls + 1 (a simulated kill)."""
    real, count = getattr(module, name), [0]

    def wrapped(*a, **kw):
        count[0] += 1
        if count[0] > calls:
            raise KeyboardInterrupt
        return real(*a, **kw)
    monkeypatch.setattr(module, name, wrapped)
    return count


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def sampled_run(lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("sampled")
    return sampled.run(lm, CFG, out, progress=False), out


def test_sampled_end_to_end(lm, sampled_run):
    res, out = sampled_run
    config = read_json(out / "config.json")
    assert config["kind"] == "collisions" and config["config"]["layers"] == [0, 1, 2, 3, 4]
    assert config["config"]["model"] == "tiny-llama"
    assert len((out / "prompts.jsonl").read_text().splitlines()) == 100
    result = read_json(out / "results.json")
    assert result == json.loads(json.dumps(res.to_dict()))
    (series,) = result["series"]
    assert series["n"] == 100 and series["n_pairs"] == 4950 and len(series["layers"]) == 5
    ids = [p["ids"] for p in res.prompts]
    classes = common.embedding_classes(lm)
    for r in series["layers"]:
        x = common.load_layer(sorted((out / "states").glob("*.safetensors")), r["layer"])
        groups = sampled.structural_groups(ids, classes, r["layer"])
        assert r["min_distance"] == pytest.approx(brute_min(x, groups), rel=1e-9)
        assert r["min_relative"] == pytest.approx(r["min_distance"] / r["median_norm"])
        assert r["closest"][0]["distance"] == r["min_distance"] and "text_i" in r["closest"][0]
        assert r["below_threshold"] == 0 and r["distribution"]["pairs"] > 0
    # layer 0 sees the last token only: prompts ending in the same byte collide structurally
    last = [s[-1] for s in ids]
    assert series["layers"][0]["structural"]["pairs"] == sum(last.count(t) * (last.count(t) - 1) // 2 for t in set(last))
    assert series["layers"][0]["structural"]["max_distance"] == 0
    assert all(r["structural"]["pairs"] == 0 for r in series["layers"][1:])
    # the states match a plain full forward pass of each prompt
    h = common.load_layer(sorted((out / "states").glob("*.safetensors")), 2)
    ref = torch.stack([lm_state(lm, s, 2) for s in ids[:3]])
    assert torch.allclose(h[:3], ref, atol=1e-5)


def lm_state(lm, ids, layer):
    from sipit.models import LayerTap
    return LayerTap(lm, layer).states(torch.tensor(ids))[-1]


def test_sampled_resumes_after_kill(lm, sampled_run, tmp_path, monkeypatch):
    _, full = sampled_run
    out = tmp_path / "run"
    with monkeypatch.context() as m:  # killed after 3 of 7 state batches
        kill_after(m, common, "save_chunk", 3)
        with pytest.raises(KeyboardInterrupt):
            sampled.run(lm, CFG, out, progress=False)
    assert len(list((out / "states").glob("*.safetensors"))) == 3 and not (out / "results.json").exists()
    with monkeypatch.context() as m:  # killed again after 2 layers of the analysis
        saved = kill_after(m, common, "save_chunk", 100)
        kill_after(m, sampled, "analyse_layer", 2)
        with pytest.raises(KeyboardInterrupt):
            sampled.run(lm, CFG, out, progress=False)
        assert saved[0] == 4  # only the missing batches were computed
    assert len(list((out / "layers").glob("*.json"))) == 2
    with monkeypatch.context() as m:
        analysed = kill_after(m, sampled, "analyse_layer", 100)
        res = sampled.run(lm, CFG, out, progress=False)
        assert analysed[0] == 3
    assert stable(res.to_dict()) == stable(read_json(full / "results.json"))
    with monkeypatch.context() as m:  # a finished run is not recomputed
        m.setattr(common, "capture_states", None)
        m.setattr(sampled, "analyse_layer", None)
        assert stable(sampled.run(lm, CFG, out, progress=False).to_dict()) == stable(res.to_dict())


def planted_lm(spec="tiny-llama"):
    """A tiny model whose token 42 has exactly the embedding row of token 7."""
    lm = load_model(spec)
    with torch.no_grad():
        lm.embed.weight[42] = lm.embed.weight[7]
    return lm


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gpt2"])
def test_exhaustive_planted_duplicate(spec, tmp_path):
    lm = planted_lm(spec)
    cfg = ExhaustiveConfig(prefixes=2, layers="all", corpus="prose:20,random:20", length=5, batch_size=64,
                           keep_states=True)
    res = exhaustive.run(lm, cfg, tmp_path, progress=False)
    assert len(res.prefixes) == 2 and (tmp_path / "sampled" / "results.json").exists()
    groups = common.embedding_classes(lm)
    assert groups[42] == 7 and (groups != torch.arange(256)).sum() == 1
    for k, layers in enumerate(res.layers):
        assert [r["layer"] for r in layers] == [0, 1, 2, 3, 4]
        chunks = sorted((tmp_path / f"prefix_{k:03d}" / "states").glob("*.safetensors"))
        for r in layers:
            st = r["structural"]
            assert st["pairs"] == 1 and st["members"] == [[7, 42]] and st["max_distance"] == 0.0
            assert st["tokens"] == [[dict(id=7, text=lm.decode([7])), dict(id=42, text=lm.decode([42]))]]
            assert r["n"] == 256 and r["n_pairs"] == 256 * 255 // 2 and r["searched_pairs"] == 255 * 254 // 2
            x = common.load_layer(chunks, r["layer"])
            assert torch.equal(x[7], x[42])  # a genuine zero distance
            assert r["min_distance"] > 0 and r["min_distance"] == pytest.approx(brute_min(x, groups), rel=1e-9)
            assert all({p["i"], p["j"]} != {7, 42} and p["embedding_distance"] > 0 for p in r["closest"])
    # the states are those of prefix + token through the ordinary tap
    p = res.prefixes[0]["ids"]
    from sipit.models import LayerTap
    ref = LayerTap(lm, 3).states(torch.tensor([*p, 99]))[-1]
    x = common.load_layer(sorted((tmp_path / "prefix_000" / "states").glob("*.safetensors")), 3)
    assert torch.allclose(x[99], ref, atol=1e-5)


def test_exhaustive_from_sampled_resumes(lm, sampled_run, tmp_path, monkeypatch):
    _, src = sampled_run
    cfg = ExhaustiveConfig(prefixes=1, layers=[1, -1], source=str(src), batch_size=32)
    full = exhaustive.run(lm, cfg, tmp_path / "full", progress=False)
    assert not (tmp_path / "full" / "sampled").exists() and not (tmp_path / "full" / "prefix_000" / "states").exists()
    chosen = full.prefixes[0]
    best = min((p for r in read_json(src / "results.json")["series"][0]["layers"] if r["layer"] >= 1
                for p in r["closest"]), key=lambda p: p["relative"])
    assert chosen["index"] in (best["i"], best["j"]) and chosen["selected"]["relative"] == best["relative"]
    out = tmp_path / "killed"
    with monkeypatch.context() as m:
        kill_after(m, common, "save_chunk", 5)
        with pytest.raises(KeyboardInterrupt):
            exhaustive.run(lm, cfg, out, progress=False)
    with monkeypatch.context() as m:
        saved = kill_after(m, common, "save_chunk", 100)
        res = exhaustive.run(lm, cfg, out, progress=False)
        assert saved[0] == 3  # 8 batches of 32 candidates, 5 done before the kill
    assert stable(res.to_dict()) == stable(full.to_dict())
    assert [r["layer"] for r in res.layers[0]] == [1, 4]


@pytest.mark.parametrize("cfg,msg", [
    (SampledConfig(corpus="prose:10", layers="7"), "layer 7 out of range"),
    (SampledConfig(corpus="prose:10", layers="1,x"), "bad layer 'x'"),
    (SampledConfig(corpus="prose=10"), "bad corpus spec"),
    (SampledConfig(corpus="nosuchcorpus:10"), "unknown corpus"),
    (SampledConfig(corpus="/no/such/file.txt:10"), "not found"),
    (SampledConfig(corpus="prose:1"), "at least 2"),
])
def test_sampled_bad_input(lm, tmp_path, cfg, msg):
    with pytest.raises(SipitError, match=msg):
        sampled.run(lm, cfg, tmp_path / "out", progress=False)


def test_different_config_into_existing_dir(lm, sampled_run, tmp_path):
    _, out = sampled_run
    with pytest.raises(SipitError, match=r"different config \(threshold: 1e-06 there, 0.001 now\)"):
        sampled.run(lm, SampledConfig(**{**CFG.__dict__, "threshold": 1e-3}), out, progress=False)
    with pytest.raises(SipitError, match="different config"):
        sampled.run(load_model("tiny-gpt2"), CFG, out, progress=False)
    with pytest.raises(SipitError, match="holds a 'collisions' run, not 'exhaustive'"):
        exhaustive.run(lm, ExhaustiveConfig(), out, progress=False)
    with pytest.raises(SipitError, match="not a finished"):
        exhaustive.run(lm, ExhaustiveConfig(source=str(tmp_path)), tmp_path / "e", progress=False)


def test_cli_collisions_exhaustive_report(tmp_path, capsys):
    s, e = str(tmp_path / "s"), str(tmp_path / "e")
    assert main(["--threads", "1", "collisions", "--model", "tiny-gpt2", "--corpus", "code:20,random:20",
                 "--length", "5", "--layers", "1,-1", "-q", "-o", s]) == 0
    out = capsys.readouterr().out
    assert "40 sampled prompts" in out and "780 pairs per layer" in out
    assert main(["exhaustive", "--model", "tiny-gpt2", "--from", s, "--layers", "1,-1", "-q", "-o", e]) == 0
    assert "32,640 pairs per layer" in capsys.readouterr().out
    assert main(["report", e]) == 0
    assert "| layer 1 |" in capsys.readouterr().out
    # bad input: one line on stderr, exit code 2
    for args, msg in [(["collisions", "--model", "tiny-gpt2", "--layers", "9", "-o", s], "layer 9 out of range"),
                      (["collisions", "--model", "tiny-gpt2", "--corpus", "code", "-o", str(tmp_path / "x")], "bad corpus spec"),
                      (["collisions", "--model", "tiny-gpt2", "--corpus", "code:20,random:20", "--length", "5",
                        "--layers", "1,-1", "--seed", "1", "-o", s], "different config"),
                      (["report", str(tmp_path)], "no results.json")]:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


def test_cli_collisions_on_a_prompt_file_line_by_line(tmp_path, capsys):
    from sipit.cli import main
    from sipit.models import load_model

    lines = ["The cat sat.", "A much longer line about the weather today.", "Hi", "The cat sat on the mat.",
             "Code: x = 1", "Hi"]  # mixed lengths, one repeated line
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    assert main(["--threads", "1", "collisions", "--model", "tiny-gpt2", "--corpus", str(f), "--layers", "1,-1",
                 "--batch-size", "2", "-q", "-o", str(out)]) == 0
    assert "5 sampled prompts" in capsys.readouterr().out
    prompts = [json.loads(s) for s in (out / "prompts.jsonl").read_text().splitlines()]
    assert [p["text"] for p in prompts] == lines[:5]  # every distinct line, in order, as given
    lm = load_model("tiny-gpt2")
    assert [p["ids"] for p in prompts] == [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in lines[:5]]
    result = read_json(out / "results.json")
    for r in result["series"][0]["layers"]:  # each prompt's own last-token state, in prompt order
        x = torch.stack([lm_state(lm, p["ids"], r["layer"]) for p in prompts])
        groups = sampled.structural_groups([p["ids"] for p in prompts], common.embedding_classes(lm), r["layer"])
        assert r["min_distance"] == pytest.approx(brute_min(x, groups), rel=1e-6)
        assert {(p["i"], p["j"]) for p in r["closest"]} == {(i, j) for i in range(5) for j in range(i + 1, 5)}
        for p in r["closest"]:  # rows map back to the right prompts though batched by length
            assert p["distance"] == pytest.approx(float((x[p["i"]].double() - x[p["j"]].double()).norm()), rel=1e-5)
