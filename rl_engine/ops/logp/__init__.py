"""``logp``: log-probabilities of target tokens from FP32 logits, ``[T, V] -> [T]`` FP32.

Public function: :func:`logp` (selects a backend explicitly).
"""

from rl_engine.ops.logp.api import logp

__all__ = ["logp"]
