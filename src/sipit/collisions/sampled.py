"""Sampled collision test: last-token states of N prompts at every requested layer, then the exact
minimum pairwise L2 distance per layer (the paper's layerwise collision search).

    lm = load_model("smollm2")
    res = run(lm, SampledConfig(corpus="prose:2000,code:2000,random:1000"), "out/collisions")
    res.layers[15]["min_distance"]

Run directory (every file written atomically; a killed run resumes where it stopped):

    config.json            kind, config (compared on rerun: a different one is refused), model info
    prompts.jsonl          the sampled prompts: index, source, ids, text
    states/batch_00000.safetensors   last-token states of one batch, one tensor [B, d] per layer
    layers/layer_015.json  the analysis of one layer (see common.analyse_layer)
    results.json           everything above gathered; what `sipit report` reads
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..engines import ModelRef
from ..environment import load_average
from ..io import SipitError, atomic_write, write_json
from ..models import LM
from .common import (analyse_layer, cached_json, chunk_seconds, embedding_classes, group_ids,
                     load_layer, open_run_dir, parse_layers, run_batches)


@dataclass
class SampledConfig:
    corpus: str = "prose:2000,code:2000,random:1000"  # sipit.corpora spec: sources and counts
    length: int | None = 20  # tokens per prompt; None: the lines of a corpus file as they are
    layers: str | list[int] = "all"  # 'all', '1,15,-1' or a list
    seed: int = 0  # prompt sampling
    final_norm: bool = False  # states after the model's final norm instead of the raw residual stream
    threshold: float = 1e-6  # a pair at distance <= threshold is a collision
    keep: int = 20  # closest pairs reported per layer
    batch_size: int = 64  # prompts per forward pass (part of the config: it changes rounding)


@dataclass
class SampledResult:
    out_dir: Path
    model: str
    n_layers: int
    config: dict
    prompts: list[dict]  # index, source, ids, text
    layers: list[dict]  # one analysis per requested layer, ascending (common.analyse_layer + texts)
    seconds: dict = field(default_factory=dict)  # states / pairwise (summed over resumes), this_run
    load: dict = field(default_factory=dict)  # os.getloadavg() at start and end of this run

    @property
    def n_pairs(self) -> int:
        return len(self.prompts) * (len(self.prompts) - 1) // 2

    def to_dict(self) -> dict:
        """The results.json structure shared by every layerwise result (see sipit.report)."""
        label = f"{len(self.prompts)} sampled prompts ({self.config['corpus']})"
        return dict(kind="collisions", model=self.model, n_layers=self.n_layers, config=self.config,
                    series=[dict(label=label, n=len(self.prompts), n_pairs=self.n_pairs, layers=self.layers)],
                    seconds=self.seconds, load=self.load)


def sample_prompts(lm: LM, corpus: str, length: int | None, seed: int) -> list[dict]:
    """Prompts from sipit.corpora as dicts (index, source, ids, text)."""
    from .. import corpora

    prompts = corpora.sample(corpus, lm.tokenizer, length, seed=seed, vocab_size=lm.vocab_size)
    if len(prompts) < 2:
        raise SipitError(f"corpus {corpus!r} gives {len(prompts)} prompt(s): a pairwise test needs at least 2")
    return [dict(index=k, source=p.source, ids=list(p.ids), text=p.text) for k, p in enumerate(prompts)]


def length_batches(ids: list[list[int]], size: int) -> list[list[int]]:
    """Prompt indices in batches of at most `size` prompts of one length, in index order within a
    length (prompts of one length: the batches 0..size-1, size..2*size-1, ...)."""
    by_length: dict[int, list[int]] = {}
    for k, s in enumerate(ids):
        by_length.setdefault(len(s), []).append(k)
    return [g[s : s + size] for _, g in sorted(by_length.items()) for s in range(0, len(g), size)]


def structural_groups(ids: list[list[int]], classes: torch.Tensor, layer: int) -> torch.Tensor:
    """Rows whose states are identical by construction: same embedding rows at every position the
    state at `layer` depends on (the last token at layer 0, the whole prompt after). -> [N]"""
    canon = [tuple(classes[torch.tensor(s)].tolist()) for s in ids]
    return group_ids([(len(c), c[-1]) if layer == 0 else c for c in canon])


def run(lm: LM, cfg: SampledConfig, out_dir: str | Path, progress: bool = True, engine=None) -> SampledResult:
    """The sampled collision test in run directory `out_dir` (resumes a killed run). engine
    (sipit.engines): where state capture and the pairwise panels run; default this process."""
    t_start, load_start = time.perf_counter(), load_average()
    out = Path(out_dir)
    layers = parse_layers(cfg.layers, lm)
    if (cfg.length is not None and cfg.length < 1) or cfg.batch_size < 1 or cfg.keep < 1 or cfg.threshold < 0:
        raise SipitError("length, batch_size and keep must be >= 1 and threshold >= 0")
    config = {**asdict(cfg), "layers": layers, "model": lm.name, "precision": lm.precision,
              "tokenizer": lm.tokenizer_fingerprint}
    open_run_dir(out, "collisions", config,
                 dict(n_layers=lm.n_layers, d_model=lm.d_model, vocab_size=lm.vocab_size))

    path = out / "prompts.jsonl"
    if path.exists():
        prompts = [json.loads(line) for line in path.read_text().splitlines()]
    else:
        prompts = sample_prompts(lm, cfg.corpus, cfg.length, cfg.seed)
        atomic_write(path, "".join(json.dumps(p) + "\n" for p in prompts))
    ids = [p["ids"] for p in prompts]
    batches = length_batches(ids, cfg.batch_size)
    chunks = [out / "states" / f"batch_{b:05d}.safetensors" for b in range(len(batches))]
    job = dict(model=ModelRef.of(lm), layers=layers, final_norm=cfg.final_norm)
    run_batches(engine, job, [torch.tensor([ids[k] for k in b]) for b in batches], chunks, progress, "states")
    rows = torch.tensor([k for b in batches for k in b]).argsort()  # chunk row of each prompt

    classes = embedding_classes(lm)

    def analyse(layer):
        res = analyse_layer(load_layer(chunks, layer)[rows], structural_groups(ids, classes, layer), layer=layer,
                            threshold=cfg.threshold, keep=cfg.keep, engine=engine, device=lm.device)
        for p in res["closest"]:
            p.update(text_i=prompts[p["i"]]["text"], text_j=prompts[p["j"]]["text"],
                     source_i=prompts[p["i"]]["source"], source_j=prompts[p["j"]]["source"])
        return res

    results = [cached_json(out / "layers" / f"layer_{l:03d}.json", lambda l=l: analyse(l))
               for l in tqdm(layers, disable=not progress, desc="pairwise", unit="layer")]
    seconds = dict(states=sum(map(chunk_seconds, chunks)), pairwise=sum(r["seconds"] for r in results),
                   this_run=time.perf_counter() - t_start)
    res = SampledResult(out, lm.name, lm.n_layers, config, prompts, results, seconds,
                        dict(start=load_start, end=load_average()))
    write_json(out / "results.json", res.to_dict())
    return res
