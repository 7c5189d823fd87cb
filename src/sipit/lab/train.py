"""Training keeps prompts apart (Theorem 2.3): train a lab model on next-token prediction and
re-run the exhaustive collision check along the way."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .enumerate import default_layers, layer_collisions
from .models import LabError, LabModel, PromptSet, build, check_size, last_token_states, with_bos

OPTIMIZERS = {"gd": "full-batch gradient descent", "sgd": "minibatch SGD", "adam": "minibatch Adam"}
DEFAULT_LR = {"gd": 0.1, "sgd": 0.1, "adam": 3e-3}


@dataclass
class TrainConfig:
    model: LabModel = field(default_factory=LabModel)
    optimizer: str = "adam"  # gd | sgd | adam
    steps: int = 500
    lr: float | None = None  # default: DEFAULT_LR[optimizer]
    batch: int = 64  # sequences per step (sgd, adam); gd uses the whole training set
    n_train: int = 1024  # training sequences of length K from a random Markov chain
    eval_every: int = 25  # steps between exhaustive checks
    data_seed: int = 0
    layers: list[int] | None = None
    tol: float = 1e-6
    max_prompts: int = 300_000


def markov_data(vocab: int, length: int, n: int, seed: int, bos: bool = False) -> tuple[Tensor, float]:
    """n sequences [n, length] from a random peaked Markov chain (uniform first token), and the
    lowest next-token loss any model can reach on them (nats; with a BOS, predicting the first
    token counts too, at log V)."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3 * torch.randn(vocab, vocab, generator=g), 1)  # [V, V] rows: next-token law
    seqs = torch.empty(n, length, dtype=torch.long)
    seqs[:, 0] = torch.randint(vocab, (n,), generator=g)
    for t in range(1, length):
        seqs[:, t] = torch.multinomial(trans[seqs[:, t - 1]], 1, generator=g)[:, 0]
    row_entropy = -(trans * trans.log()).sum(1)  # [V]
    p, terms = torch.full((vocab,), 1 / vocab), [math.log(vocab)] if bos else []
    for _ in range(1, length):
        terms.append(float(p @ row_entropy))
        p = p @ trans
    return seqs, sum(terms) / max(len(terms), 1)


@dataclass
class Checkpoint:
    step: int
    loss: float  # next-token loss on the whole training set
    min_distance: list[float]  # per layer, exact global minimum over all prompt pairs
    min_relative: list[float]
    mean_norm: list[float]
    collisions: list[int]  # pairs closer than tol x mean norm, per layer
    closest: list  # per layer, the closest pair (ids, ids)
    seconds: float  # of the exhaustive check


@dataclass
class TrainResult:
    config: dict
    layers: list[int]
    n_prompts: int
    n_pairs: int
    lr: float
    entropy: float  # the best achievable loss on the data (its conditional entropy)
    losses: list[float]  # training (batch) loss at every step
    checkpoints: list[Checkpoint]
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def next_token_loss(lm, ids: Tensor, bos: int | None) -> Tensor:
    """Mean cross-entropy of predicting ids[:, t] from ids[:, :t] (t >= 1; t = 0 too with a BOS)."""
    x = with_bos(ids.to(lm.device), bos)
    logits = lm.logits(x[:, :-1])  # [B, T', V(+1)]
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())


def run_train(cfg: TrainConfig, out_dir=None, progress: bool = False) -> TrainResult:
    """Train the lab model, checking all prompts every `eval_every` steps; write results to out_dir."""
    t0 = time.perf_counter()
    if cfg.optimizer not in OPTIMIZERS:
        raise LabError(f"optimizer {cfg.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if cfg.steps < 1 or cfg.eval_every < 1:
        raise LabError(f"steps and eval_every must be >= 1, got {cfg.steps}, {cfg.eval_every}")
    m = cfg.model
    layers = default_layers(m, cfg.layers)
    prompts = PromptSet(m.vocab, m.context)
    check_size(prompts, m.width, len(layers), cfg.max_prompts)
    lm = build(m)
    data, entropy = markov_data(m.vocab, m.context, cfg.n_train, cfg.data_seed, m.bos)
    params = [p for p in lm.model.parameters()]
    lr = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
    opt = torch.optim.Adam(params, lr=lr) if cfg.optimizer == "adam" else torch.optim.SGD(params, lr=lr)
    g = torch.Generator().manual_seed(cfg.data_seed + 1)

    def checkpoint(step):
        t = time.perf_counter()
        with torch.no_grad():
            loss = float(next_token_loss(lm, data, m.bos_id))
        states = last_token_states(lm, prompts, layers, bos=m.bos_id)
        rs = layer_collisions(states, prompts, layers, tol=cfg.tol, show=1)
        c = Checkpoint(step, loss, [r.min_distance for r in rs], [r.min_relative for r in rs],
                       [r.min_distance / r.min_relative if r.min_relative else 0.0 for r in rs],
                       [r.collisions for r in rs], [r.closest[0][:2] for r in rs], time.perf_counter() - t)
        if progress:
            print(f"step {step:5d}  loss {loss:.4f}  min distance per layer "
                  + "  ".join(f"L{ell}: {d:.3e}" for ell, d in zip(layers, c.min_distance)), flush=True)
        return c

    losses, checkpoints = [], [checkpoint(0)]
    lm.model.requires_grad_(True)
    try:
        for step in range(1, cfg.steps + 1):
            batch = data if cfg.optimizer == "gd" else data[torch.randint(len(data), (cfg.batch,), generator=g)]
            loss = next_token_loss(lm, batch, m.bos_id)
            if not math.isfinite(loss.item()):
                raise LabError(f"training diverged at step {step} (loss {loss.item()}): lower --lr (now {lr:g})")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if step % cfg.eval_every == 0 or step == cfg.steps:
                lm.model.requires_grad_(False)
                checkpoints.append(checkpoint(step))
                lm.model.requires_grad_(True)
    finally:
        lm.model.requires_grad_(False)
    n = len(prompts)
    result = TrainResult(asdict(cfg), layers, n, n * (n - 1) // 2, lr, entropy, losses, checkpoints,
                         time.perf_counter() - t0)
    if out_dir is not None:
        from .report import write_train

        write_train(result, cfg, out_dir)
    return result
