"""FP32 reference for the token embedding (WS1 §3.1): a row gather, ``weight[ids]``.

The gradient of ``weight`` follows from the same definition through autograd:
``dweight[v] = sum of dy[t] over the tokens t with ids[t] == v`` (FP32).
"""

import torch
import torch.nn.functional as F

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def embedding_reference(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """ids: [T] int64, weight: [V, E] float32 (upcast BF16 values) -> [T, E] float32."""
    require_fp32(weight=weight)
    with fp32_reference_guard():
        return F.embedding(ids, weight)
