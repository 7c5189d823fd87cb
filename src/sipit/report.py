"""Tables and plots (matplotlib Agg, PNG) from a result directory's results.json.

    rep = report("out/collisions")   # writes table.md, layerwise_min.png, distributions.png there
    print(rep.table)

results.json names its `kind`; REPORTS maps a kind to the function that reports it, so a new kind
of result plugs in without touching the others. Layerwise kinds ("collisions", "exhaustive") share
one structure: `series`, each with `label`, `n`, `n_pairs` and `layers` (one analysis per layer:
layer, min_distance, min_relative, median_norm, below_threshold, structural, distribution).
"""
from __future__ import annotations

import io

from dataclasses import dataclass, field
from pathlib import Path

from .io import SipitError, atomic_write, read_json


@dataclass
class Report:
    out_dir: Path
    table: str  # markdown, also written to out_dir/table.md
    files: list[Path] = field(default_factory=list)


def report(out_dir: str | Path) -> Report:
    out = Path(out_dir)
    path = out / "results.json"
    if not path.exists():
        raise SipitError(f"{out} has no results.json: not a finished sipit run directory")
    result = read_json(path)
    kind = result.get("kind")
    if kind not in REPORTS:
        raise SipitError(f"{path}: no report for result kind {kind!r} (known: {', '.join(REPORTS)})")
    return REPORTS[kind](result, out)


# ---------------------------------------------------------------- layerwise minimum distances


def _fmt(d) -> str:
    return "—" if d is None else ("0" if d == 0 else f"{d:.3g}")


def table_layers(n_layers: int) -> list[int]:
    """The paper's Table 1 columns: layers 1, L/2 and L."""
    return [1, n_layers // 2, n_layers]


def layerwise_table(result: dict) -> str:
    """Markdown: one row per series with the minimum distance at layers 1, L/2, L (relative to the
    median state norm in parentheses), then every layer of every series."""
    L, thr = result["n_layers"], result["config"]["threshold"]
    cols = table_layers(L)
    kind, model = result["kind"], result["model"]
    lines = [f"Minimum pairwise L2 distance between last-token states ({kind}, {model}, {L} layers; "
             f"relative = distance / median state norm at that layer). Structural pairs (identical "
             f"embedding rows) are excluded from the minimum and counted separately.", "",
             "| model | test | states | pairs / layer | " + " | ".join(f"layer {c}" for c in cols)
             + f" | pairs ≤ {thr:g} | structural pairs |",
             "|---|---|---:|---:|" + "---:|" * len(cols) + "---:|---:|"]
    for s in result["series"]:
        by_layer = {r["layer"]: r for r in s["layers"]}
        cells = [f"{_fmt(by_layer[c]['min_distance'])} ({_fmt(by_layer[c]['min_relative'])})"
                 if c in by_layer else "—" for c in cols]
        below = sum(r["below_threshold"] for r in s["layers"])
        structural = sorted({r["structural"]["pairs"] for r in s["layers"] if r["layer"] >= 1}) or [0]
        lines.append(f"| {model} | {s['label']} | {s['n']:,} | {s['n_pairs']:,} | " + " | ".join(cells)
                     + f" | {below} | {'/'.join(map(str, structural))} |")
    lines += ["", "| test | layer | min distance | relative | median norm | pairs ≤ threshold | structural pairs |"
              " max structural distance |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in result["series"]:
        for r in s["layers"]:
            st = r["structural"]
            lines.append(f"| {s['label']} | {r['layer']} | {_fmt(r['min_distance'])} | {_fmt(r['min_relative'])} | "
                         f"{r['median_norm']:.4g} | {r['below_threshold']} | {st['pairs']} | {_fmt(st['max_distance'])} |")
    sec = result.get("seconds", {})
    if sec:
        lines += ["", "Compute: " + ", ".join(f"{k} {v:.1f} s" for k, v in sec.items())
                  + (f"; load average {result['load']}" if result.get("load") else "")]
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return atomic_write(path, buf.getvalue())


def plot_layerwise_min(result: dict, path: Path) -> Path:
    """Minimum distance per layer, absolute and relative, log y; one line per series."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for s in result["series"]:
        rows = [r for r in s["layers"] if r["min_distance"] is not None]
        x = [r["layer"] for r in rows]
        for ax, key in zip(axes, ("min_distance", "min_relative")):
            y = [max(r[key], 1e-12) for r in rows]  # a 0 cannot sit on a log axis: drawn at 1e-12
            ax.plot(x, y, marker="o", ms=3, label=s["label"])
    axes[0].axhline(result["config"]["threshold"], color="red", ls="--", lw=1, label="collision threshold")
    for ax, title in zip(axes, ("minimum L2 distance", "minimum distance / median state norm")):
        ax.set_yscale("log")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("layer")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{result['model']}: layerwise minimum pairwise distance ({result['kind']})")
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_distributions(result: dict, path: Path, max_series: int = 4) -> Path:
    """Distribution of pairwise distances (relative to the median state norm) per layer, from each
    layer's row subsample (see collisions.common.distribution). One row of panels per series: the
    quantile bands against the layer with the exact minimum, and the histograms coloured by layer."""
    plt = _pyplot()
    series = result["series"][:max_series]
    fig, axes = plt.subplots(len(series), 2, figsize=(12, 4 * len(series)), squeeze=False)
    cmap = plt.get_cmap("viridis")
    L = max(result["n_layers"], 1)
    for (band, hist), s in zip(axes, series):
        rows = [r for r in s["layers"] if r.get("distribution") and r["distribution"]["relative_quantiles"]]
        x = [r["layer"] for r in rows]
        q = [dict(zip(r["distribution"]["quantiles"], r["distribution"]["relative_quantiles"])) for r in rows]
        band.fill_between(x, [v[0.01] for v in q], [v[0.99] for v in q], alpha=0.15, color="C0", label="1–99%")
        band.fill_between(x, [v[0.25] for v in q], [v[0.75] for v in q], alpha=0.35, color="C0", label="25–75%")
        band.plot(x, [v[0.5] for v in q], color="C0", marker="o", ms=3, label="median (subsample)")
        exact = [(r["layer"], max(r["min_relative"], 1e-12)) for r in s["layers"] if r["min_relative"] is not None]
        band.plot(*zip(*exact), color="C3", marker="v", ms=4, ls="", label="exact minimum (all pairs)")
        band.set_yscale("log")
        band.xaxis.get_major_locator().set_params(integer=True)
        band.set_xlabel("layer")
        band.set_ylabel("distance / median state norm")
        band.set_title(s["label"], fontsize=9)
        band.grid(True, which="both", alpha=0.3)
        band.legend(fontsize=7)
        used = []
        for r in rows:
            d = r["distribution"]
            edges, counts = d["edges"], d["counts"][1:-1]  # the in-range bins
            centers = [(a * b) ** 0.5 for a, b in zip(edges, edges[1:])]
            hist.plot(centers, [c / d["pairs"] for c in counts], color=cmap(r["layer"] / L), lw=1)
            used += [c for c, n in zip(centers, counts) if n]
        hist.set_xscale("log")
        if used:
            hist.set_xlim(min(used) / 2, max(used) * 2)
        hist.set_xlabel("distance / median state norm")
        hist.set_ylabel("fraction of pairs per bin (1/20 decade)")
        hist.grid(True, which="both", alpha=0.3)
        fig.colorbar(plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, L)), ax=hist, label="layer")
    fig.suptitle(f"{result['model']}: distribution of pairwise distances per layer ({result['kind']})")
    fig.tight_layout()
    return _save(plt, fig, path)


def layerwise_report(result: dict, out: Path) -> Report:
    table = layerwise_table(result)
    files = [atomic_write(out / "table.md", table),
             plot_layerwise_min(result, out / "layerwise_min.png"),
             plot_distributions(result, out / "distributions.png")]
    return Report(out, table, files)


REPORTS = {"collisions": layerwise_report, "exhaustive": layerwise_report}
