"""SiLU: ``y = x * sigmoid(x)``.

Public function: :func:`silu` (selects a backend explicitly).
"""

from rl_engine.ops.silu.api import silu

__all__ = ["silu"]
