"""The learned ranker: a per-(model, tap) linear forward model of the observed states, fitted once
on the model's own states of offline text (data.py, fit.py), cached by content (cache.py), and used
at run time to guess and rank tokens (ranker.py, policy.py).

    cal = calibrate(tap)                       # or Calibration.load(path)
    ranker = LinearRanker(cal, tap)
    [(guesses, prior_on)] = ranker.guesses([target])  # target [T, d] -> top-1 ids for positions 1..T-1
"""
from .. import policies  # noqa: F401  first: its Policy is Learned's base, and it imports Learned back
from .cache import VERSION, Calibration, cache_path, calibration_key, load_cached
from .config import LearnedConfig, learned_config
from .fit import calibrate, calibrate_cached_layers, calibrate_layers, load_or_calibrate
from .ranker import LinearRanker

__all__ = ["VERSION", "Calibration", "LearnedConfig", "LinearRanker", "cache_path", "calibrate",
           "calibrate_cached_layers", "calibrate_layers", "calibration_key", "learned_config", "load_cached",
           "load_or_calibrate"]
