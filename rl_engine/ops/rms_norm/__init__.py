"""RMSNorm (Qwen3RMSNorm) with an explicit rounding order and an explicit eps.

Public function: :func:`rms_norm` (selects a backend explicitly).
"""

from rl_engine.ops.rms_norm.api import rms_norm

__all__ = ["rms_norm"]
