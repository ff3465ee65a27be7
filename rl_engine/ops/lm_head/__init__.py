"""lm_head: FP32 logits ``hidden @ weight^T`` for scoring (contract ``logits_for_scoring``).

Public function: :func:`lm_head` (selects a backend explicitly).
"""

from rl_engine.ops.lm_head.api import lm_head

__all__ = ["lm_head"]
