"""CUDA C++ SiLU (``cuda_bf16`` backend), forward and backward.

Kernels: ``rl_silu_fwd`` / ``rl_silu_bwd`` in ``rl_engine/backends/cuda_src/elementwise.cu``. One
block per (row, 1024 columns); ``y = x / (1 + exp(-x))`` and ``dx = dy * s * (1 + x * (1 - s))``
with ``s = 1 / (1 + exp(-x))`` in FP32 (IEEE ``expf`` and division), one rounding to BF16. Every
element depends only on its own inputs, so batch invariance holds by construction.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch


def silu_fwd(x: torch.Tensor) -> torch.Tensor:
    """y [T, F] bf16 of validated x [T, F] bf16 (unit stride on F)."""
    t, f = x.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_silu_fwd", x, y, t, f, x.stride(0), y.stride(0))
    return y


def silu_bwd(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx [T, F] bf16 of x and dy [T, F] bf16 (unit stride on F)."""
    t, f = x.shape
    dx = torch.empty((t, f), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_silu_bwd", x, dy, dx, t, f, x.stride(0), dy.stride(0), dx.stride(0))
    return dx
