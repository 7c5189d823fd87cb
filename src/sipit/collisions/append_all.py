"""Exhaustive collision test: append every vocabulary token to a prefix and compare all V(V-1)/2
pairs of the resulting last-token states at every requested layer (the paper's exhaustive test).

The prefixes are the K prompts whose states are closest to another prompt's in a sampled run
(`source`, a `sipit collisions` directory); without one, a small sampled run is made in out/sampled.
Tokens with identical embedding rows give identical states: they are reported as structural
collisions, and the minimum is taken over the other pairs (see common.analyse_layer).

    res = run(lm, ExhaustiveConfig(prefixes=1, layers=[1, 15, 30]), "out/exhaustive")

Run directory (atomic writes; a killed run resumes where it stopped):

    config.json             kind, config (a different one is refused), model info
    sampled/                the sampled run the prefixes come from (when no source is given)
    prefixes.json           the chosen prefixes: ids, text, source, why chosen
    prefix_000/states/batch_00000.safetensors   states of a batch of candidates, [B, d] per layer
                                                (deleted once every layer is done, unless keep_states)
    prefix_000/layer_015.json                   the analysis of one layer for this prefix
    results.json            everything gathered; what `sipit report` reads
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..engines import ModelRef
from ..environment import load_average
from ..io import SipitError, read_json, write_json
from ..models import LM
from . import sampled
from .common import (analyse_layer, cached_json, chunk_seconds, embedding_classes, load_layer,
                     open_run_dir, parse_layers, run_batches)


@dataclass
class ExhaustiveConfig:
    prefixes: int = 1  # K: how many prefixes to test
    layers: str | list[int] | None = None  # 'all', '1,15,-1' or a list; None = 1, L/2, L
    source: str | None = None  # a `sipit collisions` run dir to take the prefixes from
    corpus: str = "prose:200,code:200,random:100"  # without source: prompts sampled here instead
    length: int | None = 20  # of the sampled prompts; None: the lines of a corpus file as they are
    seed: int = 0
    final_norm: bool = False
    threshold: float = 1e-6
    keep: int = 20
    batch_size: int = 512  # candidates per forward pass
    keep_states: bool = False  # keep the V x d state chunks after the analysis (not part of the identity)


@dataclass
class ExhaustiveResult:
    out_dir: Path
    model: str
    n_layers: int
    vocab_size: int
    config: dict
    prefixes: list[dict]  # ids, text, source, selected (layer, partner, distance, relative)
    layers: list[list[dict]]  # [prefix][layer]: common.analyse_layer + decoded tokens
    seconds: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        v = self.vocab_size
        series = [dict(label=f"prefix {k}: {_short(p['text'])}", n=v, n_pairs=v * (v - 1) // 2, layers=ls,
                       prefix=p) for k, (p, ls) in enumerate(zip(self.prefixes, self.layers))]
        return dict(kind="exhaustive", model=self.model, n_layers=self.n_layers, config=self.config,
                    series=series, seconds=self.seconds, load=self.load)


def _short(text: str, n: int = 40) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= n else "…" + text[-n:])


def select_prefixes(source: dict, prompts: list[dict], k: int) -> list[dict]:
    """The k prompts of a sampled run (results.json dict, its prompts) with the smallest relative
    distance to another prompt, over the closest pairs of its layers >= 1 (layer 0 only if alone:
    it sees the last token, not the prefix)."""
    layers = source["series"][0]["layers"]
    layers = [r for r in layers if r["layer"] >= 1] or layers
    pairs = sorted((p["relative"], r["layer"], p["i"], p["j"], p["distance"]) for r in layers for p in r["closest"])
    chosen: dict[int, dict] = {}
    for rel, layer, i, j, dist in pairs:
        for a, b in ((i, j), (j, i)):
            if a not in chosen and len(chosen) < k:
                chosen[a] = dict(prompts[a], selected=dict(layer=layer, partner=b, distance=dist, relative=rel))
    if len(chosen) < k:
        raise SipitError(f"the sampled run offers only {len(chosen)} prefixes (its closest pairs); "
                         f"ask for fewer or rerun it with a larger keep")
    return list(chosen.values())


def _source_run(lm: LM, cfg: ExhaustiveConfig, out: Path, layers: list[int], progress: bool, engine):
    """(results.json dict, prompts) of the sampled run the prefixes are chosen from."""
    if cfg.source is None:
        scfg = sampled.SampledConfig(corpus=cfg.corpus, length=cfg.length, layers=layers, seed=cfg.seed,
                                     final_norm=cfg.final_norm, threshold=cfg.threshold, keep=cfg.keep)
        res = sampled.run(lm, scfg, out / "sampled", progress=progress, engine=engine)
        return res.to_dict(), res.prompts
    src = Path(cfg.source)
    if not (src / "results.json").exists():
        raise SipitError(f"{src} is not a finished `sipit collisions` run (no results.json)")
    result = read_json(src / "results.json")
    if result.get("kind") != "collisions":
        raise SipitError(f"{src} holds a {result.get('kind')!r} result, not a sampled collisions run")
    if result["config"]["model"] != lm.name:
        raise SipitError(f"{src} was run on {result['config']['model']!r}, not {lm.name!r}")
    prompts = [json.loads(line) for line in (src / "prompts.jsonl").read_text().splitlines()]
    return result, prompts


def run(lm: LM, cfg: ExhaustiveConfig, out_dir: str | Path, progress: bool = True, engine=None) -> ExhaustiveResult:
    """The append-every-token test in run directory `out_dir` (resumes a killed run). engine
    (sipit.engines): where state capture and the pairwise panels run; default this process."""
    t_start, load_start = time.perf_counter(), load_average()
    out = Path(out_dir)
    L = lm.n_layers
    layers = parse_layers(cfg.layers if cfg.layers is not None else [1, L // 2, L], lm)
    if cfg.prefixes < 1 or cfg.batch_size < 1 or cfg.keep < 1 or cfg.threshold < 0:
        raise SipitError("prefixes, batch_size and keep must be >= 1 and threshold >= 0")
    config = {**asdict(cfg), "layers": layers, "model": lm.name, "precision": lm.precision,
              "tokenizer": lm.tokenizer_fingerprint,
              "source": str(Path(cfg.source).resolve()) if cfg.source else None}
    del config["keep_states"]
    open_run_dir(out, "exhaustive", config, dict(n_layers=L, d_model=lm.d_model, vocab_size=lm.vocab_size))

    if (out / "prefixes.json").exists():
        prefixes = read_json(out / "prefixes.json")
    else:
        prefixes = select_prefixes(*_source_run(lm, cfg, out, layers, progress, engine), cfg.prefixes)
        write_json(out / "prefixes.json", prefixes)

    classes = embedding_classes(lm)  # [V]: token -> smallest token with the same embedding row
    emb = lm.embedding_rows()  # [V, d]
    V, B = lm.vocab_size, cfg.batch_size
    all_results = []
    for k, prefix_info in enumerate(prefixes):
        pdir = out / f"prefix_{k:03d}"
        layer_files = [pdir / f"layer_{l:03d}.json" for l in layers]
        starts = range(0, V, B)
        chunks = [pdir / "states" / f"batch_{b:05d}.safetensors" for b in range(len(starts))]
        if not all(f.exists() for f in layer_files):
            job = dict(model=ModelRef.of(lm), layers=layers, final_norm=cfg.final_norm, prefix=prefix_info["ids"])
            batches = [torch.arange(s, min(s + B, V)) for s in starts]  # candidate tokens [B]
            run_batches(engine, job, batches, chunks, progress, f"prefix {k} states")

        def analyse(layer):
            res = analyse_layer(load_layer(chunks, layer), classes, layer=layer, threshold=cfg.threshold,
                                keep=cfg.keep, progress=progress, engine=engine, device=lm.device)
            for p in res["closest"]:  # how far apart the two tokens already were at the input
                p.update(text_i=lm.decode([p["i"]]), text_j=lm.decode([p["j"]]),
                         embedding_distance=float((emb[p["i"]].double() - emb[p["j"]].double()).norm()))
            res["structural"]["tokens"] = [[dict(id=t, text=lm.decode([t])) for t in m]
                                           for m in res["structural"]["members"]]
            res["states_seconds"] = sum(map(chunk_seconds, chunks))
            return res

        results = [cached_json(f, lambda l=l: analyse(l)) for l, f in zip(layers, layer_files)]
        if not cfg.keep_states:
            shutil.rmtree(pdir / "states", ignore_errors=True)
        all_results.append(results)

    seconds = dict(states=sum(r[0]["states_seconds"] for r in all_results),
                   pairwise=sum(x["seconds"] for r in all_results for x in r), this_run=time.perf_counter() - t_start)
    res = ExhaustiveResult(out, lm.name, L, lm.vocab_size, config, prefixes, all_results, seconds,
                           dict(start=load_start, end=load_average()))
    write_json(out / "results.json", res.to_dict())
    return res
