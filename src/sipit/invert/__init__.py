"""SipIt inversion: recover the exact prompt from a causal LM's hidden states at one layer."""
from .sipit import InversionError, InversionResult, InvertConfig, Position, PromptResult, SipIt, invert
from .verify import DuplicateClasses, rel_distance, tolerance

__all__ = ["DuplicateClasses", "InversionError", "InversionResult", "InvertConfig", "Position", "PromptResult",
           "SipIt", "invert", "rel_distance", "tolerance"]
