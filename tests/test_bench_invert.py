"""`sipit bench invert` on a tiny model: every policy on the same prompts, slow ones on a subset."""
import pytest

from sipit.bench.invert import Config, first_of_each_kind, interleaved, main, run


def test_first_of_each_kind_and_interleaved():
    data = [("a", 0), ("a", 1), ("a", 2), ("b", 3), ("b", 4)]
    assert first_of_each_kind(data, 1) == [0, 3] and first_of_each_kind(data, None) == [0, 1, 2, 3, 4]
    assert interleaved(data) == [0, 3, 1, 4, 2]


def test_bench_invert_reports_every_policy_on_the_same_prompts():
    cfg = Config(model="tiny-llama", layers=[2], policies=("learned", "exhaustive"), kinds=("prose", "random"),
                 prompts=2, length=6, slow_prompts=1, slow_positions=2, slow_max_seconds=60, certify=("top:8",),
                 certify_prompts=1, batches=(1, 3, 8), threads=1)
    out = run(cfg)
    assert out["loop"] == dict(batch_size=256, speculate_tokens=32, pass_tokens=1024)  # the CPU's
    layer = out["layers"]["2"]
    learned, exhaustive = layer["policies"]["learned"], layer["policies"]["exhaustive"]
    assert learned["prompts"] == 4 and learned["exact"] == 4 and not learned["extrapolated"]
    assert exhaustive["prompts"] == 2 and exhaustive["extrapolated"] and exhaustive["positions_per_prompt"] == 2
    assert exhaustive["exact"] == 2 and exhaustive["time_capped"] == 0
    assert learned["on_slow_subset"]["prompts"] == 2 and learned["on_slow_subset"]["exact"] == 2
    assert learned["candidates_scored_per_position"] > learned["candidates_verified_per_position"]
    by_kind = learned["ratio_by_kind"]  # per source: median and max of the prompts' own ratios
    assert set(by_kind) == {"prose", "random"} and all(0 < k["median"] <= k["max"] for k in by_kind.values())
    # as a file: Σ seconds ÷ Σ forwards, a weighted mean of the prompts' ratios, so at most the largest
    assert all(0 < k["of_totals"] <= k["max"] for k in by_kind.values())
    assert 0 < learned["ratio_of_totals"] <= max(k["max"] for k in by_kind.values())
    assert learned["seconds_per_prompt_mean"] > 0
    # the learned engine's first-prompt set-up is timed apart, by an untimed inversion before the timed ones
    assert learned["warmup_seconds"] > 0 and exhaustive["warmup_seconds"] is None
    assert set(exhaustive["ratio_by_kind"]) == {"prose", "random"}
    # one-pass prompts (every guess right): the exhaustive policy never guesses; per source and in all
    assert exhaustive["one_pass_prompts"] == "0/2" and {k["one_pass"] for k in exhaustive["ratio_by_kind"].values()} == {"0/1"}
    assert sum(int(k["one_pass"].split("/")[0]) for k in by_kind.values()) == int(learned["one_pass_prompts"].split("/")[0])
    assert set(learned["amortised_seconds_per_prompt"]) == {"1", "100", "10000"}
    assert layer["certify"]["learned top:8"]["prompts"] == 2 and layer["eps_headroom"] > 1
    # lock-step: B = 1 and 3 (one batch of 3, the 4th prompt left out); B = 8 > 4 prompts is not run
    assert [(e["batch"], e["batches"], e["prompts"], e["exact"]) for e in learned["lock_step"]] == [(1, 4, 4, 4), (3, 1, 3, 3)]
    assert all(0 < e["ratio_in_passes_median"] < e["ratio_to_batched_forward_median"] for e in learned["lock_step"])
    # each batch inverted 3 times (the default), the try of median ratio reported
    for e in learned["lock_step"]:
        assert e["repeats"] == 3 and [len(t) for t in e["ratio_tries"]] == [3] * e["batches"]
        assert e["ratio_to_batched_forward"] == [sorted(t)[1] for t in e["ratio_tries"]]
    # a file's way: all 4 prompts, at most B in flight (the 4th too), against the batched forwards of B at a time
    assert [(e["window"]["prompts"], e["window"]["exact"], e["window"]["ok"]) for e in learned["lock_step"]] == [(4, 4, 4)] * 2
    assert all(e["window"]["ratio_to_batched_forwards"] > 0 for e in learned["lock_step"])
    # where the time goes: the forward passes and the rest, each prompt against its forward
    for entry in (learned, exhaustive):
        assert entry["ratio_split"]["passes"] > 0 and entry["ratio_split"]["rest"] > 0


def test_bench_invert_fast_calibration_is_the_fast_one(tmp_path, monkeypatch):
    from sipit.invert.learned import cache_path
    from sipit.invert.learned.config import calibration_config
    from sipit.models import LayerTap, load_model

    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path))
    cfg = Config(model="tiny-llama", layers=[1], policies=("learned",), kinds=("random",), prompts=1, length=6,
                 certify=(), threads=1, calibration="fast")
    learned = run(cfg)["layers"]["1"]["policies"]["learned"]
    assert learned["exact"] == 1 and not learned["calibration_cached"]
    tap = LayerTap(load_model("tiny-llama"), 1)
    assert cache_path(tap, calibration_config("fast")).exists() and not cache_path(tap, calibration_config()).exists()


def test_bench_invert_refuses_no_repeats(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", "tiny-llama", "--batch-repeats", "0"])
    assert e.value.code == 2 and "--batch-repeats must be at least 1, got 0" in capsys.readouterr().err
