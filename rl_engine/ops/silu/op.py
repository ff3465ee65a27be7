"""SiLU, the op's one path: input checks, the torch ops ``rl_engine::silu_fwd`` /
``rl_engine::silu_bwd`` (fake shapes and autograd registered), the per-backend entry points the
op spec lists, and the public :func:`silu`. Kernels and launchers: ``triton.py``, ``cuda.py``.
"""

from __future__ import annotations

import torch

from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, register_autograd, run
from rl_engine.ops._validate import check_tensor


def _silu_fwd(x: torch.Tensor, backend: str) -> torch.Tensor:
    """y [T, F] bf16 of validated x [T, F] bf16."""
    return launchers("silu", backend).silu_fwd(x)


silu_fwd = torch.library.custom_op("rl_engine::silu_fwd", _silu_fwd, mutates_args=())


@silu_fwd.register_fake
def _(x, backend):
    return x.new_empty(x.shape, dtype=torch.bfloat16)


@torch.library.custom_op("rl_engine::silu_bwd", mutates_args=())
def silu_bwd(x: torch.Tensor, dy: torch.Tensor, backend: str) -> torch.Tensor:
    """dx [T, F] bf16 of x and dy [T, F] bf16."""
    return launchers("silu", backend).silu_bwd(x, dy)


@silu_bwd.register_fake
def _(x, dy, backend):
    return x.new_empty(x.shape, dtype=torch.bfloat16)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.backend = inputs[1]


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return call(silu_bwd, x, grad_bf16(dy), ctx.backend), None


register_autograd(silu_fwd, _silu_fwd, _backward, _setup)


def silu_kernel(x: torch.Tensor, *, backend: str) -> torch.Tensor:
    """SiLU on a kernel backend. x: [T, F] bfloat16 (unit stride on F) -> [T, F] bfloat16.

    ``x * sigmoid(x)`` (Elfwing et al. 2018) as ``x / (1 + exp(-x))`` in FP32 (``exp`` is CUDA's
    ``expf``, division IEEE: ``docs/declared-arithmetic.md``), one rounding to BF16. Backward: dx
    [T, F] bfloat16 = ``dy * s * (1 + x * (1 - s))``, FP32 math, one rounding.

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on the last axis (checked before launch).
    BackendUnavailable
        ``triton_cuda_bf16``: x is not on a CUDA device (and the Triton interpreter is off).
        ``cuda_bf16``: no CUDA GPU of compute capability 9.0, x not on it, or ``nvcc`` missing.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_device(backend, x)
    return run(silu_fwd, _silu_fwd, x, backend)


def silu_triton(x: torch.Tensor) -> torch.Tensor:
    """:func:`silu_kernel` on ``triton_cuda_bf16``."""
    return silu_kernel(x, backend="triton_cuda_bf16")


def silu_cuda(x: torch.Tensor) -> torch.Tensor:
    """:func:`silu_kernel` on ``cuda_bf16``."""
    return silu_kernel(x, backend="cuda_bf16")
