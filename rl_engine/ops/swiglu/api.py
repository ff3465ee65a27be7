"""Public entry point for SwiGLU."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """SwiGLU ``silu(gate) * up``. gate, up: [T, F] bfloat16 -> [T, F] bfloat16 (FP32 math, one rounding).

    Backward: dgate and dup [T, F] bfloat16. ``backend`` is explicit; an unavailable backend
    raises BackendUnavailable naming why.
    """
    return resolve_impl("swiglu", backend)(gate=gate, up=up)
