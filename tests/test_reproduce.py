"""sipit reproduce: the four tables, on a tiny model with tiny caps."""
import json

from sipit.reproduce import ReproduceConfig, layerwise_table, run


def test_layerwise_table_renders_a_collisions_run(tmp_path):
    from sipit.io import write_json

    layers = [dict(layer=i, min_distance=10.0 ** -i, min_relative=2e-3 * (i + 1), below_threshold=int(i == 0),
                   n_pairs=4) for i in range(5)]
    path = write_json(tmp_path / "run" / "results.json", dict(
        n_layers=4, model="tiny", config=dict(threshold=1e-6),
        series=[dict(label="prose", n_pairs=4, layers=layers)]))
    other = write_json(tmp_path / "run2" / "results.json", dict(
        n_layers=2, model="tiny2", config=dict(threshold=1e-6),
        series=[dict(label="code", n_pairs=6, layers=[dict(layers[i], n_pairs=6) for i in range(3)])]))
    rows, md = layerwise_table([path, other])
    assert [(r["model"], r["layer"]) for r in rows] == [("tiny", i) for i in range(5)] + [("tiny2", i) for i in range(3)]
    assert rows[3]["min_distance"] == 1e-3
    assert "Table 1" in md and "`run`" in md and "| 2 | 0.01 | 0.006 | 0 |" in md and "| 0 |" in md
    # one row per model: layers 1, L/2, L and the smallest relative distance over layers >= 1
    assert "| tiny (`run`) | 4 | prose | 4 | 0.1 (0.004) | 0.01 (0.006) | 0.0001 (0.01) | 0.004 (layer 1) | 0 |" in md
    assert "| tiny2 (`run2`) | 2 | code | 6 | 0.1 (0.004) | 0.1 (0.004) | 0.01 (0.006) | 0.004 (layer 1) | 0 |" in md


def test_reproduce_tiny(tmp_path):
    cfg = ReproduceConfig(model="tiny-gpt2", length=6, natural="prose:1", random=1, bruteforce_seconds=2,
                          hardprompts_seconds=2, hardprompts_steps=20, sweep_prompts=1, sweep_lengths=(6, 10),
                          vocab_models=("tiny-llama",), vocab_prompts=1, policy="learned")
    res = run(cfg, tmp_path, command="test", log=lambda *a: None)
    assert set(res.tables) == {"layerwise", "inversion", "sweep", "vocab"}
    methods = {r["key"]: r for r in res.inversion}
    assert set(methods) == {"hardprompts", "bruteforce", "sipit"}
    assert methods["sipit"]["exact_match"] == 1.0 and methods["sipit"]["token_accuracy"] == 1.0
    bf = methods["bruteforce"]  # only verified tokens: whatever it finished before its cap is right
    assert bf["accuracy_finished"] == (1.0 if bf["finished_positions"] else None)
    hp = methods["hardprompts"]  # PEZ really optimises: its best loss is below its first
    assert hp["first_loss"] and all(best < first for first, best in zip(hp["first_loss"], hp["final_loss"]))
    assert {(r["layer"], r["length"]) for r in res.sweep} >= {(1, 6), (2, 6), (4, 6), (2, 10)}
    assert all(r["exact_match"] == 1.0 for r in res.sweep + res.vocab)
    md = (tmp_path / "tables.md").read_text()
    assert "paper: seconds" in md and "6132.59" in md
    assert json.loads((tmp_path / "results.json").read_text())["environment"]["command"] == "test"
