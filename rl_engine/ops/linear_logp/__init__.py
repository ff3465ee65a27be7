"""``linear_logp``: fused ``hidden @ weight.T`` + log-softmax + gather, ``[T, E] -> [T]`` FP32.

Public function: :func:`linear_logp` (selects a backend explicitly).
"""

from rl_engine.ops.linear_logp.api import linear_logp

__all__ = ["linear_logp"]
