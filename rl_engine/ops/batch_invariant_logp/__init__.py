"""``batch_invariant_logp``: padded-layout target logprobs, ``[B, S, V]`` FP32 -> ``[B, S]`` FP32.

Public function: :func:`batch_invariant_logp` (selects a backend explicitly).
"""

from rl_engine.ops.batch_invariant_logp.api import batch_invariant_logp

__all__ = ["batch_invariant_logp"]
