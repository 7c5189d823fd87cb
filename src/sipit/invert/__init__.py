"""SipIt inversion: recover the exact prompt from a causal LM's hidden states at one layer."""
from .config import GradientConfig, InversionError, InvertConfig
from .driver import METHODS, Inverter, as_prompts, invert, make_inverter, run
from .result import HardPromptsResult, InversionResult, Position, PromptResult
from .sipit import SipIt
from .verify import DuplicateClasses, duplicate_classes, rel_distance, tolerance

__all__ = ["DuplicateClasses", "GradientConfig", "HardPromptsResult", "InversionError", "InversionResult",
           "Inverter", "InvertConfig", "METHODS", "Position", "PromptResult", "SipIt", "as_prompts",
           "duplicate_classes", "invert", "make_inverter", "rel_distance", "run", "tolerance"]
