"""The audit's page: one self-contained index.html (no network, PNGs inline as base64), and the PNGs.

    write_page(report, out_dir)   # tradeoff_L008.png per layer, margins.png, index.html
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from ..io import atomic_write
from ..report import _pyplot, _save

FAMILY_STYLE = {"none": ("k", "*"), "noise": ("tab:blue", "o"), "quant": ("tab:orange", "s"),
                "project": ("tab:green", "^")}


def plot_tradeoff(report: dict, layer: int, path: Path) -> Path:
    """Exact-recovery rate vs utility cost (share of next-token predictions changed), one curve per
    defence family; the tables give Δ cross-entropy too."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    cells = [c for c in report["cells"] if c["layer"] == layer and c["utility"] is not None]
    for family, (color, marker) in FAMILY_STYLE.items():
        fam = sorted((c for c in cells if c["family"] == family), key=lambda c: c["strength"])
        if not fam:
            continue
        x = [1 - c["utility"]["top1_agreement"] for c in fam]
        y = [c["attack"]["exact_rate"] for c in fam]
        ax.plot(x, y, marker=marker, color=color, ms=7 if family == "none" else 5, label=family)
        for c, xi, yi in zip(fam, x, y):
            if family != "none":
                ax.annotate(c["defense"].split(":", 1)[1], (xi, yi), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=color)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.05, 1.05)
    return _finish(plt, fig, ax, path, f"{report['model']} ({report['surface']}) layer {layer}: privacy vs utility",
                   "utility cost: share of next-token predictions changed (1 − top-1 agreement)",
                   "exact prompt recovery rate")


def plot_margins(report: dict, path: Path) -> Path:
    """Per-position relative margin Δ_t/‖ĥ_t‖ (sorted, one curve per layer) with each layer's radius ρ."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (layer, info) in enumerate(sorted(report["layers"].items(), key=lambda kv: int(kv[0]))):
        m = info["margins"]
        rel = m["relative_margins"]
        line, = ax.plot([(j + 0.5) / len(rel) for j in range(len(rel))], [max(r, 1e-12) for r in rel],
                        label=f"layer {layer}")
        ax.axhline(max(m["radius_rel_min"], 1e-12), color=line.get_color(), ls=":", lw=1)
    ax.set_yscale("log")
    return _finish(plt, fig, ax, path, f"{report['model']} {report['surface']}: margins",
                   "fraction of positions", "relative margin Δ_t / ‖ĥ_t‖ (dotted: radius ρ)")


def _finish(plt, fig, ax, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    """Labels, grid and legend of one audit plot, saved as PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(plt, fig, path)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _num(x, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _cell_rows(cells: list[dict]) -> str:
    rows = []
    for c in cells:
        a, u = c["attack"], c["utility"] or dict(delta_ce=None, top1_agreement=None)
        rows.append("<tr>" + "".join(f"<td>{v}</td>" for v in (
            html.escape(c["surface"]), html.escape(c["defense"]), _pct(a["exact_rate"]), _pct(a["token_accuracy"]),
            _num(a["seconds_per_prompt"]), _num(a["candidates_per_position"], ".1f"), _pct(a.get("certified_share")),
            _num(u["delta_ce"], "+.3g"), _pct(u["top1_agreement"]))) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("surface", "defence", "exact recovery", "token accuracy", "s / prompt",
                                              "candidates / position", "certified", "Δ CE (nats/token)",
                                              "top-1 agreement"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _examples(cells: list[dict]) -> str:
    rows = []
    for c in cells:
        for e in c["attack"]["examples"][:2]:
            rows.append(f"<tr><td>{html.escape(c['defense'])}</td><td><code>{html.escape(e['original'])}</code></td>"
                        f"<td><code>{html.escape(e['recovered'])}</code></td>"
                        f"<td>{'exact' if e['exact'] else 'not exact'} ({html.escape(str(e['status']))})</td></tr>")
    return ("<details><summary>recovered vs original (2 per defence)</summary><table><tr><th>defence</th>"
            "<th>original</th><th>recovered</th><th></th></tr>" + "".join(rows) + "</table></details>")


def _geometry(info: dict) -> str:
    g, m = info["geometry"], info["margins"]
    mq = m["margin_quantiles"]
    return (f"<p><b>Geometry</b> (observed through {html.escape(info['observed_through'])}). Minimum distance "
            f"between last-token observations of {g['prompts']} sampled prompts "
            f"({g['pairs']:,} pairs, exact): {_num(g['min_distance'])} ({_num(g['min_relative'])} of the median "
            f"norm {g['median_norm']:.3g}); structural pairs (identical embedding rows; "
            f"at the embedding layer, equal last tokens): {g['structural_pairs']}. "
            f"Per-position margin Δ_t/‖ĥ_t‖ of the attacked prompts: min {_num(mq['0.0'])}, "
            f"1% {_num(mq['0.01'])}, "
            f"median {_num(mq['0.5'])}. Noise radius ρ ({html.escape(m['bound'])}): min {_num(m['radius_rel_min'])}, "
            f"median {_num(m['radius_rel_median'])}. One-time calibration of the attack's policy: "
            f"{_num(m.get('calibration_seconds'), '.0f')} s (0 when cached).</p>")


STYLE = """body{font-family:sans-serif;max-width:1150px;margin:1.5em auto;padding:0 1em;color:#222;line-height:1.4}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #bbb;padding:3px 7px;
text-align:right}th{background:#eee}td:first-child{text-align:left}code{font-size:12px;white-space:pre-wrap}
details td{text-align:left;max-width:420px}img{max-width:49%;vertical-align:top}.verdict{background:#f4f6fb;
padding:.5em .8em;border-left:4px solid #4a6fd1}h2{margin-top:1.6em;border-bottom:1px solid #ccc}"""


def write_page(report: dict, out: Path) -> Path:
    """PNGs and index.html for a report dict (see run.run) in out."""
    out = Path(out)
    margins = plot_margins(report, out / "margins.png")
    cfg = report["config"]
    sections = []
    for layer, info in sorted(report["layers"].items(), key=lambda kv: int(kv[0])):
        cells = [c for c in report["cells"] if c["layer"] == int(layer)]
        plot = _img(plot_tradeoff(report, int(layer), out / f"tradeoff_L{int(layer):03d}.png"),
                    f"privacy vs utility, layer {layer}") if any(c["utility"] for c in cells) else \
            "<p><small>No privacy/utility plot: no defence here has a utility cost.</small></p>"
        methods = sorted({f"{c['family']}: {c['attack']['method']}" for c in cells})
        sections.append(f"<h2>Layer {layer} of {report['n_layers']}</h2>"
                        f"<p>What leaks: {html.escape(info['leaks'])}.</p>"
                        f"<p class=verdict>{html.escape(info['verdict'])}</p>"
                        f"{_cell_rows(cells)}<p><small>Attacks: {html.escape('; '.join(methods))}.</small></p>"
                        f"{_geometry(info)}{plot}"
                        f"{_examples(cells)}")
    verdicts = "".join(f"<li>{html.escape(i['verdict'])}</li>" for _, i in
                       sorted(report["layers"].items(), key=lambda kv: int(kv[0])))
    title = f"sipit audit: {html.escape(report['model'])}"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>{STYLE}</style></head><body>
<h1>Does {html.escape(report['model'])} leak the prompt?</h1>
<p>Surface <b>{html.escape(report['surface'])}</b> (what leaks is named per layer below; defences act on it), attacked
by SipIt on {report['prompts']} prompts ({html.escape(cfg['prompts'])}, lengths {report['prompt_lengths']}).
Utility is measured on {report['utility_tokens']} held-out tokens ({html.escape(cfg['utility_text'])}):
{html.escape(report['utility_note'])}.
Model fingerprint {report['fingerprint']}; {report['threads']} threads; load {report['load']};
{report['seconds_this_run']} s this run (of which {report.get('calibration_seconds_this_run', 0)} s one-time calibration).</p>
<h2>Verdicts</h2><ul>{verdicts}</ul>
<p><b>How to read.</b> <i>Exact recovery</i>: share of prompts recovered token for token. <i>Certified</i>: for
SipIt attacks (none, quant, project), the share of positions with a certificate (every other token shown farther
than ε; n/a when the engine does not report it); for noise, the share of prompts whose certified radius exceeds σ.
<i>Δ CE</i>: extra next-token cross-entropy when the model reads the defended surface (0 = free; n/a when the
model never reads it); <i>top-1 agreement</i>: share of next-token predictions unchanged. A defence works when it
drives exact recovery to 0 at a small Δ CE. Distances, margins and the radius ρ are measured in the surface's own
observation space; ρ is the relative noise (on what leaks) every audited prompt provably survives (Theorem 3.2):
no noise defence below ρ can work.</p>
{''.join(sections)}
<h2>Margins</h2>{_img(margins, 'margins per layer')}
</body></html>
"""
    return atomic_write(out / "index.html", page)
