"""Reports: tables and PNG plots from collisions and exhaustive run dirs; clear errors otherwise."""
import pytest

from sipit.collisions import append_all as exhaustive, sampled
from sipit.io import SipitError, write_json
from sipit.models import load_model
from sipit.report import report

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    lm = load_model("tiny-llama")
    s, e = tmp_path_factory.mktemp("s"), tmp_path_factory.mktemp("e")
    sampled.run(lm, sampled.SampledConfig(corpus="code:20,random:20", length=5), s, progress=False)
    exhaustive.run(lm, exhaustive.ExhaustiveConfig(prefixes=2, source=str(s), layers="all"), e, progress=False)
    return s, e


@pytest.mark.parametrize("which", [0, 1])
def test_report_writes_table_and_pngs(runs, which):
    out = runs[which]
    rep = report(out)
    assert {p.name for p in rep.files} == {"table.md", "layerwise_min.png", "distributions.png"}
    for name in ("layerwise_min.png", "distributions.png"):
        assert (out / name).read_bytes()[:8] == PNG
    table = (out / "table.md").read_text()
    assert table == rep.table
    assert "| layer 1 | layer 2 | layer 4 |" in table  # the paper's columns: 1, L/2, L
    rows = [line for line in table.splitlines() if line.startswith("| tiny-llama |")]
    assert len(rows) == (1 if which == 0 else 2)
    assert all(line.count("|") == 10 for line in rows)
    per_layer = [line.split("|")[2].strip() for line in table.splitlines() if line.startswith("| ") and "pairs" not in line]
    assert per_layer.count("3") == len(rows)  # then one row per layer per series


def test_report_errors(tmp_path):
    with pytest.raises(SipitError, match="no results.json"):
        report(tmp_path)
    write_json(tmp_path / "results.json", {"kind": "mystery"})
    with pytest.raises(SipitError, match="no report for result kind 'mystery'"):
        report(tmp_path)
