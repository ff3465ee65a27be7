"""SwiGLU: ``y = silu(gate) * up``.

Public function: :func:`swiglu` (selects a backend explicitly).
"""

from rl_engine.ops.swiglu.api import swiglu

__all__ = ["swiglu"]
