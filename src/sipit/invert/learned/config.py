"""Every constant of the learned ranker in one place (InvertConfig nests it as `learned`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class LearnedConfig:
    # --- calibration corpus (data.py): never the prompts being inverted
    calibration_tokens: int = 49_152  # text + random-id tokens the forward model is fitted on
    seq_len: int = 64  # calibration rows: positions 0..63 cover typical prompt lengths
    random_fraction: float = 0.2  # share of calibration tokens that are uniform random ids
    sampled_fraction: float = 1 / 3  # share that are the model's own samples in place of corpus text (data.model_samples:
    #                                  the corpus is manuals and code; fewer wrong guesses on held-out prose and chat);
    #                                  made once per model and cached, but their pass through the whole model costs
    #                                  (SmolLM2, 256 rows of 64 on 2 cores: 38 s), so fast mode has none
    table_tokens: int | None = None  # position-0 states of a seeded sample of this many tokens and a linear
    #                                  model of the rest (fast mode, fit.py); None or ≥ V: every token's (the table)
    first_tokens: int = 1024  # fast mode: the exact position-0 states of this many of the calibration text's most
    #                           frequent tokens (and the tokenizer's special tokens) are kept: the linear model misses
    #                           the first tokens text starts with most (newlines, punctuation), whose states it does
    #                           not predict (Gemma-3-270M layer 9: a newline ranked 170,877th; first_token_fast.py)
    low_precision_states: bool = False  # without a table (fast mode), fit on states from a copy of the model in the
    #                                     screening dtype (bfloat16 where native: a 2x faster forward on this project's
    #                                     CPU); the ranker only orders candidates, every token is verified in the model's
    #                                     own precision. A table always comes from the model itself: its lower bounds certify
    # --- fit (fit.py): h_t ≈ A [e_v, table_v] + B ĥ_{t−1} + c by ridge on standardised features
    ridge: float = 1e-3  # λ, relative to the number of fitted positions
    # --- screening (fit.py, ranker.py): low-rank scores first, exact for the best few
    screen_rank: int = 16  # smallest rank tried for the whitened token predictions P (doubled until it agrees;
    #                        64 before: SmolLM2 layers 1 and 15 now agree at 32, 30 at 256 as before; a smaller
    #                        screen leaves more of the model's weights in cache: docs/results/invert/README.md)
    screen_top: int = 64  # candidates per position scored exactly after the screen (position 0, searches) ...
    guess_top: int = 16  # ... and for the guesses at t ≥ 1 without a lens (a lens reads screen_top: screen_best).
    #                      SmolLM2, the bench prompts of seeds 59 / 61 / 67, against 64: layer 30 wrong first guesses
    #                      181 / 183 / 206 vs 181 / 183 / 207, 10.9-12.0 vs 12.4-12.9 ms a prompt; layer 1 none wrong,
    #                      1.2 vs 1.9 ms
    screen_agree: float = 0.999  # a rank is kept once its top-1 does as well as full scoring's this often, where that
    #                              is right (fit._agreement; a miss costs a pass; SmolLM2's 608 validation positions:
    #                              every one)
    table_rank: int = 32  # columns of the position-0 table's principal subspace (its screen and certified bounds;
    #                       SmolLM2: half of 128 read 1.04 -> 0.42 ms a prompt, 32 another 0.2-0.3 ms; the bounds
    #                       still exclude every token but the truth at layers 1 / 15 / 30, fresh seed 149: the
    #                       closest others are scored exactly)
    head_rank: int = 128  # smallest rank tried for the LM head's screen (the LM prior; doubled until its guesses are as
    #                      good as the whole head's: SmolLM2 layer 30 takes the whole head, Gemma-3-270M 128)
    gains: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # shrinkage of the token part
    validation_rows: int = 32  # fresh calibration-like rows (20 tokens) choosing gain and rank
    # --- LM prior (last layer, plain states only): + lm_weight · log p_LM(v | prefix) on text-like prompts
    lm_weight: float = 5.0
    gate_rows: int = 128  # fresh random-id rows (20 tokens) placing the text/random gate ...
    gate_margin: float = 1.0  # ... this many nats above their 99th percentile of mean LM log-prob
    # --- lens prior (below the last layer, plain states only): the same weight, through a tuned lens
    lens_rows: int = 64  # calibration rows whose last-layer states fit the lens (their blocks above the tap run
    #                      once more); 0: no lens prior. 64 fit about as well as 256 for a quarter of the pass
    #                      (SmolLM2, wrong first guesses of 760 with 64 / 256 rows, fresh seeds: fast layer 15
    #                      59 / 56, 67 / 68, 75 / 74 (no lens 66, 80, 85); fast layer 22 80 / 76, 79 / 78; full
    #                      layer 15 25 / 24, 21 / 21; Gemma-3-270M fast layer 9 19 / 15, 15 / 19;
    #                      docs/results/invert/lens_rows_ab.py), so cache.lens_fitted's LENS_SHARE is a quarter
    # --- runtime (ranker.py, policy.py); not part of the calibration's cache key
    max_anchors: int = 1024  # evaluated candidates kept per position for re-ranking

    @classmethod
    def fast(cls) -> "LearnedConfig":
        """Fast calibration (`--calibration fast`): no position-0 table, a third of the fitted tokens, no lens.
        It is what a first inversion at a new layer pays for; the lens's pass and the gate rows it reads were a
        third of it at SmolLM2 layer 15 (the first inversion of 5 prompts 58.8 / 60.3 → 47.0 / 51.5 s on this
        project's AVX2-only EPYC, first_inversion_ab-15-125adca.txt) for a few wrong guesses more (fresh seeds
        1049 / 1051, 760 positions each: layer 15 47 / 49 → 50 / 58 wrong, 113 / 92 → 102 / 99 passes of 40 prompts;
        layer 22 64 / 81 → 84 / 89, 145 / 139 → 154 / 145; Gemma-3-270M layer 9, seed 1049, 62.9 → 51.4 s: 9 → 21,
        56 → 78; docs/results/invert/lens_rows_ab.py): a full calibration keeps it."""
        return cls(calibration_tokens=16_384, table_tokens=4096, low_precision_states=True, sampled_fraction=0.0,
                   lens_rows=0)

    def has_table(self, vocab_size: int) -> bool:
        """Every token's position-0 state is computed (a full calibration, or a vocabulary no larger
        than the fast sample); otherwise a sample and a linear model of the rest (fast mode)."""
        return self.table_tokens is None or self.table_tokens >= vocab_size

    def sizes(self, d_model: int, vocab_size: int) -> tuple[int, int | None]:
        """(calibration tokens, position-0 sample or None with a table) for a model of this width and
        vocabulary: the configured numbers, raised to POSITIONS_PER_FEATURE fitted positions per ridge
        feature and POSITION0_PER_DIM sampled tokens per dimension. (Taps observe at most d_model
        numbers per position, except KV "both" of wide-head models: d_model bounds the features anyway.)"""
        table = self.has_table(vocab_size)
        features = (3 if table else 2) * d_model
        tokens = max(self.calibration_tokens, -(-POSITIONS_PER_FEATURE * features * self.seq_len // (self.seq_len - 1)))
        # (a sample stays within half the vocabulary, a table's cost or more: tiny test models)
        return tokens, None if table else max(self.table_tokens, min(vocab_size // 2, POSITION0_PER_DIM * d_model))

    def fit_key(self) -> str:
        """The settings a calibration depends on (part of its cache key). table_tokens=None,
        low_precision_states=False, sampled_fraction=0 and first_tokens with a table (full mode: unused) are left out,
        so such calibrations keep the keys they were cached under before those settings existed."""
        return repr({k: v for k, v in asdict(self).items()
                     if k != "max_anchors" and not (k == "table_tokens" and v is None)
                     and not (k == "first_tokens" and self.table_tokens is None)
                     and not (k in ("low_precision_states", "sampled_fraction") and not v)})


# Wide models need more calibration than the defaults give: the ridge fit has F = 3·d_model features with a
# table ([e_v, table_v, ĥ_{t−1}]; 2·d_model without), and with too few fitted positions per feature its in-sample
# residuals understate the noise, so the whitened scores of new prompts rank no better than chance
# (random:llama-3.1-8b, d = 4096: 3.9 positions per feature at the default 49,152 tokens, 2.0 in fast mode and
# 1.0 sampled position-0 state per dimension; the true token's rank was ~50,000 of 128,256 and the whitened
# residuals' norm 192 where ~64 is expected). The floors sit below what SmolLM2 (28 / 14 / 7.1) and
# Gemma-3-270M (26 / 13 / 6.4), where the ranker was validated, get by default: their calibrations are unchanged.
POSITIONS_PER_FEATURE = 12
POSITION0_PER_DIM = 6

CALIBRATIONS = ("full", "fast")  # `--calibration`: every token's position-0 state, or LearnedConfig.fast()


def calibration_config(mode: str = "full", tokens: int | None = None) -> LearnedConfig:
    """`--calibration full|fast` (and `--tokens N`: calibration tokens) -> LearnedConfig."""
    base = LearnedConfig.fast() if mode == "fast" else LearnedConfig()
    return base if tokens is None else replace(base, calibration_tokens=tokens)


def learned_config(config) -> LearnedConfig:
    """The LearnedConfig of an InvertConfig: its nested `learned` if it has one, else built from
    its flat `calibration_tokens` (so InvertConfig(calibration_tokens=...) keeps working)."""
    nested = getattr(config, "learned", None)
    if isinstance(nested, LearnedConfig):
        return nested
    n = getattr(config, "calibration_tokens", None)
    return LearnedConfig() if n is None else LearnedConfig(calibration_tokens=n)
