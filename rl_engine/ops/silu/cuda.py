"""CUDA C++ SiLU (``cuda_bf16`` backend), forward and backward.

Kernels: ``rl_silu_fwd`` / ``rl_silu_bwd`` in ``rl_engine/backends/cuda_src/elementwise.cu``. One
block per (row, 1024 columns); ``y = x / (1 + exp(-x))`` and ``dx = dy * s * (1 + x * (1 - s))``
with ``s = 1 / (1 + exp(-x))`` in FP32 (IEEE ``expf`` and division), one rounding to BF16. Every
element depends only on its own inputs, so batch invariance holds by construction.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, unit_last
from rl_engine.ops._validate import check_tensor


def _fwd(x: torch.Tensor) -> torch.Tensor:
    t, f = x.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_silu_fwd", x, y, t, f, x.stride(0), y.stride(0))
    return y


def _bwd(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    t, f = x.shape
    dx = torch.empty((t, f), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_silu_bwd", x, dy, dx, t, f, x.stride(0), dy.stride(0), dx.stride(0))
    return dx


class _SiluCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _fwd(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _bwd(x, unit_last(dy.to(torch.bfloat16)))


def silu_cuda(x: torch.Tensor) -> torch.Tensor:
    """SiLU with CUDA C++ kernels. x: [T, F] bfloat16 (unit stride on F) -> [T, F] bfloat16.

    ``x * sigmoid(x)`` (Elfwing et al. 2018) in FP32, one rounding to BF16. Backward: dx [T, F]
    bfloat16, FP32 math, one rounding.

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on the last axis (checked before launch).
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, x not on it, or ``nvcc`` missing for the build.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_cuda_device(x)
    return _SiluCuda.apply(x)
