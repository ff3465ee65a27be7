"""FP32 reference for SiLU (WS1 §3.1). Math: Elfwing et al. 2018, ``x * sigmoid(x)``."""

import torch

from rl_engine.ops.reference_guard import fp32_reference_guard, require_fp32


def silu_reference(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` in FP32. x: [T, F] float32 (upcast BF16 values) -> [T, F] float32."""
    require_fp32(x=x)
    with fp32_reference_guard():
        return x * torch.sigmoid(x)
