"""The leakage audit: attack, geometry and utility of defences per (surface, layer) -> one HTML page."""
from .defenses import Defense, parse_defenses
from .run import AuditConfig, run

__all__ = ["AuditConfig", "Defense", "parse_defenses", "run"]
