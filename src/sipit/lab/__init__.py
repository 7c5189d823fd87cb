"""Theory lab: the paper's theorems checked over *every* prompt of a tiny decoder.

    run_exhaustive(ExhaustiveConfig(), out_dir)        Thm 2.2: exact closest pair per layer
    run_train(TrainConfig(), out_dir)                  Thm 2.3: separation during training
    run_counterexamples(CounterexampleConfig(), out)   what breaks it, and a perturbation repairing it
    run_guarantee(GuaranteeConfig(), out_dir)          Thm 3.1: SipIt recovers all, in <= T·|V| steps
"""
from .counterexamples import CounterexampleConfig, CounterexamplesResult, run_counterexamples
from .exhaustive import ExhaustiveConfig, ExhaustiveResult, run_exhaustive
from .guarantee import GuaranteeConfig, GuaranteeResult, exhaustive_sipit, run_guarantee
from .models import LabError, LabModel, PromptSet, build
from .train import TrainConfig, TrainResult, run_train

__all__ = ["CounterexampleConfig", "CounterexamplesResult", "ExhaustiveConfig", "ExhaustiveResult", "GuaranteeConfig",
           "GuaranteeResult", "LabError", "LabModel", "PromptSet", "TrainConfig", "TrainResult", "build",
           "exhaustive_sipit", "run_counterexamples", "run_exhaustive", "run_guarantee", "run_train"]
