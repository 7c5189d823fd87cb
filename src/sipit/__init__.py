"""sipit: exact prompt recovery and injectivity tests for causal language models."""
from .invert import InversionResult, InvertConfig, PromptResult, invert  # noqa: E402,F401
