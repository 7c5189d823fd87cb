"""Files of a lab run: result.json (atomic), report.md linking the experiment to its theorem, PNG plots."""
from __future__ import annotations

import json
import os
from pathlib import Path

from sipit.io import atomic_write

from .models import LabModel

THEOREMS = {
    "2.1": "Theorem 2.1 — a transformer is real-analytic in its parameters (and inputs)",
    "2.2": "Theorem 2.2 — with parameters drawn from a density, distinct prompts almost surely get distinct "
           "last-token states",
    "2.3": "Theorem 2.3 — gradient descent keeps the parameters off the collision set",
    "3.1": "Theorem 3.1 — SipIt recovers any prompt exactly, in at most T·|V| steps",
}


def ids(seq) -> str:
    return "[" + ", ".join(map(str, seq)) + "]"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_fig(fig, path: Path):
    """PNG via a temporary file and os.replace, like every result file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    os.replace(tmp, path)


def _dir(out_dir) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write(out_dir, result, markdown: str) -> Path:
    out = _dir(out_dir)
    atomic_write(out / "result.json", json.dumps(result.to_dict(), indent=1, default=str) + "\n")
    atomic_write(out / "report.md", markdown)
    return out


def _model_line(cfg: LabModel) -> str:
    return f"Model: {cfg.describe()}."


def _layer_table(layers) -> list[str]:
    rows = ["| layer | pairs | min distance | min / mean norm | collisions | closest pair |", "|---|---|---|---|---|---|"]
    for r in layers:
        a, b, _ = r.closest[0]
        rows.append(f"| {r.layer} | {r.n_pairs:,} | {r.min_distance:.3e} | {r.min_relative:.2e} | {r.collisions:,} "
                    f"| {ids(a)} vs {ids(b)} |")
    return rows


# ----------------------------------------------------------------------------------------------


def write_enumeration(result, cfg, out_dir):
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ls = [r.layer for r in result.layers]
    ax1.bar([str(x) for x in ls], [max(r.min_relative, 1e-12) for r in result.layers], color="tab:blue")
    ax1.axhline(cfg.tol, color="tab:red", ls="--", label=f"collision threshold ({cfg.tol:g})")
    ax1.set(yscale="log", xlabel="layer", ylabel="min distance / mean norm",
            title=f"closest pair among all {result.n_pairs:,} pairs")
    ax1.legend(loc="lower right")
    for r in result.layers:
        h = r.histogram
        if h and r.mean_norm > 0:
            nz = [k for k, c in enumerate(h["counts"]) if c]
            lo, hi = max(nz[0] - 1, 1), min(nz[-1] + 1, len(h["edges"]) - 1)  # bins [edges[k-1], edges[k])
            x = [(h["edges"][k - 1] * h["edges"][k]) ** 0.5 / r.mean_norm for k in range(lo, hi + 1)]
            ax2.step(x, [max(c, 0.5) for c in h["counts"][lo : hi + 1]], where="mid", label=f"layer {r.layer}")
    ax2.set(xscale="log", yscale="log", ylim=(0.5, None), xlabel="pairwise distance / mean norm",
            ylabel="pairs", title=f"distances among {result.layers[0].histogram.get('rows', 0):,} random prompts")
    ax2.legend()
    save_fig(fig, _dir(out_dir) / "exhaustive.png")
    m = cfg.model
    verdict = ("**No collision at any layer**" if result.collisions == 0 else
               f"**{result.collisions:,} colliding pairs** (distance ≤ {cfg.tol:g} × mean norm)")
    md = [f"# Exhaustive collision check — {THEOREMS['2.2']}", "", _model_line(m), "",
          f"All {result.n_prompts:,} prompts of length 1..{m.context} over {m.vocab} tokens "
          f"({result.n_pairs:,} pairs per layer); last-token state at each layer (no final norm); exact "
          "minimum distance over every pair (float32 screen, float64 recheck).", "",
          *_layer_table(result.layers), "", f"{verdict}.", ""]
    for r in result.layers:
        if r.colliding:
            md += [f"Colliding pairs at layer {r.layer} (first {len(r.colliding)}): "
                   + "; ".join(f"{ids(a)} ≡ {ids(b)}" for a, b, _ in r.colliding), ""]
    md += ["![exhaustive](exhaustive.png)", "",
           f"Forward passes {result.seconds_forward:.1f} s, total {result.seconds:.1f} s.", ""]
    write(out_dir, result, "\n".join(md))


def write_train(result, cfg, out_dir):
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(range(1, len(result.losses) + 1), result.losses, lw=0.8, color="0.6", label="batch loss")
    axes[0].plot([c.step for c in result.checkpoints], [c.loss for c in result.checkpoints], "o-", label="training-set loss")
    axes[0].axhline(result.entropy, color="tab:red", ls="--", label=f"best possible ({result.entropy:.3f})")
    axes[0].set(ylabel="next-token loss (nats)", title=f"{cfg.optimizer}, lr {result.lr:g}: "
                f"{cfg.model.describe()}")
    axes[0].title.set_fontsize(8)
    for k, layer in enumerate(result.layers):
        steps = [c.step for c in result.checkpoints]
        axes[1].plot(steps, [c.min_distance[k] for c in result.checkpoints], "o-", label=f"layer {layer}")
        axes[2].plot(steps, [c.min_relative[k] for c in result.checkpoints], "o-", label=f"layer {layer}")
    axes[1].set(yscale="log", ylabel="min distance (all pairs)")
    axes[2].set(yscale="log", ylabel="min distance / mean norm", xlabel="step")
    axes[2].axhline(cfg.tol, color="tab:red", ls="--", label="collision threshold")
    for ax in axes:
        ax.legend(fontsize=8)
    save_fig(fig, _dir(out_dir) / "train.png")
    first, last = result.checkpoints[0], result.checkpoints[-1]
    rows = ["| step | loss | " + " | ".join(f"min dist L{ell} (rel.)" for ell in result.layers) + " | collisions |",
            "|---" * (len(result.layers) + 3) + "|"]
    for c in result.checkpoints:
        rows.append(f"| {c.step} | {c.loss:.4f} | " + " | ".join(
            f"{d:.3e} ({r:.1e})" for d, r in zip(c.min_distance, c.min_relative)) + f" | {sum(c.collisions)} |")
    never = all(sum(c.collisions) == 0 for c in result.checkpoints)
    growth = ", ".join(f"layer {ell}: ×{b / a:.3g}" for ell, a, b in zip(result.layers, first.min_distance, last.min_distance))
    lowest = []
    for k, ell in enumerate(result.layers):
        c = min(result.checkpoints, key=lambda c: c.min_relative[k])
        lowest.append(f"layer {ell}: {c.min_relative[k]:.2e} at step {c.step} ({ids(c.closest[k][0])} vs "
                      f"{ids(c.closest[k][1])})")
    md = [f"# Training — {THEOREMS['2.3']}", "", _model_line(cfg.model), "",
          f"Task: next-token prediction on {cfg.n_train} sequences of length {cfg.model.context} from a random "
          f"Markov chain (the best possible loss is {result.entropy:.4f} nats; it depends on the last token only, "
          "so the task never rewards keeping prompts apart). "
          f"Optimizer {cfg.optimizer} ({cfg.steps} steps). Every {cfg.eval_every} steps: exact minimum distance "
          f"over all {result.n_pairs:,} pairs of the {result.n_prompts:,} prompts, at each layer.", "",
          *rows, "",
          f"**{'No collision at any checkpoint' if never else f'Pairs closer than {cfg.tol:g} × mean norm appeared'}**"
          f"; loss {first.loss:.4f} → {last.loss:.4f}; minimum distance from step 0 to step {last.step}: {growth}. "
          f"Lowest minimum relative to the mean norm: {'; '.join(lowest)}. In exact arithmetic training cannot "
          "create a collision (Thm 2.3), but nothing stops distances from shrinking towards float32 rounding "
          "(~1e-7 of the norm).", "",
          "![train](train.png)", "", f"Total {result.seconds:.1f} s.", ""]
    write(out_dir, result, "\n".join(md))


def write_counterexamples(result, cfg, out_dir):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for item in result.items:
        sig = [s for s, _ in item.after]
        rel = [max(min(r.min_relative for r in rs), 1e-12) for _, rs in item.after]
        ax.plot(sig, rel, "o-", label=f"{item.name} ({item.found:,} colliding pairs at σ=0)")
    ax.axhline(cfg.tol, color="tab:red", ls="--", label="collision threshold")
    ax.set(xscale="log", yscale="log", xlabel="σ of the random perturbation added to every parameter",
           ylabel="min distance / mean norm (worst layer)", title="collisions of a measure-zero choice disappear")
    ax.legend(fontsize=7)
    save_fig(fig, _dir(out_dir) / "counterexamples.png")
    m = cfg.model
    md = [f"# Counterexamples — what breaks injectivity, and what a perturbation does", "", _model_line(m), "",
          f"Each model breaks one hypothesis. All {result.n_prompts:,} prompts of length 1..{m.context} are "
          f"checked exhaustively (collision: distance ≤ {cfg.tol:g} × mean norm); then N(0, σ²) is added to "
          f"every parameter, for σ in {cfg.sigmas}.", ""]
    for item in result.items:
        theorems = " and ".join(THEOREMS[t] for t in item.theorem.split("/"))
        ex = item.example()
        md += [f"## {item.name}", "", f"Breaks: {item.breaks}. Illustrates {theorems}.", "",
               f"Expected collisions: {item.expect}.", "",
               "| layer | colliding pairs | examples |", "|---|---|---|"]
        for r in item.before:
            md.append(f"| {r.layer} | {r.collisions:,} | " + "; ".join(f"{ids(a)} ≡ {ids(b)}" for a, b, _ in r.colliding) + " |")
        md += ["", "| σ | " + " | ".join(f"layer {r.layer}: collisions, min/mean norm" for r in item.before) + " |",
               "|---" * (len(item.before) + 1) + "|"]
        for s, rs in item.after:
            md.append(f"| {s:g} | " + " | ".join(f"{r.collisions:,}, {r.min_relative:.1e}" for r in rs) + " |")
        if item.removed_at is not None:
            verdict = f"Removed by a perturbation of σ = {item.removed_at:g}"
        else:
            verdict = "Not removed by any perturbation tried"
        why = ("a measure-zero parameter choice" if item.measure_zero else
               "not a parameter choice: the map itself is outside the theorem's hypotheses")
        md += ["", f"Found: {'yes' if item.found else 'no'}{f', e.g. {ids(ex[0])} ≡ {ids(ex[1])}' if ex else ''}. "
                   f"{verdict} ({why}).", ""]
    md += ["![counterexamples](counterexamples.png)", "", f"Total {result.seconds:.1f} s.", ""]
    write(out_dir, result, "\n".join(md))


def write_guarantee(result, cfg, out_dir):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lengths = [r["length"] for r in result.layers[0].by_length]
    ax.plot(lengths, [r["bound"] for r in result.layers[0].by_length], "k--", label="bound T·|V|")
    for lg in result.layers:
        ax.plot(lengths, [r["max_steps"] for r in lg.by_length], "o-", label=f"layer {lg.layer}: max")
        ax.plot(lengths, [r["mean_steps"] for r in lg.by_length], "x:", label=f"layer {lg.layer}: mean")
    ax.set(xlabel="prompt length T", ylabel="candidate evaluations", title="SipIt steps on every prompt", xticks=lengths)
    ax.legend(fontsize=8)
    save_fig(fig, _dir(out_dir) / "guarantee.png")
    rows = ["| layer | prompts | recovered | max steps | max steps / (T·\\|V\\|) | mean steps | closest rejected (rel.) | seconds |",
            "|---|---|---|---|---|---|---|---|"]
    for r in result.layers:
        rows.append(f"| {r.layer} | {r.n_prompts:,} | {r.recovered:,} ({100 * r.recovered / r.n_prompts:.1f}%) | "
                    f"{r.max_steps} | {r.max_steps_ratio:.3f} | {r.mean_steps:.2f} | {r.min_wrong_relative:.2e} | {r.seconds:.1f} |")
    fails = [f"layer {r.layer}: " + "; ".join(f"{ids(a)} → {ids(b)}" for a, b in r.failures)
             for r in result.layers if r.failures]
    md = [f"# SipIt guarantee — {THEOREMS['3.1']}", "", _model_line(cfg.model), "",
          f"Every prompt of length 1..{result.max_len} is inverted from its own full-forward states with "
          f"`{result.inverter}` (exhaustive policy, acceptance radius {cfg.eps:g} × ‖h_t‖, all |V| = "
          f"{result.vocab} tokens searched; bound K·|V| = {result.bound}).", "", *rows, "",
          f"**{'Guarantee holds' if result.holds else 'Guarantee FAILS'}**: "
          f"{sum(r.recovered for r in result.layers):,} of {sum(r.n_prompts for r in result.layers):,} inversions exact.",
          "", *(["Failures: " + " | ".join(fails), ""] if fails else []),
          "![guarantee](guarantee.png)", "", f"Total {result.seconds:.1f} s.", ""]
    write(out_dir, result, "\n".join(md))
