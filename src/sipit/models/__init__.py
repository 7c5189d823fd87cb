"""Model access: the only place that touches transformers internals."""
from .device import batch_for, exact_matmul, resolve_device, retry_on_oom
from .lm import LM, ModelError, attention_weights, position_table, temporary_edit
from .load import DEFAULT_MODEL, cache_dir, embedded_status, installed_embedded, load_model
from .precision import PRECISIONS, apply_precision
from .tap import LayerTap, Prefix, run_layers
from .tiny import tiny_model

__all__ = ["DEFAULT_MODEL", "LM", "LayerTap", "ModelError", "PRECISIONS", "Prefix", "apply_precision",
           "attention_weights", "batch_for", "cache_dir", "embedded_status", "exact_matmul", "installed_embedded",
           "load_model", "position_table", "resolve_device", "retry_on_oom", "run_layers", "temporary_edit",
           "tiny_model"]
