"""Public entry point for SiLU."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl


def silu(x: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """SiLU ``x * sigmoid(x)``. x: [T, F] bfloat16 -> [T, F] bfloat16 (FP32 math inside).

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("silu", backend)(x=x)
