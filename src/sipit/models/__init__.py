"""Model access: the only place that touches transformers internals."""
from .load import DEFAULT_MODEL, LM, ModelError, embedded_status, load_model, resolve_device
from .precision import PRECISIONS, apply_precision
from .tap import LayerTap, Prefix, run_layers

__all__ = ["DEFAULT_MODEL", "LM", "LayerTap", "ModelError", "PRECISIONS", "apply_precision", "Prefix", "embedded_status", "load_model", "resolve_device", "run_layers"]
