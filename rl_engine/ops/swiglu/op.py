"""SwiGLU, the op's one path: input checks, the torch ops ``rl_engine::swiglu_fwd`` /
``rl_engine::swiglu_bwd`` (fake shapes and autograd registered), the per-backend entry points the
op spec lists, and the public :func:`swiglu`. Kernels and launchers: ``triton.py``, ``cuda.py``.
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, register_autograd, run
from rl_engine.ops._validate import check_same_device, check_tensor


def _swiglu_fwd(gate: torch.Tensor, up: torch.Tensor, backend: str) -> torch.Tensor:
    """y [T, F] bf16 of validated gate, up [T, F] bf16."""
    return launchers("swiglu", backend).swiglu_fwd(gate, up)


swiglu_fwd = torch.library.custom_op("rl_engine::swiglu_fwd", _swiglu_fwd, mutates_args=())


@swiglu_fwd.register_fake
def _(gate, up, backend):
    return gate.new_empty(gate.shape, dtype=torch.bfloat16)


@torch.library.custom_op("rl_engine::swiglu_bwd", mutates_args=())
def swiglu_bwd(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor,
               backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) [T, F] bf16."""
    return launchers("swiglu", backend).swiglu_bwd(gate, up, dy)


@swiglu_bwd.register_fake
def _(gate, up, dy, backend):
    return gate.new_empty(gate.shape, dtype=torch.bfloat16), gate.new_empty(gate.shape, dtype=torch.bfloat16)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.backend = inputs[2]


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dg, du = call(swiglu_bwd, gate, up, grad_bf16(dy), ctx.backend)
    return dg, du, None


register_autograd(swiglu_fwd, _swiglu_fwd, _backward, _setup)


def swiglu_kernel(gate: torch.Tensor, up: torch.Tensor, *, backend: str) -> torch.Tensor:
    """SwiGLU on a kernel backend. gate, up: [T, F] bfloat16 (unit stride on F) -> [T, F] bfloat16.

    ``silu(gate) * up`` in FP32 (``exp`` is CUDA's ``expf``, division IEEE:
    ``docs/declared-arithmetic.md``), one rounding to BF16. Backward: dgate, dup [T, F] bfloat16,
    FP32 math, one rounding each.

    Raises
    ------
    InputError
        gate or up is not a 2-D bfloat16 tensor with unit stride on F, their shapes differ, or
        they sit on different devices (checked before launch).
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    check_tensor("gate", gate, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_tensor("up", up, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if gate.shape != up.shape:
        raise InputError(f"gate and up must have the same shape [T, F], got {list(gate.shape)} and {list(up.shape)}")
    check_same_device(gate=gate, up=up)
    check_device(backend, gate, up)
    return run(swiglu_fwd, _swiglu_fwd, gate, up, backend)


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`swiglu_kernel` on ``triton_cuda_bf16``."""
    return swiglu_kernel(gate, up, backend="triton_cuda_bf16")


def swiglu_cuda(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`swiglu_kernel` on ``cuda_bf16``."""
    return swiglu_kernel(gate, up, backend="cuda_bf16")
