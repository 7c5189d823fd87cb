"""Theory lab: the paper's theorems checked over *every* prompt of a tiny decoder.

    run_enumeration(EnumerationConfig(), out_dir)      Thm 2.2: exact closest pair per layer
    run_train(TrainConfig(), out_dir)                  Thm 2.3: separation during training
    run_counterexamples(CounterexampleConfig(), out)   what breaks it, and a perturbation repairing it
    run_guarantee(GuaranteeConfig(), out_dir)          Thm 3.1: SipIt recovers all, in <= T·|V| steps
"""
from .counterexamples import CounterexampleConfig, CounterexamplesResult, run_counterexamples
from .enumerate import EnumerationConfig, EnumerationResult, run_enumeration
from .guarantee import GuaranteeConfig, GuaranteeResult, run_guarantee
from .models import LabError, LabModel, PromptSet, build
from .train import TrainConfig, TrainResult, run_train

__all__ = ["CounterexampleConfig", "CounterexamplesResult", "EnumerationConfig", "EnumerationResult", "GuaranteeConfig",
           "GuaranteeResult", "LabError", "LabModel", "PromptSet", "TrainConfig", "TrainResult", "build",
           "run_counterexamples", "run_enumeration", "run_guarantee", "run_train"]
